/* test_dist.c — the pieces of the scale-out that need no second process (docs/scale-out.md): the split of a
 * work list (contiguous, covering, balanced, snapped to group starts only when that is cheap); the
 * instruments' work units run in slices and added up in the one-process order giving the very bits of the
 * one-process functions (a sweep in both modes; a knockout grid batched and naive, over every way to cut
 * its work list in three; the gate statistics); partial results written as part files, read back and
 * merged, and the merge's refusals (a missing or repeated shard, parts of other runs, parts split
 * differently, a file that is not a part); and the single-rank collectives (no-ops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "scaleout/dist.h"
#include "gates/gates.h"
#include "interventions/knockout.h"
#include "scaleout/partial.h"
#include "interventions/sweep.h"
#include "testutil.h"
#include "interventions/units.h"
#include "tasks/tasks.h"

static ps_task small_task(void) {
    ps_task t = {.kind = PS_TASK_KV, .seq_len = 30, .n_keys = 6, .n_values = 6, .n_fillers = 3, .n_pairs = 3,
                 .key_len = 1, .value_len = 2, .gap_min = 0, .gap_max = 3, .query_gap = 4, .n_queries = 2};
    return t;
}

static void make_model(ps_model *m, ps_attn_kind kind, uint64_t seed) {
    ps_config c = tu_config(kind);
    c.n_layers = 3;
    c.n_kv_heads = 2;
    c.max_seq_len = 40;
    c.window = 4, c.stride = 4, c.local_window = 4;
    tu_random_model(m, &c, seed, 0.5f);
}

static int same_stats(const ps_residue_stats *a, const ps_residue_stats *b) {
    if (a->P != b->P) return 0;
    for (int64_t r = 0; r < a->P; r++)
        if (a->n[r] != b->n[r] || a->k[r] != b->k[r] || memcmp(&a->lp[r], &b->lp[r], sizeof(double))) return 0;
    return 1;
}

static void test_split(void) {
    int64_t w[40];
    unsigned char snap[40] = {0};
    for (int u = 0; u < 40; u++) w[u] = 10 + (u % 5 == 0 ? 30 : 0) + u;
    for (int u = 0; u < 40; u += 5) snap[u] = 1;
    for (int np = 1; np <= 7; np++) {
        int64_t at = 0, total = 0, most = 0;
        int tiled = 1;
        for (int u = 0; u < 40; u++) total += w[u];
        for (int p = 0; p < np; p++) {
            int64_t a, b, s = 0;
            ps_dist_split(w, NULL, 40, 0, p, np, &a, &b);
            tiled &= a == at && b >= a;
            at = b;
            for (int64_t u = a; u < b; u++) s += w[u];
            most = s > most ? s : most;
        }
        CHECK(tiled && at == 40, "%d parts: contiguous ranges covering the list", np);
        CHECK(most <= total / np + 80, "%d parts: the heaviest holds %lld of %lld", np, (long long)most, (long long)total);
        /* with a large penalty every boundary falls on a group start */
        int on_groups = 1;
        at = 0;
        for (int p = 0; p < np; p++) {
            int64_t a, b;
            ps_dist_split(w, snap, 40, 1 << 20, p, np, &a, &b);
            on_groups &= a == at && (a == 0 || a == 40 || snap[a]);
            at = b;
        }
        CHECK(on_groups && at == 40, "%d parts, large penalty: boundaries on group starts", np);
    }
    /* no penalty: snapping never moves a boundary off the balanced place */
    int64_t a0, b0, a1, b1;
    ps_dist_split(w, NULL, 40, 0, 0, 3, &a0, &b0);
    ps_dist_split(w, snap, 40, 0, 0, 3, &a1, &b1);
    CHECK(b0 == b1 || snap[b1], "penalty 0 keeps the balanced boundary (%lld vs %lld)", (long long)b0, (long long)b1);
    /* more parts than units: some are empty, all still tile */
    int64_t at = 0;
    int ok = 1;
    for (int p = 0; p < 5; p++) {
        int64_t a, b;
        ps_dist_split(w, NULL, 3, 0, p, 5, &a, &b);
        ok &= a == at && b >= a;
        at = b;
    }
    CHECK(ok && at == 3, "5 parts of 3 units tile");
}

/* The sweep's units, in any slices, then added up: ps_sweep_run's bits. */
static void test_sweep_units(ps_sweep_mode mode) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 61);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 11, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 5, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    int64_t P = 4, batch = 4, N = base.B, maxq = base.max_q, nb = ps_sweep_n_batches(N, batch), nu = P * nb;
    ps_residue_stats ref, st;
    REQUIRE_OK(ps_sweep_run(&m, &base, &t, &fam, mode, P, 7, batch, &ref, NULL, NULL, &err), &err);
    int64_t n = P * N * maxq;
    int32_t *ok = calloc((size_t)n, 4), *rho = calloc((size_t)n, 4);
    double *lp = calloc((size_t)n, 8);
    int64_t cuts[][2] = {{0, nu}, {0, 5}, {5, 6}, {6, nu}};
    ps_runtime rt_;
    ps_runtime_model(&rt_, &m);
    for (int c = 0; c < 4; c++)
        CHECK_OK(ps_sweep_units(&rt_, &base, &t, &fam, mode, P, 7, batch, cuts[c][0], cuts[c][1], ok, lp, rho, NULL, NULL, &err), &err);
    ps_residue_stats_init(&st, P, &err);
    ps_residue_stats_add_items(&st, ok, lp, rho, n);
    CHECK(same_stats(&ref, &st), "sweep (%s): units in slices, added up = ps_sweep_run, bit for bit", mode ? "move" : "pad");
    ps_residue_stats_free(&st);
    ps_residue_stats_free(&ref);
    free(ok);
    free(lp);
    free(rho);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* The knockout grid's outcomes gathered by the recorder (the command's layout, done here by hand). */
typedef struct {
    int64_t nu, maxq, N, batch;
    int nl, nh;
    int64_t *clean_off, *cell_off; /* per unit, in items */
    int32_t *rho, *cok, *kok;
    double *clp, *klp;
} ko_items;

static void ko_record(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok, const double *lp) {
    ko_items *r = user;
    int64_t maxq = set->b.max_q;
    for (int64_t i = 0; i < set->b.B; i++)
        for (int64_t q = 0; q < maxq; q++) {
            int64_t k = i * maxq + q;
            int scored = q < set->b.n_q[i] && set->residue[k] >= 0;
            if (cell < 0) {
                int64_t o = r->clean_off[unit] + first * maxq + k;
                r->rho[o] = scored ? (int32_t)set->residue[k] : -1;
                r->cok[o] = scored ? ok[k] : 0;
                r->clp[o] = scored ? lp[k] : 0;
            } else {
                int64_t n_unit = (r->cell_off[unit + 1] - r->cell_off[unit]) / (r->nh * maxq);
                int64_t o = r->cell_off[unit] + ((cell % r->nh) * n_unit + first) * maxq + k;
                r->kok[o] = scored ? ok[k] : 0;
                r->klp[o] = scored ? lp[k] : 0;
            }
        }
}

static void test_knockout_units(int naive, int max_cells) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 43);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 10, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 3, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    int layers[2] = {0, 2}, heads[2] = {1, 0}, top[2] = {2, 0};
    int64_t P = 3, batch = 4, N = base.B, maxq = base.max_q;
    ps_knockout_opts o = {.naive = naive, .max_cells = max_cells};
    ps_knockout_result ref;
    REQUIRE_OK(tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_BOTH, &o, &ref, NULL, NULL, &err),
               &err);
    ko_items it = {.nu = ps_knockout_n_units(N, batch, P, 2), .maxq = maxq, .N = N, .batch = batch, .nl = 2, .nh = 2};
    it.clean_off = calloc((size_t)it.nu + 1, 8);
    it.cell_off = calloc((size_t)it.nu + 1, 8);
    for (int64_t u = 0; u < it.nu; u++) {
        int64_t p, i0, n;
        int li;
        ps_grid_unit(N, batch, 2, 1, u, &p, &i0, &n, &li);
        it.clean_off[u + 1] = it.clean_off[u] + (li == 0 ? n * maxq : 0);
        it.cell_off[u + 1] = it.cell_off[u] + 2 * n * maxq;
    }
    it.rho = calloc((size_t)it.clean_off[it.nu], 4);
    it.cok = calloc((size_t)it.clean_off[it.nu], 4);
    it.clp = calloc((size_t)it.clean_off[it.nu], 8);
    it.kok = calloc((size_t)it.cell_off[it.nu], 4);
    it.klp = calloc((size_t)it.cell_off[it.nu], 8);
    /* cuts of the work list (18 units: 3 shifts x 3 batches x 2 layers) into three slices: inside a batch
     * (between its layers), inside a shift, on shift boundaries, one slice a single unit */
    static const int64_t CUTS[][2] = {{1, 2}, {3, 10}, {6, 12}, {7, 8}, {5, 17}, {11, 13}};
    int all_same = 1, tried = 0;
    for (int ci = 0; ci < (int)(sizeof CUTS / sizeof CUTS[0]); ci++) {
            int64_t cut[4] = {0, CUTS[ci][0], CUTS[ci][1], it.nu};
            memset(it.rho, 0xff, (size_t)it.clean_off[it.nu] * 4);
            for (int s = 0; s < 3; s++) {
                ps_knockout_opts os = o;
                os.unit0 = cut[s], os.unit1 = cut[s + 1], os.record = ko_record, os.record_user = &it;
                ps_knockout_result part;
                int rc = tu_knockout_opts(&m, &base, &t, &fam, P, 0, batch, layers, 2, heads, 2, PS_KO_BOTH, &os, &part, NULL,
                                               NULL, &err);
                CHECK_OK(rc, &err);
                ps_knockout_result_free(&part);
            }
            ps_knockout_result r;
            ps_grid_result_init(&r, P, top, 2, heads, 2, &err);
            for (int64_t u = 0; u < it.nu; u++) {
                int64_t p, i0, n;
                int li;
                ps_grid_unit(N, batch, 2, 1, u, &p, &i0, &n, &li);
                int64_t co = it.clean_off[u], ni = n * maxq;
                static int64_t rho_at;
                if (li == 0) {
                    rho_at = co;
                    ps_residue_stats_add_items(&r.clean, it.cok + co, it.clp + co, it.rho + co, ni);
                }
                for (int h = 0; h < 2; h++)
                    ps_residue_stats_add_items(&r.cells[li * 2 + h], it.kok + it.cell_off[u] + h * ni, it.klp + it.cell_off[u] + h * ni,
                                               it.rho + rho_at, ni);
            }
            int same = same_stats(&ref.clean, &r.clean);
            for (int c = 0; c < 4; c++) same &= same_stats(&ref.cells[c], &r.cells[c]);
            all_same &= same;
            tried++;
            ps_knockout_result_free(&r);
        }
    CHECK(all_same && it.nu == 18 && tried == 6, "knockout (%s, %d cells per forward): %d cuts into 3 slices, added up = the whole grid, bit for bit",
          naive ? "naive" : "batched", max_cells, tried);
    free(it.clean_off);
    free(it.cell_off);
    free(it.rho);
    free(it.cok);
    free(it.clp);
    free(it.kok);
    free(it.klp);
    ps_knockout_result_free(&ref);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* Gate statistics: recorded per batch, replayed = the accumulator fed by hooks in one pass. */
static void test_gates_units(void) {
    ps_model m;
    make_model(&m, PS_ATTN_COMPRESSED, 45);
    ps_task t = small_task();
    ps_batch base;
    ps_error err;
    ps_batch_alloc(&base, 9, t.seq_len, t.n_queries, &err);
    CHECK(ps_task_generate(&t, 2, &base, NULL) == 0, "task generation");
    ps_filler_family fam = {.name = "repeat", .n_pattern = 1, .pattern = {0}};
    ps_shifted s;
    REQUIRE_OK(ps_make_shifted(&base, &t, &fam, PS_SWEEP_PAD, 1, 0, 0, m.cfg.max_seq_len, &s, &err), &err);
    ps_gate_acc ref, acc;
    ps_hooks h;
    ps_hooks_init(&h);
    ps_gate_acc_init(&ref, &m.cfg, &err);
    ps_gate_acc_watch(&ref, &h, &m.cfg, &err);
    int *ok = malloc(9 * 2 * sizeof(int));
    double *lp = malloc(9 * 2 * sizeof(double));
    CHECK_OK(ps_eval_shifted(&m, &s, 4, &h, ok, lp, &err), &err);
    int64_t nu = ps_sweep_n_batches(9, 4), ev[4] = {0}, fl[4] = {0};
    ps_runtime rt; /* the generic gate units over the family's gate data */
    ps_runtime_model(&rt, &m);
    for (int64_t u = 0; u < nu; u++) {
        int64_t n = 9 - u * 4 < 4 ? 9 - u * 4 : 4, ne = 0, nf = 0;
        CHECK_OK(ps_gate_unit_size(&rt, n, s.b.T, &ne, &nf, &err), &err);
        ev[u + 1] = ev[u] + ne;
        fl[u + 1] = fl[u] + nf;
    }
    int32_t *events = calloc((size_t)ev[nu] * PS_GATES_EVENT_INTS, 4);
    float *alpha = calloc((size_t)fl[nu], 4);
    CHECK_OK(ps_gate_units(&rt, &s, 4, 2, 3, ev, fl, events, alpha, &err), &err);
    CHECK_OK(ps_gate_units(&rt, &s, 4, 0, 2, ev, fl, events, alpha, &err), &err);
    ps_gate_acc_init(&acc, &m.cfg, &err);
    CHECK_OK(ps_gate_acc_replay(&acc, events, ev[nu], alpha, fl[nu], &err), &err);
    int64_t na = m.cfg.n_layers * m.cfg.n_kv_heads * 2 * m.cfg.window, ne = m.cfg.n_layers * m.cfg.n_kv_heads * 2;
    CHECK(!memcmp(ref.sum_alpha, acc.sum_alpha, (size_t)na * 8) && !memcmp(ref.sum_neff, acc.sum_neff, (size_t)ne * 8) &&
              !memcmp(ref.n_windows, acc.n_windows, (size_t)(m.cfg.n_layers * m.cfg.n_kv_heads * 2) * 8),
          "gates: batches recorded out of order, replayed = the hooks' accumulator, bit for bit");
    events[1] = 7; /* a corrupt record is refused */
    ps_gate_acc_reset(&acc);
    CHECK_ERR(ps_gate_acc_replay(&acc, events, ev[nu], alpha, fl[nu], &err), &err, "does not fit");
    ps_gate_acc_free(&ref);
    ps_gate_acc_free(&acc);
    ps_hooks_free(&h);
    free(events);
    free(alpha);
    free(ok);
    free(lp);
    ps_shifted_free(&s);
    ps_batch_free(&base);
    ps_model_free(&m);
}

/* A partial result of 6 units and two arrays, split into shards. */
static void fill_part(ps_partial *p, int shard, int n, int64_t u0, int64_t u1, const char *seed) {
    ps_error err;
    int64_t per[6] = {3, 0, 2, 5, 1, 4};
    ps_partial_init(p, "sweep", 6, json_pack("{s:{s:s, s:s, s:s}, s:i}", "provenance", "model", "m", "compute", seed, "command", seed, "period", 4),
                    &err);
    p->shard = shard, p->n_shards = n, p->u0 = u0, p->u1 = u1;
    ps_partial_add(p, "ok", PS_PART_I32, per, &err);
    ps_partial_add(p, "logprob", PS_PART_F64, per, &err);
    for (int64_t u = u0; u < u1; u++)
        for (int64_t i = 0; i < per[u]; i++) {
            ((int32_t *)ps_partial_at(p, 0, u))[i] = (int32_t)(100 * u + i);
            ((double *)ps_partial_at(p, 1, u))[i] = -0.1 * (double)(100 * u + i) / 3.0;
        }
}

static void test_partial_files(void) {
    char dir[512], paths[4][600];
    ps_error err;
    tu_tempdir(dir, sizeof dir, "dist");
    int64_t cut[4] = {0, 2, 2, 6}; /* shard 1 is empty */
    for (int s = 0; s < 3; s++) {
        ps_partial p;
        fill_part(&p, s, 3, cut[s], cut[s + 1], s == 1 ? "machine B" : "machine A");
        snprintf(paths[s], sizeof paths[s], "%s/sweep.part-%d-of-3.safetensors", dir, s);
        CHECK_OK(ps_partial_write(&p, paths[s], &err), &err);
        ps_partial_free(&p);
    }
    ps_partial whole, m;
    fill_part(&whole, 0, 1, 0, 6, "x");
    const char *order[3] = {paths[2], paths[0], paths[1]};
    REQUIRE_OK(ps_partial_merge_files(order, 3, &m, &err), &err);
    int same = m.n_arr == 2 && m.u0 == 0 && m.u1 == 6;
    for (int a = 0; a < 2 && same; a++)
        same = !memcmp(m.arr[a].data, whole.arr[a].data, (size_t)(whole.arr[a].off[6] * ps_partial_type_size(whole.arr[a].type)));
    CHECK(same, "three part files (any order, one empty) merge into the whole arrays");
    CHECK(strstr(json_string_value(json_object_get(json_object_get(m.meta, "provenance"), "compute")), "merged from 3 shards"),
          "the merged provenance says so");
    ps_partial_free(&m);
    const char *two[2] = {paths[0], paths[2]};
    CHECK_ERR(ps_partial_merge_files(two, 2, &m, &err), &err, "the run has 3 shards", "missing: 1");
    const char *rep[3] = {paths[0], paths[0], paths[2]};
    CHECK_ERR(ps_partial_merge_files(rep, 3, &m, &err), &err, "both shard 0 of 3");
    /* another run: a different period */
    ps_partial o;
    fill_part(&o, 1, 3, 2, 2, "x");
    json_object_set_new(o.meta, "period", json_integer(8));
    snprintf(paths[3], sizeof paths[3], "%s/other.safetensors", dir);
    CHECK_OK(ps_partial_write(&o, paths[3], &err), &err);
    ps_partial_free(&o);
    const char *other[3] = {paths[0], paths[3], paths[2]};
    CHECK_ERR(ps_partial_merge_files(other, 3, &m, &err), &err, "parts of different runs");
    /* split differently: shard 1 claims units [3, 4) */
    fill_part(&o, 1, 3, 3, 4, "x");
    CHECK_OK(ps_partial_write(&o, paths[3], &err), &err);
    ps_partial_free(&o);
    CHECK_ERR(ps_partial_merge_files(other, 3, &m, &err), &err, "expected to start at 2");
    /* not a part file */
    FILE *f = fopen(paths[3], "w");
    fputs("hello", f);
    fclose(f);
    CHECK_ERR(ps_partial_merge_files(other, 3, &m, &err), &err, paths[3]);
    ps_partial_free(&whole);
    for (int s = 0; s < 4; s++) unlink(paths[s]);
    rmdir(dir);
}

static void test_single_rank(void) {
    ps_error err;
    double x[2] = {1.5, -2};
    int64_t k[1] = {3};
    float g[3] = {1, 2, 3};
    CHECK(ps_dist_rank() == 0 && ps_dist_size() == 1 && ps_dist_local_size() == 1, "one process: rank 0 of 1");
    CHECK(ps_dist_barrier(&err) == 0 && ps_dist_bcast(x, sizeof x, 0, &err) == 0 && ps_dist_allreduce_f64(x, 2, &err) == 0 &&
              ps_dist_allreduce_i64(k, 1, &err) == 0 && ps_dist_allreduce_buf(NULL, g, 3, &err) == 0,
          "collectives are no-ops");
    CHECK(x[0] == 1.5 && x[1] == -2 && k[0] == 3 && g[2] == 3, "and change nothing");
    ps_fail(&err, "boom");
    CHECK(ps_dist_agree(-1, &err) == -1 && !strcmp(err.msg, "boom"), "agree: this rank's own error");
    CHECK(ps_dist_agree(0, &err) == 0, "agree: success");
    char d[256];
    ps_dist_describe(d, sizeof d);
    CHECK(strstr(d, "one process") != NULL, "described as one process: %s", d);
}

int main(void) {
    test_split();
    test_sweep_units(PS_SWEEP_PAD);
    test_sweep_units(PS_SWEEP_MOVE);
    test_knockout_units(0, 0);
    test_knockout_units(0, 1);
    test_knockout_units(1, 0);
    test_gates_units();
    test_partial_files();
    test_single_rank();
    CHECK_DONE();
}
