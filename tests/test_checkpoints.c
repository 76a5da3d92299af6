/* test_checkpoints.c — checkpoints as published (issue 15): the Hugging Face layout written and read
 * back (single file or shards, F32/BF16/F16, full and compressed attention: same weights, identical
 * forward), stale files of the other layout removed, every malformed shard index answered by a one-line
 * error naming the file (and the tensor or shard), lazy shard opening, the hub-cache symlink layout,
 * the config written before the weights (a save's commit point), and the memory model of loading (peak RSS while
 * loading a BF16 sharded checkpoint). */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "core/forward.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "testutil.h"

static char TMP[512];

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

static int exists(const char *dir, const char *name) {
    char p[2048];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &st) == 0;
}

static float *logits_of(const ps_model *m, const int32_t *tok, int64_t T) {
    ps_error err;
    ps_acts a;
    if (ps_acts_create(&a, m->ctx, &m->cfg, 1, T, false, &err)) return NULL;
    float *out = NULL;
    if (ps_forward(m, &a, tok, NULL, &err) == 0) {
        out = malloc((size_t)(T * m->cfg.vocab_size) * sizeof(float));
        memcpy(out, a.p.logits, (size_t)(T * m->cfg.vocab_size) * sizeof(float));
    }
    ps_acts_free(&a);
    return out;
}

static int same_config(const ps_config *a, const ps_config *b) {
    int ok = a->vocab_size == b->vocab_size && a->d_model == b->d_model && a->n_layers == b->n_layers &&
             a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
             a->d_ff == b->d_ff && a->max_seq_len == b->max_seq_len && a->rope == b->rope &&
             a->rope_theta == b->rope_theta && a->qk_norm == b->qk_norm && a->rms_eps == b->rms_eps &&
             a->tie_embeddings == b->tie_embeddings && a->kind == b->kind;
    if (ok && a->kind == PS_ATTN_COMPRESSED)
        ok = a->window == b->window && a->stride == b->stride && a->local_window == b->local_window &&
             a->gate == b->gate && a->payload == b->payload;
    return ok;
}

/* Save m with opts, load it back, compare weights (rounded to the stored dtype) and logits. */
static void round_trip(const ps_model *m, const ps_save_opts *o, const char *tag, int want_shards) {
    ps_error err;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/rt_%s", TMP, tag);
    CHECK_OK(ps_model_save_as(m, dir, o, &err), &err);
    ps_model m2;
    if (ps_model_load(&m2, dir, &err)) {
        CHECK(0, "%s: reload: %s", tag, err.msg);
        return;
    }
    CHECK(same_config(&m->cfg, &m2.cfg), "%s: config changed", tag);
    CHECK(m2.n_shards == want_shards, "%s: %d shards, want %d", tag, m2.n_shards, want_shards);
    /* the expected weights: the originals rounded to the stored dtype */
    ps_model r;
    CHECK_OK(ps_model_create(&r, &m->cfg, &err), &err);
    int exact = m2.n_params == m->n_params;
    for (int64_t i = 0; i < m->n_params; i++) {
        float x = m->params[i];
        r.params[i] = !o->dtype_set || o->dtype == PS_DT_F32 ? x
                      : o->dtype == PS_DT_BF16               ? ps_bf16_to_f32(ps_f32_to_bf16(x))
                                                             : ps_f16_to_f32(ps_f32_to_f16(x));
        if (exact && m2.params[i] != r.params[i]) exact = 0;
    }
    CHECK(exact, "%s: weights differ from the stored-dtype rounding", tag);
    CHECK(ps_model_get_meta(&m2, "task") && !strcmp(ps_model_get_meta(&m2, "task"), "{\"kind\":\"kv\"}"), "%s: metadata lost",
          tag);
    int32_t tok[20];
    tu_random_tokens(tok, 20, m->cfg.vocab_size, 9);
    float *a = logits_of(&r, tok, 20), *b = logits_of(&m2, tok, 20);
    CHECK(a && b && !memcmp(a, b, (size_t)(20 * m->cfg.vocab_size) * sizeof(float)), "%s: forward differs", tag);
    free(a);
    free(b);
    ps_model_free(&r);
    ps_model_free(&m2);
}

static void test_round_trips(void) {
    ps_error err;
    for (int kind = 0; kind < 2; kind++) {
        ps_config c = tu_config(kind ? PS_ATTN_COMPRESSED : PS_ATTN_FULL);
        c.n_layers = 2;
        c.rope_theta = 1e6;
        if (!kind) c.tie_embeddings = false;
        ps_model m;
        tu_random_model(&m, &c, 11 + (uint64_t)kind, 0.3f);
        CHECK_OK(ps_model_set_meta(&m, "task", "{\"kind\":\"kv\"}", &err), &err);
        char tag[64];
        ps_save_opts o1 = {.layout = PS_LAYOUT_HF};
        snprintf(tag, sizeof tag, "hf_f32_%d", kind);
        round_trip(&m, &o1, tag, 1);
        ps_save_opts o2 = {.layout = PS_LAYOUT_HF, .dtype_set = 1, .dtype = PS_DT_BF16, .max_shard_bytes = 2000};
        snprintf(tag, sizeof tag, "hf_bf16_sharded_%d", kind);
        int64_t n_sh = 1, cur = 0;
        for (int i = 0; i < m.n_tensors; i++) { /* the shard count the writer's rule gives */
            int64_t b = m.table[i].numel * 2;
            if (cur > 0 && cur + b > 2000) n_sh++, cur = 0;
            cur += b;
        }
        round_trip(&m, &o2, tag, (int)n_sh);
        ps_save_opts o3 = {.layout = PS_LAYOUT_HF, .dtype_set = 1, .dtype = PS_DT_F16, .max_shard_bytes = 1};
        snprintf(tag, sizeof tag, "hf_f16_one_per_shard_%d", kind);
        round_trip(&m, &o3, tag, m.n_tensors);
        ps_save_opts o4 = {.layout = PS_LAYOUT_PHASESCOPE, .max_shard_bytes = 4000};
        snprintf(tag, sizeof tag, "ps_f32_sharded_%d", kind);
        n_sh = 1, cur = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            int64_t b = m.table[i].numel * 4;
            if (cur > 0 && cur + b > 4000) n_sh++, cur = 0;
            cur += b;
        }
        round_trip(&m, &o4, tag, (int)n_sh);
        /* the HF config: Qwen3 keys as published; the compressed model adds its attention object */
        char path[1200];
        snprintf(path, sizeof path, "%s/rt_hf_f32_%d/config.json", TMP, kind);
        char *txt;
        size_t len;
        if (ps_read_file(path, 1 << 20, &txt, &len, &err) == 0) {
            const char *keys[] = {"\"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ]", "\"model_type\": \"qwen3\"",
                                  "\"rope_parameters\": {\n    \"rope_theta\": 1000000.0,\n    \"rope_type\": \"default\"\n  }",
                                  "\"layer_types\": [\n    \"full_attention\",\n    \"full_attention\"\n  ]",
                                  "\"dtype\": \"float32\"", "\"hidden_size\": 16", "\"num_key_value_heads\": 2"};
            for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) CHECK(strstr(txt, keys[i]), "HF config lacks %s", keys[i]);
            CHECK(kind ? strstr(txt, "\"attention\": {") != NULL : strstr(txt, "\"attention\"") == NULL,
                  "attention extension %s", kind ? "missing" : "present in a full-attention config");
            free(txt);
        }
        ps_model_free(&m);
    }
    /* rope or qk_norm off cannot be written as Qwen3 */
    ps_config c = tu_config(PS_ATTN_FULL);
    c.qk_norm = false;
    ps_model m;
    tu_random_model(&m, &c, 3, 0.3f);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/noqk", TMP);
    ps_save_opts o = {.layout = PS_LAYOUT_HF};
    CHECK_ERR(ps_model_save_as(&m, dir, &o, &err), &err, dir, "qk_norm");
    CHECK(!exists(TMP, "noqk"), "a refused HF save wrote something");
    ps_model_free(&m);
}

/* Switching layouts leaves one checkpoint in the directory. */
static void test_stale_files(void) {
    ps_error err;
    ps_config c = tu_config(PS_ATTN_FULL);
    ps_model m, m2;
    tu_random_model(&m, &c, 4, 0.3f);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/switch", TMP);
    ps_save_opts sh5 = {.max_shard_bytes = 2500}, sh1 = {0};
    CHECK_OK(ps_model_save_as(&m, dir, &sh5, &err), &err);
    CHECK(exists(dir, PS_ST_INDEX_NAME) && !exists(dir, "model.safetensors"), "sharded save layout");
    int files = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) files += strstr(e->d_name, "-of-") != NULL;
    if (d) closedir(d);
    CHECK(files >= 2, "expected several shards, got %d", files);
    ps_save_opts sh2 = {.max_shard_bytes = 1 << 20, .layout = PS_LAYOUT_HF};
    CHECK_OK(ps_model_save_as(&m, dir, &sh1, &err), &err);
    CHECK(!exists(dir, PS_ST_INDEX_NAME) && exists(dir, "model.safetensors"), "single save left the index");
    files = 0;
    d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) files += strstr(e->d_name, "-of-") != NULL;
    if (d) closedir(d);
    CHECK(files == 0, "single save left %d shards", files);
    (void)sh2;
    CHECK_OK(ps_model_save_as(&m, dir, &sh5, &err), &err);
    CHECK(!exists(dir, "model.safetensors"), "sharded save left model.safetensors (it would win on load)");
    CHECK_OK(ps_model_load(&m2, dir, &err), &err);
    ps_model_free(&m2);
    ps_model_free(&m);
}

/* The weights are a save's commit point: config.json is written before them, so a save that cannot write its
 * config (here config.json is a directory; a process killed between the two files is the same case) leaves
 * no model.safetensors or shard index behind, the files train --resume and every loader take for a whole
 * checkpoint (the CI failure of test_kill_resume: a kill after the step-0 weights, before their config). */
static void test_config_before_weights(void) {
    ps_error err;
    ps_config c = tu_config(PS_ATTN_COMPRESSED);
    ps_model m;
    tu_random_model(&m, &c, 4, 0.3f);
    ps_save_opts single = {0}, sharded = {.max_shard_bytes = 2500};
    const ps_save_opts *opts[2] = {&single, &sharded};
    for (int k = 0; k < 2; k++) {
        char dir[1024], cdir[1100];
        snprintf(dir, sizeof dir, "%s/order%d", TMP, k);
        snprintf(cdir, sizeof cdir, "%s/config.json", dir);
        CHECK(mkdir(dir, 0700) == 0 && mkdir(cdir, 0700) == 0, "cannot make %s", cdir);
        CHECK_ERR(ps_model_save_as(&m, dir, opts[k], &err), &err, "config.json");
        CHECK(!exists(dir, "model.safetensors") && !exists(dir, PS_ST_INDEX_NAME),
              "%s save: weights written although their config.json could not be", k ? "sharded" : "single-file");
        int files = 0;
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));) files += strstr(e->d_name, ".safetensors") != NULL;
        if (d) closedir(d);
        CHECK(files == 0, "%s save: %d weight files written without a config", k ? "sharded" : "single-file", files);
        /* with the obstacle gone the same directory takes the checkpoint */
        rmdir(cdir);
        CHECK_OK(ps_model_save_as(&m, dir, opts[k], &err), &err);
        ps_model m2;
        CHECK_OK(ps_model_load(&m2, dir, &err), &err);
        ps_model_free(&m2);
    }
    ps_model_free(&m);
}

/* ---- malformed indexes ---- */

static char BASE[1024]; /* a sharded checkpoint, one tensor per shard */
static ps_model BM;

static void fresh(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, BASE, dir);
    if (system(cmd) != 0) CHECK(0, "cannot copy %s", BASE);
}

/* The shard file name of tensor i of BM (one tensor per shard). */
static void shard_name(int i, char *out, size_t n) {
    snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, BM.n_tensors);
}

static void write_index_with(const char *dir, const char *override_name, const char *override_json, const char *extra) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, PS_ST_INDEX_NAME);
    size_t cap = 1 << 16, w = 0;
    char *s = malloc(cap);
    w += (size_t)snprintf(s + w, cap - w, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < BM.n_tensors; i++) {
        char sh[64];
        shard_name(i, sh, sizeof sh);
        if (override_name && !strcmp(override_name, BM.table[i].name)) {
            if (override_json) w += (size_t)snprintf(s + w, cap - w, "%s\"%s\": %s", i ? ", " : "", BM.table[i].name, override_json);
            else if (i == 0) w += (size_t)snprintf(s + w, cap - w, "\"__x\": \"%s\"", sh); /* keep the commas right */
            continue;
        }
        w += (size_t)snprintf(s + w, cap - w, "%s\"%s\": \"%s\"", i ? ", " : "", BM.table[i].name, sh);
    }
    w += (size_t)snprintf(s + w, cap - w, "%s}}", extra ? extra : "");
    write_text(path, s);
    free(s);
}

static void save_tensors(const char *path, const char *const *names, int n) {
    ps_st_tensor t[8];
    ps_error err;
    for (int i = 0; i < n; i++) {
        const ps_param_info *p = ps_model_find(&BM, names[i]);
        t[i] = (ps_st_tensor){.name = p->name, .ndim = p->ndim, .data = BM.params + p->offset};
        for (int d = 0; d < 3; d++) t[i].shape[d] = p->shape[d];
    }
    CHECK_OK(ps_st_save(path, t, n, NULL, NULL, 0, &err), &err);
}

static void expect_load_error(const char *dir, const char *a, const char *b, const char *c) {
    ps_error err;
    ps_model m;
    CHECK_ERR(ps_model_load(&m, dir, &err), &err, a, b, c);
    CHECK(strchr(err.msg, '\n') == NULL, "error not one line: %s", err.msg);
}

static void test_bad_indexes(void) {
    ps_error err;
    ps_config c = tu_config(PS_ATTN_FULL);
    tu_random_model(&BM, &c, 21, 0.3f);
    snprintf(BASE, sizeof BASE, "%s/base", TMP);
    ps_save_opts o = {.layout = PS_LAYOUT_HF, .dtype_set = 1, .dtype = PS_DT_BF16, .max_shard_bytes = 1};
    CHECK_OK(ps_model_save_as(&BM, BASE, &o, &err), &err);
    ps_model m;
    CHECK_OK(ps_model_load(&m, BASE, &err), &err);
    CHECK(m.n_shards == BM.n_tensors, "one shard per tensor: %d", m.n_shards);
    ps_model_free(&m);
    char dir[1024], path[2400], sh[64], sh2[64], json[256];
    snprintf(dir, sizeof dir, "%s/bad", TMP);
    const char *t0 = BM.table[0].name, *t1 = BM.table[1].name, *t2 = BM.table[2].name;

    /* missing shard file */
    fresh(dir);
    shard_name(1, sh, sizeof sh);
    snprintf(path, sizeof path, "%s/%s", dir, sh);
    unlink(path);
    expect_load_error(dir, sh, "cannot open: No such file or directory", PS_ST_INDEX_NAME);
    /* a tensor in two shards: stored in shard 2 as well as in its own shard 3 */
    fresh(dir);
    shard_name(1, sh, sizeof sh);
    snprintf(path, sizeof path, "%s/%s", dir, sh);
    const char *two[] = {t1, t2};
    save_tensors(path, two, 2);
    shard_name(2, sh2, sizeof sh2);
    expect_load_error(dir, t2, "also stored here", sh2);
    /* ... or listed twice in weight_map */
    fresh(dir);
    shard_name(1, sh, sizeof sh);
    snprintf(json, sizeof json, ", \"%s\": \"%s\"", t2, sh);
    write_index_with(dir, NULL, NULL, json);
    expect_load_error(dir, PS_ST_INDEX_NAME, "listed twice", t2);
    /* listed, but absent from its shard */
    fresh(dir);
    shard_name(1, sh, sizeof sh);
    snprintf(json, sizeof json, "\"%s\"", sh);
    write_index_with(dir, t2, json, NULL); /* t2 listed in shard 2, which holds only t1 */
    expect_load_error(dir, t2, "is missing", PS_ST_INDEX_NAME);
    /* present in a shard, but not in weight_map: refused (index and shards disagree) */
    fresh(dir);
    shard_name(1, sh, sizeof sh);
    snprintf(path, sizeof path, "%s/%s", dir, sh);
    const char *with_extra[] = {t1, "lm_head.weight"};
    {
        ps_st_tensor t[2];
        const ps_param_info *p = ps_model_find(&BM, t1);
        t[0] = (ps_st_tensor){.name = p->name, .ndim = p->ndim, .shape = {p->shape[0], p->shape[1]}, .data = BM.params + p->offset};
        t[1] = (ps_st_tensor){.name = with_extra[1], .ndim = 1, .shape = {4}, .data = BM.params};
        CHECK_OK(ps_st_save(path, t, 2, NULL, NULL, 0, &err), &err);
    }
    expect_load_error(dir, sh, "lm_head.weight", "not listed in the weight_map");
    /* shard names outside the directory: ../x, an absolute path, a symlink that escapes */
    const char *names[] = {"../base/model-00001-of-00015.safetensors", "/etc/passwd", "..", ""};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        fresh(dir);
        snprintf(json, sizeof json, "\"%s\"", names[i]);
        write_index_with(dir, t0, json, NULL);
        expect_load_error(dir, PS_ST_INDEX_NAME, "must be a file name in the checkpoint directory", t0);
    }
    fresh(dir);
    shard_name(0, sh, sizeof sh);
    snprintf(path, sizeof path, "%s/%s", dir, sh);
    unlink(path);
    char target[1200];
    snprintf(target, sizeof target, "%s/%s", BASE, sh);
    CHECK(symlink(target, path) == 0, "symlink");
    expect_load_error(dir, PS_ST_INDEX_NAME, "outside the checkpoint directory", sh);
    /* a symlink that stays inside is fine */
    fresh(dir);
    snprintf(path, sizeof path, "%s/%s", dir, sh);
    char moved[1300];
    snprintf(moved, sizeof moved, "%s/real.bin", dir);
    CHECK(rename(path, moved) == 0 && symlink("real.bin", path) == 0, "inside symlink");
    CHECK_OK(ps_model_load(&m, dir, &err), &err);
    ps_model_free(&m);
    /* malformed JSON and wrong types */
    struct { const char *text, *expect1, *expect2; } bad[] = {
        {"{\"weight_map\": {", "not valid JSON", "line 1"},
        {"[1, 2]", "must be a JSON object", "an array"},
        {"{\"metadata\": {}}", "missing \"weight_map\"", "shard file"},
        {"{\"weight_map\": [\"a\"]}", "\"weight_map\" must be an object", "an array"},
        {"{\"weight_map\": \"model.safetensors\"}", "\"weight_map\" must be an object", "a string"},
        {"{\"weight_map\": {\"model.norm.weight\": 3}}", "weight_map[\"model.norm.weight\"] must be a string", "an integer"},
        {"{\"weight_map\": {\"model.norm.weight\": null}}", "must be a string", "null"},
        {"{\"weight_map\": {\"model.norm.weight\": [\"a\"]}}", "must be a string", "an array"},
        {"{\"metadata\": 5, \"weight_map\": {}}", "\"metadata\" must be an object", "an integer"},
        {"{\"weight_map\": {\"a\\nb\": 1}}", "a\\x0ab", "must be a string"},
        {"{\"weight_map\": {}}", "is missing from weight_map", "model.embed_tokens.weight"},
        {"{\"weight_map\": {\"model.layers.0.self_attn.rotary.inv_freq\": \"x.safetensors\"}}", "unexpected tensor",
         "rotary.inv_freq"},
        {"", "not valid JSON", PS_ST_INDEX_NAME},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fresh(dir);
        snprintf(path, sizeof path, "%s/%s", dir, PS_ST_INDEX_NAME);
        write_text(path, bad[i].text);
        expect_load_error(dir, PS_ST_INDEX_NAME, bad[i].expect1, bad[i].expect2);
    }
    /* the index is a directory */
    fresh(dir);
    snprintf(path, sizeof path, "%s/%s", dir, PS_ST_INDEX_NAME);
    unlink(path);
    mkdir(path, 0755);
    expect_load_error(dir, PS_ST_INDEX_NAME, "directory", PS_ST_INDEX_NAME);
    /* neither model.safetensors nor an index */
    fresh(dir);
    unlink(path);
    expect_load_error(dir, "model.safetensors", "cannot open", "No such file");

    /* lazy opening: a listed shard holding only a tolerated tensor (lm_head in a tied model) is never
     * opened, even when it is missing */
    fresh(dir);
    write_index_with(dir, NULL, NULL, ", \"lm_head.weight\": \"model-99999-of-99999.safetensors\"");
    CHECK_OK(ps_model_load(&m, dir, &err), &err);
    CHECK(m.n_shards == BM.n_tensors, "opened %d shards", m.n_shards);
    ps_model_free(&m);
    /* model.safetensors wins over an index when both exist (as in transformers) */
    fresh(dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_text(path, "xyz");
    expect_load_error(dir, "model.safetensors", "too short", "");

    /* the Hugging Face hub cache: ROOT/snapshots/REV/NAME -> ../../blobs/HASH */
    fresh(dir);
    char root[1024], cmd[8000];
    snprintf(root, sizeof root, "%s/models--x--y", TMP);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/blobs' '%s/snapshots/abc' && cd '%s' && for f in *; do mv \"$f\" '%s/blobs/'\"h_$f\" && "
             "ln -s \"../../blobs/h_$f\" '%s/snapshots/abc/'\"$f\"; done",
             root, root, dir, root, root);
    CHECK(system(cmd) == 0, "hub cache layout");
    snprintf(path, sizeof path, "%s/snapshots/abc", root);
    CHECK_OK(ps_model_load(&m, path, &err), &err);
    ps_model_free(&m);
    ps_model_free(&BM);
}

/* ---- memory: loading a BF16 sharded checkpoint peaks at about the float32 parameters ---- */

__attribute__((unused)) static long vm_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) v = atol(line + kl);
    if (f) fclose(f);
    return v;
}

static void test_peak_memory(void) {
#if defined(__SANITIZE_ADDRESS__)
    printf("peak-memory check skipped under AddressSanitizer\n");
    return;
#else
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
    printf("peak-memory check skipped under AddressSanitizer\n");
    return;
#endif
#endif
    ps_error err;
    ps_config c = tu_config(PS_ATTN_FULL);
    c.vocab_size = 8192;
    c.d_model = 512;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 64;
    c.d_ff = 1536;
    c.n_layers = 6;
    ps_model m;
    CHECK_OK(ps_model_create(&m, &c, &err), &err);
    ps_model_init(&m, 1);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/big", TMP);
    ps_save_opts o = {.layout = PS_LAYOUT_HF, .dtype_set = 1, .dtype = PS_DT_BF16, .max_shard_bytes = 8 << 20};
    CHECK_OK(ps_model_save_as(&m, dir, &o, &err), &err);
    double f32_mb = (double)m.n_params * 4 / 1048576.0, file_mb = (double)m.n_params * 2 / 1048576.0;
    ps_model_free(&m);
    int fd[2];
    if (pipe(fd)) return;
    pid_t pid = fork();
    if (pid == 0) { /* a fresh process: its high-water mark is the load's */
        close(fd[0]);
        long before = vm_kb("VmRSS:");
        ps_model m2;
        long r[3] = {before, -1, 0};
        if (ps_model_load(&m2, dir, &err) == 0) {
            r[1] = vm_kb("VmHWM:");
            r[2] = m2.n_shards;
            ps_model_free(&m2);
        }
        if (write(fd[1], r, sizeof r) != (ssize_t)sizeof r) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    long r[3] = {0, -1, 0};
    ssize_t got = read(fd[0], r, sizeof r);
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    CHECK(got == (ssize_t)sizeof r && r[1] > 0, "child load failed");
    double grow_mb = (double)(r[1] - r[0]) / 1024.0;
    printf("peak memory: loading %.1f MB of BF16 in %ld shards into %.1f MB of float32 raised the high-water mark by %.1f MB\n",
           file_mb, r[2], f32_mb, grow_mb);
    /* one copy: the float32 parameters plus about one tensor of the file (here at most 8 MB) and slack */
    CHECK(grow_mb < f32_mb + 0.25 * file_mb, "peak grew by %.1f MB, more than %.1f MB float32 + %.1f MB",
          grow_mb, f32_mb, 0.25 * file_mb);
#endif
}

int main(void) {
    tu_tempdir(TMP, sizeof TMP, "ckpt");
    test_peak_memory();
    test_round_trips();
    test_stale_files();
    test_config_before_weights();
    test_bad_indexes();
    CHECK_DONE();
}
