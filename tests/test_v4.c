/* test_v4.c — DeepSeek-V4 checkpoints (SPEC-v4.md): the conformance vectors (tests/conformance/v4/,
 * copied from the project's shared folder: mix4 with sliding / CSA / HCA layers and both config forms,
 * hub3 with the hub's keys only) through every hook they hold; both tensor-name schemes and a sharded
 * index give the same logits; FP8 e4m3 / FP4 e2m1 weights with e8m0 scales dequantise to what a plain
 * decoder written here from the format definitions gives; hooks overwrite; hostile checkpoints and
 * configs fail with one-line errors naming the file and the tensor or key. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "core/hooks.h"
#include "core/safetensors.h"
#include "testutil.h"
#include "core/tokens.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

static int verbose = 0;

/* ---- conformance ---- */

typedef struct {
    char name[128];
    double worst;
    int integer;
} result;

static result results[256];
static int n_results;

static void record(const char *name, double r, int integer) {
    for (int i = 0; i < n_results; i++)
        if (!strcmp(results[i].name, name)) {
            if (r > results[i].worst || isnan(r)) results[i].worst = r;
            return;
        }
    if (n_results < 256) {
        snprintf(results[n_results].name, sizeof results[0].name, "%s", name);
        results[n_results].worst = r;
        results[n_results++].integer = integer;
    }
}

/* Selections as sets per row (topk), or exact (experts). Returns mismatching rows. */
static int64_t compare_sets(const float *got, const float *want, int64_t rows, int64_t k, int as_set) {
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        int ok = 1;
        for (int64_t j = 0; j < k && ok; j++) {
            if (!as_set) {
                ok = got[r * k + j] == want[r * k + j];
                continue;
            }
            int found = 0;
            for (int64_t i = 0; i < k; i++) found |= got[r * k + i] == want[r * k + j];
            ok = found;
        }
        bad += !ok;
    }
    return bad;
}

static void run_conformance(const char *model) {
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/v4/%s", tu_conformance_dir(), model);
    ps_error err;
    ps_v4_model m;
    REQUIRE_OK(ps_v4_model_load(&m, dir, 0, &err), &err);
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    ps_token_lists toks;
    REQUIRE_OK(ps_tokens_load(path, 0, 0, &toks, &err), &err);
    ps_st_file ref;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    REQUIRE_OK(ps_st_open(path, &ref, &err), &err);
    ps_hooks h;
    ps_cache cache;
    ps_hooks_init(&h);
    ps_cache_init(&cache);
    for (int i = 0; i < ref.n; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s", ref.entries[i].name);
        char *dot = strrchr(nm, '.');
        if (!dot || strcmp(dot, ".0")) continue;
        *dot = '\0';
        if (strcmp(nm, "logits")) CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, nm, &err), &err);
    }
    for (int s = 0; s < toks.n; s++) {
        ps_v4_acts a;
        REQUIRE_OK(ps_v4_acts_create(&a, &m, 1, toks.len[s], &err), &err);
        CHECK_OK(ps_v4_forward(&m, &a, toks.seq[s], &h, -1, &err), &err);
        for (int i = 0; i < ref.n; i++) {
            const ps_st_entry *e = &ref.entries[i];
            char nm[128], want_sfx[16];
            snprintf(nm, sizeof nm, "%s", e->name);
            snprintf(want_sfx, sizeof want_sfx, ".%d", s);
            char *dot = strrchr(nm, '.');
            if (!dot || strcmp(dot, want_sfx)) continue;
            *dot = '\0';
            const float *got;
            int64_t n = ps_st_numel(e), have = 0;
            if (!strcmp(nm, "logits")) {
                got = a.logits;
                have = a.T * m.cfg.vocab_size;
            } else {
                const ps_cache_item *it = ps_cache_get(&cache, nm);
                CHECK(it != NULL, "%s: %s not cached", model, nm);
                if (!it) continue;
                int same = it->ndim == e->ndim + 1 && it->shape[0] == 1;
                for (int d = 0; same && d < e->ndim; d++) same = it->shape[d + 1] == e->shape[d];
                CHECK(same, "%s: %s.%d: cached shape differs from the expected one", model, nm, s);
                if (!same) continue;
                got = it->data;
                have = n;
            }
            CHECK(have == n, "%s: %s.%d: %lld values, expected %lld", model, nm, s, (long long)have, (long long)n);
            if (have != n) continue;
            float *want = malloc((size_t)(n ? n : 1) * sizeof(float));
            CHECK_OK(ps_st_read_f32(&ref, e, want, &err), &err);
            int topk = strstr(nm, "indexer.topk") != NULL, experts = strstr(nm, "ffn.experts") != NULL;
            if (topk || experts) {
                int64_t k = e->ndim ? e->shape[e->ndim - 1] : 1, rows = k ? n / k : 0;
                int64_t bad = compare_sets(got, want, rows, k, topk);
                CHECK(bad == 0, "%s: %s.%d: %lld of %lld rows select other entries", model, nm, s, (long long)bad, (long long)rows);
                record(nm, (double)bad, 1);
            } else {
                double r = rel_err_f(got, want, n);
                CHECK(r < 1e-4, "%s: %s.%d: relative error %.3g", model, nm, s, r);
                record(nm, r, 0);
            }
            free(want);
        }
        ps_v4_acts_free(&a);
    }
    ps_cache_free(&cache);
    ps_hooks_free(&h);
    ps_st_close(&ref);
    ps_tokens_free(&toks);
    ps_v4_model_free(&m);
}

static void print_results(const char *model) {
    if (!verbose) return;
    printf("%s: worst over the sequences (relative error; integer hooks: rows that differ)\n", model);
    for (int i = 0; i < n_results; i++)
        printf("  %-40s %s%.3g\n", results[i].name, results[i].integer ? "rows " : "", results[i].worst);
    n_results = 0;
}


/* ---- raw safetensors files written here (any dtype, raw bytes) ---- */

typedef struct {
    char name[200];
    char dtype[12];
    int ndim;
    int64_t shape[4];
    uint8_t *data;
    size_t bytes;
} rawt;

typedef struct {
    int n, cap;
    rawt *t;
} rawlist;

static rawt *raw_add(rawlist *l, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data,
                     size_t bytes) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
    }
    rawt *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = malloc(bytes ? bytes : 1);
    if (data) memcpy(t->data, data, bytes);
    else memset(t->data, 0, bytes);
    t->bytes = bytes;
    return t;
}

static void raw_free(rawlist *l) {
    for (int i = 0; i < l->n; i++) free(l->t[i].data);
    free(l->t);
    memset(l, 0, sizeof *l);
}

static rawt *raw_find(rawlist *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static void raw_drop(rawlist *l, const char *name) {
    rawt *t = raw_find(l, name);
    if (!t) return;
    free(t->data);
    *t = l->t[--l->n];
}

/* Tensors [i0, i1) of l to path, in list order. */
static void raw_write(const char *path, const rawlist *l, int i0, int i1) {
    size_t cap = 1 << 16, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{");
    uint64_t off = 0;
    for (int i = i0; i < i1; i++) {
        const rawt *t = &l->t[i];
        if (cap - len < 512) h = realloc(h, cap *= 2);
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i > i0 ? "," : "", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + t->bytes));
        off += t->bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    FILE *f = fopen(path, "wb");
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)((uint64_t)len >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(h, 1, len, f);
    for (int i = i0; i < i1; i++) fwrite(l->t[i].data, 1, l->t[i].bytes, f);
    fclose(f);
    free(h);
}

static void raw_read(const char *path, rawlist *l) {
    ps_st_file f;
    ps_error err;
    memset(l, 0, sizeof *l);
    if (ps_st_open(path, &f, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    for (int i = 0; i < f.n; i++) {
        const ps_st_entry *e = &f.entries[i];
        raw_add(l, e->name, ps_dtype_name(e->dtype), e->ndim, e->shape, f.data + e->begin, (size_t)(e->end - e->begin));
    }
    ps_st_close(&f);
}

static void copy_file(const char *from, const char *to) {
    char *text;
    size_t len;
    ps_error err;
    if (ps_read_file(from, 1 << 24, &text, &len, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    FILE *f = fopen(to, "wb");
    fwrite(text, 1, len, f);
    fclose(f);
    free(text);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

/* Remove a scratch directory made by make_dir (plain files only). */
static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[4400];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* A fresh checkpoint directory: DIR/config.json from `config_src` (a file) or the text `config_text`. */
static void make_dir(char *dir, size_t n, const char *tag, const char *config_src, const char *config_text) {
    tu_tempdir(dir, n, tag);
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (config_text) write_text(p, config_text);
    else copy_file(config_src, p);
}

static const char *conf(const char *model, const char *file, char *buf, size_t n) {
    snprintf(buf, n, "%s/v4/%s/%s", tu_conformance_dir(), model, file);
    return buf;
}

/* Logits of one sequence of `model_dir` (lazy or not), as a malloc'd copy; NULL on failure. */
static float *logits_of(const char *dir, const int32_t *tok, int64_t T, int lazy, int64_t *V) {
    ps_v4_model m;
    ps_error err;
    if (ps_v4_model_load(&m, dir, lazy, &err)) {
        CHECK(0, "%s", err.msg);
        return NULL;
    }
    ps_v4_acts a;
    float *out = NULL;
    if (ps_v4_acts_create(&a, &m, 1, T, &err) == 0) {
        if (ps_v4_forward(&m, &a, tok, NULL, -1, &err) == 0) {
            *V = m.cfg.vocab_size;
            out = malloc((size_t)(T * *V) * sizeof(float));
            memcpy(out, a.logits, (size_t)(T * *V) * sizeof(float));
        } else
            CHECK(0, "%s", err.msg);
        ps_v4_acts_free(&a);
    } else
        CHECK(0, "%s", err.msg);
    ps_v4_model_free(&m);
    return out;
}

/* ---- both name schemes, shards, lazy layers ---- */

static void test_names_and_shards(void) {
    char p1[4200], p2[4200], hfdir[4096], shdir[4096];
    ps_error err;
    ps_token_lists toks;
    REQUIRE_OK(ps_tokens_load(conf("mix4", "tokens.json", p1, sizeof p1), 0, 0, &toks, &err), &err);
    int64_t V = 0, T = toks.len[1];
    float *ref = logits_of(conf("mix4", "", p1, sizeof p1), toks.seq[1], T, 0, &V);
    /* transformers' names: renamed tensors, experts stacked, tid2eid as I64 */
    ps_v4_model nat;
    REQUIRE_OK(ps_v4_model_open(&nat, conf("mix4", "", p1, sizeof p1), &err), &err);
    rawlist in, out = {0};
    raw_read(conf("mix4", "model.safetensors", p1, sizeof p1), &in);
    const ps_v4_config *c = &nat.cfg;
    for (int t = 0; t < nat.n_tensors; t++) {
        const ps_v4_tensor *x = &nat.table[t];
        char nn[256], hn[256];
        ps_v4_tensor_name(hn, sizeof hn, PS_V4_NAMES_HF, x->kind, x->layer, 0);
        if (x->kind == PS_V4_T_W3) continue; /* stacked with W1 */
        if (x->kind == PS_V4_T_W1 || x->kind == PS_V4_T_W2) {
            int64_t E = c->n_routed_experts, I = c->moe_inter, D = c->hidden_size, per = I * D * 2 /* BF16 */;
            int up = x->kind == PS_V4_T_W1;
            int64_t shape[3] = {E, up ? 2 * I : D, up ? D : I};
            rawt *r = raw_add(&out, hn, "BF16", 3, shape, NULL, (size_t)(E * per * (up ? 2 : 1)));
            for (int64_t e = 0; e < E; e++) {
                ps_v4_tensor_name(nn, sizeof nn, PS_V4_NAMES_NATIVE, x->kind, x->layer, (int)e);
                rawt *w = raw_find(&in, nn);
                memcpy(r->data + e * per * (up ? 2 : 1), w->data, (size_t)per);
                if (up) {
                    ps_v4_tensor_name(nn, sizeof nn, PS_V4_NAMES_NATIVE, PS_V4_T_W3, x->layer, (int)e);
                    memcpy(r->data + e * per * 2 + per, raw_find(&in, nn)->data, (size_t)per);
                }
            }
            continue;
        }
        ps_v4_tensor_name(nn, sizeof nn, PS_V4_NAMES_NATIVE, x->kind, x->layer, 0);
        rawt *w = raw_find(&in, nn);
        CHECK(w != NULL, "mix4 lacks %s", nn);
        if (!w) continue;
        if (x->kind == PS_V4_T_TID2EID) {
            int64_t n = w->bytes / 4;
            rawt *r = raw_add(&out, hn, "I64", w->ndim, w->shape, NULL, (size_t)n * 8);
            for (int64_t i = 0; i < n; i++) {
                int32_t v;
                memcpy(&v, w->data + 4 * i, 4);
                int64_t v64 = v;
                memcpy(r->data + 8 * i, &v64, 8);
            }
        } else
            raw_add(&out, hn, w->dtype, w->ndim, w->shape, w->data, w->bytes);
    }
    make_dir(hfdir, sizeof hfdir, "v4hf", conf("mix4", "config.json", p1, sizeof p1), NULL);
    snprintf(p2, sizeof p2, "%s/model.safetensors", hfdir);
    raw_write(p2, &out, 0, out.n);
    float *hf = logits_of(hfdir, toks.seq[1], T, 0, &V);
    CHECK(ref && hf && !memcmp(ref, hf, (size_t)(T * V) * sizeof(float)), "transformers' names give the same logits");
    ps_v4_model hm;
    if (ps_v4_model_open(&hm, hfdir, &err) == 0) {
        CHECK(hm.names == PS_V4_NAMES_HF, "HF scheme detected");
        ps_v4_model_free(&hm);
    }
    /* the same in three shards with an index; lazy layers */
    make_dir(shdir, sizeof shdir, "v4shard", conf("mix4", "config.json", p1, sizeof p1), NULL);
    int cut[4] = {0, out.n / 3, 2 * out.n / 3, out.n};
    size_t cap = 1 << 16, len = 0;
    char *ix = malloc(cap);
    len += (size_t)snprintf(ix, cap, "{\"metadata\": {}, \"weight_map\": {");
    for (int s = 0; s < 3; s++) {
        char sn[64];
        snprintf(sn, sizeof sn, "model-%05d-of-00003.safetensors", s + 1);
        snprintf(p2, sizeof p2, "%s/%s", shdir, sn);
        raw_write(p2, &out, cut[s], cut[s + 1]);
        for (int i = cut[s]; i < cut[s + 1]; i++) {
            if (cap - len < 512) ix = realloc(ix, cap *= 2);
            len += (size_t)snprintf(ix + len, cap - len, "%s\"%s\": \"%s\"", i ? ", " : "", out.t[i].name, sn);
        }
    }
    snprintf(ix + len, cap - len, "}}");
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", shdir);
    write_text(p2, ix);
    free(ix);
    float *sh = logits_of(shdir, toks.seq[1], T, 1, &V);
    CHECK(ref && sh && !memcmp(ref, sh, (size_t)(T * V) * sizeof(float)), "sharded, lazily loaded: the same logits");
    /* a shard holding a tensor the index maps elsewhere: the shard is named */
    snprintf(p1, sizeof p1, "%s/model-00002-of-00003.safetensors", shdir);
    snprintf(p2, sizeof p2, "%s/model-00001-of-00003.safetensors", shdir);
    raw_write(p1, &out, cut[0], cut[2]);
    ps_v4_model bad;
    CHECK_ERR(ps_v4_model_load(&bad, shdir, 0, &err), &err, "model-00002-of-00003.safetensors", "a tensor in two shards");
    free(ref), free(hf), free(sh);
    rm_dir(hfdir), rm_dir(shdir);
    raw_free(&in), raw_free(&out);
    ps_v4_model_free(&nat);
    ps_tokens_free(&toks);
}

/* ---- FP8 / FP4 dequantisation, against a decoder written here from the format definitions ---- */

/* e4m3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0: subnormal m/8 * 2^-6. */
static double dec_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    double v = e ? pow(2.0, e - 7) * (1 + m / 8.0) : pow(2.0, -6) * (m / 8.0);
    return s ? -v : v;
}
/* e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0: subnormal m * 0.5. */
static double dec_e2m1(uint8_t nib) {
    int s = (nib >> 3) & 1, e = (nib >> 1) & 3, m = nib & 1;
    double v = e ? pow(2.0, e - 1) * (1 + m / 2.0) : 0.5 * m;
    return s ? -v : v;
}
/* e8m0: 2^(bits - 127). */
static double dec_e8m0(uint8_t b) { return pow(2.0, (int)b - 127); }

static uint8_t rand_byte(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint8_t)(*s >> 56);
}

typedef struct {
    const char *name;  /* native tensor */
    int fmt;           /* 8: FP8 (F8_E4M3), 4: FP4 (F4), 5: FP4 packed in U8 */
    int64_t br, bc;    /* the writer's block */
    const char *scale_dtype;
} qspec;

static void test_quantised(void) {
    char p1[4200], p2[4200], dir[4096];
    ps_error err;
    rawlist l;
    raw_read(conf("mix4", "model.safetensors", p1, sizeof p1), &l);
    const qspec qs[] = {
        {"layers.0.attn.wq_a.weight", 8, 16, 16, "F8_E8M0"},          /* [32, 64]: 2 x 4 blocks */
        {"layers.0.attn.wq_b.weight", 8, 128, 128, "F8_E8M0"},        /* [128, 32]: one 128-block */
        {"layers.1.attn.wkv.weight", 8, 16, 22, "U8"},                /* [32, 64]: partial last column block */
        {"layers.1.ffn.shared_experts.w2.weight", 8, 128, 128, "F8_E8M0"},
        {"layers.2.ffn.experts.3.w1.weight", 4, 1, 32, "F8_E8M0"},    /* [16, 64] FP4 (F4) */
        {"layers.2.ffn.experts.3.w2.weight", 4, 1, 32, "F8_E8M0"},    /* [64, 16]: a partial 32-block */
        {"layers.3.ffn.experts.0.w3.weight", 5, 1, 32, "F8_E8M0"},    /* [16, 64] FP4 packed in U8 */
    };
    int nq = (int)(sizeof qs / sizeof qs[0]);
    double *want[8];
    uint64_t seed = 12345;
    for (int i = 0; i < nq; i++) {
        rawt *w = raw_find(&l, qs[i].name);
        int64_t R = w->shape[0], C = w->shape[1], SR = (R + qs[i].br - 1) / qs[i].br, SC = (C + qs[i].bc - 1) / qs[i].bc;
        uint8_t *q = malloc((size_t)(R * C)), *sc = malloc((size_t)(SR * SC));
        for (int64_t j = 0; j < SR * SC; j++) sc[j] = (uint8_t)(120 + rand_byte(&seed) % 10); /* 2^-7 .. 2^2 */
        want[i] = malloc((size_t)(R * C) * sizeof(double));
        for (int64_t r = 0; r < R; r++)
            for (int64_t cc = 0; cc < C; cc++) {
                uint8_t b = rand_byte(&seed);
                if (qs[i].fmt == 8 && (b & 0x7f) == 0x7f) b ^= 1; /* not the NaN code */
                if (qs[i].fmt != 8) b &= 0xf;
                q[r * C + cc] = b;
                double v = qs[i].fmt == 8 ? dec_e4m3(b) : dec_e2m1(b);
                want[i][r * C + cc] = v * dec_e8m0(sc[(r / qs[i].br) * SC + cc / qs[i].bc]);
            }
        char name[200], sname[200];
        snprintf(name, sizeof name, "%s", qs[i].name);
        snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(name) - 7), name);
        raw_drop(&l, name);
        int64_t shp[2] = {R, C}, sshp[2] = {SR, SC};
        if (qs[i].fmt == 8) raw_add(&l, name, "F8_E4M3", 2, shp, q, (size_t)(R * C));
        else {
            uint8_t *pk = calloc((size_t)(R * C / 2), 1); /* element 2k in the low nibble */
            for (int64_t k = 0; k < R * C; k++) pk[k / 2] |= (uint8_t)(q[k] << (4 * (k % 2)));
            int64_t half[2] = {R, C / 2};
            raw_add(&l, name, qs[i].fmt == 4 ? "F4" : "U8", 2, qs[i].fmt == 4 ? shp : half, pk, (size_t)(R * C / 2));
            free(pk);
        }
        raw_add(&l, sname, qs[i].scale_dtype, 2, sshp, sc, (size_t)(SR * SC));
        free(q), free(sc);
    }
    make_dir(dir, sizeof dir, "v4quant", conf("mix4", "config.json", p1, sizeof p1), NULL);
    snprintf(p2, sizeof p2, "%s/model.safetensors", dir);
    raw_write(p2, &l, 0, l.n);
    ps_v4_model m;
    if (ps_v4_model_load(&m, dir, 0, &err)) {
        CHECK(0, "%s", err.msg);
    } else {
        CHECK(m.storage.n_tensors[1] == 4 && m.storage.n_tensors[2] == 3 && m.storage.n_tensors[4] == 7,
              "storage counts: FP8 %lld, FP4 %lld, scales %lld", (long long)m.storage.n_tensors[1],
              (long long)m.storage.n_tensors[2], (long long)m.storage.n_tensors[4]);
        for (int i = 0; i < nq; i++) {
            int layer = qs[i].name[7] - '0';
            ps_v4_layer w;
            if (ps_v4_layer_acquire(&m, layer, &w, &err)) {
                CHECK(0, "%s", err.msg);
                continue;
            }
            const float *got = NULL;
            int64_t n = 0;
            const char *s = qs[i].name + 9;
            if (!strcmp(s, "attn.wq_a.weight")) got = w.wq_a, n = 32 * 64;
            else if (!strcmp(s, "attn.wq_b.weight")) got = w.wq_b, n = 128 * 32;
            else if (!strcmp(s, "attn.wkv.weight")) got = w.wkv, n = 32 * 64;
            else if (!strcmp(s, "ffn.shared_experts.w2.weight")) got = w.sw2, n = 64 * 16;
            else if (!strcmp(s, "ffn.experts.3.w1.weight")) got = w.w1 + 3 * 16 * 64, n = 16 * 64;
            else if (!strcmp(s, "ffn.experts.3.w2.weight")) got = w.w2 + 3 * 64 * 16, n = 64 * 16;
            else if (!strcmp(s, "ffn.experts.0.w3.weight")) got = w.w3, n = 16 * 64;
            int64_t bad = 0;
            for (int64_t j = 0; got && j < n; j++) bad += (double)got[j] != want[i][j];
            CHECK(got && bad == 0, "%s: %lld of %lld dequantised values differ from the plain decoder", qs[i].name,
                  (long long)bad, (long long)n);
            ps_v4_layer_release(&m, layer);
        }
        ps_v4_acts a;
        if (ps_v4_acts_create(&a, &m, 1, 20, &err) == 0) {
            int32_t tok[20];
            for (int i = 0; i < 20; i++) tok[i] = (i * 37) % 256;
            CHECK_OK(ps_v4_forward(&m, &a, tok, NULL, -1, &err), &err);
            int finite = 1;
            for (int64_t i = 0; i < 20 * 256; i++) finite &= isfinite(a.logits[i]);
            CHECK(finite, "quantised model: finite logits");
            ps_v4_acts_free(&a);
        }
        ps_v4_model_free(&m);
    }
    for (int i = 0; i < nq; i++) free(want[i]);
    rm_dir(dir);
    /* the decoders agree with the formats' tables on every code */
    int ok = 1;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) ok &= isnan(ps_v4_fp8_e4m3_to_f32((uint8_t)b));
        else ok &= (double)ps_v4_fp8_e4m3_to_f32((uint8_t)b) == dec_e4m3((uint8_t)b);
        if (b < 16) ok &= (double)ps_v4_fp4_e2m1_to_f32((uint8_t)b) == dec_e2m1((uint8_t)b);
        if (b < 255) ok &= (double)ps_v4_e8m0_to_f32((uint8_t)b) == dec_e8m0((uint8_t)b);
    }
    CHECK(ok && isnan(ps_v4_e8m0_to_f32(255)) && ps_v4_fp8_e4m3_to_f32(0x7e) == 448.0f, "element decoders on every code");
    raw_free(&l);
}

/* ---- hostile checkpoints ---- */

typedef void (*mutate_fn)(rawlist *l);

/* The tensor must be there (the mutations below edit hub3's). */
static rawt *need(rawlist *l, const char *name) {
    rawt *t = raw_find(l, name);
    if (!t) {
        fprintf(stderr, "hub3 has no %s\n", name);
        abort();
    }
    return t;
}


static void mut_missing(rawlist *l) { raw_drop(l, "layers.1.attn.wkv.weight"); }
static void mut_extra(rawlist *l) {
    int64_t s[1] = {4};
    raw_add(l, "layers.0.attn.bogus", "F32", 1, s, NULL, 16);
}
static void mut_sliding_comp(rawlist *l) {
    int64_t s[2] = {4, 32};
    raw_add(l, "layers.0.attn.compressor.ape", "F32", 2, s, NULL, 512);
}
static void mut_shape(rawlist *l) {
    rawt *t = need(l, "layers.2.attn.wq_a.weight");
    t->shape[0] = 23;
    t->bytes = (size_t)(23 * 48 * 2);
}
static void mut_fp8_noscale(rawlist *l) {
    rawt *t = need(l, "layers.1.attn.wkv.weight");
    memcpy(t->dtype, "F8_E4M3", 8);
    t->bytes /= 2;
}
static void mut_bad_scale(rawlist *l) {
    rawt *t = need(l, "layers.1.attn.wkv.weight");
    memcpy(t->dtype, "F8_E4M3", 8);
    t->bytes /= 2;
    int64_t s[2] = {40, 1}; /* more block rows than the weight has rows */
    raw_add(l, "layers.1.attn.wkv.scale", "F8_E8M0", 2, s, NULL, 40);
}
static void mut_f64(rawlist *l) {
    rawt *t = need(l, "norm.weight");
    memcpy(t->dtype, "F64", 4);
    t->data = realloc(t->data, t->bytes * 4);
    t->bytes *= 4;
}
static void mut_nan(rawlist *l) {
    rawt *t = need(l, "layers.1.attn.q_norm.weight");
    t->data[6] = 0xc0, t->data[7] = 0x7f; /* BF16 NaN at index 3 */
}
static void mut_tid(rawlist *l) {
    rawt *t = need(l, "layers.0.ffn.gate.tid2eid");
    int32_t v = 9;
    memcpy(t->data + 4 * 5, &v, 4);
}
static void mut_nan_scale(rawlist *l) {
    rawt *t = need(l, "layers.1.attn.wkv.weight");
    memcpy(t->dtype, "F8_E4M3", 8);
    t->bytes /= 2;
    memset(t->data, 0x38, t->bytes); /* 1.0 */
    int64_t s[2] = {1, 1};
    uint8_t nan = 0xff;
    raw_add(l, "layers.1.attn.wkv.scale", "F8_E8M0", 2, s, &nan, 1);
}
static void mut_neither(rawlist *l) { memcpy(need(l, "embed.weight")->name, "tok_embeddings.weight", 22); }
static void mut_mtp(rawlist *l) {
    int64_t s[1] = {4};
    raw_add(l, "mtp.0.norm.weight", "F32", 1, s, NULL, 16);
}

static void test_hostile(void) {
    char p1[4200], p2[4200], dir[4096];
    ps_error err;
    struct {
        mutate_fn fn;
        const char *want[3];
    } cases[] = {
        {mut_missing, {"model.safetensors: tensor \"layers.1.attn.wkv.weight\" is missing", "config.json needs it"}},
        {mut_extra, {"unexpected tensor \"layers.0.attn.bogus\""}},
        {mut_sliding_comp, {"unexpected tensor \"layers.0.attn.compressor.ape\"", "layer 0 is sliding_attention"}},
        {mut_shape, {"tensor \"layers.2.attn.wq_a.weight\" has shape [23, 48] but the config needs [24, 48]"}},
        {mut_fp8_noscale, {"tensor \"layers.1.attn.wkv.weight\" is FP8 but has no scale tensor"}},
        {mut_bad_scale, {"scale tensor \"layers.1.attn.wkv.scale\" has shape [40, 1], which is no block grid"}},
        {mut_f64, {"tensor \"norm.weight\" has dtype F64, which is not supported"}},
        {mut_nan, {"tensor \"layers.1.attn.q_norm.weight\" holds a non-finite value (nan at flat index 3)"}},
        {mut_tid, {"tensor \"layers.0.ffn.gate.tid2eid\" holds 9 at flat index 5, outside [0, 6)"}},
        {mut_nan_scale, {"tensor \"layers.1.attn.wkv.weight\" holds a non-finite value", "scale \"layers.1.attn.wkv.scale\""}},
        {mut_neither, {"holds neither \"embed.weight\"", "\"model.embed_tokens.weight\""}},
        {mut_mtp, {NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rawlist l;
        raw_read(conf("hub3", "model.safetensors", p1, sizeof p1), &l);
        cases[i].fn(&l);
        make_dir(dir, sizeof dir, "v4bad", conf("hub3", "config.json", p1, sizeof p1), NULL);
        snprintf(p2, sizeof p2, "%s/model.safetensors", dir);
        raw_write(p2, &l, 0, l.n);
        raw_free(&l);
        ps_v4_model m;
        err.msg[0] = '\0';
        int rc = ps_v4_model_load(&m, dir, 0, &err);
        char keep[4096];
        snprintf(keep, sizeof keep, "%s", dir);
        rm_dir(keep);
        if (!cases[i].want[0]) {
            CHECK(rc == 0, "case %zu: %s", i, err.msg); /* mtp.* is ignored */
            if (!rc) ps_v4_model_free(&m);
            continue;
        }
        int ok = rc != 0 && strchr(err.msg, '\n') == NULL && strstr(err.msg, dir) != NULL;
        for (int k = 0; k < 3 && cases[i].want[k]; k++) ok &= strstr(err.msg, cases[i].want[k]) != NULL;
        CHECK(ok, "case %zu: one-line error naming the file and tensor, got \"%s\"", i, err.msg);
    }
}

/* ---- configs ---- */

static char *read_text(const char *path) {
    char *t;
    size_t n;
    ps_error err;
    return ps_read_file(path, 1 << 20, &t, &n, &err) ? NULL : t;
}

/* hub3's config text with `from` replaced by `to` (first occurrence). */
static char *edit(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    CHECK(at != NULL, "config edit: \"%s\" not found", from);
    if (!at) return strdup(text);
    size_t a = (size_t)(at - text), n = strlen(text) - strlen(from) + strlen(to);
    char *o = malloc(n + 1);
    memcpy(o, text, a);
    strcpy(o + a, to);
    strcat(o, at + strlen(from));
    return o;
}

static void test_configs(void) {
    char p1[4200];
    ps_error err;
    ps_v4_config c;
    char *hub = read_text(conf("hub3", "config.json", p1, sizeof p1)), *mix = read_text(conf("mix4", "config.json", p1, sizeof p1));
    REQUIRE_OK(hub && mix ? 0 : -1, &err);
    CHECK(ps_v4_config_detect(hub, strlen(hub)) && ps_v4_config_detect(mix, strlen(mix)), "V4 configs detected");
    char *q3 = read_text(PS_SOURCE_DIR "/tests/conformance/qwen3_published/config.json");
    CHECK(q3 && !ps_v4_config_detect(q3, strlen(q3)), "a Qwen3 config is not V4");
    free(q3);
    /* the hub form: compress_ratios, num_hash_layers, qk_rope_head_dim, flat rope_scaling */
    REQUIRE_OK(ps_v4_config_parse(hub, strlen(hub), "hub3/config.json", &c, &err), &err);
    CHECK(c.attn_type[0] == PS_V4_SLIDING && c.attn_type[1] == PS_V4_CSA && c.attn_type[2] == PS_V4_CSA &&
              c.compress_rate[1] == 4 && c.mlp_type[0] == PS_V4_HASH_MOE && c.mlp_type[1] == PS_V4_MOE && c.rope_dim == 16 &&
              c.rope_compress.yarn && c.rope_compress.attention_factor == 1.0 && c.rope_compress.theta == 160000 &&
              !c.rope_main.yarn && c.config_form == 2,
          "hub form parsed");
    /* both forms: the HF keys win */
    char *m2 = edit(mix, "\"compress_ratios\": [\n    0,\n    4,\n    8,\n    4\n  ]", "\"compress_ratios\": [0, 4, 4, 4, 0]");
    REQUIRE_OK(ps_v4_config_parse(m2, strlen(m2), "mix4/config.json", &c, &err), &err);
    CHECK(c.attn_type[2] == PS_V4_HCA && c.compress_rate[2] == 8 && c.mlp_type[1] == PS_V4_HASH_MOE && c.config_form == 3,
          "layer_types and compress_rates win over compress_ratios");
    free(m2);
    /* hub ratios: 128 and any other positive rate are HCA; MTP entries past the layers are ignored */
    m2 = edit(hub, "\"compress_ratios\": [\n    0,\n    4,\n    4\n  ]", "\"compress_ratios\": [0, 128, 8, 4]");
    REQUIRE_OK(ps_v4_config_parse(m2, strlen(m2), "c.json", &c, &err), &err);
    CHECK(c.attn_type[1] == PS_V4_HCA && c.compress_rate[1] == 128 && c.attn_type[2] == PS_V4_HCA && c.compress_rate[2] == 8,
          "hub ratios 128 and 8 are HCA");
    free(m2);
    /* nested rope_parameters: YaRN's mscale when attention_factor is absent; "type" accepted */
    m2 = edit(hub, "\"rope_scaling\"", "\"rope_parameters\": {\"main\": {\"rope_type\": \"default\", \"rope_theta\": 5000}, "
                                      "\"compress\": {\"type\": \"yarn\", \"rope_theta\": 40000, \"factor\": 4, "
                                      "\"original_max_position_embeddings\": 1024}}, \"old_rope_scaling\"");
    REQUIRE_OK(ps_v4_config_parse(m2, strlen(m2), "c.json", &c, &err), &err);
    CHECK(c.rope_main.theta == 5000 && c.rope_compress.theta == 40000 && c.rope_compress.yarn &&
              fabs(c.rope_compress.attention_factor - (0.1 * log(4.0) + 1)) < 1e-12 && c.rope_compress.original_max == 1024,
          "nested rope parameters (attention factor %g)", c.rope_compress.attention_factor);
    free(m2);
    struct {
        const char *from, *to, *want;
    } bad[] = {
        {"\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4", "key \"compress_ratios\" has 3 entries but num_hidden_layers is 4"},
        {"\"compress_ratios\": [\n    0,", "\"layer_types\": [\"sliding_attention\", \"dense\", \"sliding_attention\"], \"x\": [0,",
         "key \"layer_types[1]\" is \"dense\""},
        {"\"type\": \"yarn\"", "\"type\": \"linear\"", "key \"rope_scaling.type\" is \"linear\""},
        {"\"beta_fast\": 32", "\"beta_fats\": 32", "unknown key \"rope_scaling.beta_fats\""},
        {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2", "key \"num_key_value_heads\" is 2"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "key \"hidden_act\" must be \"silu\""},
        {"\"o_groups\": 4", "\"o_groups\": 3", "\"num_attention_heads\" (4) must be a multiple of \"o_groups\" (3)"},
        {"\"qk_rope_head_dim\": 16", "\"qk_rope_head_dim\": 15", "key \"qk_rope_head_dim\" (15) must be even"},
        {"\"hidden_size\": 48", "\"hidden_size\": \"48\"", "key \"hidden_size\" must be an integer, got a string"},
        {"\"vocab_size\": 256,", "", "missing required key \"vocab_size\""},
        {"\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"softmax\"", "key \"scoring_func\" must be"},
        {"\"index_head_dim\": 16", "\"index_head_dim\": 8", "exceeds \"index_head_dim\" (8)"},
        {"\"rope_scaling\"", "\"rope_parameters\": {\"main\": {}}, \"x\"", "has \"main\" but not \"compress\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *t = edit(hub, bad[i].from, bad[i].to);
        CHECK_ERR(ps_v4_config_parse(t, strlen(t), "dir/config.json", &c, &err), &err, "dir/config.json: ", bad[i].want);
        free(t);
    }
    free(hub), free(mix);
}

/* ---- variants the conformance models do not cover: tied head, no shared expert, sigmoid scoring ---- */

static void test_variants(void) {
    char p1[4200], p2[4200], dir[4096];
    ps_error err;
    char *hub = read_text(conf("hub3", "config.json", p1, sizeof p1));
    REQUIRE_OK(hub ? 0 : -1, &err);
    char *t1 = edit(hub, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    char *t2 = edit(t1, "\"n_shared_experts\": 1", "\"n_shared_experts\": 0");
    char *t3 = edit(t2, "\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"sigmoid\"");
    rawlist l;
    raw_read(conf("hub3", "model.safetensors", p1, sizeof p1), &l);
    raw_drop(&l, "head.weight");
    for (int i = 0; i < 3; i++)
        for (int w = 1; w <= 3; w++) {
            char nm[96];
            snprintf(nm, sizeof nm, "layers.%d.ffn.shared_experts.w%d.weight", i, w);
            raw_drop(&l, nm);
        }
    make_dir(dir, sizeof dir, "v4var", NULL, t3);
    snprintf(p2, sizeof p2, "%s/model.safetensors", dir);
    raw_write(p2, &l, 0, l.n);
    ps_v4_model m;
    if (ps_v4_model_load(&m, dir, 0, &err) == 0) {
        CHECK(ps_v4_global(&m, PS_V4_T_HEAD) == ps_v4_global(&m, PS_V4_T_EMBED), "tied: the head is the embedding");
        ps_hooks h;
        ps_cache cache;
        ps_hooks_init(&h);
        ps_cache_init(&cache);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.1.ffn.shared", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.1.ffn.weights", &err), &err);
        ps_v4_acts a;
        int32_t tok[10] = {1, 5, 9, 200, 7, 7, 3, 0, 255, 42};
        if (ps_v4_acts_create(&a, &m, 1, 10, &err) == 0) {
            CHECK_OK(ps_v4_forward(&m, &a, tok, &h, -1, &err), &err);
            const ps_cache_item *sh = ps_cache_get(&cache, "layers.1.ffn.shared"), *w = ps_cache_get(&cache, "layers.1.ffn.weights");
            int zero = sh && sh->data != NULL, finite = 1;
            for (int64_t i = 0; zero && i < 10 * 48; i++) zero &= sh->data[i] == 0.0f;
            for (int64_t i = 0; i < 10 * 256; i++) finite &= isfinite(a.logits[i]);
            double worst = 0;
            for (int64_t t = 0; w && w->data && t < 10; t++) worst = fmax(worst, fabs(w->data[t * 3] + w->data[t * 3 + 1] + w->data[t * 3 + 2] - 1.5));
            CHECK(zero && finite && w && worst < 1e-5, "no shared expert: its output is 0; sigmoid scores renormalised (%g)", worst);
            ps_v4_acts_free(&a);
        } else
            CHECK(0, "%s", err.msg);
        ps_cache_free(&cache);
        ps_hooks_free(&h);
        ps_v4_model_free(&m);
    } else
        CHECK(0, "%s", err.msg);
    rm_dir(dir);
    raw_free(&l);
    free(hub), free(t1), free(t2), free(t3);
}

/* ---- hooks: overwrite, materialised attention, batches, stopping early ---- */

typedef struct {
    int calls;
} ident;

static int hook_identity(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    int64_t n = 1;
    for (int i = 0; i < ev->ndim; i++) n *= ev->shape[i];
    float *tmp = malloc((size_t)(n ? n : 1) * sizeof(float));
    memcpy(tmp, ev->data, (size_t)n * sizeof(float));
    memcpy(ev->data, tmp, (size_t)n * sizeof(float));
    free(tmp);
    ((ident *)user)->calls++;
    return 0;
}

static int hook_topk_empty(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)user, (void)err;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2];
    for (int64_t i = 0; i < n; i++) ev->data[i] = -1.0f;
    return 0;
}

static int hook_topk_bad(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)user, (void)err;
    ev->data[5] = 99.0f;
    return 0;
}

static int hook_experts_fixed(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)user, (void)err;
    int64_t rows = ev->shape[0] * ev->shape[1], k = ev->shape[2];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++) ev->data[r * k + j] = (float)(j + 5);
    return 0;
}

static int hook_sink_zero(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    float *old = user;
    int64_t n = ev->shape[0] * ev->shape[1] * ev->shape[2];
    memcpy(old, ev->data, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) ev->data[i] = 0.0f;
    return 0;
}

/* head 2 of a [B, T, H, Dh] activation set to src[t, 2, :] at every position (what a set action does) */
static int hook_set_head2(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    const float *src = user;
    int64_t B = ev->shape[0], T = ev->shape[1], H = ev->shape[2], Dh = ev->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) memcpy(ev->data + ((b * T + t) * H + 2) * Dh, src + (t * H + 2) * Dh, (size_t)Dh * sizeof(float));
    return 0;
}

static void run(ps_v4_model *m, const int32_t *tok, int64_t B, int64_t T, const ps_hooks *h, int n_run, float **logits);

/* The backend-side actions on V4 points (the one hook path): each equals the same edit in a host
 * callback, bit for bit; a sum action adds what a cache holds. */
static void test_v4_actions(ps_v4_model *m, const int32_t *tok, int64_t T, const float *ref) {
    ps_error err;
    int64_t V = m->cfg.vocab_size, H = m->cfg.n_heads, Dh = m->cfg.head_dim;
    float *got = NULL, *want = NULL;
    float *vec = ps_buf_alloc(m->ctx, T * H * Dh * (int64_t)sizeof(float), "a source", &err);
    float *hv = malloc((size_t)(T * H * Dh) * sizeof(float));
    for (int64_t i = 0; vec && i < T * H * Dh; i++) hv[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    if (vec) ps_buf_from_host(m->ctx, vec, hv, T * H * Dh * (int64_t)sizeof(float), &err);
    float *old = calloc((size_t)(H * T), sizeof(float));
    struct { const char *name; ps_hook_action act; ps_hook_fn fn; void *user; } cases[] = {
        {"layers.1.attn.q", {.kind = PS_ACT_SET, .head = 2, .src = vec, .src_npos = T}, hook_set_head2, hv},
        {"layers.2.attn.sink", {.kind = PS_ACT_ZERO, .head = -1}, hook_sink_zero, old},
    };
    for (int i = 0; i < 2; i++) {
        ps_hooks h;
        ps_hooks_init(&h);
        CHECK_OK(ps_v4_hooks_add_action(&h, &m->cfg, cases[i].name, &cases[i].act, &err), &err);
        run(m, tok, 1, T, &h, -1, &got);
        ps_hooks_free(&h);
        ps_hooks_init(&h);
        CHECK_OK(ps_v4_hooks_add(&h, &m->cfg, cases[i].name, cases[i].fn, cases[i].user, &err), &err);
        run(m, tok, 1, T, &h, -1, &want);
        ps_hooks_free(&h);
        CHECK(got && want && !memcmp(got, want, (size_t)(T * V) * sizeof(float)) && memcmp(got, ref, (size_t)(T * V) * sizeof(float)),
              "V4 action on %s = the same edit in a callback, and it changes the logits", cases[i].name);
        free(got), free(want);
        got = want = NULL;
    }
    /* sum: the accumulator gets the activation's values, in double; a head on it is refused */
    {
        int64_t n = T * Dh;
        double *acc = ps_buf_alloc(m->ctx, n * (int64_t)sizeof(double), "sums", &err), *host = malloc((size_t)n * sizeof(double));
        ps_hooks h;
        ps_cache c;
        ps_hooks_init(&h);
        ps_cache_init(&c);
        ps_hook_action sum = {.kind = PS_ACT_SUM, .head = -1, .acc = acc, .acc_n = n};
        CHECK_OK(ps_v4_hooks_add_action(&h, &m->cfg, "layers.1.attn.kv", &sum, &err), &err);
        CHECK_OK(ps_v4_cache_watch(&c, &h, &m->cfg, "layers.1.attn.kv", &err), &err);
        run(m, tok, 1, T, &h, -1, &got);
        const ps_cache_item *it = ps_cache_get(&c, "layers.1.attn.kv");
        int ok = it && got && !ps_buf_to_host(m->ctx, host, acc, n * (int64_t)sizeof(double), &err);
        for (int64_t i = 0; ok && i < n; i++) ok = host[i] == (double)it->data[i];
        CHECK(ok, "V4 sum action = the cached activation");
        free(got);
        got = NULL;
        ps_hook_action bad = {.kind = PS_ACT_SET, .head = 5, .src = vec, .src_npos = T};
        CHECK_ERR(ps_v4_hooks_add_action(&h, &m->cfg, "layers.1.attn.q", &bad, &err), &err, "out of range (the point has 4 heads");
        bad.head = 0;
        CHECK_ERR(ps_v4_hooks_add_action(&h, &m->cfg, "layers.1.attn.kv", &bad, &err), &err, "has no head axis");
        ps_hooks_free(&h);
        ps_cache_free(&c);
        ps_buf_free(m->ctx, acc, n * (int64_t)sizeof(double));
        free(host);
    }
    if (vec) ps_buf_free(m->ctx, vec, T * H * Dh * (int64_t)sizeof(float));
    free(hv);
    free(old);
}

static void run(ps_v4_model *m, const int32_t *tok, int64_t B, int64_t T, const ps_hooks *h, int n_run, float **logits) {
    ps_v4_acts a;
    ps_error err;
    *logits = NULL;
    REQUIRE_OK(ps_v4_acts_create(&a, m, B, T, &err), &err);
    int rc = ps_v4_forward(m, &a, tok, h, n_run, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (!rc) {
        *logits = malloc((size_t)(B * T * m->cfg.vocab_size) * sizeof(float));
        memcpy(*logits, a.logits, (size_t)(B * T * m->cfg.vocab_size) * sizeof(float));
    }
    ps_v4_acts_free(&a);
}

static void test_hooks(void) {
    char p1[4200];
    ps_error err;
    ps_v4_model m;
    REQUIRE_OK(ps_v4_model_load(&m, conf("mix4", "", p1, sizeof p1), 0, &err), &err);
    ps_token_lists toks;
    REQUIRE_OK(ps_tokens_load(conf("mix4", "tokens.json", p1, sizeof p1), 0, 0, &toks, &err), &err);
    int64_t T = toks.len[1], V = m.cfg.vocab_size, L = m.cfg.n_layers;
    float *ref, *got;
    run(&m, toks.seq[1], 1, T, NULL, -1, &ref);
    if (!ref) goto out;
    test_v4_actions(&m, toks.seq[1], T, ref);
    /* every point of every layer overwritten with itself: the same bits */
    {
        ps_hooks h;
        ps_hooks_init(&h);
        ident id = {0};
        int n = 0;
        for (int p = 0; p < PS_V4H_NPOINTS; p++)
            for (int l = 0; l < (p >= PS_V4H_N_LAYER_POINTS ? 1 : L); l++) {
                char nm[96];
                ps_v4_hook_name(nm, sizeof nm, l, p);
                int slot;
                ps_v4_hook_point pt;
                if (ps_v4_hook_parse(&m.cfg, nm, &slot, &pt, &err)) continue; /* not on this layer's type */
                if (p == PS_V4H_BIAS || p == PS_V4H_LOGITS || p == PS_V4H_PATTERN || p == PS_V4H_SINK) continue;
                CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, nm, hook_identity, &id, &err), &err);
                n++;
            }
        run(&m, toks.seq[1], 1, T, &h, -1, &got);
        CHECK(got && !memcmp(got, ref, (size_t)(T * V) * sizeof(float)) && id.calls == n,
              "identity overwrites of %d points keep the logits bit for bit (%d calls)", n, id.calls);
        free(got);
        ps_hooks_free(&h);
    }
    /* the materialised attention (bias / logits / pattern / sink hooks on every layer) = the flash path */
    {
        ps_hooks h;
        ps_hooks_init(&h);
        ident id = {0};
        for (int l = 0; l < L; l++) {
            char nm[96];
            ps_v4_hook_name(nm, sizeof nm, l, PS_V4H_PATTERN);
            CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, nm, hook_identity, &id, &err), &err);
            ps_v4_hook_name(nm, sizeof nm, l, l % 2 ? PS_V4H_BIAS : PS_V4H_SINK);
            CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, nm, hook_identity, &id, &err), &err);
        }
        run(&m, toks.seq[1], 1, T, &h, -1, &got);
        double r = got ? rel_err_f(got, ref, T * V) : 1;
        CHECK(r < 1e-6, "materialised attention = flash attention (%g)", r);
        free(got);
        ps_hooks_free(&h);
    }
    /* an empty selection: the CSA layer's compressed columns get no probability */
    {
        ps_hooks h;
        ps_cache cache;
        ps_hooks_init(&h);
        ps_cache_init(&cache);
        CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, "layers.1.attn.indexer.topk", hook_topk_empty, NULL, &err), &err);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.1.attn.pattern", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.1.attn.bias", &err), &err);
        run(&m, toks.seq[1], 1, T, &h, -1, &got);
        const ps_cache_item *pat = ps_cache_get(&cache, "layers.1.attn.pattern"), *bias = ps_cache_get(&cache, "layers.1.attn.bias");
        int ok = pat && bias && pat->shape[3] == T + T / 4;
        double mass = 0;
        for (int64_t r = 0; ok && r < pat->shape[1] * pat->shape[2]; r++)
            for (int64_t cc = T; cc < pat->shape[3]; cc++) mass += pat->data[r * pat->shape[3] + cc];
        for (int64_t i = 0; ok && i < T * bias->shape[2]; i++) ok &= (i % bias->shape[2] < T) || bias->data[i] == -INFINITY;
        CHECK(ok && mass == 0, "topk overwritten with -1: no compressed entry is attended (mass %g)", mass);
        free(got);
        ps_cache_free(&cache);
        ps_hooks_free(&h);
        /* an invalid selection is an error naming the hook */
        ps_hooks_init(&h);
        CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, "layers.3.attn.indexer.topk", hook_topk_bad, NULL, &err), &err);
        ps_v4_acts a;
        if (ps_v4_acts_create(&a, &m, 1, T, &err) == 0) {
            CHECK_ERR(ps_v4_forward(&m, &a, toks.seq[1], &h, -1, &err), &err, "hook \"layers.3.attn.indexer.topk\"",
                      "is 99, not an index in [-1, 9)");
            ps_v4_acts_free(&a);
        }
        ps_hooks_free(&h);
    }
    /* forced experts: the weights follow them */
    {
        ps_hooks h;
        ps_cache cache;
        ps_hooks_init(&h);
        ps_cache_init(&cache);
        CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, "layers.2.ffn.experts", hook_experts_fixed, NULL, &err), &err);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.2.ffn.weights", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&cache, &h, &m.cfg, "layers.2.ffn.router_logits", &err), &err);
        run(&m, toks.seq[1], 1, T, &h, -1, &got);
        const ps_cache_item *w = ps_cache_get(&cache, "layers.2.ffn.weights"), *lg = ps_cache_get(&cache, "layers.2.ffn.router_logits");
        double worst = 0;
        for (int64_t t = 0; w && lg && t < T; t++) {
            double s5 = sqrt(log1p(exp((double)lg->data[t * 8 + 5]))), s6 = sqrt(log1p(exp((double)lg->data[t * 8 + 6])));
            worst = fmax(worst, fabs(w->data[t * 2] - 1.5 * s5 / (s5 + s6)));
            worst = fmax(worst, fabs(w->data[t * 2 + 1] - 1.5 * s6 / (s5 + s6)));
        }
        CHECK(w && lg && worst < 1e-5, "weights of forced experts 5, 6 (%g)", worst);
        free(got);
        ps_cache_free(&cache);
        ps_hooks_free(&h);
    }
    /* the sink mass set to 0: the heads' outputs scale by 1 / (1 - old mass) */
    {
        ps_hooks h, h0;
        ps_cache c1, c0;
        ps_hooks_init(&h), ps_hooks_init(&h0);
        ps_cache_init(&c1), ps_cache_init(&c0);
        float *old = calloc((size_t)(4 * T), sizeof(float));
        CHECK_OK(ps_v4_hooks_add(&h, &m.cfg, "layers.2.attn.sink", hook_sink_zero, old, &err), &err);
        CHECK_OK(ps_v4_cache_watch(&c1, &h, &m.cfg, "layers.2.attn.out_heads", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&c0, &h0, &m.cfg, "layers.2.attn.out_heads", &err), &err);
        float *g0;
        run(&m, toks.seq[1], 1, T, &h, -1, &got);
        run(&m, toks.seq[1], 1, T, &h0, -1, &g0);
        const ps_cache_item *a1 = ps_cache_get(&c1, "layers.2.attn.out_heads"), *a0 = ps_cache_get(&c0, "layers.2.attn.out_heads");
        /* the inverse rope is a rotation: compare norms per (t, head) */
        double worst = 0;
        for (int64_t t = 0; a1 && a0 && t < T; t++)
            for (int64_t hh = 0; hh < 4; hh++) {
                double n1 = 0, n0 = 0;
                for (int64_t d = 0; d < 32; d++) {
                    n1 += (double)a1->data[(t * 4 + hh) * 32 + d] * a1->data[(t * 4 + hh) * 32 + d];
                    n0 += (double)a0->data[(t * 4 + hh) * 32 + d] * a0->data[(t * 4 + hh) * 32 + d];
                }
                worst = fmax(worst, fabs(sqrt(n1) - sqrt(n0) / (1 - old[hh * T + t])) / (sqrt(n1) + 1e-30));
            }
        CHECK(a1 && a0 && worst < 1e-5, "sink mass 0 rescales the heads (%g)", worst);
        free(got), free(g0), free(old);
        ps_cache_free(&c1), ps_cache_free(&c0);
        ps_hooks_free(&h), ps_hooks_free(&h0);
    }
    /* a batch of two equals the two runs alone */
    {
        int64_t Tb = 30;
        int32_t *tk = malloc((size_t)(2 * Tb) * sizeof(int32_t));
        memcpy(tk, toks.seq[0], (size_t)Tb * sizeof(int32_t));
        memcpy(tk + Tb, toks.seq[1], (size_t)Tb * sizeof(int32_t));
        float *both, *one, *two;
        run(&m, tk, 2, Tb, NULL, -1, &both);
        run(&m, tk, 1, Tb, NULL, -1, &one);
        run(&m, tk + Tb, 1, Tb, NULL, -1, &two);
        double r1 = both && one ? rel_err_f(both, one, Tb * V) : 1, r2 = both && two ? rel_err_f(both + Tb * V, two, Tb * V) : 1;
        CHECK(r1 < 1e-6 && r2 < 1e-6, "batch of 2 = runs alone (%g, %g)", r1, r2);
        free(tk), free(both), free(one), free(two);
    }
    /* stopping after layer 1: layer 1's hooks as in the full run, no logits */
    {
        ps_hooks h1, h2;
        ps_cache c1, c2;
        ps_hooks_init(&h1), ps_hooks_init(&h2);
        ps_cache_init(&c1), ps_cache_init(&c2);
        CHECK_OK(ps_v4_cache_watch(&c1, &h1, &m.cfg, "layers.1.out", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&c2, &h2, &m.cfg, "layers.1.out", &err), &err);
        CHECK_OK(ps_v4_cache_watch(&c2, &h2, &m.cfg, "logits", &err), &err);
        float *g2;
        run(&m, toks.seq[1], 1, T, &h1, -1, &got);
        run(&m, toks.seq[1], 1, T, &h2, 2, &g2);
        const ps_cache_item *x1 = ps_cache_get(&c1, "layers.1.out"), *x2 = ps_cache_get(&c2, "layers.1.out");
        CHECK(x1 && x2 && x2->data && !memcmp(x1->data, x2->data, (size_t)(T * 4 * 64) * sizeof(float)) &&
                  !ps_cache_get(&c2, "logits")->data,
              "stopping after layer 1");
        free(got), free(g2);
        ps_cache_free(&c1), ps_cache_free(&c2);
        ps_hooks_free(&h1), ps_hooks_free(&h2);
    }
    /* V4 names are refused by a controlled-model parser and the other way round */
    {
        ps_hooks h;
        ps_hooks_init(&h);
        CHECK_ERR(ps_v4_hooks_add(&h, &m.cfg, "blocks.0.hook_resid_pre", hook_identity, NULL, &err), &err, "unknown hook name");
        CHECK_ERR(ps_v4_hooks_add(&h, &m.cfg, "layers.2.attn.indexer.q", hook_identity, NULL, &err), &err,
                  "layer 2 is heavily_compressed_attention, which has no indexer");
        CHECK_ERR(ps_v4_hooks_add(&h, &m.cfg, "layers.4.out", hook_identity, NULL, &err), &err, "layer 4 out of range");
        ps_hooks_free(&h);
    }
    free(ref);
out:
    ps_tokens_free(&toks);
    ps_v4_model_free(&m);
}

int main(int argc, char **argv) {
    verbose = argc > 1 && !strcmp(argv[1], "-v");
    run_conformance("mix4");
    print_results("mix4");
    run_conformance("hub3");
    print_results("hub3");
    test_configs();
    test_names_and_shards();
    test_quantised();
    test_hostile();
    test_variants();
    test_hooks();
    CHECK_DONE();
}
