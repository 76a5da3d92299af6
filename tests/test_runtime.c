/* test_runtime.c — the family interface (core/runtime.h) against what the forwards do: for every family
 * and every point of its hook-point table, on the small conformance checkpoints (tests/conformance/, the
 * DeepSeek-V4 ones in tests/conformance/v4/) and a channel-attention model: a forward with a host callback
 * on every (slot, point) the family's hook enumeration has sees each point fire exactly once on exactly the
 * layers the table gives, with exactly the table's shape, and nothing else fires; every point number the
 * forward can fire is in the table; the name parsers accept a point's name exactly on the table's layers.
 * Also: opening picks the family (detection), the controlled model's restart from a layer gives the full
 * forward's logits, scoring through the family equals ps_score_queries on the forward's logits, and the
 * config hash is the one provenance has always recorded (ps_config_hash; FNV-1a 64 of a V4 config.json,
 * computed here again). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/fileio.h"
#include "core/runtime.h"
#include "testutil.h"

#define MAX_SLOTS 64
#define MAX_POINTS 64

typedef struct {
    const ps_runtime *rt;
    int64_t B, T;
    int fired[MAX_SLOTS][MAX_POINTS];
    int bad_shape[MAX_SLOTS][MAX_POINTS];
    int index_of[MAX_POINTS]; /* point number -> table index, -1: not in the table */
} fire_log;

typedef struct {
    fire_log *log;
    int slot, point;
} fire_at;

static int on_fire(const ps_hook_event *ev, void *u, ps_error *err) {
    (void)err;
    fire_at *at = u;
    fire_log *lg = at->log;
    lg->fired[at->slot][at->point]++;
    int i = lg->index_of[at->point];
    int64_t want[4] = {0};
    int nd = i < 0 ? -1 : lg->rt->family->point_shape(lg->rt, i, at->slot, lg->B, lg->T, want);
    int ok = nd == ev->ndim;
    for (int k = 0; ok && k < nd; k++) ok = ev->shape[k] == want[k];
    if (!ok) lg->bad_shape[at->slot][at->point]++;
    return 0;
}

/* whether the table has point i at slot s (a layer, or the global slot n_layers) */
static int table_has(const ps_runtime *rt, int i, int s) {
    int64_t d[4];
    int global = ps_point_is_global(&rt->family->points[i]);
    if (global != (s == rt->n_layers)) return 0;
    return rt->family->point_shape(rt, i, global ? -1 : s, 1, 1, d) > 0;
}

static void check_family_table(const char *dir, const ps_family *want, int64_t B, int64_t T) {
    ps_runtime rt;
    ps_error err = {0};
    ps_runtime_opts o = {.backend = "cpu", .weights = 1, .lazy = 0};
    CHECK(ps_runtime_detect(dir) == want, "%s: detected as %s", dir, ps_runtime_detect(dir)->name);
    REQUIRE_OK(ps_runtime_open(&rt, dir, &o, &err), &err);
    const ps_family *f = rt.family;
    CHECK(f == want, "%s: opened as %s", dir, f->name);
    fire_log *lg = calloc(1, sizeof *lg);
    lg->rt = &rt;
    lg->B = B;
    lg->T = T;
    /* the table covers the enumeration: point numbers 0 .. n_points-1, each once */
    for (int p = 0; p < MAX_POINTS; p++) lg->index_of[p] = -1;
    int n_global = 0;
    for (int i = 0; i < f->n_points; i++) {
        int p = f->points[i].point;
        CHECK(p >= 0 && p < f->n_points && lg->index_of[p] < 0, "%s: point %s numbered %d", f->name, f->points[i].pattern, p);
        if (p >= 0 && p < MAX_POINTS) lg->index_of[p] = i;
        n_global += ps_point_is_global(&f->points[i]);
        CHECK(f->points[i].head_axis >= -1 && f->points[i].head_axis < 4, "%s: head axis", f->points[i].pattern);
    }
    int n_slots = (int)rt.n_layers + (n_global ? 1 : 0);
    /* a callback on every (slot, point) of the enumeration, past the name parsers */
    ps_hooks h;
    ps_hooks_init(&h);
    fire_at *ats = calloc((size_t)n_slots * (size_t)f->n_points, sizeof *ats);
    for (int s = 0; s < n_slots; s++)
        for (int p = 0; p < f->n_points; p++) {
            fire_at *at = &ats[s * f->n_points + p];
            *at = (fire_at){lg, s, p};
            char name[128];
            f->hook_family->point_name(name, sizeof name, s, p);
            REQUIRE_OK(ps_hooks_add_at(&h, f->hook_family, n_slots, s, p, name, on_fire, at, NULL, 0, &err), &err);
        }
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok);
    tu_random_tokens(tok, B * T, f->vocab(&rt), 11);
    void *acts = f->acts_create(&rt, B, T, 0, &err);
    CHECK(acts != NULL, "%s", err.msg);
    if (acts) CHECK_OK(f->forward(&rt, acts, tok, &h, -1, &err), &err);
    int fired_pairs = 0, table_pairs = 0;
    for (int s = 0; s < n_slots; s++)
        for (int p = 0; p < f->n_points; p++) {
            int i = lg->index_of[p], want_fire = i >= 0 && table_has(&rt, i, s);
            char name[128];
            f->hook_family->point_name(name, sizeof name, s, p);
            CHECK(lg->fired[s][p] == want_fire, "%s: %s fired %d times (the table says %d)", dir, name, lg->fired[s][p], want_fire);
            CHECK(!lg->bad_shape[s][p], "%s: %s fired with a shape other than the table's", dir, name);
            fired_pairs += lg->fired[s][p] > 0;
            table_pairs += want_fire;
        }
    CHECK(fired_pairs == table_pairs && fired_pairs > 0, "%s: %d points fired, the table has %d", dir, fired_pairs, table_pairs);
    /* the name parsers agree with the table, layer by layer */
    for (int i = 0; i < f->n_points; i++) {
        int global = ps_point_is_global(&f->points[i]);
        for (int l = global ? -1 : 0; l < (global ? 0 : rt.n_layers); l++) {
            char name[128];
            int slot, point;
            ps_error e2 = {0};
            ps_runtime_point_name(&rt, i, l, name, sizeof name);
            int ok = f->hook_parse(&rt, name, &slot, &point, &e2) == 0;
            int has = table_has(&rt, i, global ? (int)rt.n_layers : l);
            CHECK(ok == has, "%s: %s parses %d, the table says %d (%s)", dir, name, ok, has, e2.msg);
            if (ok) CHECK(point == f->points[i].point && slot == (global ? rt.n_layers : l), "%s: %s parses to %d/%d", dir, name, slot, point);
        }
    }
    /* scoring through the family = ps_score_queries on the forward's logits (one batch, no hooks) */
    if (acts) {
        ps_batch b;
        REQUIRE_OK(ps_batch_alloc(&b, B, T, 1, &err), &err);
        memcpy(b.tokens, tok, (size_t)(B * T) * sizeof *tok);
        for (int64_t s = 0; s < B; s++) {
            b.n_q[s] = 1;
            b.queries[s] = (ps_query){.key_pos = 0, .answer_pos = T - 3, .answer_len = 2, .answer_src = T - 2};
        }
        int ok1[8], ok2[8];
        double lp1[8], lp2[8];
        CHECK_OK(f->forward(&rt, acts, tok, NULL, -1, &err), &err);
        const float *lgt = f->logits(acts, &err);
        CHECK(lgt != NULL, "%s", err.msg);
        if (lgt) ps_score_queries(&b, lgt, f->vocab(&rt), ok1, lp1);
        CHECK_OK(f->score(&rt, &b, 1, NULL, ok2, lp2, &err), &err); /* batches of one */
        for (int64_t s = 0; lgt && s < B; s++)
            CHECK(ok1[s] == ok2[s] && fabs(lp1[s] - lp2[s]) <= 1e-5 * (1 + fabs(lp1[s])), "%s: score of sequence %lld: %g vs %g",
                  dir, (long long)s, lp1[s], lp2[s]);
        ps_batch_free(&b);
    }
    /* a restart from layer 1 of a kept pass gives the full forward's logits (the families that have one) */
    if (f->restart && acts && rt.n_layers > 1) {
        int64_t n = B * T * f->vocab(&rt);
        float *full = malloc((size_t)n * sizeof *full);
        const float *lgt = f->logits(acts, &err);
        if (lgt) memcpy(full, lgt, (size_t)n * sizeof *full);
        void *kept = f->acts_create(&rt, B, T, 1, &err);
        CHECK(kept != NULL, "%s", err.msg);
        if (kept && lgt) {
            CHECK_OK(f->forward(&rt, kept, tok, NULL, -1, &err), &err);
            /* spoil the logits, then restart: they must come back */
            float *lg2 = (float *)f->logits(kept, &err);
            for (int64_t k = 0; k < n; k++) lg2[k] = -1e30f;
            CHECK_OK(f->restart(&rt, kept, 1, NULL, &err), &err);
            lg2 = (float *)f->logits(kept, &err);
            double worst = 0;
            for (int64_t k = 0; k < n; k++) worst = fmax(worst, fabs((double)lg2[k] - full[k]));
            CHECK(worst <= 1e-4, "%s: restart from layer 1 differs from the full forward by %g", dir, worst);
        }
        f->acts_free(kept);
        free(full);
    }
    if (!f->restart) { /* a family without restarts keeps no per-layer activations either */
        void *k = f->acts_create(&rt, B, T, 1, &err);
        CHECK(k == NULL, "%s: kept activations without a restart", dir);
        f->acts_free(k);
    }
    /* the config hash provenance records */
    char hash[17] = "", want_hash[17] = "";
    f->config_hash(&rt, hash);
    if (f == &ps_family_model) ps_config_hash(&ps_runtime_controlled(&rt)->cfg, want_hash);
    else {
        char path[4200], *text;
        size_t len;
        snprintf(path, sizeof path, "%s/config.json", dir);
        uint64_t hh = 1469598103934665603ULL;
        if (ps_read_file(path, (size_t)1 << 24, &text, &len, &err) == 0) {
            for (size_t k = 0; k < len; k++) hh = (hh ^ (unsigned char)text[k]) * 1099511628211ULL;
            free(text);
            snprintf(want_hash, sizeof want_hash, "%016llx", (unsigned long long)hh);
        }
    }
    CHECK(!strcmp(hash, want_hash) && hash[0], "%s: config hash %s, want %s", dir, hash, want_hash);
    json_t *cj = f->config_json(&rt);
    CHECK(cj && json_is_object(cj), "%s: config JSON", dir);
    json_decref(cj);
    CHECK(f->default_period(&rt) >= 1, "%s: default period", dir);
    f->acts_free(acts);
    free(tok);
    free(ats);
    free(lg);
    ps_hooks_free(&h);
    ps_runtime_free(&rt);
    CHECK(rt.model == NULL && rt.family == NULL, "freed");
}

/* the per-layer sets of DeepSeek-V4's points in words and in numbers */
static void check_layers_text(void) {
    char dir[4200], buf[256];
    ps_runtime rt;
    ps_error err = {0};
    ps_runtime_opts o = {.backend = "cpu", .weights = 0};
    snprintf(dir, sizeof dir, "%s/v4/mix4", tu_conformance_dir());
    REQUIRE_OK(ps_runtime_open(&rt, dir, &o, &err), &err); /* layers: sliding, CSA, HCA, CSA */
    for (int i = 0; i < rt.family->n_points; i++) {
        ps_runtime_point_layers(&rt, i, buf, sizeof buf);
        const char *pat = rt.family->points[i].pattern;
        if (!strcmp(pat, "layers.{L}.attn.compressor.kv")) CHECK(!strcmp(buf, "1-3"), "compressor.kv on %s", buf);
        if (!strcmp(pat, "layers.{L}.attn.indexer.topk")) CHECK(!strcmp(buf, "1, 3"), "indexer.topk on %s", buf);
        if (!strcmp(pat, "layers.{L}.attn.q")) CHECK(!strcmp(buf, "0-3"), "attn.q on %s", buf);
        if (!strcmp(pat, "logits")) CHECK(!strcmp(buf, "once"), "logits %s", buf);
    }
    ps_runtime_free(&rt);
}

/* a channel-attention model (the controlled family's third attention kind), saved and opened */
static void check_channel(void) {
    ps_config c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 2;
    c.max_seq_len = 40;
    c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_CSA, c.local_window = 3;
    ps_model m;
    ps_error err = {0};
    tu_random_model(&m, &c, 5, 0.3f);
    char dir[4096];
    tu_tempdir(dir, sizeof dir, "runtime_channel");
    REQUIRE_OK(ps_model_save(&m, dir, &err), &err);
    ps_model_free(&m);
    check_family_table(dir, &ps_family_model, 2, 17);
}

/* the memory a context's buffers live in: the host's for the cpu (free <= total, both > 0) */
static void check_mem_info(void) {
    ps_ctx *c;
    ps_error err;
    REQUIRE_OK(ps_ctx_create(&c, "cpu", &err), &err);
    int64_t fb = -1, tb = -1;
    CHECK_OK(ps_ctx_mem_info(c, &fb, &tb, &err), &err);
    CHECK(fb > 0 && tb > 0 && fb <= tb, "cpu memory: %lld free of %lld", (long long)fb, (long long)tb);
    uint64_t f2 = ps_ctx_mem_free(c);
    CHECK(f2 > 0 && f2 <= (uint64_t)tb, "ps_ctx_mem_free %llu of %lld", (unsigned long long)f2, (long long)tb);
    /* a context with a failed op answers nothing and keeps the op's message for ps_ctx_check */
    ps_ctx_fail(c, "op X broke");
    CHECK_ERR(ps_ctx_mem_info(c, &fb, &tb, &err), &err, "earlier op failed", "op X broke");
    CHECK(ps_ctx_mem_free(c) == 0, "ps_ctx_mem_free of a failed context");
    CHECK(ps_ctx_check(c, &err) != 0 && strstr(err.msg, "op X broke"), "the op's failure was lost: %s", err.msg);
    ps_ctx_free(c);
}

/* ---- descriptions: labels, kinds and the default period from core's families ---- */

/* the description of a config given as JSON text; "" for want_err: it must describe */
static void check_desc_json(const char *cfg_text, const char *want_label, const char *want_kind, int kv_shared, const char *want_err) {
    json_error_t je;
    json_t *cfg = json_loads(cfg_text, 0, &je);
    CHECK(cfg != NULL, "bad test JSON %s: %s", cfg_text, je.text);
    if (!cfg) return;
    ps_model_desc d;
    ps_error err = {0};
    if (want_err) CHECK_ERR(ps_model_desc_from_config(cfg, &d, &err), &err, want_err);
    else {
        CHECK_OK(ps_model_desc_from_config(cfg, &d, &err), &err);
        CHECK(!strcmp(d.label, want_label), "%s: label \"%s\", expected \"%s\"", cfg_text, d.label, want_label);
        CHECK(!strcmp(d.kind, want_kind), "%s: kind \"%s\", expected \"%s\"", cfg_text, d.kind, want_kind);
        CHECK(d.kv_shared == kv_shared, "%s: kv_shared %d", cfg_text, d.kv_shared);
        /* a provenance holding only this config gets the same label (a result written before labels) */
        json_t *prov = json_pack("{s:O}", "config", cfg);
        char lab[256], kind[32];
        CHECK(!ps_label_from_provenance(prov, lab, sizeof lab, kind, sizeof kind) && !strcmp(lab, want_label) && !strcmp(kind, want_kind),
              "%s: from provenance \"%s\" / \"%s\"", cfg_text, lab, kind);
        /* a label the writer stored wins */
        json_object_set_new(prov, "label", json_string("stored"));
        CHECK(!ps_label_from_provenance(prov, lab, sizeof lab, NULL, 0) && !strcmp(lab, "stored"), "stored label: \"%s\"", lab);
        json_decref(prov);
    }
    json_decref(cfg);
}

/* an opened checkpoint: its label and kind (as its config describes them) and its default period, computed
 * here from the config the other way */
static void check_runtime_desc(const char *dir, const char *want_label, const char *want_kind, int64_t want_period) {
    ps_runtime rt;
    ps_error err = {0};
    ps_runtime_opts o = {.backend = "cpu", .weights = 0, .lazy = 0};
    REQUIRE_OK(ps_runtime_open(&rt, dir, &o, &err), &err);
    char lab[256];
    ps_model_desc d;
    CHECK(!strcmp(ps_runtime_label(&rt, lab, sizeof lab), want_label), "%s: label \"%s\", expected \"%s\"", dir, lab, want_label);
    CHECK_OK(ps_runtime_desc(&rt, &d, &err), &err);
    CHECK(!strcmp(d.kind, want_kind), "%s: kind %s, expected %s", dir, d.kind, want_kind);
    CHECK(ps_runtime_default_period(&rt) == want_period, "%s: default period %lld, expected %lld", dir,
          (long long)ps_runtime_default_period(&rt), (long long)want_period);
    ps_runtime_free(&rt);
}

static void check_descriptions(void) {
    check_desc_json("{\"attention\": {\"kind\": \"full\"}}", "full attention", "full", 0, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, \"head_offsets\": [0, 1, 2, 3]}}",
                    "W8/S8, staggered 0–3", "compressed", 0, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 4, \"gate\": \"uniform\", "
                    "\"head_offsets\": [0, 2]}, \"rope\": false}",
                    "W8/S4, offsets 0,2, uniform gate, no RoPE", "compressed", 0, NULL);
    /* per-layer grids: the "staggered_layers" formula (S 8: k 3; n_kv 2: 0, 4 then + 3l) and any other 2-D list */
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, "
                    "\"head_offsets\": [[0, 4], [3, 7], [6, 2]]}}",
                    "W8/S8, staggered by layer (k 3)", "compressed", 0, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, "
                    "\"head_offsets\": [[0, 4], [1, 7], [6, 2]]}}",
                    "W8/S8, per-layer offsets", "compressed", 0, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 16, \"stride\": 8, \"boundaries\": \"content\", "
                    "\"chunk_min\": 4}}", "content chunks 4-16, mean 8", "compressed", 0, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"channel\", \"rate\": 4, \"mode\": \"hca\", \"local_window\": 3}}",
                    "V4 compressor: HCA, rate 4, window 3", "channel", 1, NULL);
    check_desc_json("{\"attention\": {\"kind\": \"deepseek_v4\", \"layer_types\": [\"sliding\", \"csa\"], \"compress_rates\": [0, 4]}}",
                    "DeepSeek-V4, compress rates 0,4", "deepseek_v4", 1, NULL);
    /* a bad field is named under the config, as the results validator reports it */
    check_desc_json("{\"attention\": {\"kind\": \"v4\", \"mode\": \"csa\", \"local_window\": 3}}", NULL, NULL, 0, "attention.rate: missing");
    check_desc_json("{\"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 9}}", NULL, NULL, 0,
                    "attention.stride: 9 is out of range [1, 8]");
    check_desc_json("{\"attention\": {\"kind\": \"deepseek_v4\", \"layer_types\": [\"csa\"], \"compress_rates\": [-1]}}", NULL, NULL, 0,
                    "attention.compress_rates[0]: -1 is negative");
    check_desc_json("{\"attention\": {\"kind\": \"sparse\"}}", NULL, NULL, 0,
                    "attention.kind: \"sparse\" is not one of deepseek_v4, infllm_v2, full, compressed, channel, v4, select");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/compressed_w6s3_overlap", tu_conformance_dir());
    check_runtime_desc(dir, "W6/S3", "compressed", 3);
    snprintf(dir, sizeof dir, "%s/full_gqa", tu_conformance_dir());
    check_runtime_desc(dir, "full attention", "full", 8);
    snprintf(dir, sizeof dir, "%s/v4/mix4", tu_conformance_dir()); /* layers: sliding, CSA 4, HCA 8, CSA 4 */
    check_runtime_desc(dir, "DeepSeek-V4, compress rates 0,4,8,4", "deepseek_v4", 4);
    /* the channel attention: its rate (the one default period the instruments share) */
    ps_config c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 1, c.max_seq_len = 24, c.n_kv_heads = 1, c.rate = 3, c.v4_mode = PS_V4_MODE_CSA, c.local_window = 3;
    ps_model m;
    ps_error err = {0};
    tu_random_model(&m, &c, 6, 0.3f);
    tu_tempdir(dir, sizeof dir, "runtime_desc_channel");
    REQUIRE_OK(ps_model_save(&m, dir, &err), &err);
    ps_model_free(&m);
    check_runtime_desc(dir, "V4 compressor: CSA, rate 3, window 3", "channel", 3);
}

int main(void) {
    check_mem_info();
    const char *models[] = {"compressed_w8s8", "compressed_w6s3_overlap", "full_gqa", "qwen3_published"};
    char dir[4200];
    for (int i = 0; i < 4; i++) {
        snprintf(dir, sizeof dir, "%s/%s", tu_conformance_dir(), models[i]);
        check_family_table(dir, &ps_family_model, 2, 21);
    }
    check_channel();
    const char *v4[] = {"mix4", "hub3"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/v4/%s", tu_conformance_dir(), v4[i]);
        check_family_table(dir, &ps_family_v4, 2, 19);
    }
    check_layers_text();
    check_descriptions();
    CHECK_DONE();
}
