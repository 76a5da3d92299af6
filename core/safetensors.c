#define _POSIX_C_SOURCE 200809L
#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"

static const struct {
    const char *name;
    ps_dtype dt;
    int bits;
} DTYPES[] = {
    {"F32", PS_DT_F32, 32},  {"F16", PS_DT_F16, 16},   {"BF16", PS_DT_BF16, 16}, {"F64", PS_DT_F64, 64},
    {"I64", PS_DT_I64, 64},  {"I32", PS_DT_I32, 32},   {"I16", PS_DT_I16, 16},   {"I8", PS_DT_I8, 8},
    {"U8", PS_DT_U8, 8},     {"BOOL", PS_DT_BOOL, 8},  {"U16", PS_DT_U16, 16},   {"U32", PS_DT_U32, 32},
    {"U64", PS_DT_U64, 64},  {"F8_E4M3", PS_DT_F8_E4M3, 8}, {"F8_E5M2", PS_DT_F8_E5M2, 8},
    {"F8_E8M0", PS_DT_F8_E8M0, 8}, {"F4", PS_DT_F4, 4},
};
#define N_DTYPES (int)(sizeof DTYPES / sizeof DTYPES[0])

const char *ps_dtype_name(ps_dtype d) {
    for (int i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == d) return DTYPES[i].name;
    return "?";
}

int ps_dtype_size(ps_dtype d) {
    for (int i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == d) return DTYPES[i].bits / 8;
    return 0;
}

int ps_dtype_bits(ps_dtype d) {
    for (int i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == d) return DTYPES[i].bits;
    return 0;
}

int64_t ps_st_numel(const ps_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

/* ---- half precision ---- */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ps_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t ps_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ps_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return u2f(sign);
        float v = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t ps_f32_to_f16(float f) {
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf (rounds up past 65504) */
    if (a < 0x38800000u) {                                    /* subnormal or zero in half */
        float v = u2f(a) * 16777216.0f;                        /* scale by 2^24, round to nearest even */
        uint32_t m = (uint32_t)__builtin_rintf(v);
        return (uint16_t)(sign | m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ---- reader ---- */

void ps_st_close(ps_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->entries[i].name);
    free(f->entries);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const ps_st_entry *x = *(const ps_st_entry *const *)a, *y = *(const ps_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_entry(const char *path, const char *name, json_t *v, ps_st_entry *e, uint64_t data_len,
                       ps_error *err) {
    if (!json_is_object(v)) return ps_fail(err, "%s: tensor \"%s\": header entry is not an object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
    if (json_object_size(v) != 3 || !dt || !sh || !off)
        return ps_fail(err, "%s: tensor \"%s\": header entry must have exactly dtype, shape and data_offsets", path, name);
    if (!json_is_string(dt)) return ps_fail(err, "%s: tensor \"%s\": dtype is not a string", path, name);
    int found = 0;
    for (int i = 0; i < N_DTYPES; i++)
        if (!strcmp(json_string_value(dt), DTYPES[i].name)) {
            e->dtype = DTYPES[i].dt;
            found = 1;
        }
    if (!found) return ps_fail(err, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name, json_string_value(dt));
    if (!json_is_array(sh)) return ps_fail(err, "%s: tensor \"%s\": shape is not an array", path, name);
    if (json_array_size(sh) > PS_ST_MAX_NDIM)
        return ps_fail(err, "%s: tensor \"%s\": shape has %zu dimensions (at most %d supported)", path, name,
                       json_array_size(sh), PS_ST_MAX_NDIM);
    e->ndim = (int)json_array_size(sh);
    uint64_t nbits = (uint64_t)ps_dtype_bits(e->dtype), nbytes;
    for (int i = 0; i < e->ndim; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ps_fail(err, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, name, i);
        e->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(nbits, (uint64_t)e->shape[i], &nbits))
            return ps_fail(err, "%s: tensor \"%s\": shape size overflows", path, name);
    }
    if (nbits % 8)
        return ps_fail(err, "%s: tensor \"%s\": dtype %s and shape give a fractional number of bytes", path, name,
                       ps_dtype_name(e->dtype));
    nbytes = nbits / 8;
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return ps_fail(err, "%s: tensor \"%s\": data_offsets must be [begin, end] integers", path, name);
    json_int_t b = json_integer_value(json_array_get(off, 0)), en = json_integer_value(json_array_get(off, 1));
    if (b < 0 || en < b)
        return ps_fail(err, "%s: tensor \"%s\": data_offsets [%lld, %lld] are invalid", path, name, (long long)b,
                       (long long)en);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if (e->end > data_len)
        return ps_fail(err, "%s: tensor \"%s\": data_offsets end %llu is past the data section (%llu bytes)", path, name,
                       (unsigned long long)e->end, (unsigned long long)data_len);
    if (e->end - e->begin != nbytes)
        return ps_fail(err, "%s: tensor \"%s\": data_offsets span %llu bytes but dtype %s and shape need %llu", path,
                       name, (unsigned long long)(e->end - e->begin), ps_dtype_name(e->dtype),
                       (unsigned long long)nbytes);
    return 0;
}

/* The header's __metadata__ (v): string values only, copied into f. */
static int parse_metadata(const char *path, json_t *v, ps_st_file *f, ps_error *err) {
    if (!json_is_object(v)) return ps_fail(err, "%s: __metadata__ is not an object", path);
    size_t nm = json_object_size(v);
    f->meta_keys = calloc(nm ? nm : 1, sizeof(char *));
    f->meta_vals = calloc(nm ? nm : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_vals) return ps_fail(err, "%s: out of memory", path);
    const char *mk;
    json_t *mv;
    json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) return ps_fail(err, "%s: __metadata__ value of \"%s\" is not a string", path, mk);
        f->meta_keys[f->n_meta] = strdup(mk);
        f->meta_vals[f->n_meta] = strdup(json_string_value(mv));
        f->n_meta++;
    }
    return 0;
}

/* The tensors must tile the data section exactly: no holes, no overlaps, no trailing bytes. */
static int check_tiling(const char *path, const ps_st_file *f, ps_error *err) {
    ps_st_entry **order = malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
    if (!order) return ps_fail(err, "%s: out of memory", path);
    for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
    qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
    uint64_t pos = 0;
    for (int i = 0; i < f->n; i++) {
        if (order[i]->begin != pos) {
            ps_fail(err, "%s: tensor \"%s\": data_offsets begin %llu %s (expected %llu)", path, order[i]->name,
                    (unsigned long long)order[i]->begin,
                    order[i]->begin < pos ? "overlaps the previous tensor" : "leaves a hole", (unsigned long long)pos);
            free(order);
            return -1;
        }
        pos = order[i]->end;
    }
    free(order);
    if (pos != f->data_len)
        return ps_fail(err, "%s: %llu trailing bytes after the last tensor", path, (unsigned long long)(f->data_len - pos));
    return 0;
}

int ps_st_open(const char *path, ps_st_file *f, ps_error *err) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ps_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ps_fail(err, "%s: not a regular file", path);
    }
    uint64_t fsize = (uint64_t)st.st_size;
    json_t *root = NULL;
    char *header = NULL;
    uint8_t lenb[8];
    if (fsize < 8 || pread_all(fd, lenb, 8, 0)) {
        ps_fail(err, "%s: file too short (%llu bytes) for a safetensors header length", path, (unsigned long long)fsize);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen > PS_ST_MAX_HEADER) {
        ps_fail(err, "%s: header length %llu exceeds the 100 MB limit", path, (unsigned long long)hlen);
        goto fail;
    }
    if (hlen > fsize - 8) {
        ps_fail(err, "%s: header length %llu runs past the end of the file (%llu bytes)", path,
                (unsigned long long)hlen, (unsigned long long)fsize);
        goto fail;
    }
    if (hlen < 2) {
        ps_fail(err, "%s: header of %llu bytes cannot hold a JSON object", path, (unsigned long long)hlen);
        goto fail;
    }
    header = malloc(hlen);
    if (!header || pread_all(fd, header, hlen, 8)) {
        ps_fail(err, "%s: cannot read the %llu-byte header", path, (unsigned long long)hlen);
        goto fail;
    }
    json_error_t je;
    /* Jansson rejects invalid UTF-8; duplicate keys are refused as in the reference library. */
    root = json_loadb(header, hlen, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root) {
        ps_fail(err, "%s: header is not valid UTF-8 JSON (%s)", path, je.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        ps_fail(err, "%s: header is not a JSON object", path);
        goto fail;
    }
    size_t nkeys = json_object_size(root);
    if (nkeys > PS_ST_MAX_TENSORS + 1) {
        ps_fail(err, "%s: header lists %zu tensors (limit %d)", path, nkeys, PS_ST_MAX_TENSORS);
        goto fail;
    }
    f->path = strdup(path);
    f->data_len = fsize - 8 - hlen;
    f->entries = calloc(nkeys ? nkeys : 1, sizeof *f->entries);
    if (!f->path || !f->entries) {
        ps_fail(err, "%s: out of memory", path);
        goto fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__")) {
            if (parse_metadata(path, v, f, err)) goto fail;
            continue;
        }
        ps_st_entry *e = &f->entries[f->n];
        if (parse_entry(path, k, v, e, f->data_len, err)) goto fail;
        e->name = strdup(k);
        if (!e->name) {
            ps_fail(err, "%s: out of memory", path);
            goto fail;
        }
        f->n++;
    }
    if (check_tiling(path, f, err)) goto fail;
    /* The data section is mapped, not read: a tensor's pages come in when it is converted and go
     * again with ps_st_release, so loading never holds the file's bytes and the float32 copy at once. */
    {
        size_t map_len = (size_t)fsize;
        if ((uint64_t)map_len != fsize) {
            ps_fail(err, "%s: file of %llu bytes is too large to map", path, (unsigned long long)fsize);
            goto fail;
        }
        void *mp = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mp == MAP_FAILED) {
            ps_fail(err, "%s: cannot map the file: %s", path, strerror(errno));
            goto fail;
        }
        f->map = mp;
        f->map_len = map_len;
        f->data = (const uint8_t *)mp + 8 + hlen;
    }
    json_decref(root);
    free(header);
    close(fd);
    return 0;
fail:
    json_decref(root);
    free(header);
    close(fd);
    ps_st_close(f);
    return -1;
}

const ps_st_entry *ps_st_find(const ps_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

const char *ps_st_meta(const ps_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

int ps_st_read_f32(const ps_st_file *f, const ps_st_entry *e, float *out, ps_error *err) {
    int64_t n = ps_st_numel(e);
    const uint8_t *p = f->data + e->begin;
    switch (e->dtype) {
    case PS_DT_F32:
        memcpy(out, p, (size_t)n * 4);
        return 0;
    case PS_DT_F16:
    case PS_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            out[i] = e->dtype == PS_DT_F16 ? ps_f16_to_f32(h) : ps_bf16_to_f32(h);
        }
        return 0;
    default:
        return ps_fail(err, "%s: tensor \"%s\": dtype %s is not supported (F32, F16 or BF16)", f->path, e->name,
                       ps_dtype_name(e->dtype));
    }
}

/* ---- writer ---- */

void ps_st_release(const ps_st_file *f, const ps_st_entry *e) {
    if (!f->map || e->end <= e->begin) return;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) return;
    uintptr_t a = (uintptr_t)(f->data + e->begin), b = (uintptr_t)(f->data + e->end);
    uintptr_t lo = (a + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg, hi = b / (uintptr_t)pg * (uintptr_t)pg;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* a private read-only mapping: pages re-read if touched */
}

int ps_st_save(const char *path, const ps_st_tensor *t, int n, const char *const *mk, const char *const *mv,
               int n_meta, ps_error *err) {
    return ps_st_save_as(path, t, n, mk, mv, n_meta, PS_DT_F32, err);
}

int ps_st_save_as(const char *path, const ps_st_tensor *t, int n, const char *const *mk, const char *const *mv,
                  int n_meta, ps_dtype dtype, ps_error *err) {
    if (dtype != PS_DT_F32 && dtype != PS_DT_BF16 && dtype != PS_DT_F16)
        return ps_fail(err, "%s: cannot write dtype %s (F32, BF16 or F16)", path, ps_dtype_name(dtype));
    uint64_t esz = (uint64_t)ps_dtype_size(dtype);
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    for (int i = 0; i < n_meta; i++) json_object_set_new(meta, mk[i], json_string(mv[i]));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *sh = json_array();
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            json_array_append_new(sh, json_integer(t[i].shape[d]));
            numel *= t[i].shape[d];
        }
        json_object_set_new(e, "dtype", json_string(ps_dtype_name(dtype)));
        json_object_set_new(e, "shape", sh);
        json_t *o = json_array();
        json_array_append_new(o, json_integer((json_int_t)off));
        json_array_append_new(o, json_integer((json_int_t)(off + (uint64_t)numel * esz)));
        json_object_set_new(e, "data_offsets", o);
        if (json_object_set_new(root, t[i].name, e) != 0) {
            json_decref(root);
            return ps_fail(err, "%s: tensor \"%s\": invalid name", path, t[i].name);
        }
        off += (uint64_t)numel * esz;
    }
    if ((int)json_object_size(root) != n + 1) {
        json_decref(root);
        return ps_fail(err, "%s: duplicate tensor names", path);
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return ps_fail(err, "%s: cannot serialise header", path);
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8; /* pad with spaces to 8-byte alignment */
    ps_atomic_file af;
    if (ps_atomic_open(&af, path, err)) {
        free(hdr);
        return -1;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int bad = fwrite(lenb, 1, 8, af.f) != 8 || fwrite(hdr, 1, hl, af.f) != hl;
    for (size_t i = hl; i < padded && !bad; i++) bad = fputc(' ', af.f) == EOF;
    free(hdr);
    enum { CHUNK = 16384 };
    uint8_t buf[CHUNK * 2];
    for (int i = 0; i < n && !bad; i++) {
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        if (dtype == PS_DT_F32) {
            if (numel && fwrite(t[i].data, 4, (size_t)numel, af.f) != (size_t)numel) bad = 1;
            continue;
        }
        for (int64_t j = 0; j < numel && !bad; j += CHUNK) { /* converted a chunk at a time, little-endian */
            int64_t m = numel - j < CHUNK ? numel - j : CHUNK;
            for (int64_t k = 0; k < m; k++) {
                uint16_t h = dtype == PS_DT_BF16 ? ps_f32_to_bf16(t[i].data[j + k]) : ps_f32_to_f16(t[i].data[j + k]);
                buf[2 * k] = (uint8_t)(h & 0xff);
                buf[2 * k + 1] = (uint8_t)(h >> 8);
            }
            if (fwrite(buf, 2, (size_t)m, af.f) != (size_t)m) bad = 1;
        }
    }
    if (bad) {
        int e = errno;
        ps_atomic_abort(&af);
        return ps_fail(err, "%s: write failed: %s", path, strerror(e ? e : EIO));
    }
    return ps_atomic_commit(&af, err);
}

/* ---- the shard index ---- */

const char *ps_st_printable(const char *s, char *buf, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    if (!n) return buf;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (w + 8 >= n) { /* room for "..." and the NUL */
            memcpy(buf + w, "...", 3);
            w += 3;
            break;
        }
        if (*p < 0x20 || *p >= 0x7f || *p == '\\') {
            buf[w++] = '\\';
            buf[w++] = 'x';
            buf[w++] = hex[*p >> 4];
            buf[w++] = hex[*p & 15];
        } else
            buf[w++] = (char)*p;
    }
    buf[w] = '\0';
    return buf;
}

void ps_st_index_free(ps_st_index *ix) {
    if (!ix) return;
    for (int i = 0; i < ix->n; i++) free(ix->names[i]);
    for (int i = 0; i < ix->n_shards; i++) free(ix->shards[i]);
    free(ix->names);
    free(ix->shard);
    free(ix->order);
    free(ix->shards);
    free(ix->path);
    memset(ix, 0, sizeof *ix);
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(((const ps_st_index_key *)a)->name, ((const ps_st_index_key *)b)->name);
}


int ps_st_index_parse(const char *text, size_t len, const char *src, ps_st_index *ix, ps_error *err) {
    memset(ix, 0, sizeof *ix);
    char pa[160], pb[160];
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (!strncmp(je.text, "duplicate object key", 20)) {
            /* name the key: the last string that ends before where the parser stopped */
            size_t end = je.position >= 0 && (size_t)je.position < len ? (size_t)je.position : len, beg;
            while (end > 0 && text[end - 1] != '"') end--;
            beg = end ? end - 1 : 0;
            while (beg > 0 && !(text[beg - 1] == '"' && (beg < 2 || text[beg - 2] != '\\'))) beg--;
            char key[200];
            size_t kl = end > beg + 1 ? end - 1 - beg : 0;
            if (kl >= sizeof key) kl = sizeof key - 1;
            memcpy(key, text + beg, kl);
            key[kl] = '\0';
            return ps_fail(err, "%s: key \"%s\" is listed twice (line %d); a tensor may be listed only once, in one shard",
                           src, ps_st_printable(key, pa, sizeof pa), je.line);
        }
        return ps_fail(err, "%s: not valid JSON (line %d: %s)", src, je.line, ps_st_printable(je.text, pa, sizeof pa));
    }
    int rc = -1;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL, *md;
    if (!json_is_object(root)) {
        ps_fail(err, "%s: a shard index must be a JSON object with \"weight_map\", got %s", src, ps_json_type_name(root));
        goto done;
    }
    if (!wm) {
        ps_fail(err, "%s: missing \"weight_map\" (the tensor -> shard file map)", src);
        goto done;
    }
    if (!json_is_object(wm)) {
        ps_fail(err, "%s: \"weight_map\" must be an object (tensor name -> shard file), got %s", src, ps_json_type_name(wm));
        goto done;
    }
    if ((md = json_object_get(root, "metadata")) && !json_is_object(md)) {
        ps_fail(err, "%s: \"metadata\" must be an object, got %s", src, ps_json_type_name(md));
        goto done;
    }
    size_t nw = json_object_size(wm);
    if (nw > PS_ST_MAX_TENSORS) {
        ps_fail(err, "%s: weight_map lists %zu tensors (limit %d)", src, nw, PS_ST_MAX_TENSORS);
        goto done;
    }
    ix->path = strdup(src);
    ix->names = calloc(nw ? nw : 1, sizeof *ix->names);
    ix->shard = calloc(nw ? nw : 1, sizeof *ix->shard);
    ix->order = calloc(nw ? nw : 1, sizeof *ix->order);
    ix->shards = calloc(nw ? nw : 1, sizeof *ix->shards);
    if (!ix->path || !ix->names || !ix->shard || !ix->order || !ix->shards) {
        ps_fail(err, "%s: out of memory", src);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
            ps_fail(err, "%s: weight_map[\"%s\"] must be a string (a shard file name), got %s", src,
                    ps_st_printable(k, pa, sizeof pa), ps_json_type_name(v));
            goto done;
        }
        const char *sh = json_string_value(v);
        if (!*sh || strchr(sh, '/') || !strcmp(sh, ".") || !strcmp(sh, "..")) {
            ps_fail(err, "%s: weight_map[\"%s\"]: shard \"%s\" must be a file name in the checkpoint directory "
                    "(not empty, no \"/\", not \".\" or \"..\")",
                    src, ps_st_printable(k, pa, sizeof pa), ps_st_printable(sh, pb, sizeof pb));
            goto done;
        }
        int s = -1;
        for (int j = ix->n_shards - 1; j >= 0 && s < 0; j--) /* shards come in runs: look from the newest */
            if (!strcmp(ix->shards[j], sh)) s = j;
        if (s < 0) {
            if (!(ix->shards[ix->n_shards] = strdup(sh))) {
                ps_fail(err, "%s: out of memory", src);
                goto done;
            }
            s = ix->n_shards++;
        }
        if (!(ix->names[ix->n] = strdup(k))) {
            ps_fail(err, "%s: out of memory", src);
            goto done;
        }
        ix->shard[ix->n] = s;
        ix->order[ix->n] = (ps_st_index_key){ix->names[ix->n], ix->n};
        ix->n++;
    }
    qsort(ix->order, (size_t)ix->n, sizeof *ix->order, cmp_key);
    rc = 0;
done:
    json_decref(root);
    if (rc) ps_st_index_free(ix);
    return rc;
}

int ps_st_index_load(const char *path, ps_st_index *ix, ps_error *err) {
    memset(ix, 0, sizeof *ix);
    char *text;
    size_t len;
    if (ps_read_file(path, PS_ST_INDEX_MAX_BYTES, &text, &len, err)) return -1;
    int rc = ps_st_index_parse(text, len, path, ix, err);
    free(text);
    return rc;
}

int ps_st_index_find(const ps_st_index *ix, const char *name) {
    int lo = 0, hi = ix->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ix->order[mid].name, name);
        if (!c) return ix->order[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* The parent of an absolute, resolved path (in place); "/" stays "/". */
static void parent_dir(char *p) {
    char *s = strrchr(p, '/');
    if (!s) return;
    if (s == p) p[1] = '\0';
    else *s = '\0';
}

static int inside(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/') return path[0] == '/' && path[1] != '\0';
    return !strncmp(path, dir, n) && path[n] == '/';
}

int ps_st_shard_path(const char *dir, const char *index_path, const char *shard, char *out, size_t n, ps_error *err) {
    char ps[160];
    if (!*shard || strchr(shard, '/') || !strcmp(shard, ".") || !strcmp(shard, ".."))
        return ps_fail(err, "%s: shard \"%s\" must be a file name in the checkpoint directory", index_path,
                       ps_st_printable(shard, ps, sizeof ps));
    if (ps_path_join(out, n, dir, shard, err)) return -1;
    char rdir[PATH_MAX], rfile[PATH_MAX];
    if (!realpath(dir, rdir)) return ps_fail(err, "%s: cannot resolve: %s", dir, strerror(errno));
    if (!realpath(out, rfile)) {
        int e = errno;
        return ps_fail(err, "%s: cannot open: %s (a shard listed in %s)", out, strerror(e), index_path);
    }
    if (inside(rfile, rdir)) return 0;
    /* A Hugging Face hub cache snapshot: ROOT/snapshots/REV/NAME -> ../../blobs/HASH. */
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s", rdir);
    parent_dir(root);
    const char *base = strrchr(root, '/');
    if (base && !strcmp(base + 1, "snapshots")) {
        parent_dir(root);
        char blobs[PATH_MAX + 8];
        snprintf(blobs, sizeof blobs, "%s%sblobs", root, strcmp(root, "/") ? "/" : "");
        if (inside(rfile, blobs)) return 0;
    }
    char pf[160];
    return ps_fail(err, "%s: shard \"%s\" resolves to %s, outside the checkpoint directory %s", index_path,
                   ps_st_printable(shard, ps, sizeof ps), ps_st_printable(rfile, pf, sizeof pf), rdir);
}

/* ---- a checkpoint's weight files (single file or lazily opened shards) ---- */

int ps_st_set_open(ps_st_set *s, const char *dir, ps_error *err) {
    memset(s, 0, sizeof *s);
    char wpath[4096], ipath[4096];
    if ((size_t)snprintf(s->dir, sizeof s->dir, "%s", dir) >= sizeof s->dir ||
        ps_path_join(wpath, sizeof wpath, dir, "model.safetensors", err) ||
        ps_path_join(ipath, sizeof ipath, dir, PS_ST_INDEX_NAME, err))
        return ps_fail(err, "%s: path too long", dir);
    /* As in transformers: model.safetensors first, else the shard index. */
    struct stat st;
    s->sharded = lstat(wpath, &st) != 0 && errno == ENOENT && stat(ipath, &st) == 0;
    snprintf(s->path, sizeof s->path, "%s", s->sharded ? ipath : wpath);
    if (!s->sharded) return ps_st_open(wpath, &s->single, err);
    if (ps_st_index_load(ipath, &s->ix, err)) return -1;
    s->sh = calloc((size_t)(s->ix.n_shards ? s->ix.n_shards : 1), sizeof *s->sh);
    s->opened = calloc((size_t)(s->ix.n_shards ? s->ix.n_shards : 1), 1);
    if (!s->sh || !s->opened) {
        ps_st_set_close(s);
        return ps_fail(err, "%s: out of memory", ipath);
    }
    return 0;
}

void ps_st_set_close(ps_st_set *s) {
    if (!s) return;
    if (s->sharded) {
        for (int i = 0; s->sh && i < s->ix.n_shards; i++)
            if (s->opened[i]) ps_st_close(&s->sh[i]);
        free(s->sh);
        free(s->opened);
        ps_st_index_free(&s->ix);
    } else
        ps_st_close(&s->single);
    memset(s, 0, sizeof *s);
}

int ps_st_set_find(ps_st_set *s, const char *name, const ps_st_file **f, const ps_st_entry **e, ps_error *err) {
    char b1[200], b2[200];
    if (!s->sharded) {
        *f = &s->single;
        *e = ps_st_find(&s->single, name);
        return *e != NULL;
    }
    int k = ps_st_index_find(&s->ix, name);
    if (k < 0) return 0;
    int sh = s->ix.shard[k];
    if (!s->opened[sh]) {
        char spath[4096];
        if (ps_st_shard_path(s->dir, s->path, s->ix.shards[sh], spath, sizeof spath, err) ||
            ps_st_open(spath, &s->sh[sh], err))
            return -1;
        s->opened[sh] = 1;
        for (int j = 0; j < s->sh[sh].n; j++) {
            const char *nm = s->sh[sh].entries[j].name;
            int i = ps_st_index_find(&s->ix, nm);
            if (i < 0)
                return ps_fail(err, "%s: tensor \"%s\" is not listed in the weight_map of %s", spath,
                               ps_st_printable(nm, b1, sizeof b1), s->path);
            if (s->ix.shard[i] != sh)
                return ps_fail(err, "%s: tensor \"%s\" is also stored here, but %s maps it to shard \"%s\" (a tensor in two shards)",
                               spath, ps_st_printable(nm, b1, sizeof b1), s->path,
                               ps_st_printable(s->ix.shards[s->ix.shard[i]], b2, sizeof b2));
        }
    }
    *f = &s->sh[sh];
    *e = ps_st_find(&s->sh[sh], name);
    if (!*e)
        return ps_fail(err, "%s: tensor \"%s\" is missing (%s lists it in this shard)", s->sh[sh].path,
                       ps_st_printable(name, b1, sizeof b1), s->path);
    return 1;
}

int ps_st_set_n_names(const ps_st_set *s) { return s->sharded ? s->ix.n : s->single.n; }

const char *ps_st_set_name(const ps_st_set *s, int i) { return s->sharded ? s->ix.names[i] : s->single.entries[i].name; }

int ps_st_set_n_open(const ps_st_set *s) {
    if (!s->sharded) return 1;
    int n = 0;
    for (int i = 0; i < s->ix.n_shards; i++) n += s->opened[i];
    return n;
}
