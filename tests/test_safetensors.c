/* test_safetensors.c — checkpoints (SPEC §3): bit-exact round trip, F16/BF16 loading, atomic writes,
 * and every hostile-file defect SPEC §3 lists, each answered by a one-line error naming the file and,
 * where there is one, the tensor. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/fileio.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "testutil.h"

static char TMP[512];

/* Write 8-byte length + header + data bytes to TMP/name; returns the path (static buffer). */
static const char *raw_file(const char *name, const char *header, uint64_t claimed_len, const void *data, size_t n) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", TMP, name);
    FILE *f = fopen(path, "wb");
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(claimed_len >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

static const char *st(const char *name, const char *header, size_t data_bytes) {
    static uint8_t zeros[4096];
    return raw_file(name, header, strlen(header), zeros, data_bytes);
}

static void test_hostile_files(void) {
    ps_st_file f;
    ps_error err;
    const char *p;
    /* a valid baseline, including a zero-size tensor and metadata */
    p = st("ok.safetensors", "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]}}", 16);
    CHECK_OK(ps_st_open(p, &f, &err), &err);
    CHECK(f.n == 2 && ps_st_find(&f, "z") && ps_st_numel(ps_st_find(&f, "z")) == 0 && !strcmp(ps_st_meta(&f, "format"), "pt"),
          "baseline parsed wrong");
    ps_st_close(&f);

    struct { const char *name, *header; size_t data; const char *expect1, *expect2; } bad[] = {
        {"notjson", "{\"a\":{\"dtype\":\"F32\",", 0, "not valid UTF-8 JSON", NULL},
        {"array", "[1,2,3]", 0, "not a JSON object", NULL},
        {"badutf8", "{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "UTF-8", NULL},
        {"dupkey", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "JSON", NULL},
        {"pastend", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "\"a\"", "past the data section"},
        {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "\"b\"", "overlaps"},
        {"hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "\"b\"", "hole"},
        {"trailing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, "8 trailing bytes", NULL},
        {"shape_vs_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "\"a\"", "need 12"},
        {"overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}", 8, "\"a\"", "overflow"},
        {"negdim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "\"a\"", "shape[0]"},
        {"baddtype", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"a\"", "unknown dtype"},
        {"revoffsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "\"a\"", "invalid"},
        {"hugeoffset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9223372036854775800,9223372036854775804]}}", 4, "\"a\"", "past the data"},
        {"missingfield", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"a\"", "data_offsets"},
        {"extrafield", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "\"a\"", "exactly"},
        {"metanotstring", "{\"__metadata__\":{\"step\":3},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "__metadata__", "step"},
        {"entrynotobject", "{\"a\":5}", 0, "\"a\"", "not an object"},
        {"toomanydims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "\"a\"", "dimensions"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = st(bad[i].name, bad[i].header, bad[i].data);
        CHECK_ERR(ps_st_open(p, &f, &err), &err, p, bad[i].expect1, bad[i].expect2 ? bad[i].expect2 : bad[i].expect1);
        CHECK(strchr(err.msg, '\n') == NULL, "%s: error not one line", bad[i].name);
    }
    /* lengths that lie */
    p = raw_file("short", "", 0, "\x01\x02", 2);
    {
        /* a 5-byte file: shorter than the length prefix */
        FILE *fp = fopen(p, "wb");
        fwrite("abcde", 1, 5, fp);
        fclose(fp);
    }
    CHECK_ERR(ps_st_open(p, &f, &err), &err, p, "too short");
    p = raw_file("hdrpastend", "{}", 1000, NULL, 0);
    CHECK_ERR(ps_st_open(p, &f, &err), &err, p, "past the end");
    p = raw_file("hdrhuge", "{}", (uint64_t)1 << 62, NULL, 0);
    CHECK_ERR(ps_st_open(p, &f, &err), &err, p, "100 MB");
    p = raw_file("hdrmax", "{}", UINT64_MAX, NULL, 0);
    CHECK_ERR(ps_st_open(p, &f, &err), &err, p, "100 MB");
    p = raw_file("empty", "", 0, NULL, 0);
    CHECK_ERR(ps_st_open(p, &f, &err), &err, p);
    CHECK_ERR(ps_st_open("/nonexistent/x.safetensors", &f, &err), &err, "/nonexistent/x.safetensors", "cannot open");
    CHECK_ERR(ps_st_open(TMP, &f, &err), &err, TMP, "not a regular file");
}

static void save_model_with(const ps_model *m, const char *dir, const char *drop, const char *extra_name,
                            const int64_t *reshape_dims, int reshape_ndim, const char *reshape_name) {
    ps_error err;
    CHECK_OK(ps_model_save(m, dir, &err), &err);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ps_st_tensor t[64];
    int n = 0;
    static float extra[4];
    for (int i = 0; i < m->n_tensors; i++) {
        if (drop && !strcmp(m->table[i].name, drop)) continue;
        t[n] = (ps_st_tensor){.name = m->table[i].name, .ndim = m->table[i].ndim, .data = m->params + m->table[i].offset};
        for (int d = 0; d < 3; d++) t[n].shape[d] = m->table[i].shape[d];
        if (reshape_name && !strcmp(reshape_name, m->table[i].name)) {
            t[n].ndim = reshape_ndim;
            for (int d = 0; d < reshape_ndim; d++) t[n].shape[d] = reshape_dims[d];
        }
        n++;
    }
    if (extra_name) t[n++] = (ps_st_tensor){.name = extra_name, .ndim = 1, .shape = {4}, .data = extra};
    CHECK_OK(ps_st_save(path, t, n, NULL, NULL, 0, &err), &err);
}

static void test_model_checkpoints(void) {
    ps_error err;
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    c.n_layers = 2;
    ps_model m, m2;
    tu_random_model(&m, &c, 77, 0.3f);
    CHECK_OK(ps_model_set_meta(&m, "task", "{\"kind\":\"kv\"}", &err), &err);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/ckpt", TMP);
    /* round trip: bit-exact, metadata kept */
    CHECK_OK(ps_model_save(&m, dir, &err), &err);
    CHECK_OK(ps_model_load(&m2, dir, &err), &err);
    CHECK(m2.n_params == m.n_params && memcmp(m.params, m2.params, (size_t)m.n_params * 4) == 0, "round trip not bit-exact");
    CHECK(memcmp(&m.cfg, &m2.cfg, sizeof m.cfg) == 0, "config changed in round trip");
    CHECK(ps_model_get_meta(&m2, "task") && !strcmp(ps_model_get_meta(&m2, "task"), "{\"kind\":\"kv\"}"), "metadata lost");
    ps_model_free(&m2);
    /* saving again over it leaves no temporary files behind */
    CHECK_OK(ps_model_save(&m, dir, &err), &err);
    DIR *dd = opendir(dir);
    int stray = 0, files = 0;
    for (struct dirent *e; (e = readdir(dd));) {
        if (e->d_name[0] == '.') continue;
        files++;
        if (strstr(e->d_name, ".tmp")) stray++;
    }
    closedir(dd);
    CHECK(files == 2 && stray == 0, "checkpoint dir holds %d files, %d temporary", files, stray);
    /* the saved header has __metadata__.format = pt */
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ps_st_file f;
    CHECK_OK(ps_st_open(path, &f, &err), &err);
    CHECK(ps_st_meta(&f, "format") && !strcmp(ps_st_meta(&f, "format"), "pt"), "format metadata missing");
    ps_st_close(&f);

    /* missing / unexpected / mis-shaped tensors */
    save_model_with(&m, dir, "model.layers.1.self_attn.compressor.key_gate.bias", NULL, NULL, 0, NULL);
    CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "model.safetensors", "model.layers.1.self_attn.compressor.key_gate.bias", "missing");
    save_model_with(&m, dir, NULL, "model.layers.0.self_attn.rotary.inv_freq", NULL, 0, NULL);
    CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "model.safetensors", "rotary.inv_freq", "unexpected");
    int64_t dims[2] = {2, 16};
    save_model_with(&m, dir, NULL, NULL, dims, 2, "model.layers.0.self_attn.k_norm.weight");
    CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "model.layers.0.self_attn.k_norm.weight", "[2, 16]", "[4]");
    /* lm_head in a tied checkpoint is tolerated and ignored */
    save_model_with(&m, dir, NULL, "lm_head.weight", NULL, 0, NULL);
    CHECK_OK(ps_model_load(&m2, dir, &err), &err);
    ps_model_free(&m2);
    /* NaN and Inf weights */
    for (int k = 0; k < 2; k++) {
        const ps_param_info *pi = ps_model_find(&m, "model.layers.1.mlp.up_proj.weight");
        float keep = m.params[pi->offset + 5];
        m.params[pi->offset + 5] = k ? INFINITY : NAN;
        CHECK_OK(ps_model_save(&m, dir, &err), &err);
        m.params[pi->offset + 5] = keep;
        CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "model.safetensors", "model.layers.1.mlp.up_proj.weight", "non-finite");
    }
    /* config mismatch: config says untied, checkpoint lacks lm_head */
    CHECK_OK(ps_model_save(&m, dir, &err), &err);
    ps_config c2 = m.cfg;
    c2.tie_embeddings = false;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ps_config_save(&c2, path, &err);
    CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "lm_head.weight", "missing");
    /* bad config.json surfaces with the file name */
    ps_write_file_atomic(path, "{\"vocab_size\": 3}", 17, &err);
    CHECK_ERR(ps_model_load(&m2, dir, &err), &err, "config.json", "missing required key");
    CHECK_ERR(ps_model_load(&m2, "/nonexistent_ckpt", &err), &err, "/nonexistent_ckpt/config.json");
    ps_model_free(&m);
}

/* F16 and BF16 tensors load (converted to float32). */
static void test_half_precision(void) {
    CHECK(ps_f16_to_f32(0x3c00) == 1.0f && ps_f16_to_f32(0xc000) == -2.0f && ps_f16_to_f32(0x0001) == 5.9604644775390625e-8f &&
              ps_f16_to_f32(0x7bff) == 65504.0f && isinf(ps_f16_to_f32(0x7c00)) && isnan(ps_f16_to_f32(0x7e00)),
          "f16 decode");
    CHECK(ps_bf16_to_f32(0x3f80) == 1.0f && ps_bf16_to_f32(0xc040) == -3.0f, "bf16 decode");
    int ok = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ps_f16_to_f32((uint16_t)h);
        if (!isnan(f) && ps_f32_to_f16(f) != h) ok = 0;
        f = ps_bf16_to_f32((uint16_t)h);
        if (!isnan(f) && ps_f32_to_bf16(f) != h) ok = 0;
    }
    CHECK(ok, "half-precision round trip of every code");
    CHECK(ps_f32_to_f16(1.0f + 1.0f / 4096) == 0x3c00 && ps_f32_to_bf16(1.00390625f) == 0x3f80, "round to nearest even");

    ps_error err;
    ps_config c = tu_config(PS_ATTN_FULL);
    ps_model m, m2;
    tu_random_model(&m, &c, 5, 0.3f);
    for (int dt = 0; dt < 2; dt++) {
        /* round the weights to the half format, write a checkpoint in that format by hand */
        char dir[1024], path[1100];
        snprintf(dir, sizeof dir, "%s/half%d", TMP, dt);
        CHECK_OK(ps_model_save(&m, dir, &err), &err);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        size_t hcap = 65536, hl = 0;
        char *hdr = malloc(hcap);
        uint16_t *data = malloc((size_t)m.n_params * 2);
        hl += (size_t)snprintf(hdr + hl, hcap - hl, "{");
        int64_t off = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            const ps_param_info *p = &m.table[i];
            for (int64_t j = 0; j < p->numel; j++) {
                float x = m.params[p->offset + j];
                data[off + j] = dt ? ps_f32_to_bf16(x) : ps_f32_to_f16(x);
            }
            hl += (size_t)snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", i ? "," : "", p->name,
                                   dt ? "BF16" : "F16", (long long)p->shape[0]);
            for (int d = 1; d < p->ndim; d++) hl += (size_t)snprintf(hdr + hl, hcap - hl, ",%lld", (long long)p->shape[d]);
            hl += (size_t)snprintf(hdr + hl, hcap - hl, "],\"data_offsets\":[%lld,%lld]}", (long long)off * 2,
                                   (long long)(off + p->numel) * 2);
            off += p->numel;
        }
        hl += (size_t)snprintf(hdr + hl, hcap - hl, "}");
        FILE *fp = fopen(path, "wb");
        uint64_t L = hl;
        fwrite(&L, 8, 1, fp);
        fwrite(hdr, 1, hl, fp);
        fwrite(data, 2, (size_t)m.n_params, fp);
        fclose(fp);
        CHECK_OK(ps_model_load(&m2, dir, &err), &err);
        int exact = 1;
        for (int64_t j = 0; j < m.n_params && m2.params; j++) {
            float want = dt ? ps_bf16_to_f32(data[j]) : ps_f16_to_f32(data[j]);
            if (m2.params[j] != want) exact = 0;
        }
        CHECK(exact, "%s checkpoint did not load to the exact float32 values", dt ? "BF16" : "F16");
        ps_model_free(&m2);
        free(hdr);
        free(data);
    }
    ps_model_free(&m);
}

int main(void) {
    tu_tempdir(TMP, sizeof TMP, "st");
    test_hostile_files();
    test_model_checkpoints();
    test_half_precision();
    CHECK_DONE();
}
