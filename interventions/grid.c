/* grid.c — the cell-grid engine (grid.h). */
#include "interventions/grid.h"

#include "interventions/ko_model.h"
#include "interventions/units.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/ops.h"

/* ---- the controlled model's runtime ---- */

void ps_runtime_model(ps_runtime *rt, const ps_model *m) { ps_runtime_wrap_model(rt, m); }

/* ---- results and units ---- */

void ps_grid_result_free(ps_grid_result *r) {
    ps_residue_stats_free(&r->clean);
    ps_residue_stats_free(&r->ref);
    if (r->cells)
        for (int64_t i = 0; i < (int64_t)r->n_layers * r->n_heads; i++) ps_residue_stats_free(&r->cells[i]);
    free(r->cells);
    free(r->layers);
    free(r->heads);
    memset(r, 0, sizeof *r);
}

int ps_grid_result_init(ps_grid_result *r, int64_t P, const int *layers_topdown, int n_layers, const int *cells, int n_cells,
                        ps_error *err) {
    memset(r, 0, sizeof *r);
    if (n_layers < 1 || n_cells < 1) return ps_fail(err, "a grid needs layers and cells (%d layers, %d cells)", n_layers, n_cells);
    r->P = P;
    r->n_layers = n_layers;
    r->n_heads = n_cells;
    r->layers = malloc((size_t)n_layers * sizeof(int));
    r->heads = malloc((size_t)n_cells * sizeof(int));
    r->cells = calloc((size_t)n_layers * (size_t)n_cells, sizeof *r->cells);
    if (!r->layers || !r->heads || !r->cells) {
        ps_grid_result_free(r);
        return ps_fail(err, "out of memory for a grid of %d layers x %d cells", n_layers, n_cells);
    }
    memcpy(r->layers, layers_topdown, (size_t)n_layers * sizeof(int));
    memcpy(r->heads, cells, (size_t)n_cells * sizeof(int));
    int rc = ps_residue_stats_init(&r->clean, P, err);
    if (!rc) rc = ps_residue_stats_init(&r->ref, P, err);
    for (int64_t i = 0; i < (int64_t)n_layers * n_cells && !rc; i++) rc = ps_residue_stats_init(&r->cells[i], P, err);
    if (rc) ps_grid_result_free(r);
    return rc;
}

double ps_grid_default_budget(void) {
    double b = PS_GRID_DEFAULT_BUDGET, avail = (double)ps_mem_available();
    if (avail > 0 && avail / 4 < b) b = avail / 4;
    return b;
}

int ps_grid_last_first(const ps_runtime *rt) { return rt->family->restart != NULL; }

int64_t ps_grid_n_units(int64_t N, int64_t batch, int64_t P, int n_layers) {
    int64_t B = batch < N ? batch : N;
    return B < 1 ? 0 : P * ((N + B - 1) / B) * n_layers;
}

void ps_grid_unit(int64_t N, int64_t batch, int n_layers, int last_first, int64_t u, int64_t *p, int64_t *i0, int64_t *n,
                  int *li) {
    int64_t B = batch < N ? batch : N, nb = (N + B - 1) / B, last0 = (N - 1) / B * B, bi = u / n_layers % nb;
    *li = (int)(u % n_layers);
    *p = u / n_layers / nb;
    *i0 = last_first ? last0 - bi * B : bi * B;
    *n = N - *i0 < B ? N - *i0 : B;
}

void ps_grid_unit_weights(const ps_runtime *rt, int64_t N, int64_t batch, int64_t P, const int *layers, int n_layers, int nc,
                          int64_t L, int64_t *w, unsigned char *snap) {
    int64_t nu = ps_grid_n_units(N, batch, P, n_layers), B = batch < N ? batch : N, nb = B > 0 ? (N + B - 1) / B : 0;
    int lf = ps_grid_last_first(rt);
    for (int64_t u = 0; u < nu; u++) {
        int64_t p, i0, n;
        int li;
        ps_grid_unit(N, batch, n_layers, lf, u, &p, &i0, &n, &li);
        int64_t cell = rt->family->restart ? 64 * (L - 1 - layers[li]) / L + 8 : 64; /* restarted cells: from their layer up */
        w[u] = n * nc * cell + (li == 0 ? 64 * n : 0);
        snap[u] = 0;
        if (li == 0 && u / n_layers % nb == 0) { /* the shift's first unit: its reference pass */
            w[u] += 64 * N;
            snap[u] = 1;
        }
    }
}

void ps_grid_unit_weights_estimate(int64_t N, int64_t batch, int64_t P, int n_layers, int64_t *w, unsigned char *snap) {
    int64_t nu = ps_grid_n_units(N, batch, P, n_layers), B = batch < N ? batch : N, nb = B > 0 ? (N + B - 1) / B : 0;
    for (int64_t u = 0; u < nu; u++) {
        int64_t p, i0, n;
        int li;
        ps_grid_unit(N, batch, n_layers, 1, u, &p, &i0, &n, &li);
        w[u] = li == 0 ? 3 * 64 * n : 1; /* the batch's clean run and backward; its cells read the result */
        snap[u] = 0;
        if (li == 0 && u / n_layers % nb == 0) {
            w[u] += 64 * N;
            snap[u] = 1;
        }
    }
}

/* ---- the restart path's pieces (the controlled model) ---- */

/* Bytes of an activation set of B sequences of T tokens (as ps_acts_create allocates it): keep_all with
 * the pattern scratch (the attention restart), or without either (the layer restart). */
static double acts_bytes(const ps_config *c, int64_t B, int64_t T, bool keep_all) {
    return 4.0 * (double)ps_acts_size(c, B, T, keep_all, keep_all);
}

/* n sequences of `width` floats from rows of src_per floats into rows of dst_per floats (the first
 * `width` of each): one copy op when both are contiguous, one strided-block op otherwise. */
static int copy_seqs(ps_ctx *ctx, float *dst, int64_t dst_per, const float *src, int64_t src_per, int64_t n, int64_t width) {
    if (dst_per == width && src_per == width) return ps_copy(ctx, dst, src, n * width);
    return ps_copy_blocks(ctx, dst, dst_per, 0, src, src_per, 0, n, 1, width, 0, 0.0f);
}

/* Copy the restart state of sequences src_b0 … src_b0 + n − 1 of the clean pass (layer l's input
 * residual, q, k, v and, compressed, ck, cv; T tokens, nW windows) into sequences dst_b0 … of the
 * replica set (T2 ≤ T tokens, nW2 ≤ nW windows: the first T2 positions, the first nW2 windows), with
 * copy ops on the model's context. */
static int copy_restart(const ps_config *c, const ps_acts *src, int64_t src_b0, ps_acts *dst, int64_t dst_b0, int64_t n, int l,
                        ps_error *err) {
    ps_ctx *ctx = dst->ctx;
    int64_t T = src->T, T2 = dst->T, nW = src->nW, nW2 = dst->nW, d = c->d_model;
    int64_t qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    ps_act_ptrs s = ps_acts_layer(src, l), t = ps_acts_layer(dst, l);
    const float *rs = src->p.resid + (int64_t)l * src->B * T * d;
    float *rd = dst->p.resid + (int64_t)l * dst->B * T2 * d;
    int64_t i = src_b0, o = dst_b0;
    int rc = copy_seqs(ctx, rd + o * T2 * d, T2 * d, rs + i * T * d, T * d, n, T2 * d) ||
             copy_seqs(ctx, t.q + o * T2 * qd, T2 * qd, s.q + i * T * qd, T * qd, n, T2 * qd) ||
             copy_seqs(ctx, t.k + o * T2 * kd, T2 * kd, s.k + i * T * kd, T * kd, n, T2 * kd) ||
             copy_seqs(ctx, t.v + o * T2 * kd, T2 * kd, s.v + i * T * kd, T * kd, n, T2 * kd);
    if (!rc && c->kind == PS_ATTN_COMPRESSED && nW2 > 0)
        rc = copy_seqs(ctx, t.ck + o * nW2 * kd, nW2 * kd, s.ck + i * nW * kd, nW * kd, n, nW2 * kd) ||
             copy_seqs(ctx, t.cv + o * nW2 * kd, nW2 * kd, s.cv + i * nW * kd, nW * kd, n, nW2 * kd);
    if (rc) return ps_ctx_check(ctx, err);
    return ps_acts_copy_chunks(dst, o, src, i, n, err); /* content chunk boundaries: the sequences' chunks */
}

/* The state of one shift's run. */
typedef struct {
    const ps_grid *g;
    ps_grid_result *out;
    ps_grid_shift sh;
    ps_shifted s;
    int *ok;
    double *lp;
    int64_t N, B, maxq, nb, u_lo, u_hi;
    int last_first;
    /* restart path */
    ps_grid_restart restart;
    int64_t T2, k_cells, m_pr;
    ps_acts a, part, rep;
    int have_a, have_part, have_rep;
    int64_t *rows, *dst_rows, n_ans_max;
    float *ans_logits;
    /* the cells that run, [n_layers · n_cells] top-down (NULL: all); a layer's masked cells in order */
    unsigned char *mask;
    int *sel;
    /* an estimate: the cells' log-probs of one batch, the clean outcomes kept beside them */
    double *cell_lp, *clean_lp;
    int *clean_ok;
} run_state;

#define CELL_ON(st, li, ci) (!(st)->mask || (st)->mask[(int64_t)(li) * (st)->g->n_cells + (ci)])

#define UNIT(st, p, bi, li) ((((p) * (st)->nb + (bi)) * (st)->g->n_layers) + (li))
#define IN(st, u) ((u) >= (st)->u_lo && (u) < (st)->u_hi)

static void record_set(run_state *st, ps_residue_stats *rs, int64_t unit, int cell, int64_t first, const ps_shifted *set) {
    ps_residue_stats_add(rs, set, st->ok, st->lp);
    if (st->g->record) st->g->record(st->g->record_user, unit, cell, first, set, st->ok, st->lp);
}

/* The reference run's outcomes (st->ok, st->lp) of a batch (the set, its unit's): into the result's `ref` and,
 * as cell PS_GRID_REF, to `record`. */
static void record_ref(run_state *st, int64_t unit, const ps_shifted *set) {
    ps_residue_stats_add(&st->out->ref, set, st->ok, st->lp);
    if (st->g->record) st->g->record(st->g->record_user, unit, PS_GRID_REF, 0, set, st->ok, st->lp);
}

/* The view of prompts [i0, i0 + n) of the shift. */
static ps_shifted view_of(const run_state *st, int64_t i0, int64_t n) {
    ps_shifted v = st->s;
    v.b = ps_batch_view(&st->s.b, i0, n);
    v.residue = st->s.residue + i0 * st->maxq;
    return v;
}

/* The outcomes of the set (prompts [prompt0, prompt0 + set->b.B) of the shift) from their logits
 * [set->b.B, T, V] (host) into st->ok, st->lp: the spec's scoring, or the answers' (ps_score_queries). */
static void score_logits(run_state *st, const ps_shifted *set, int64_t prompt0, const float *logits) {
    const ps_grid_spec *sp = st->g->spec;
    int64_t V = st->g->rt->family->vocab(st->g->rt);
    if (sp->score) sp->score(sp->self, &st->sh, set, prompt0, logits, V, st->ok, st->lp);
    else ps_score_queries(&set->b, logits, V, st->ok, st->lp);
}

/* The same from the logits of an activation set run on exactly those prompts. */
static int score_acts(run_state *st, ps_acts *a, const ps_shifted *set, int64_t prompt0, ps_error *err) {
    if (!st->g->spec->score) return ps_acts_score(a, &set->b, st->ok, st->lp, err);
    const float *lg = ps_acts_logits_host(a, err);
    if (!lg) return -1;
    score_logits(st, set, prompt0, lg);
    return 0;
}

/* One full forward per cell (any family): the cells of layer index li on the batch view (prompts from i0). */
static int cells_full(run_state *st, int64_t unit, int li, const ps_shifted *sv, int64_t i0, ps_acts *use, ps_error *err) {
    const ps_grid *g = st->g;
    int rc = 0;
    for (int ci = 0; ci < g->n_cells && !rc; ci++) {
        if (!CELL_ON(st, li, ci)) continue;
        ps_hooks h;
        ps_hooks_init(&h);
        rc = g->spec->cell(g->spec->self, g->rt, &st->sh, li, ci, 0, 0, i0, &h, err);
        if (!rc) {
            if (use) { /* the controlled model: the batch's own activation set */
                rc = g->rt->family->forward(g->rt, use, sv->b.tokens, &h, -1, err);
                if (!rc) rc = score_acts(st, use, sv, i0, err);
            } else
                rc = ps_eval_mapped(g->rt, &sv->b, sv->b.B > 0 ? sv->b.B : 1, &h, st->ok, st->lp, err);
        }
        ps_hooks_free(&h);
        if (!rc) record_set(st, &st->out->cells[li * g->n_cells + ci], unit, li * g->n_cells + ci, 0, sv);
    }
    return rc;
}

/* The restart path: groups of k_cells cells × m_pr prompts restarted at layer l from the kept state of
 * `use` (the batch view sv, prompts from i0): at its attention (PS_GRID_RESTART_ATTENTION: the kept
 * residual, q, k, v, ck, cv; the answer rows only, which go into the batch's own logits at their own
 * positions for scoring) or at its input residual (PS_GRID_RESTART_LAYER: every row's logits, scored
 * per replica). Each replica r = sequences [r·mm, (r+1)·mm) gets cell sel[h0 + r]'s hooks. */
static int cells_restart(run_state *st, int64_t unit, int li, const ps_shifted *sv, int64_t i0, ps_acts *use, ps_error *err) {
    const ps_grid *g = st->g;
    const ps_model *m = ps_runtime_controlled(g->rt);
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = m->ctx;
    int l = st->out->layers[li], rc = 0, at_attn = st->restart == PS_GRID_RESTART_ATTENTION;
    int64_t n = use->B, T = use->T, T2 = st->T2, maxq = st->maxq, V = c->vocab_size, d = c->d_model;
    /* the layer's cells that run, in order: cell sel[h0 + r] is replica r of a group */
    int ns = 0;
    for (int ci = 0; ci < g->n_cells; ci++)
        if (CELL_ON(st, li, ci)) st->sel[ns++] = ci;
    for (int h0 = 0; h0 < ns && !rc; h0 += (int)st->k_cells) {
        int kk = ns - h0 < st->k_cells ? ns - h0 : (int)st->k_cells;
        for (int64_t b0 = 0; b0 < n && !rc; b0 += st->m_pr) {
            int64_t mm = n - b0 < st->m_pr ? n - b0 : st->m_pr;
            /* one replica set per shift, of k_cells × m_pr sequences (re-made only if a group needs more:
             * making it again per group would fault its pages in again, once per group); a group of fewer
             * sequences uses its first kk·mm, the rest is computed and not read (what an earlier group
             * left there, or the set's initial contents) */
            if (st->have_rep && st->rep.B < kk * mm) {
                ps_acts_free(&st->rep);
                st->have_rep = 0;
            }
            if (!st->have_rep) {
                int64_t nb = st->k_cells * st->m_pr > kk * mm ? st->k_cells * st->m_pr : kk * mm;
                if ((rc = ps_acts_create(&st->rep, ctx, c, nb, T2, at_attn, err))) break;
                st->have_rep = 1;
            }
            for (int r = 0; r < kk && !rc; r++) {
                if (at_attn) rc = copy_restart(c, use, b0, &st->rep, r * mm, mm, l, err);
                else if (ps_copy(ctx, st->rep.p.resid + (int64_t)l * st->rep.B * T * d + r * mm * T * d,
                                 use->p.resid + (int64_t)l * n * T * d + b0 * T * d, mm * T * d))
                    rc = ps_ctx_check(ctx, err);
                else rc = ps_acts_copy_chunks(&st->rep, r * mm, use, b0, mm, err); /* content chunk boundaries */
            }
            ps_hooks hooks;
            ps_hooks_init(&hooks);
            for (int r = 0; r < kk && !rc; r++)
                rc = g->spec->cell(g->spec->self, g->rt, &st->sh, li, st->sel[h0 + r], r * mm, (r + 1) * mm, i0 + b0, &hooks, err);
            ps_batch sub = ps_batch_view(&sv->b, b0, mm);
            ps_shifted ss = *sv;
            ss.b = sub;
            ss.residue = sv->residue + b0 * maxq;
            if (!at_attn) { /* every row's logits, replica by replica */
                const float *lg = NULL;
                if (!rc) rc = ps_forward_from(m, &st->rep, l, &hooks, err);
                ps_hooks_free(&hooks);
                if (!rc && !(lg = ps_acts_logits_host(&st->rep, err))) rc = -1;
                for (int r = 0; r < kk && !rc; r++) {
                    score_logits(st, &ss, i0 + b0, lg + r * mm * T * V);
                    int ci = st->sel[h0 + r];
                    record_set(st, &st->out->cells[li * g->n_cells + ci], unit, li * g->n_cells + ci, b0, &ss);
                }
                continue;
            }
            /* the rows whose logits are scored: every answer token of every query; per replica, the
             * same rows of the prompts' own batch (dst_rows) */
            int64_t n_rows = 0, n_dst = 0;
            for (int r = 0; r < kk; r++)
                for (int64_t b = 0; b < mm; b++)
                    for (int64_t q = 0; q < sub.n_q[b]; q++) {
                        const ps_query *qq = &sub.queries[b * maxq + q];
                        for (int64_t t = 0; t < qq->answer_len; t++) {
                            st->rows[n_rows++] = (r * mm + b) * T2 + qq->answer_pos + t;
                            if (r == 0) st->dst_rows[n_dst++] = (b0 + b) * T + qq->answer_pos + t;
                        }
                    }
            if (!rc) rc = ps_forward_from_attention_rows(m, &st->rep, l, &hooks, st->rows, n_rows, err);
            ps_hooks_free(&hooks);
            for (int r = 0; r < kk && !rc; r++) {
                if (ps_gather_rows(ctx, st->ans_logits, st->rep.p.logits, NULL, st->rows + r * n_dst, n_dst, V) ||
                    ps_scatter_rows(ctx, use->p.logits, st->ans_logits, st->dst_rows, n_dst, V)) {
                    rc = ps_ctx_check(ctx, err);
                    break;
                }
                const float *lg = ps_acts_logits_host(use, err);
                if (!lg) {
                    rc = -1;
                    break;
                }
                score_logits(st, &ss, i0 + b0, lg + b0 * T * V);
                int ci = st->sel[h0 + r];
                record_set(st, &st->out->cells[li * g->n_cells + ci], unit, li * g->n_cells + ci, b0, &ss);
            }
        }
    }
    return rc;
}

/* Sizes and buffers of the restart path for this shift (T tokens). */
static int restart_prepare(run_state *st, double budget, ps_error *err) {
    const ps_grid *g = st->g;
    const ps_config *c = &ps_runtime_controlled(g->rt)->cfg; /* the restart path: the controlled model's acts */
    int64_t N = st->N, B = st->B, maxq = st->maxq, T = st->sh.T, V = c->vocab_size;
    int at_attn = st->restart == PS_GRID_RESTART_ATTENTION;
    /* the restarted passes stop at the last answer row (causal: nothing after it is read); from the
     * layer's input every position runs (a cell may act on any of them) */
    int64_t T2 = 1;
    for (int64_t b = 0; b < N && at_attn; b++)
        for (int64_t q = 0; q < st->s.b.n_q[b]; q++) {
            const ps_query *qq = &st->s.b.queries[b * maxq + q];
            if (qq->answer_pos + qq->answer_len > T2) T2 = qq->answer_pos + qq->answer_len;
        }
    st->T2 = T2 > T || !at_attn ? T : T2;
    /* cells per forward: k cells of one layer, each a replica of m prompts, k·m sequences in all, as many
     * as the memory budget holds (at least one cell of one prompt) */
    st->k_cells = 1, st->m_pr = B;
    double one = acts_bytes(c, 2, st->T2, at_attn) - acts_bytes(c, 1, st->T2, at_attn);
    double fixed = acts_bytes(c, 1, st->T2, at_attn) - one;
    double fit = floor((budget - fixed) / one);
    if (fit < 1) fit = 1;
    if (fit >= (double)B) {
        st->k_cells = fit / (double)B >= g->n_cells ? g->n_cells : (int64_t)(fit / (double)B);
        if (g->max_cells > 0 && st->k_cells > g->max_cells) st->k_cells = g->max_cells;
        /* groups of equal size where they can be (8 cells by 5 → 4 + 4): the replica set is made once per
         * shift, and a smaller last group runs in it (its spare replicas computed, not read) */
        int64_t ng = (g->n_cells + st->k_cells - 1) / st->k_cells;
        st->k_cells = (g->n_cells + ng - 1) / ng;
    } else
        st->m_pr = (int64_t)fit;
    if (st->k_cells > st->out->cells_per_forward) st->out->cells_per_forward = (int)st->k_cells;
    if (st->m_pr > st->out->prompts_per_forward) st->out->prompts_per_forward = st->m_pr;
    if (!at_attn) return 0; /* every row's logits: no answer rows to gather */
    int64_t ans = 1, seqs = st->k_cells * st->m_pr;
    if (g->task && !g->prompts) ans = g->task->kind == PS_TASK_KV ? g->task->value_len : 1;
    else /* a prompt set without a task: its longest answer */
        for (int64_t i = 0; i < N * maxq; i++)
            if (i % maxq < st->s.b.n_q[i / maxq] && st->s.b.queries[i].answer_len > ans) ans = st->s.b.queries[i].answer_len;
    /* sizes in double first: a corrupt task (absurd value_len) must fail here, not wrap around */
    if ((double)seqs * (double)maxq * (double)ans * 8.0 > 9e18) st->rows = NULL;
    else st->rows = malloc((size_t)(seqs * maxq * ans) * sizeof(int64_t));
    if (!st->rows)
        return ps_fail(err, "out of memory for the answer rows of %lld prompts x %lld queries x %lld answer tokens",
                       (long long)seqs, (long long)maxq, (long long)ans);
    st->n_ans_max = st->m_pr * maxq * ans; /* the answer rows of one replica */
    st->dst_rows = malloc((size_t)st->n_ans_max * sizeof(int64_t));
    if (!st->dst_rows) return ps_fail(err, "out of memory for the answer rows of %lld prompts", (long long)st->m_pr);
    st->ans_logits = ps_buf_alloc(g->rt->ctx, st->n_ans_max * V * (int64_t)sizeof(float), "a replica's answer logits", err);
    return st->ans_logits ? 0 : -1;
}

static void shift_free(run_state *st) {
    const ps_grid *g = st->g;
    if (st->have_rep) ps_acts_free(&st->rep);
    if (st->have_part) ps_acts_free(&st->part);
    if (st->have_a) ps_acts_free(&st->a);
    st->have_rep = st->have_part = st->have_a = 0;
    free(st->rows);
    free(st->dst_rows);
    if (st->ans_logits) ps_buf_free(g->rt->ctx, st->ans_logits, st->n_ans_max * g->rt->family->vocab(g->rt) * (int64_t)sizeof(float));
    st->rows = st->dst_rows = NULL;
    st->ans_logits = NULL;
    if (g->spec->shift_end) g->spec->shift_end(g->spec->self, g->rt);
    if (!g->prompts) ps_shifted_free(&st->s); /* a given prompt set is the caller's */
}

/* An estimate's batch: every cell of every layer from one call of the spec, recorded per unit of the
 * slice as if each cell had been run (ok: the clean outcome; an estimate has no accuracy). */
static int estimate_batch(run_state *st, int64_t p, int64_t bi, const ps_shifted *sv, ps_acts *use, ps_error *err) {
    const ps_grid *g = st->g;
    int nl = g->n_layers, nc = g->n_cells;
    int64_t nq = sv->b.B * st->maxq;
    memcpy(st->clean_lp, st->lp, (size_t)nq * sizeof(double));
    memcpy(st->clean_ok, st->ok, (size_t)nq * sizeof(int));
    if (g->spec->estimate(g->spec->self, g->rt, &st->sh, sv, use, st->clean_lp, st->cell_lp, err)) return -1;
    for (int li = 0; li < nl; li++) {
        if (!IN(st, UNIT(st, p, bi, li))) continue;
        for (int ci = 0; ci < nc; ci++) {
            if (!CELL_ON(st, li, ci)) continue;
            memcpy(st->ok, st->clean_ok, (size_t)nq * sizeof(int));
            memcpy(st->lp, st->cell_lp + ((int64_t)li * nc + ci) * nq, (size_t)nq * sizeof(double));
            record_set(st, &st->out->cells[li * nc + ci], UNIT(st, p, bi, li), li * nc + ci, 0, sv);
        }
    }
    return 0;
}

/* One shift: the reference pass, the sources, then per batch its clean run and its units' cells. */
static int run_shift(run_state *st, int64_t p, double budget, ps_error *err) {
    const ps_grid *g = st->g;
    const ps_runtime *rt = g->rt;
    int nl = g->n_layers, rc = 0;
    int64_t N = st->N, B = st->B, nb = st->nb, last0 = (N - 1) / B * B;
    if (UNIT(st, p + 1, 0, 0) <= st->u_lo || UNIT(st, p, 0, 0) >= st->u_hi) return 0; /* no unit of this shift here */
    memset(&st->s, 0, sizeof st->s);
    if (g->prompts) st->s = *g->prompts;
    else if (ps_make_shifted(g->base, g->task, g->fam, PS_SWEEP_PAD, g->P, p, g->seed, rt->max_pos, &st->s, err)) return -1;
    st->sh = (ps_grid_shift){.p = p, .s = &st->s, .N = N, .T = st->s.b.T, .layers = st->out->layers, .n_layers = nl};
    int64_t T = st->sh.T;
    /* the controlled model keeps every batch's clean state (the restart reads it; the reference pass's
     * last batch is not run again) */
    int keep = rt->family->restart != NULL, keep_all = g->spec->restart != PS_GRID_RESTART_LAYER; /* the layer restart reads the residual only */
    if (keep && st->restart) rc = restart_prepare(st, budget, err);
    if (!rc && keep) {
        rc = ps_acts_create(&st->a, rt->ctx, &ps_runtime_controlled(rt)->cfg, B, T, keep_all, err);
        st->have_a = !rc;
        if (!rc && N - last0 != B) {
            rc = ps_acts_create(&st->part, rt->ctx, &ps_runtime_controlled(rt)->cfg, N - last0, T, keep_all, err);
            st->have_part = !rc;
        }
    }
    /* pass 1: the reference pass over every prompt of the shift (or the reference tokens), collecting
     * the sources */
    ps_hooks ref;
    ps_hooks_init(&ref);
    if (!rc) rc = g->spec->sources(g->spec->self, rt, &st->sh, &ref, err);
    for (int64_t i0 = 0; i0 < N && !rc; i0 += B) {
        int64_t n = N - i0 < B ? N - i0 : B;
        if (keep) {
            ps_acts *use = i0 == last0 && st->have_part ? &st->part : &st->a;
            rc = rt->family->forward(rt, use, (g->ref_tokens ? g->ref_tokens : st->s.b.tokens) + i0 * T, &ref, -1, err);
            int64_t u0 = UNIT(st, p, st->last_first ? (last0 - i0) / B : i0 / B, 0);
            if (!rc && g->ref_tokens && IN(st, u0)) { /* the reference run's outcomes */
                ps_shifted sv = view_of(st, i0, n);
                if (!(rc = score_acts(st, use, &sv, i0, err))) record_ref(st, u0, &sv);
            }
        } else {
            /* a runtime without kept state scores the clean run here (or the reference run: its tokens in
             * the prompts' view), batches in order */
            ps_shifted sv = view_of(st, i0, n);
            int64_t bi = i0 / B;
            if (g->ref_tokens) sv.b.tokens = (int32_t *)g->ref_tokens + i0 * T;
            rc = ps_eval_mapped(rt, &sv.b, sv.b.B > 0 ? sv.b.B : 1, &ref, st->ok, st->lp, err);
            if (!rc && IN(st, UNIT(st, p, bi, 0))) {
                if (g->ref_tokens) record_ref(st, UNIT(st, p, bi, 0), &sv);
                else record_set(st, &st->out->clean, UNIT(st, p, bi, 0), -1, 0, &sv);
            }
        }
    }
    ps_hooks_free(&ref);
    if (!rc) rc = g->spec->sources_done(g->spec->self, rt, &st->sh, err);
    /* pass 2: per batch, its clean outcomes and the cells of its units; the controlled model from the
     * last batch (pass 1 left its clean activations in place, unless it ran other tokens) */
    for (int64_t bi = 0; bi < nb && !rc; bi++) {
        if (UNIT(st, p, bi + 1, 0) <= st->u_lo || UNIT(st, p, bi, 0) >= st->u_hi) continue; /* no unit of this batch here */
        int64_t i0 = st->last_first ? last0 - bi * B : bi * B, n = N - i0 < B ? N - i0 : B;
        ps_shifted sv = view_of(st, i0, n);
        ps_acts *use = NULL;
        if (keep) {
            use = i0 == last0 && st->have_part ? &st->part : &st->a;
            if (i0 != last0 || g->ref_tokens) rc = rt->family->forward(rt, use, sv.b.tokens, NULL, -1, err);
            /* an estimate needs the clean scores of every batch it visits */
            if (!rc && (IN(st, UNIT(st, p, bi, 0)) || g->spec->estimate) && !(rc = score_acts(st, use, &sv, i0, err)) &&
                IN(st, UNIT(st, p, bi, 0)))
                record_set(st, &st->out->clean, UNIT(st, p, bi, 0), -1, 0, &sv);
        } else if (g->ref_tokens && IN(st, UNIT(st, p, bi, 0))) { /* pass 1 ran the reference tokens: the clean run */
            rc = ps_eval_mapped(rt, &sv.b, sv.b.B > 0 ? sv.b.B : 1, NULL, st->ok, st->lp, err);
            if (!rc) record_set(st, &st->out->clean, UNIT(st, p, bi, 0), -1, 0, &sv);
        }
        if (!rc && g->spec->estimate) {
            rc = estimate_batch(st, p, bi, &sv, use, err);
            continue;
        }
        for (int li = 0; li < nl && !rc; li++) {
            if (!IN(st, UNIT(st, p, bi, li))) continue;
            rc = st->restart ? cells_restart(st, UNIT(st, p, bi, li), li, &sv, i0, use, err)
                             : cells_full(st, UNIT(st, p, bi, li), li, &sv, i0, use, err);
        }
    }
    shift_free(st);
    return rc;
}

void ps_grid_sort_topdown(int *layers, int n) {
    for (int i = 1; i < n; i++) /* insertion sort, largest first */
        for (int j = i; j > 0 && layers[j] > layers[j - 1]; j--) {
            int t = layers[j];
            layers[j] = layers[j - 1];
            layers[j - 1] = t;
        }
}

int ps_grid_run(const ps_grid *g, ps_grid_result *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    if (g->n_layers < 1 || g->n_cells < 1) return ps_fail(err, "knockout grid: no layers or no heads selected");
    if (g->batch < 1) return ps_fail(err, "knockout grid: batch %lld must be >= 1", (long long)g->batch);
    if (!g->spec || !g->spec->sources || !g->spec->sources_done || !(g->spec->cell || g->spec->estimate))
        return ps_fail(err, "a grid needs a spec with its sources and cells");
    /* visit layers top-down */
    int *td = malloc((size_t)g->n_layers * sizeof(int));
    if (!td) return ps_fail(err, "out of memory");
    memcpy(td, g->layers, (size_t)g->n_layers * sizeof(int));
    ps_grid_sort_topdown(td, g->n_layers);
    int rc = ps_grid_result_init(out, g->P, td, g->n_layers, g->cells, g->n_cells, err);
    free(td);
    if (rc) return -1;
    const ps_batch *pr = g->prompts ? &g->prompts->b : g->base;
    run_state st = {.g = g, .out = out, .N = pr->B, .maxq = pr->max_q};
    st.B = g->batch < st.N ? g->batch : st.N;
    st.nb = st.B > 0 ? (st.N + st.B - 1) / st.B : 0;
    st.last_first = ps_grid_last_first(g->rt);
    st.restart = !g->naive && g->rt->family->restart && !g->spec->estimate ? g->spec->restart : PS_GRID_RESTART_NONE;
    if (g->spec->estimate && !g->rt->family->restart) {
        ps_grid_result_free(out);
        return ps_fail(err, "an estimated grid needs the %s runtime's kept activations (this family has none)", g->rt->family->name);
    }
    if (g->spec->score && !g->rt->family->restart) {
        ps_grid_result_free(out);
        return ps_fail(err, "a grid with its own scoring needs the controlled model's logits (the %s runtime scores its answers only)",
                       g->rt->family->name);
    }
    if (g->ref_tokens && g->spec->estimate) {
        ps_grid_result_free(out);
        return ps_fail(err, "an estimated grid takes its sources from its own prompts (no reference tokens)");
    }
    int64_t n_shift = g->prompts ? 1 : g->P; /* a prompt set without shifts is one */
    st.u_lo = g->unit0;
    st.u_hi = g->unit1 > 0 ? g->unit1 : n_shift * st.nb * g->n_layers;
    double budget = g->mem_bytes > 0 ? g->mem_bytes : ps_grid_default_budget();
    int64_t nq = st.N * st.maxq > 0 ? st.N * st.maxq : 1;
    st.ok = malloc((size_t)nq * sizeof(int));
    st.lp = malloc((size_t)nq * sizeof(double));
    st.sel = malloc((size_t)g->n_cells * sizeof(int));
    if (!st.ok || !st.lp || !st.sel)
        rc = ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)st.N, (long long)st.maxq);
    if (!rc && g->cell_mask) { /* the caller's layer order into the engine's (top-down) */
        st.mask = calloc((size_t)g->n_layers * (size_t)g->n_cells, 1);
        if (!st.mask) rc = ps_fail(err, "out of memory for the cell mask");
        for (int i = 0; i < g->n_layers && !rc; i++) {
            int li = 0;
            while (out->layers[li] != g->layers[i]) li++;
            memcpy(st.mask + (int64_t)li * g->n_cells, g->cell_mask + (int64_t)i * g->n_cells, (size_t)g->n_cells);
        }
    }
    if (!rc && g->spec->estimate) {
        int64_t bq = st.B * st.maxq > 0 ? st.B * st.maxq : 1;
        st.cell_lp = malloc((size_t)g->n_layers * (size_t)g->n_cells * (size_t)bq * sizeof(double));
        st.clean_lp = malloc((size_t)bq * sizeof(double));
        st.clean_ok = malloc((size_t)bq * sizeof(int));
        if (!st.cell_lp || !st.clean_lp || !st.clean_ok)
            rc = ps_fail(err, "out of memory for the estimates of %d x %d cells on %lld queries", g->n_layers, g->n_cells, (long long)bq);
    }
    int64_t per = 1 + (int64_t)g->n_layers * g->n_cells, total = n_shift * per;
    for (int64_t p = 0; p < n_shift && !rc; p++) {
        rc = run_shift(&st, p, budget, err);
        if (!rc && g->progress && g->progress((p + 1) * per, total, g->progress_user))
            rc = ps_fail(err, "cancelled after shift %lld of %lld (%lld of %lld cells)", (long long)(p + 1), (long long)n_shift,
                         (long long)((p + 1) * per), (long long)total);
    }
    free(st.ok);
    free(st.lp);
    free(st.sel);
    free(st.mask);
    free(st.cell_lp);
    free(st.clean_lp);
    free(st.clean_ok);
    return rc;
}
