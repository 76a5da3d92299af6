#include "interventions/knockout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "tasks/tasks.h"

void ps_knockout_result_free(ps_knockout_result *r) {
    ps_residue_stats_free(&r->clean);
    if (r->cells)
        for (int64_t i = 0; i < (int64_t)r->n_layers * r->n_heads; i++) ps_residue_stats_free(&r->cells[i]);
    free(r->cells);
    free(r->layers);
    free(r->heads);
    memset(r, 0, sizeof *r);
}

/* Means of one shift: per selected layer and replaced array (k/v, ck/cv or all four), [npos, nkv, hd] on
 * the model's context: summed over the prompts in double by an op, then divided into floats. */
typedef struct {
    int n_arr;            /* 2 (k/v or ck/cv) or 4 */
    ps_hook_point pt[4];  /* which arrays, in the order the forward fires them */
    int64_t npos[4];
    int64_t off[4];       /* floats into one layer's block of sums / means */
    int64_t per_layer;    /* floats of one layer's block (all arrays) */
    double *sum;          /* [n_layers, per_layer] */
    float *mean;          /* [n_layers, per_layer] */
} means;

static float *act_array(const ps_act_ptrs *p, ps_hook_point pt) {
    switch (pt) {
    case PS_HOOK_K: return p->k;
    case PS_HOOK_V: return p->v;
    case PS_HOOK_CK: return p->ck;
    default: return p->cv;
    }
}

/* Register, for every replaced array of layer `l` (index li of the means), the mean-replacement action of
 * KV head `head` on sequences [seq0, seq1): the same public action a user registers (PS_ACT_SET from the
 * mean [npos, nkv, hd]). The naive path registers one per cell on the whole batch; the batched path one
 * per replica of a group. */
static int add_knockout(ps_hooks *h, const ps_config *c, const means *mn, int li, int l, int head, int64_t seq0, int64_t seq1,
                        ps_error *err) {
    for (int k = 0; k < mn->n_arr; k++) {
        char name[96];
        ps_hook_name(name, sizeof name, l, mn->pt[k]);
        ps_hook_action act = {.kind = PS_ACT_SET, .head = head, .seq0 = seq0, .seq1 = seq1,
                              .src = mn->mean + (int64_t)li * mn->per_layer + mn->off[k], .src_npos = mn->npos[k]};
        if (ps_hooks_add_action(h, c, name, &act, err)) return -1;
    }
    return 0;
}

/* Bytes of a keep_all activation set of B sequences of T tokens (as ps_acts_create allocates it). */
static double acts_bytes(const ps_config *c, int64_t B, int64_t T) {
    return 4.0 * (double)ps_acts_size(c, B, T, true, true);
}

double ps_knockout_default_budget(void) {
    double b = PS_KO_DEFAULT_BUDGET, avail = (double)ps_mem_available();
    if (avail > 0 && avail / 4 < b) b = avail / 4;
    return b;
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
    return rc ? ps_ctx_check(ctx, err) : 0;
}

int64_t ps_knockout_n_units(int64_t N, int64_t batch, int64_t P, int n_layers) {
    int64_t B = batch < N ? batch : N;
    return B < 1 ? 0 : P * ((N + B - 1) / B) * n_layers;
}

void ps_knockout_unit(int64_t N, int64_t batch, int n_layers, int64_t u, int64_t *p, int64_t *i0, int64_t *n, int *li) {
    int64_t B = batch < N ? batch : N, nb = (N + B - 1) / B, last0 = (N - 1) / B * B;
    *li = (int)(u % n_layers);
    *p = u / n_layers / nb;
    *i0 = last0 - (u / n_layers % nb) * B;
    *n = N - *i0 < B ? N - *i0 : B;
}

int ps_knockout_grid(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                     int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                     int n_heads, ps_ko_target target, int naive, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err) {
    ps_knockout_opts o = {.naive = naive};
    return ps_knockout_grid_opts(m, base, task, fam, P, seed, batch, layers, n_layers, heads, n_heads, target, &o, out,
                                 progress, user, err);
}

int ps_knockout_grid_opts(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                          int64_t P, uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads,
                          int n_heads, ps_ko_target target, const ps_knockout_opts *opts, ps_knockout_result *out,
                          ps_progress_fn progress, void *user, ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_config *c = &m->cfg;
    ps_ctx *ctx = m->ctx;
    int naive = opts && opts->naive;
    int v4 = c->kind == PS_ATTN_CHANNEL; /* K = V: hook_k / hook_ck only; one full forward per cell (no answer-row restart) */
    if (v4) naive = 1;
    if ((target & PS_KO_COMPRESSED) && c->kind != PS_ATTN_COMPRESSED && !v4)
        return ps_fail(err, "--target %s: a full-attention model has no compressed entries (use --target raw)",
                       target == PS_KO_BOTH ? "both" : "compressed");
    out->P = P;
    out->n_layers = n_layers;
    out->n_heads = n_heads;
    if (n_layers < 1 || n_heads < 1) return ps_fail(err, "knockout grid: no layers or no heads selected");
    if (batch < 1) return ps_fail(err, "knockout grid: batch %lld must be >= 1", (long long)batch);
    out->layers = malloc((size_t)n_layers * sizeof(int));
    out->heads = malloc((size_t)n_heads * sizeof(int));
    out->cells = calloc((size_t)n_layers * (size_t)n_heads, sizeof *out->cells);
    if (!out->layers || !out->heads || !out->cells)
        return ps_fail(err, "out of memory for a knockout grid of %d layers x %d heads", n_layers, n_heads);
    /* visit layers top-down */
    memcpy(out->layers, layers, (size_t)n_layers * sizeof(int));
    memcpy(out->heads, heads, (size_t)n_heads * sizeof(int));
    for (int i = 0; i < n_layers; i++)
        for (int j = i + 1; j < n_layers; j++)
            if (out->layers[j] > out->layers[i]) {
                int t = out->layers[i];
                out->layers[i] = out->layers[j];
                out->layers[j] = t;
            }
    int rc = ps_residue_stats_init(&out->clean, P, err);
    for (int64_t i = 0; i < (int64_t)n_layers * n_heads && !rc; i++) rc = ps_residue_stats_init(&out->cells[i], P, err);
    if (rc) return -1;
    double budget = opts && opts->mem_bytes > 0 ? opts->mem_bytes : ps_knockout_default_budget();
    int64_t N = base->B, nkv = c->n_kv_heads, hd = c->head_dim, maxq = base->max_q, V = c->vocab_size;
    int *ok = malloc((size_t)(N * maxq) * sizeof(int));
    double *lp = malloc((size_t)(N * maxq) * sizeof(double));
    if (!ok || !lp)
        rc = ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)N, (long long)maxq);
    int64_t total = P * (1 + (int64_t)n_layers * n_heads);
    /* the work slice (all by default): unit (p, b, li) = (p · nb + b) · n_layers + li */
    int64_t nb = (N + (batch < N ? batch : N) - 1) / (batch < N ? batch : N);
    int64_t u_lo = opts ? opts->unit0 : 0, u_hi = opts && opts->unit1 > 0 ? opts->unit1 : P * nb * n_layers;
#define KO_UNIT(p_, b_, li_) (((p_) * nb + (b_)) * n_layers + (li_))
#define KO_IN(u_) ((u_) >= u_lo && (u_) < u_hi)
    ps_ko_record_fn record = opts ? opts->record : NULL;
    void *ruser = opts ? opts->record_user : NULL;
    for (int64_t p = 0; p < P && !rc; p++) {
        if (KO_UNIT(p + 1, 0, 0) <= u_lo || KO_UNIT(p, 0, 0) >= u_hi) continue; /* no unit of this shift here */
        ps_shifted s;
        if ((rc = ps_make_shifted(base, task, fam, PS_SWEEP_PAD, P, p, seed, c->max_seq_len, &s, err))) break;
        int64_t T = s.b.T, nW = ps_config_n_windows(c, T);
        means mn;
        memset(&mn, 0, sizeof mn);
        if (target & PS_KO_RAW) {
            mn.pt[mn.n_arr] = PS_HOOK_K, mn.npos[mn.n_arr++] = T;
            if (!v4) mn.pt[mn.n_arr] = PS_HOOK_V, mn.npos[mn.n_arr++] = T;
        }
        if (target & PS_KO_COMPRESSED) {
            mn.pt[mn.n_arr] = PS_HOOK_CK, mn.npos[mn.n_arr++] = nW;
            if (!v4) mn.pt[mn.n_arr] = PS_HOOK_CV, mn.npos[mn.n_arr++] = nW;
        }
        for (int k = 0; k < mn.n_arr; k++) {
            mn.off[k] = mn.per_layer;
            mn.per_layer += mn.npos[k] * nkv * hd;
        }
        int64_t n_mean = (int64_t)n_layers * mn.per_layer;
        mn.sum = ps_buf_alloc(ctx, n_mean * (int64_t)sizeof(double), "the knockout sums", err);
        mn.mean = mn.sum ? ps_buf_alloc(ctx, n_mean * (int64_t)sizeof(float), "the knockout means", err) : NULL;
        if (!mn.mean) rc = -1;
        /* The restarted passes stop at the last answer row (causal: nothing after it is read). */
        int64_t T2 = 1;
        for (int64_t b = 0; b < N; b++)
            for (int64_t q = 0; q < s.b.n_q[b]; q++) {
                const ps_query *qq = &s.b.queries[b * maxq + q];
                if (qq->answer_pos + qq->answer_len > T2) T2 = qq->answer_pos + qq->answer_len;
            }
        if (T2 > T) T2 = T;
        int64_t B = batch < N ? batch : N;
        /* Cells per forward: k cells of one layer, each a replica of m prompts, k·m sequences in all, as
         * many as the memory budget holds (at least one cell of one prompt). */
        int64_t k_cells = 1, m_pr = B;
        if (!naive) {
            double one = acts_bytes(c, 2, T2) - acts_bytes(c, 1, T2), fixed = acts_bytes(c, 1, T2) - one;
            double fit = floor((budget - fixed) / one);
            if (fit < 1) fit = 1;
            if (fit >= (double)B) {
                k_cells = fit / (double)B >= n_heads ? n_heads : (int64_t)(fit / (double)B);
                if (opts && opts->max_cells > 0 && k_cells > opts->max_cells) k_cells = opts->max_cells;
            } else
                m_pr = (int64_t)fit;
            if (k_cells > out->cells_per_forward) out->cells_per_forward = (int)k_cells;
            if (m_pr > out->prompts_per_forward) out->prompts_per_forward = m_pr;
        }
        /* everything below is created only when what precedes it succeeded; cleanup frees only what was
         * created (a zeroed ps_acts / NULL pointer is never freed as if it were live) */
        ps_acts a = {0}, part = {0}, rep = {0};
        int have_a = 0, have_part = 0, have_rep = 0;
        int64_t ans = task->kind == PS_TASK_KV ? task->value_len : 1;
        int64_t *rows = NULL, *dst_rows = NULL, n_ans_max = 0;
        float *ans_logits = NULL;
        if (!rc) {
            /* sizes in double first: a corrupt task (absurd value_len) must fail here, not wrap around */
            int64_t seqs = naive ? B : k_cells * m_pr;
            if ((double)seqs * (double)maxq * (double)ans * 8.0 > 9e18) rows = NULL;
            else rows = malloc((size_t)(seqs * maxq * ans) * sizeof(int64_t));
            if (!rows)
                rc = ps_fail(err, "out of memory for the answer rows of %lld prompts x %lld queries x %lld answer tokens",
                             (long long)seqs, (long long)maxq, (long long)ans);
            if (!rc && !naive) {
                n_ans_max = m_pr * maxq * ans; /* the answer rows of one replica */
                dst_rows = malloc((size_t)n_ans_max * sizeof(int64_t));
                ans_logits = dst_rows ? ps_buf_alloc(ctx, n_ans_max * V * (int64_t)sizeof(float), "a replica's answer logits", err) : NULL;
                if (!dst_rows) rc = ps_fail(err, "out of memory for the answer rows of %lld prompts", (long long)m_pr);
                else if (!ans_logits) rc = -1;
            }
        }
        if (!rc) {
            rc = ps_acts_create(&a, ctx, c, B, T, true, err);
            have_a = !rc;
        }
        int64_t last0 = (N - 1) / B * B; /* the first prompt of the last batch */
        if (!rc && N - last0 != B) {
            rc = ps_acts_create(&part, ctx, c, N - last0, T, true, err);
            have_part = !rc;
        }
        /* pass 1: the means over all prompts of this shift, summed on the context */
        for (int64_t i0 = 0; i0 < N && !rc; i0 += B) {
            ps_acts *use = i0 == last0 && have_part ? &part : &a;
            rc = ps_forward(m, use, s.b.tokens + i0 * T, NULL, err);
            for (int li = 0; li < n_layers && !rc; li++) {
                ps_act_ptrs lp_ = ps_acts_layer(use, out->layers[li]);
                for (int k = 0; k < mn.n_arr && !rc; k++)
                    if (ps_accumulate_seqs(ctx, mn.sum + (int64_t)li * mn.per_layer + mn.off[k], act_array(&lp_, mn.pt[k]),
                                           use->B, mn.npos[k] * nkv * hd))
                        rc = ps_ctx_check(ctx, err);
            }
        }
        if (!rc && ps_sum_to_mean(ctx, mn.mean, mn.sum, (double)N, n_mean)) rc = ps_ctx_check(ctx, err);
        /* pass 2: clean and knocked-out runs per batch, last batch first (pass 1 left its clean
         * activations in place) */
        for (int64_t i0 = last0; i0 >= 0 && !rc; i0 -= B) {
            int64_t bi = (last0 - i0) / B;
            if (KO_UNIT(p, bi + 1, 0) <= u_lo || KO_UNIT(p, bi, 0) >= u_hi) continue; /* no unit of this batch here */
            ps_acts *use = i0 == last0 && have_part ? &part : &a;
            int64_t n = use->B;
            ps_batch view = ps_batch_view(&s.b, i0, n);
            ps_shifted sv = s;
            sv.b = view;
            sv.residue = s.residue + i0 * maxq;
            if (i0 != last0) rc = ps_forward(m, use, view.tokens, NULL, err);
            if (!rc && KO_IN(KO_UNIT(p, bi, 0)) && !(rc = ps_acts_score(use, &view, ok, lp, err))) {
                ps_residue_stats_add(&out->clean, &sv, ok, lp);
                if (record) record(ruser, KO_UNIT(p, bi, 0), -1, 0, &sv, ok, lp);
            }
            for (int li = 0; li < n_layers && !rc; li++) {
                if (!KO_IN(KO_UNIT(p, bi, li))) continue;
                int l = out->layers[li];
                if (naive) {
                    /* one full forward with the mean-replacement actions per cell */
                    for (int hi = 0; hi < n_heads && !rc; hi++) {
                        ps_hooks h;
                        ps_hooks_init(&h);
                        rc = add_knockout(&h, c, &mn, li, l, heads[hi], 0, 0, err);
                        if (!rc) rc = ps_forward(m, use, view.tokens, &h, err);
                        ps_hooks_free(&h);
                        if (!rc && !(rc = ps_acts_score(use, &view, ok, lp, err))) {
                            ps_residue_stats_add(&out->cells[li * n_heads + hi], &sv, ok, lp);
                            if (record) record(ruser, KO_UNIT(p, bi, li), li * n_heads + hi, 0, &sv, ok, lp);
                        }
                    }
                    continue;
                }
                /* batched: groups of k_cells heads × m_pr prompts. Each cell's replica restarts from the
                 * clean state at layer l's attention; the restart fires the replicas' actions on layer l's
                 * k/v/ck/cv (replica r = sequences [r·mm, (r+1)·mm) gets head heads[h0 + r]). */
                for (int h0 = 0; h0 < n_heads && !rc; h0 += (int)k_cells) {
                    int kk = n_heads - h0 < k_cells ? n_heads - h0 : (int)k_cells;
                    for (int64_t b0 = 0; b0 < n && !rc; b0 += m_pr) {
                        int64_t mm = n - b0 < m_pr ? n - b0 : m_pr, Bp = kk * mm;
                        if (have_rep && rep.B != Bp) {
                            ps_acts_free(&rep);
                            have_rep = 0;
                        }
                        if (!have_rep) {
                            if ((rc = ps_acts_create(&rep, ctx, c, Bp, T2, true, err))) break;
                            have_rep = 1;
                        }
                        for (int r = 0; r < kk && !rc; r++) rc = copy_restart(c, use, b0, &rep, r * mm, mm, l, err);
                        ps_hooks hooks;
                        ps_hooks_init(&hooks);
                        for (int r = 0; r < kk && !rc; r++)
                            rc = add_knockout(&hooks, c, &mn, li, l, heads[h0 + r], r * mm, (r + 1) * mm, err);
                        /* the rows whose logits are scored: every answer token of every query; per
                         * replica, the same rows of the prompts' own batch (dst_rows) */
                        ps_batch sub = ps_batch_view(&view, b0, mm);
                        int64_t n_rows = 0, n_dst = 0;
                        for (int r = 0; r < kk; r++)
                            for (int64_t b = 0; b < mm; b++)
                                for (int64_t q = 0; q < sub.n_q[b]; q++) {
                                    const ps_query *qq = &sub.queries[b * maxq + q];
                                    for (int64_t t = 0; t < qq->answer_len; t++) {
                                        rows[n_rows++] = (r * mm + b) * T2 + qq->answer_pos + t;
                                        if (r == 0) dst_rows[n_dst++] = (b0 + b) * T + qq->answer_pos + t;
                                    }
                                }
                        if (!rc) rc = ps_forward_from_attention_rows(m, &rep, l, &hooks, rows, n_rows, err);
                        ps_hooks_free(&hooks);
                        /* score each replica: its answer rows go into the clean pass's logits (already
                         * scored) at their own positions (a row gather and scatter on the context), so
                         * the prompts' view reads them */
                        ps_shifted ss = sv;
                        ss.b = sub;
                        ss.residue = sv.residue + b0 * maxq;
                        for (int r = 0; r < kk && !rc; r++) {
                            if (ps_gather_rows(ctx, ans_logits, rep.p.logits, NULL, rows + r * n_dst, n_dst, V) ||
                                ps_scatter_rows(ctx, use->p.logits, ans_logits, dst_rows, n_dst, V)) {
                                rc = ps_ctx_check(ctx, err);
                                break;
                            }
                            const float *lg = ps_acts_logits_host(use, err);
                            if (!lg) {
                                rc = -1;
                                break;
                            }
                            ps_score_queries(&sub, lg + b0 * T * V, V, ok, lp);
                            ps_residue_stats_add(&out->cells[li * n_heads + h0 + r], &ss, ok, lp);
                            if (record)
                                record(ruser, KO_UNIT(p, bi, li), li * n_heads + h0 + r, b0, &ss, ok, lp);
                        }
                    }
                }
            }
        }
        if (have_rep) ps_acts_free(&rep);
        if (have_part) ps_acts_free(&part);
        if (have_a) ps_acts_free(&a);
        free(rows);
        free(dst_rows);
        if (ans_logits) ps_buf_free(ctx, ans_logits, n_ans_max * V * (int64_t)sizeof(float));
        ps_buf_free(ctx, mn.mean, n_mean * (int64_t)sizeof(float));
        ps_buf_free(ctx, mn.sum, n_mean * (int64_t)sizeof(double));
        ps_shifted_free(&s);
        if (progress) progress((p + 1) * (1 + (int64_t)n_layers * n_heads), total, user);
    }
#undef KO_UNIT
#undef KO_IN
    free(ok);
    free(lp);
    return rc;
}

#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)

json_t *ps_knockout_json(const ps_knockout_result *r, ps_ko_target target, ps_error *err) {
    int bad = 0;
    json_t *o = json_object(), *cells = json_array(), *clean = ps_residue_stats_json(&r->clean, err);
    if (!o || !cells || !clean) {
        json_decref(o);
        json_decref(cells);
        json_decref(clean);
        if (o && cells) return NULL; /* err already names what failed */
        ps_fail(err, "out of memory for the knockout summary");
        return NULL;
    }
    SET(o, "period", json_integer(r->P));
    SET(o, "target", json_string(target == PS_KO_RAW ? "raw" : target == PS_KO_COMPRESSED ? "compressed" : "both"));
    SET(o, "clean", clean);
    /* cells in ascending layer order */
    for (int want = -1;;) {
        int next = 1 << 30;
        for (int li = 0; li < r->n_layers; li++)
            if (r->layers[li] > want && r->layers[li] < next) next = r->layers[li];
        if (next == 1 << 30) break;
        want = next;
        int li = 0;
        while (r->layers[li] != want) li++;
        for (int hi = 0; hi < r->n_heads; hi++) {
            const ps_residue_stats *cs = &r->cells[(int64_t)li * r->n_heads + hi];
            json_t *cell = json_object(), *res = json_array();
            SET(cell, "layer", json_integer(want));
            SET(cell, "head", json_integer(r->heads[hi]));
            double sum_da = 0, sum_dn = 0, worst_da = INFINITY, worst_dn = 0, worst_ac = 0, worst_ak = 0;
            int64_t used = 0, worst = -1;
            for (int64_t rho = 0; rho < r->P; rho++) {
                json_t *e = json_object();
                double ac = ps_residue_accuracy(&r->clean, rho), ak = ps_residue_accuracy(cs, rho);
                double nc = r->clean.n[rho] ? -r->clean.lp[rho] / (double)r->clean.n[rho] : 0;
                double nk = cs->n[rho] ? -cs->lp[rho] / (double)cs->n[rho] : 0;
                SET(e, "rho", json_integer(rho));
                SET(e, "n", json_integer(cs->n[rho]));
                SET(e, "accuracy", json_real(ak));
                SET(e, "mean_nll", json_real(nk));
                SET(e, "delta_accuracy_pp", json_real(100.0 * (ak - ac)));
                SET(e, "delta_nll", json_real(nk - nc));
                bad |= json_array_append_new(res, e) != 0;
                if (cs->n[rho]) {
                    double da = 100.0 * (ak - ac), dn = nk - nc;
                    sum_da += da;
                    sum_dn += dn;
                    used++;
                    /* the residue the head hurts most: largest accuracy drop, ties by the larger NLL increase */
                    if (worst < 0 || da < worst_da - 1e-9 || (fabs(da - worst_da) <= 1e-9 && dn > worst_dn)) {
                        worst = rho;
                        worst_da = da;
                        worst_dn = dn;
                        worst_ac = ac;
                        worst_ak = ak;
                    }
                }
            }
            SET(cell, "residues", res);
            SET(cell, "mean_delta_accuracy_pp", json_real(used ? sum_da / (double)used : 0));
            SET(cell, "mean_delta_nll", json_real(used ? sum_dn / (double)used : 0));
            if (worst >= 0) {
                json_t *w = json_object();
                SET(w, "rho", json_integer(worst));
                SET(w, "clean_accuracy", json_real(worst_ac));
                SET(w, "accuracy", json_real(worst_ak));
                SET(w, "delta_accuracy_pp", json_real(worst_da));
                SET(w, "delta_nll", json_real(worst_dn));
                SET(cell, "worst_residue", w);
            } else
                SET(cell, "worst_residue", json_null());
            bad |= json_array_append_new(cells, cell) != 0;
        }
    }
    SET(o, "cells", cells);
    if (bad) {
        json_decref(o);
        ps_fail(err, "out of memory while building the knockout summary");
        return NULL;
    }
    return o;
}
