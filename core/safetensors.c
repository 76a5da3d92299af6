#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"

static const struct {
    const char *name;
    ps_dtype dt;
    int size;
} DTYPES[] = {
    {"F32", PS_DT_F32, 4},  {"F16", PS_DT_F16, 2},   {"BF16", PS_DT_BF16, 2}, {"F64", PS_DT_F64, 8},
    {"I64", PS_DT_I64, 8},  {"I32", PS_DT_I32, 4},   {"I16", PS_DT_I16, 2},   {"I8", PS_DT_I8, 1},
    {"U8", PS_DT_U8, 1},    {"BOOL", PS_DT_BOOL, 1}, {"U16", PS_DT_U16, 2},   {"U32", PS_DT_U32, 4},
    {"U64", PS_DT_U64, 8},  {"F8_E4M3", PS_DT_F8_E4M3, 1}, {"F8_E5M2", PS_DT_F8_E5M2, 1},
};
#define N_DTYPES (int)(sizeof DTYPES / sizeof DTYPES[0])

const char *ps_dtype_name(ps_dtype d) {
    for (int i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == d) return DTYPES[i].name;
    return "?";
}

static int dtype_size(ps_dtype d) {
    for (int i = 0; i < N_DTYPES; i++)
        if (DTYPES[i].dt == d) return DTYPES[i].size;
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
    free(f->data);
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
    uint64_t nbytes = (uint64_t)dtype_size(e->dtype);
    for (int i = 0; i < e->ndim; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ps_fail(err, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, name, i);
        e->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(nbytes, (uint64_t)e->shape[i], &nbytes))
            return ps_fail(err, "%s: tensor \"%s\": shape size overflows", path, name);
    }
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
            if (!json_is_object(v)) {
                ps_fail(err, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            size_t nm = json_object_size(v);
            f->meta_keys = calloc(nm ? nm : 1, sizeof(char *));
            f->meta_vals = calloc(nm ? nm : 1, sizeof(char *));
            if (!f->meta_keys || !f->meta_vals) {
                ps_fail(err, "%s: out of memory", path);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    ps_fail(err, "%s: __metadata__ value of \"%s\" is not a string", path, mk);
                    goto fail;
                }
                f->meta_keys[f->n_meta] = strdup(mk);
                f->meta_vals[f->n_meta] = strdup(json_string_value(mv));
                f->n_meta++;
            }
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
    /* The tensors must tile the data section exactly: no holes, no overlaps, no trailing bytes. */
    {
        ps_st_entry **order = malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
        if (!order) {
            ps_fail(err, "%s: out of memory", path);
            goto fail;
        }
        for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
        qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
        uint64_t pos = 0;
        for (int i = 0; i < f->n; i++) {
            if (order[i]->begin != pos) {
                ps_fail(err, "%s: tensor \"%s\": data_offsets begin %llu %s (expected %llu)", path, order[i]->name,
                        (unsigned long long)order[i]->begin,
                        order[i]->begin < pos ? "overlaps the previous tensor" : "leaves a hole", (unsigned long long)pos);
                free(order);
                goto fail;
            }
            pos = order[i]->end;
        }
        free(order);
        if (pos != f->data_len) {
            ps_fail(err, "%s: %llu trailing bytes after the last tensor", path, (unsigned long long)(f->data_len - pos));
            goto fail;
        }
    }
    f->data = malloc(f->data_len ? f->data_len : 1);
    if (!f->data) {
        ps_fail(err, "%s: out of memory for %llu bytes of tensor data", path, (unsigned long long)f->data_len);
        goto fail;
    }
    if (f->data_len && pread_all(fd, f->data, f->data_len, 8 + hlen)) {
        ps_fail(err, "%s: cannot read the tensor data", path);
        goto fail;
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

int ps_st_save(const char *path, const ps_st_tensor *t, int n, const char *const *mk, const char *const *mv,
               int n_meta, ps_error *err) {
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
        json_object_set_new(e, "dtype", json_string("F32"));
        json_object_set_new(e, "shape", sh);
        json_t *o = json_array();
        json_array_append_new(o, json_integer((json_int_t)off));
        json_array_append_new(o, json_integer((json_int_t)(off + (uint64_t)numel * 4)));
        json_object_set_new(e, "data_offsets", o);
        if (json_object_set_new(root, t[i].name, e) != 0) {
            json_decref(root);
            return ps_fail(err, "%s: tensor \"%s\": invalid name", path, t[i].name);
        }
        off += (uint64_t)numel * 4;
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
    for (int i = 0; i < n && !bad; i++) {
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        if (numel && fwrite(t[i].data, 4, (size_t)numel, af.f) != (size_t)numel) bad = 1;
    }
    if (bad) {
        int e = errno;
        ps_atomic_abort(&af);
        return ps_fail(err, "%s: write failed: %s", path, strerror(e ? e : EIO));
    }
    return ps_atomic_commit(&af, err);
}
