/* test_v4_instr.c — the instruments on DeepSeek-V4 checkpoints (interventions/v4_instr.h) and on the
 * controlled model's channel attention, on the tiny random conformance models (the accuracies are meaningless;
 * the machinery, shapes and bookkeeping are what is checked):
 *   - task files: identity and mapped token ids, their errors; a mapped evaluation scores the mapped
 *     prompts exactly as a hand-run forward does;
 *   - the sweep's per-residue bookkeeping (every query visits every residue once);
 *   - knockout: a query head replaced by a mean computed here by hand gives the instrument's cell
 *     (counts equal, log-probabilities equal); the raw, compressed, sink and indexer targets run and
 *     the indexer's mean-pattern top-k follows its rule (visibility, ties to the lower index);
 *   - gate cycling by k then -k restores the model bit for bit (ape and logits), k = rate is the identity;
 *   - gates: a hand-built uniform gate (gate projection 0, constant ape) gives N_static = N_input = the
 *     slot count (HCA: the rate; CSA: twice the rate), per channel and pooled;
 *   - the channel attention of the controlled model: gate cycling k / -k, a uniform gate's N = 2m, and the
 *     knockout grid of its compressed entries against a hand-computed mean. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gates/chgates.h"
#include "core/forward.h"
#include "interventions/gatecycle.h"
#include "interventions/knockout.h"
#include "core/rng.h"
#include "interventions/sweep.h"
#include "testutil.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "interventions/units.h"
#include "interventions/v4_instr.h"
#include "tasks/tasks.h"

static char mix4[4096];
static ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};

static const char *TASK =
    "{\"task\": {\"kind\": \"kv-retrieval\", \"seq_len\": 40, \"n_keys\": 16, \"n_values\": 16, \"n_fillers\": 4, \"n_pairs\": 4,"
    " \"key_len\": 1, \"value_len\": 1, \"gap_min\": 0, \"gap_max\": 3, \"query_gap\": 8, \"n_queries\": 2}%s}";

static void write_task(const char *path, const char *ids) {
    FILE *f = fopen(path, "w");
    fprintf(f, TASK, ids);
    fclose(f);
}

static void test_task_files(const char *tmp) {
    char p[4200], ids[2048];
    ps_error err;
    ps_v4_task t;
    snprintf(p, sizeof p, "%s/t.json", tmp);
    write_task(p, "");
    CHECK_OK(ps_v4_task_load(&t, p, mix4, 256, 4096, &err), &err);
    CHECK(!t.mapped && t.n_ids == 2 + 16 + 16 + 4 && t.ids[17] == 17, "identity ids");
    ps_v4_task_free(&t);
    /* mapped: every role shifted to 100.. */
    int w = snprintf(ids, sizeof ids, ", \"ids\": {\"bos\": 200, \"marker\": 201, \"keys\": [");
    for (int i = 0; i < 16; i++) w += snprintf(ids + w, sizeof ids - w, "%s%d", i ? "," : "", 100 + i);
    w += snprintf(ids + w, sizeof ids - w, "], \"values\": [");
    for (int i = 0; i < 16; i++) w += snprintf(ids + w, sizeof ids - w, "%s%d", i ? "," : "", 130 + i);
    w += snprintf(ids + w, sizeof ids - w, "], \"fillers\": [250, 251, 252, 253]}");
    write_task(p, ids);
    CHECK_OK(ps_v4_task_load(&t, p, mix4, 256, 4096, &err), &err);
    CHECK(t.mapped && t.ids[0] == 200 && t.ids[1] == 201 && t.ids[2] == 100 && t.ids[18] == 130 && t.ids[34] == 250, "mapped ids");
    ps_v4_task_free(&t);
    CHECK_ERR(ps_v4_task_load(&t, p, mix4, 220, 4096, &err), &err, "ids.", "must be a token id in [0, 220)");
    write_task(p, ", \"ids\": {\"bos\": 0, \"marker\": 1, \"keys\": [1], \"values\": [], \"fillers\": []}");
    CHECK_ERR(ps_v4_task_load(&t, p, mix4, 256, 4096, &err), &err, "ids.keys", "16 token ids");
    /* a duplicate id */
    char dup[2048];
    snprintf(dup, sizeof dup, "%s", ids);
    char *k = strstr(dup, "250");
    memcpy(k, "100", 3);
    write_task(p, dup);
    CHECK_ERR(ps_v4_task_load(&t, p, mix4, 256, 4096, &err), &err, "token id 100 appears twice");
    CHECK_ERR(ps_v4_task_load(&t, NULL, mix4, 256, 4096, &err), &err, "carries no phasescope task", "--task FILE.json",
              "phasescope_task.json");
    /* the model's own stored task */
    char own[4200];
    snprintf(own, sizeof own, "%s/phasescope_task.json", tmp);
    write_task(own, "");
    CHECK_OK(ps_v4_task_load(&t, NULL, tmp, 256, 4096, &err), &err);
    CHECK(strstr(t.source, "phasescope_task.json") != NULL, "stored task found: %s", t.source);
    ps_v4_task_free(&t);
    unlink(own);
}

/* a mapped evaluation = a hand-run forward of the mapped tokens, scored */
static void test_mapped_eval(ps_v4_model *m, const char *tmp) {
    char p[4200], ids[2048];
    int w = snprintf(ids, sizeof ids, ", \"ids\": {\"bos\": 7, \"marker\": 9, \"keys\": [");
    for (int i = 0; i < 16; i++) w += snprintf(ids + w, sizeof ids - w, "%s%d", i ? "," : "", 40 + 3 * i);
    w += snprintf(ids + w, sizeof ids - w, "], \"values\": [");
    for (int i = 0; i < 16; i++) w += snprintf(ids + w, sizeof ids - w, "%s%d", i ? "," : "", 101 + 5 * i);
    snprintf(ids + w, sizeof ids - w, "], \"fillers\": [11, 12, 13, 14]}");
    snprintf(p, sizeof p, "%s/m.json", tmp);
    write_task(p, ids);
    ps_error err;
    ps_v4_task t;
    REQUIRE_OK(ps_v4_task_load(&t, p, mix4, 256, 4096, &err), &err);
    ps_batch b;
    REQUIRE_OK(ps_batch_alloc(&b, 5, t.task.seq_len, t.task.n_queries, &err), &err);
    CHECK(ps_task_generate(&t.task, 3, &b, NULL) == 0, "task generation");
    int ok[10], ok2[10];
    double lp[10], lp2[10];
    CHECK_OK(ps_v4_eval(m, &t, &b, 2, NULL, ok, lp, &err), &err);
    /* by hand: map, one forward of all 5, score */
    ps_batch mb;
    REQUIRE_OK(ps_batch_alloc(&mb, 5, b.T, b.max_q, &err), &err);
    for (int64_t i = 0; i < 5 * b.T; i++) mb.tokens[i] = t.ids[b.tokens[i]], mb.targets[i] = -1;
    memcpy(mb.n_q, b.n_q, 5 * sizeof *b.n_q);
    memcpy(mb.queries, b.queries, (size_t)(5 * b.max_q) * sizeof *b.queries);
    ps_v4_acts a;
    REQUIRE_OK(ps_v4_acts_create(&a, m, 5, b.T, &err), &err);
    CHECK_OK(ps_v4_forward(m, &a, mb.tokens, NULL, -1, &err), &err);
    ps_score_queries(&mb, ps_v4_logits_host(&a, &err), m->cfg.vocab_size, ok2, lp2);
    double worst = 0;
    for (int i = 0; i < 10; i++) worst = fmax(worst, fabs(lp[i] - lp2[i]) / fmax(1, fabs(lp2[i])));
    CHECK(!memcmp(ok, ok2, sizeof ok) && worst < 1e-6, "mapped eval in batches of 2 vs one forward: lp differs %.3g", worst);
    CHECK(lp[0] < 0 && lp[0] > -20, "a sane log-probability %g", lp[0]);
    ps_v4_acts_free(&a);
    ps_batch_free(&mb);
    ps_batch_free(&b);
    ps_v4_task_free(&t);
}

static int load_task(ps_v4_task *t, const char *tmp) {
    char p[4200];
    snprintf(p, sizeof p, "%s/t.json", tmp);
    write_task(p, "");
    ps_error err;
    return ps_v4_task_load(t, p, mix4, 256, 4096, &err);
}

/* The sweep the naive way (the reference of the unit path): every shift's prompts through ps_v4_eval, added
 * per residue. */
static int sweep_naive(ps_v4_model *m, const ps_v4_task *t, const ps_batch *base, int64_t P, int64_t batch, ps_residue_stats *st,
                       ps_error *err) {
    if (ps_residue_stats_init(st, P, err)) return -1;
    int64_t nq = base->B * base->max_q;
    int *ok = calloc((size_t)nq, sizeof(int));
    double *lp = calloc((size_t)nq, sizeof(double));
    int rc = ok && lp ? 0 : ps_fail(err, "out of memory");
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        rc = ps_make_shifted(base, &t->task, &fam, PS_SWEEP_PAD, P, p, 0, m->cfg.max_position_embeddings, &s, err);
        if (rc) break;
        rc = ps_v4_eval(m, t, &s.b, batch, NULL, ok, lp, err);
        if (!rc) ps_residue_stats_add(st, &s, ok, lp);
        ps_shifted_free(&s);
    }
    free(ok), free(lp);
    return rc;
}

/* The accumulator of a V4 schedule written out here from the config (the compressor's gates on every CSA/HCA
 * layer, the indexer's on CSA layers), against which the family's layout (core/gate_records.c) is checked. */
static int v4_acc_init(ps_chgate_acc *acc, const ps_v4_config *c, ps_error *err) {
    static const char *const BR[] = {"compressor", "indexer"};
    if (ps_chgate_acc_init(acc, (int)c->n_layers, 2, BR, err)) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->attn_type[l] == PS_V4_SLIDING) continue;
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t mr = c->compress_rate[l];
        const char *an = csa ? "csa" : "hca";
        if (ps_chgate_acc_set(acc, l, 0, csa ? 2 * mr : mr, c->head_dim, csa, mr, an, err) ||
            (csa && ps_chgate_acc_set(acc, l, 1, 2 * mr, c->index_head_dim, 1, mr, an, err))) {
            ps_chgate_acc_free(acc);
            return -1;
        }
    }
    return 0;
}

/* The gate statistics of the shift-0 prompts the way the instrument takes them: every unit in order
 * (ps_gate_units over the family's gate data), replayed into the accumulator of the family's layout (*layout
 * holds its branch names: the caller frees it after acc). */
static int gates_whole(ps_v4_model *m, const ps_v4_task *t, const ps_batch *base, int64_t batch, ps_chgate_acc *acc, json_t **layout,
                       ps_error *err) {
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    ps_gate_info g;
    const char *model = NULL;
    *layout = NULL;
    if (ps_gate_info_of(&rt, &g, err)) return -1;
    *layout = g.layout;
    if (!g.layout || g.ints != PS_CHGATES_RECORD_INTS || strcmp(g.records, "v4_events"))
        return ps_fail(err, "the V4 family's gate data: per-channel records of %d ints expected", PS_CHGATES_RECORD_INTS);
    ps_shifted s;
    if (ps_make_shifted(base, &t->task, &fam, PS_SWEEP_PAD, 1, 0, 0, m->cfg.max_position_embeddings, &s, err)) return -1;
    int64_t N = s.b.B, nb = ps_sweep_n_batches(N, batch), B = batch < N ? batch : N;
    int64_t *ev_off = calloc((size_t)nb + 1, sizeof(int64_t)), *al_off = calloc((size_t)nb + 1, sizeof(int64_t));
    for (int64_t u = 0; u < nb; u++) {
        int64_t nn = N - u * B < B ? N - u * B : B, ne, nf;
        ne = nf = 0;
        ps_gate_unit_size(&rt, nn, s.b.T, &ne, &nf, err);
        ev_off[u + 1] = ev_off[u] + ne, al_off[u + 1] = al_off[u] + nf;
    }
    int32_t *ev = calloc((size_t)(ev_off[nb] * PS_CHGATES_RECORD_INTS) + 1, 4);
    float *al = calloc((size_t)al_off[nb] + 1, 4);
    int rc = ps_gate_units(&rt, &s, batch, 0, nb, ev_off, al_off, ev, al, err) || ps_chgate_layout_acc(g.layout, acc, &model, err);
    if (!rc && ps_chgate_replay(acc, ev, ev_off[nb], al, al_off[nb], err)) {
        ps_chgate_acc_free(acc);
        rc = -1;
    }
    free(ev), free(al), free(ev_off), free(al_off);
    ps_shifted_free(&s);
    return rc ? -1 : 0;
}

static void test_sweep_bookkeeping(ps_v4_model *m, const ps_v4_task *t) {
    enum { N = 6, P = 4 };
    ps_batch base;
    ps_error err;
    REQUIRE_OK(ps_batch_alloc(&base, N, t->task.seq_len, t->task.n_queries, &err), &err);
    CHECK(ps_task_generate(&t->task, 1, &base, NULL) == 0, "task generation");
    /* the instrument's path: the sweep's work units (ps_sweep_units) over the V4 runtime */
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    ps_residue_stats st;
    int64_t nu = P * ps_sweep_n_batches(N, 4), n = P * N * base.max_q;
    int32_t *ok = calloc((size_t)n, 4), *rho = calloc((size_t)n, 4);
    double *lp = calloc((size_t)n, 8);
    CHECK_OK(ps_sweep_units(&rt, &base, &t->task, &fam, PS_SWEEP_PAD, P, 0, 4, 0, nu, ok, lp, rho, NULL, NULL, &err), &err);
    REQUIRE_OK(ps_residue_stats_init(&st, P, &err), &err);
    ps_residue_stats_add_items(&st, ok, lp, rho, n);
    free(ok), free(rho), free(lp);
    int64_t tot = 0;
    int same = 1;
    for (int r = 0; r < P; r++) tot += st.n[r], same &= st.n[r] == N * t->task.n_queries;
    CHECK(tot == P * N * t->task.n_queries && same, "every query visits every residue once (%lld)", (long long)tot);
    json_t *j = ps_residue_stats_json(&st, &err);
    CHECK(j && json_integer_value(json_object_get(j, "period")) == P, "curve JSON");
    json_decref(j);
    ps_residue_stats_free(&st);
    ps_batch_free(&base);
}

/* ---- the work units of a split run against the whole runs (the same bits for any split) ---- */

static int same_stats_v4(const ps_residue_stats *a, const ps_residue_stats *b) {
    int same = a->P == b->P;
    for (int64_t r = 0; same && r < a->P; r++) same = a->n[r] == b->n[r] && a->k[r] == b->k[r] && a->lp[r] == b->lp[r];
    return same;
}

static void test_units(ps_v4_model *m, const ps_v4_task *t) {
    enum { N = 7, P = 3, BATCH = 3 };
    ps_batch base;
    ps_error err;
    REQUIRE_OK(ps_batch_alloc(&base, N, t->task.seq_len, t->task.n_queries, &err), &err);
    CHECK(ps_task_generate(&t->task, 4, &base, NULL) == 0, "task generation");
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    /* the sweep: units in slices, added in order = the whole run */
    ps_residue_stats ref, st;
    REQUIRE_OK(sweep_naive(m, t, &base, P, BATCH, &ref, &err), &err);
    int64_t nb = ps_sweep_n_batches(N, BATCH), nu = P * nb, n = P * N * base.max_q;
    int32_t *ok = calloc((size_t)n, 4), *rho = calloc((size_t)n, 4);
    double *lp = calloc((size_t)n, 8);
    int64_t cuts[][2] = {{0, 2}, {2, 3}, {3, nu}};
    for (int c = 0; c < 3; c++)
        CHECK_OK(ps_sweep_units(&rt, &base, &t->task, &fam, PS_SWEEP_PAD, P, 0, BATCH, cuts[c][0], cuts[c][1], ok, lp, rho, NULL, NULL, &err), &err);
    ps_residue_stats_init(&st, P, &err);
    ps_residue_stats_add_items(&st, ok, lp, rho, n);
    CHECK(same_stats_v4(&ref, &st), "V4 sweep: units in slices, added up = the naive sweep, bit for bit");
    ps_residue_stats_free(&st);
    ps_residue_stats_free(&ref);
    free(ok), free(rho), free(lp);
    /* the knockout: slices of the unit list, recorded and added in order = the whole grid */
    int layers[] = {3, 1};
    ps_knockout_result whole, part;
    ps_knockout_spec k = {.rt = &rt, .base = &base, .task = &t->task, .fam = &fam, .P = 2, .batch = BATCH, .layers = layers,
                          .n_layers = 2, .target = PS_V4KO_RAW};
    REQUIRE_OK(ps_knockout_run(&k, &whole, &err), &err);
    int64_t ku = ps_knockout_n_units(N, BATCH, 2, 2), at[] = {0, 3, 4, ku};
    ps_knockout_result sum;
    int td[] = {3, 1}, one[] = {0};
    REQUIRE_OK(ps_grid_result_init(&sum, 2, td, 2, one, 1, &err), &err);
    for (int c = 0; c < 3; c++) {
        k.opts.unit0 = at[c], k.opts.unit1 = at[c + 1];
        CHECK_OK(ps_knockout_run(&k, &part, &err), &err);
        /* each unit's statistics belong to the slice that ran it: the slices' sums in order are the whole's */
        for (int64_t r = 0; r < 2; r++) {
            sum.clean.n[r] += part.clean.n[r], sum.clean.k[r] += part.clean.k[r];
            for (int li = 0; li < 2; li++) sum.cells[li].n[r] += part.cells[li].n[r], sum.cells[li].k[r] += part.cells[li].k[r];
        }
        ps_knockout_result_free(&part);
    }
    int same = 1;
    for (int64_t r = 0; r < 2; r++) {
        same &= sum.clean.n[r] == whole.clean.n[r] && sum.clean.k[r] == whole.clean.k[r];
        for (int li = 0; li < 2; li++) same &= sum.cells[li].n[r] == whole.cells[li].n[r] && sum.cells[li].k[r] == whole.cells[li].k[r];
    }
    CHECK(same && whole.layers[0] == 3 && whole.clean.n[0] > 0, "V4 knockout: slices of the unit list cover the grid once");
    ps_knockout_result_free(&sum);
    ps_knockout_result_free(&whole);
    /* the gates: units recorded and replayed = the whole run's accumulator */
    ps_chgate_acc acc_ref, acc;
    json_t *layout = NULL;
    REQUIRE_OK(gates_whole(m, t, &base, BATCH, &acc_ref, &layout, &err), &err);
    ps_shifted s;
    REQUIRE_OK(ps_make_shifted(&base, &t->task, &fam, PS_SWEEP_PAD, 1, 0, 0, m->cfg.max_position_embeddings, &s, &err), &err);
    int64_t ev_off[8] = {0}, al_off[8] = {0};
    for (int64_t u = 0; u < nb; u++) {
        int64_t nn = N - u * BATCH < BATCH ? N - u * BATCH : BATCH, ne, nf;
        ne = nf = 0;
        CHECK_OK(ps_gate_unit_size(&rt, nn, s.b.T, &ne, &nf, &err), &err);
        ev_off[u + 1] = ev_off[u] + ne, al_off[u + 1] = al_off[u] + nf;
    }
    int32_t *ev = calloc((size_t)(ev_off[nb] * PS_CHGATES_RECORD_INTS), 4);
    float *al = calloc((size_t)al_off[nb], 4);
    CHECK_OK(ps_gate_units(&rt, &s, BATCH, 1, nb, ev_off, al_off, ev, al, &err), &err);
    CHECK_OK(ps_gate_units(&rt, &s, BATCH, 0, 1, ev_off, al_off, ev, al, &err), &err);
    /* the accumulator written out from the schedule here: the family's layout (acc_ref's) must be the same */
    REQUIRE_OK(v4_acc_init(&acc, &m->cfg, &err), &err);
    CHECK_OK(ps_chgate_replay(&acc, ev, ev_off[nb], al, al_off[nb], &err), &err);
    json_t *a = ps_chgate_acc_to_json(&acc_ref), *b = ps_chgate_acc_to_json(&acc);
    CHECK(a && b && json_equal(a, b), "V4 gates: units recorded out of order and replayed = in order, the family's layout = the schedule's");
    CHECK_ERR(ps_chgate_replay(&acc, ev, ev_off[nb], al, al_off[nb] - 1, &err), &err, "does not fit");
    json_decref(a), json_decref(b);
    ps_chgate_acc_free(&acc);
    ps_chgate_acc_free(&acc_ref);
    json_decref(layout);
    free(ev), free(al);
    ps_shifted_free(&s);
    ps_batch_free(&base);
}

/* ---- knockout of a query head against a hand-computed mean ---- */

typedef struct {
    double *sum;
    int64_t n, count;
    const float *mean;
    int head;
    int64_t T, H, Dh;
} hand;

static int hand_sum(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    hand *h = user;
    for (int64_t b = 0; b < ev->shape[0]; b++)
        for (int64_t i = 0; i < h->n; i++) h->sum[i] += ev->data[b * h->n + i];
    h->count += ev->shape[0];
    return 0;
}

static int hand_set(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    hand *h = user;
    for (int64_t b = 0; b < ev->shape[0]; b++)
        for (int64_t t = 0; t < h->T; t++)
            for (int64_t e = 0; e < h->Dh; e++)
                ev->data[((b * h->T + t) * h->H + h->head) * h->Dh + e] = h->mean[(t * h->H + h->head) * h->Dh + e];
    return 0;
}

static void test_knockout(ps_v4_model *m, const ps_v4_task *t) {
    enum { N = 6, P = 2 };
    const ps_v4_config *c = &m->cfg;
    ps_batch base;
    ps_error err;
    REQUIRE_OK(ps_batch_alloc(&base, N, t->task.seq_len, t->task.n_queries, &err), &err);
    CHECK(ps_task_generate(&t->task, 2, &base, NULL) == 0, "task generation");
    int layers[] = {1, 3}, heads[] = {2, 0};
    ps_knockout_result r;
    ps_runtime rt; /* the knockout of a V4 checkpoint: its runtime's spec, as the instrument runs it */
    ps_v4_runtime(&rt, m, t);
    ps_knockout_spec k = {.rt = &rt, .base = &base, .task = &t->task, .fam = &fam, .P = P, .batch = N, .layers = layers,
                          .n_layers = 2, .heads = heads, .n_heads = 2, .target = PS_V4KO_HEADS};
    CHECK_OK(ps_knockout_run(&k, &r, &err), &err);
    /* cell (layer 3, head 0) by hand */
    ps_residue_stats want;
    REQUIRE_OK(ps_residue_stats_init(&want, P, &err), &err);
    int64_t H = c->n_heads, Dh = c->head_dim;
    for (int p = 0; p < P; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t->task, &fam, PS_SWEEP_PAD, P, p, 0, 4096, &s, &err), &err);
        int64_t T = s.b.T, n = T * H * Dh;
        hand h = {.sum = calloc((size_t)n, sizeof(double)), .n = n, .head = 0, .T = T, .H = H, .Dh = Dh};
        float *mean = malloc((size_t)n * sizeof(float));
        ps_hooks hk;
        ps_hooks_init(&hk);
        int ok[N * 2];
        double lp[N * 2];
        CHECK_OK(ps_v4_hooks_add(&hk, c, "layers.3.attn.q", hand_sum, &h, &err), &err);
        CHECK_OK(ps_v4_eval(m, t, &s.b, N, &hk, ok, lp, &err), &err);
        ps_hooks_free(&hk);
        for (int64_t i = 0; i < n; i++) mean[i] = (float)(h.sum[i] / (double)h.count);
        h.mean = mean;
        ps_hooks_init(&hk);
        CHECK_OK(ps_v4_hooks_add(&hk, c, "layers.3.attn.q", hand_set, &h, &err), &err);
        CHECK_OK(ps_v4_eval(m, t, &s.b, N, &hk, ok, lp, &err), &err);
        ps_hooks_free(&hk);
        ps_residue_stats_add(&want, &s, ok, lp);
        free(h.sum);
        free(mean);
        ps_shifted_free(&s);
    }
    int li3 = r.layers[0] == 3 ? 0 : 1; /* the grid's layer order (top-down) */
    const ps_residue_stats *got = &r.cells[li3 * 2 + 1]; /* layer 3, head index 1 (= 0) */
    double worst = 0;
    int same = 1;
    for (int rr = 0; rr < P; rr++) {
        same &= got->n[rr] == want.n[rr] && got->k[rr] == want.k[rr];
        worst = fmax(worst, fabs(got->lp[rr] - want.lp[rr]) / fmax(1, fabs(want.lp[rr])));
    }
    CHECK(same && worst < 1e-9, "query-head knockout = hand-computed mean replacement (lp differs %.3g)", worst);
    /* the knockout changes something, and the clean curve is the sweep's */
    double dl = 0;
    for (int rr = 0; rr < P; rr++) dl += fabs(got->lp[rr] - r.clean.lp[rr]);
    CHECK(dl > 1e-6, "knocking out a head changes the log-probabilities");
    json_t *j = ps_knockout_json(&r, "compressed", NULL, &err);
    CHECK(j && json_array_size(json_object_get(j, "cells")) == 4, "4 cells");
    json_decref(j);
    ps_residue_stats_free(&want);
    ps_knockout_result_free(&r);
    /* the per-layer targets run; layers without the target are refused */
    for (int tg = PS_V4KO_COMPRESSED; tg <= PS_V4KO_SINK; tg++) {
        int ly[1] = {tg == PS_V4KO_RAW || tg == PS_V4KO_SINK ? 0 : 1};
        k = (ps_knockout_spec){.rt = &rt, .base = &base, .task = &t->task, .fam = &fam, .P = P, .batch = 4, .layers = ly, .n_layers = 1,
                               .target = tg};
        CHECK_OK(ps_knockout_run(&k, &r, &err), &err);
        double d = 0;
        for (int rr = 0; rr < P; rr++) d += fabs(r.cells[0].lp[rr] - r.clean.lp[rr]);
        CHECK(r.n_heads == 1 && r.cells[0].n[0] == r.clean.n[0] && d > 0, "target %s: one unit per layer, changes the outcome (%g)",
              ps_v4_ko_targets[tg], d);
        ps_knockout_result_free(&r);
    }
    int sliding[1] = {0}, hca[1] = {2};
    k.layers = sliding, k.target = PS_V4KO_COMPRESSED;
    CHECK_ERR(ps_knockout_run(&k, &r, &err), &err, "layer 0", "sliding");
    ps_knockout_result_free(&r);
    k.layers = hca, k.target = PS_V4KO_INDEXER;
    CHECK_ERR(ps_knockout_run(&k, &r, &err), &err, "layer 2", "indexer");
    ps_knockout_result_free(&r);
    ps_batch_free(&base);
}

static void test_mean_topk(void) {
    /* T = 9, nW = 3, m = 3: row t sees (t + 1) / 3 entries */
    double ms[9 * 3];
    for (int t = 0; t < 9; t++) ms[t * 3 + 0] = 1.0, ms[t * 3 + 1] = 1.0, ms[t * 3 + 2] = 2.0;
    float k[9 * 2];
    ps_v4_mean_topk(ms, 9, 3, 2, 3, k);
    CHECK(k[0] == -1 && k[1] == -1, "row 0 sees nothing");
    CHECK(k[2 * 2] == 0 && k[2 * 2 + 1] == -1, "row 2 sees entry 0");
    CHECK(k[5 * 2] == 0 && k[5 * 2 + 1] == 1, "row 5: a tie goes to the lower index");
    CHECK(k[8 * 2] == 2 && k[8 * 2 + 1] == 0, "row 8: the higher score first, then the tie's lower index");
}

/* ---- gate cycling and uniform gates on the V4 runtime ---- */

static float *logits_of(ps_v4_model *m, const int32_t *tok, int64_t T) {
    ps_v4_acts a;
    ps_error err;
    if (ps_v4_acts_create(&a, m, 1, T, &err)) return NULL;
    float *out = NULL;
    if (!ps_v4_forward(m, &a, tok, NULL, -1, &err)) {
        out = malloc((size_t)(T * m->cfg.vocab_size) * sizeof(float));
        memcpy(out, ps_v4_logits_host(&a, &err), (size_t)(T * m->cfg.vocab_size) * sizeof(float));
    }
    ps_v4_acts_free(&a);
    return out;
}

static void test_cycle(ps_v4_model *m) {
    enum { T = 37 };
    int32_t tok[T];
    tu_random_tokens(tok, T, m->cfg.vocab_size, 4);
    ps_error err;
    ps_v4_layer w;
    REQUIRE_OK(ps_v4_layer_acquire(m, 1, &w, &err), &err);
    int64_t na = 4 * 2 * m->cfg.head_dim, ni = 4 * 2 * m->cfg.index_head_dim;
    float *ape0 = malloc((size_t)na * 4), *iape0 = malloc((size_t)ni * 4);
    memcpy(ape0, w.c_ape, (size_t)na * 4);
    memcpy(iape0, w.i_ape, (size_t)ni * 4);
    float *l0 = logits_of(m, tok, T);
    CHECK_OK(ps_v4_gate_cycle(m, 1, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, 3, &err), &err);
    CHECK(!memcmp(w.c_ape + 0, ape0 + 1 * 2 * m->cfg.head_dim, (size_t)(2 * m->cfg.head_dim) * 4), "ape'[0] = ape[(0 - 3) mod 4]");
    float *l1 = logits_of(m, tok, T);
    CHECK(l0 && l1 && memcmp(l0, l1, (size_t)(T * 256) * 4), "cycling by 3 changes the logits");
    CHECK_OK(ps_v4_gate_cycle(m, 1, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, -3, &err), &err);
    float *l2 = logits_of(m, tok, T);
    CHECK(!memcmp(w.c_ape, ape0, (size_t)na * 4) && !memcmp(w.i_ape, iape0, (size_t)ni * 4) && l2 &&
              !memcmp(l0, l2, (size_t)(T * 256) * 4),
          "cycling by k then -k restores the model bit for bit");
    CHECK_OK(ps_v4_gate_cycle(m, 1, PS_V4_CYCLE_COMPRESSOR, 4, &err), &err);
    CHECK(!memcmp(w.c_ape, ape0, (size_t)na * 4), "k = rate is the identity");
    CHECK_ERR(ps_v4_gate_cycle(m, 0, PS_V4_CYCLE_COMPRESSOR, 1, &err), &err, "sliding");
    CHECK_ERR(ps_v4_gate_cycle(m, 2, PS_V4_CYCLE_INDEXER, 1, &err), &err, "no indexer");
    ps_v4_layer_release(m, 1);
    free(ape0), free(iape0), free(l0), free(l1), free(l2);
}

/* a lazily loaded model: the cycled layer stays pinned, so the roll survives the forward's unloading */
static void test_cycle_lazy(ps_v4_model *eager) {
    enum { T = 37 };
    int32_t tok[T];
    tu_random_tokens(tok, T, 256, 6);
    ps_error err;
    ps_v4_model m;
    REQUIRE_OK(ps_v4_model_load(&m, mix4, 1, &err), &err);
    float *l0 = logits_of(&m, tok, T);
    CHECK_OK(ps_v4_gate_cycle(&m, 3, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, 1, &err), &err);
    CHECK_OK(ps_v4_gate_cycle(eager, 3, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, 1, &err), &err);
    float *l1 = logits_of(&m, tok, T), *l1e = logits_of(eager, tok, T), *l1b = logits_of(&m, tok, T);
    CHECK(l0 && l1 && l1e && l1b && memcmp(l0, l1, (size_t)(T * 256) * 4) && !memcmp(l1, l1e, (size_t)(T * 256) * 4) &&
              !memcmp(l1, l1b, (size_t)(T * 256) * 4),
          "lazy model: the cycled layer stays cycled over forwards (= the eager model's logits)");
    CHECK_OK(ps_v4_gate_cycle(&m, 3, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, -1, &err), &err);
    CHECK_OK(ps_v4_gate_cycle(eager, 3, PS_V4_CYCLE_COMPRESSOR | PS_V4_CYCLE_INDEXER, -1, &err), &err);
    float *l2 = logits_of(&m, tok, T);
    CHECK(l2 && !memcmp(l0, l2, (size_t)(T * 256) * 4), "lazy model: k then -k restores the logits bit for bit");
    free(l0), free(l1), free(l1e), free(l1b), free(l2);
    ps_v4_model_free(&m);
}

static void test_uniform_gates(ps_v4_model *m, const ps_v4_task *t) {
    ps_error err;
    const ps_v4_config *c = &m->cfg;
    for (int l = 1; l < 4; l++) {
        ps_v4_layer w;
        REQUIRE_OK(ps_v4_layer_acquire(m, l, &w, &err), &err);
        int csa = c->attn_type[l] == PS_V4_CSA;
        int64_t cw = (csa ? 2 : 1) * c->head_dim, mr = c->compress_rate[l];
        memset(w.c_wgate, 0, (size_t)(cw * c->hidden_size) * 4);
        for (int64_t i = 0; i < mr * cw; i++) w.c_ape[i] = 0.37f;
        if (csa) {
            memset(w.i_wgate, 0, (size_t)(2 * c->index_head_dim * c->hidden_size) * 4);
            for (int64_t i = 0; i < mr * 2 * c->index_head_dim; i++) w.i_ape[i] = -1.5f;
        }
        ps_v4_layer_release(m, l);
    }
    ps_batch base;
    REQUIRE_OK(ps_batch_alloc(&base, 3, t->task.seq_len, t->task.n_queries, &err), &err);
    CHECK(ps_task_generate(&t->task, 5, &base, NULL) == 0, "task generation");
    ps_chgate_acc acc;
    json_t *layout = NULL;
    REQUIRE_OK(gates_whole(m, t, &base, 2, &acc, &layout, &err), &err);
    /* layer 1 CSA m 4 (8 slots), layer 2 HCA m 8 (8 slots = the rate), layer 3 CSA m 4 */
    double mg[64], worst = 0;
    int checked = 0;
    for (int l = 1; l < 4; l++)
        for (int b = 0; b < 2; b++) {
            const ps_chgate_slot *s = &acc.g[l * 2 + b];
            if (!s->S) continue;
            int64_t want = c->attn_type[l] == PS_V4_CSA ? 2 * c->compress_rate[l] : c->compress_rate[l];
            CHECK(s->S == want, "layer %d: %lld slots", l, (long long)s->S);
            for (int64_t ch = -1; ch < s->d; ch++) {
                ps_chgate_stat st;
                ps_chgate_stat_of(&acc, l, b, ch, mg, &st);
                worst = fmax(worst, fmax(fabs(st.N_static - (double)want), fabs(st.N_input - (double)want)));
                checked++;
            }
        }
    CHECK(checked == 32 + 16 + 32 + 32 + 16 + 5 && worst < 1e-4, "uniform gates: N_static = N_input = slots (HCA: the rate), worst %.3g over %d", worst,
          checked);
    CHECK(acc.g[2 * 2].n_windows == 3 * (t->task.seq_len / 8) && acc.g[1 * 2].n_windows == 3 * (t->task.seq_len / 4 - 1),
          "windows pooled: HCA all, CSA all but window 0");
    json_t *j = ps_chgate_acc_to_json(&acc);
    json_t *l1 = json_array_get(json_object_get(j, "layers"), 0), *po = json_object_get(json_array_get(json_object_get(l1, "branches"), 0), "pooled");
    CHECK(json_integer_value(json_object_get(l1, "layer")) == 1 && !strcmp(json_string_value(json_object_get(po, "label")), "diffuse") &&
              json_array_size(json_object_get(po, "mean_gate")) == 8,
          "per-channel gates JSON");
    json_decref(j);
    ps_chgate_acc_free(&acc);
    json_decref(layout);
    ps_batch_free(&base);
}

/* ---- the controlled model's channel attention ---- */

static void test_controlled_v4(void) {
    ps_config c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 2, c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_CSA, c.local_window = 3;
    ps_model m;
    tu_random_model(&m, &c, 21, 0.5f);
    ps_error err;
    enum { T = 30 };
    int32_t tok[T];
    tu_random_tokens(tok, T, c.vocab_size, 22);
    ps_acts a;
    REQUIRE_OK(ps_acts_create(&a, m.ctx, &c, 1, T, false, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    float *l0 = malloc((size_t)(T * c.vocab_size) * 4), *p0 = malloc((size_t)m.n_params * 4);
    memcpy(l0, a.p.logits, (size_t)(T * c.vocab_size) * 4);
    memcpy(p0, m.params, (size_t)m.n_params * 4);
    CHECK_OK(ps_gate_cycle(&m, 1, -1, PS_CYCLE_KEY | PS_CYCLE_VALUE, PS_CYCLE_GATE, 2, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    CHECK(memcmp(l0, a.p.logits, (size_t)(T * c.vocab_size) * 4), "v4 gate cycling changes the logits");
    CHECK_OK(ps_gate_cycle(&m, 1, -1, PS_CYCLE_KEY | PS_CYCLE_VALUE, PS_CYCLE_GATE, -2, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, NULL, &err), &err);
    CHECK(!memcmp(p0, m.params, (size_t)m.n_params * 4) && !memcmp(l0, a.p.logits, (size_t)(T * c.vocab_size) * 4),
          "v4 gate cycling by 2 then -2: the same parameters and logits, bit for bit");
    CHECK_ERR(ps_gate_cycle(&m, 1, -1, PS_CYCLE_KEY, PS_CYCLE_PAYLOAD, 1, &err), &err, "shared by the slots");
    CHECK_ERR(ps_gate_cycle(&m, 1, -1, PS_CYCLE_VALUE, PS_CYCLE_GATE, 1, &err), &err, "one compressor");
    /* a uniform gate: N = 2m per channel */
    for (int l = 0; l < 2; l++) {
        ps_layer_params w = ps_model_layer(&m, m.params, l);
        memset(w.c_wgate, 0, (size_t)(2 * c.head_dim * c.d_model) * 4);
        for (int64_t i = 0; i < c.rate * 2 * c.head_dim; i++) w.c_ape[i] = 0.5f;
    }
    ps_chgate_acc acc;
    ps_hooks h;
    ps_hooks_init(&h);
    REQUIRE_OK(ps_chgate_init_model(&acc, &c, &err), &err);
    CHECK_OK(ps_chgate_watch_model(&acc, &h, &c, &err), &err);
    CHECK_OK(ps_forward(&m, &a, tok, &h, &err), &err);
    double mg[16], worst = 0;
    for (int l = 0; l < 2; l++)
        for (int64_t ch = -1; ch < c.head_dim; ch++) {
            ps_chgate_stat st;
            ps_chgate_stat_of(&acc, l, 0, ch, mg, &st);
            worst = fmax(worst, fmax(fabs(st.N_static - 8), fabs(st.N_input - 8)));
        }
    CHECK(worst < 1e-4 && acc.g[0].n_windows == T / 4 - 1, "channel attention, uniform gate: N = 2m = 8 (worst %.3g), %lld windows", worst,
          (long long)acc.g[0].n_windows);
    ps_hooks_free(&h);
    ps_chgate_acc_free(&acc);
    ps_acts_free(&a);
    free(l0), free(p0);
    ps_model_free(&m);
}

/* the knockout grid on the channel attention: its compressed entries replaced by a hand-computed mean */
typedef struct {
    double *sum;
    float *mean;
    int64_t n, count;
} cmean;

static int cm_sum(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    cmean *x = user;
    for (int64_t b = 0; b < ev->shape[0]; b++)
        for (int64_t i = 0; i < x->n; i++) x->sum[i] += ev->data[b * x->n + i];
    x->count += ev->shape[0];
    return 0;
}
static int cm_set(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    cmean *x = user;
    for (int64_t b = 0; b < ev->shape[0]; b++) memcpy(ev->data + b * x->n, x->mean, (size_t)x->n * 4);
    return 0;
}

static void test_controlled_knockout(void) {
    ps_config c = tu_config(PS_ATTN_CHANNEL);
    c.n_layers = 2, c.n_kv_heads = 1, c.rate = 4, c.v4_mode = PS_V4_MODE_HCA, c.local_window = 4, c.vocab_size = 40;
    ps_model m;
    tu_random_model(&m, &c, 31, 0.5f);
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 32, .n_keys = 10, .n_values = 10, .n_fillers = 4, .n_pairs = 3, .key_len = 1,
                 .value_len = 1, .gap_min = 0, .gap_max = 2, .query_gap = 6, .n_queries = 2};
    ps_error err;
    ps_batch base;
    REQUIRE_OK(ps_batch_alloc(&base, 5, t.seq_len, t.n_queries, &err), &err);
    CHECK(ps_task_generate(&t, 8, &base, NULL) == 0, "task generation");
    int layers[1] = {0}, heads[1] = {0};
    ps_knockout_result r;
    CHECK_OK(tu_knockout_opts(&m, &base, &t, &fam, 4, 0, 5, layers, 1, heads, 1, PS_KO_COMPRESSED, NULL, &r, NULL, NULL, &err), &err);
    ps_residue_stats want;
    REQUIRE_OK(ps_residue_stats_init(&want, 4, &err), &err);
    for (int p = 0; p < 4; p++) {
        ps_shifted s;
        REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, 4, p, 0, c.max_seq_len, &s, &err), &err);
        int64_t nW = s.b.T / 4;
        cmean x = {.sum = calloc((size_t)(nW * c.head_dim), sizeof(double)), .mean = malloc((size_t)(nW * c.head_dim) * 4), .n = nW * c.head_dim};
        ps_hooks h;
        ps_hooks_init(&h);
        int ok[10];
        double lp[10];
        CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_ck", cm_sum, &x, &err), &err);
        CHECK_OK(ps_eval_shifted(&m, &s, 5, &h, ok, lp, &err), &err);
        ps_hooks_free(&h);
        for (int64_t i = 0; i < x.n; i++) x.mean[i] = (float)(x.sum[i] / (double)x.count);
        ps_hooks_init(&h);
        CHECK_OK(ps_hooks_add(&h, &c, "blocks.0.attn.hook_ck", cm_set, &x, &err), &err);
        CHECK_OK(ps_eval_shifted(&m, &s, 5, &h, ok, lp, &err), &err);
        ps_hooks_free(&h);
        ps_residue_stats_add(&want, &s, ok, lp);
        free(x.sum), free(x.mean);
        ps_shifted_free(&s);
    }
    double worst = 0;
    int same = 1;
    for (int rr = 0; rr < 4; rr++) {
        same &= r.cells[0].n[rr] == want.n[rr] && r.cells[0].k[rr] == want.k[rr];
        worst = fmax(worst, fabs(r.cells[0].lp[rr] - want.lp[rr]) / fmax(1, fabs(want.lp[rr])));
    }
    CHECK(same && worst < 1e-5, "channel attention: compressed-entry knockout = hand mean replacement (%.3g)", worst);
    ps_residue_stats_free(&want);
    ps_knockout_result_free(&r);
    ps_batch_free(&base);
    ps_model_free(&m);
}

int main(void) {
    snprintf(mix4, sizeof mix4, "%s/v4/mix4", tu_conformance_dir());
    char tmp[4096];
    tu_tempdir(tmp, sizeof tmp, "v4instr");
    ps_error err;
    ps_v4_model m;
    test_task_files(tmp);
    test_mean_topk();
    test_controlled_v4();
    test_controlled_knockout();
    if (ps_v4_model_load(&m, mix4, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(0, "loading mix4");
        CHECK_DONE();
    }
    ps_v4_task t;
    if (load_task(&t, tmp)) {
        CHECK(0, "task");
        CHECK_DONE();
    }
    test_mapped_eval(&m, tmp);
    test_sweep_bookkeeping(&m, &t);
    test_knockout(&m, &t);
    test_units(&m, &t);
    test_cycle(&m);
    test_cycle_lazy(&m);
    test_uniform_gates(&m, &t); /* last: it overwrites the compressors */
    ps_v4_task_free(&t);
    ps_v4_model_free(&m);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {}
    CHECK_DONE();
}
