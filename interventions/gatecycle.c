#include "interventions/gatecycle.h"

#include "core/ops.h"
#include "interventions/stats.h"
#include "tasks/tasks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The channel attention: the compressor's only per-slot parameter is its position bias ape [m, c·hd] (the
 * gate and payload projections are shared by the slots); rolling its rows by k moves the bias of token
 * offset r in a window to offset r + k (mod m), in both of CSA's series. */
static int v4_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    if (head < -1 || head >= c->n_kv_heads)
        return ps_fail(err, "--head %d: out of range (the model has %lld KV heads, 0..%lld)", head, (long long)c->n_kv_heads,
                       (long long)c->n_kv_heads - 1);
    if (!(branches & PS_CYCLE_KEY))
        return ps_fail(err, "--branch value: the channel attention has one compressor (K = V); use --branch key or both");
    if (params & PS_CYCLE_PAYLOAD)
        return ps_fail(err, "--params %s: the v4 compressor's payload projection is shared by the slots; only its position bias "
                            "(gate) is per slot",
                       params == PS_CYCLE_PAYLOAD ? "payload" : "all");
    int64_t mr = c->rate, w = ps_config_v4_series(c) * c->head_dim;
    k = ((k % mr) + mr) % mr;
    ps_layer_params p = ps_model_layer(m, m->params, layer);
    if (ps_roll_blocks(m->ctx, p.c_ape, mr, w, 0, w, k)) {
        ps_ctx_check(m->ctx, err);
        return ps_fail_prefix(err, "cycling layer %d's position bias (m = %lld): ", layer, (long long)mr);
    }
    return 0;
}

int ps_gate_cycle(ps_model *m, int layer, int head, int branches, int params, int64_t k, ps_error *err) {
    const ps_config *c = &m->cfg;
    if (c->kind == PS_ATTN_CHANNEL) return v4_cycle(m, layer, head, branches, params, k, err);
    if (c->kind != PS_ATTN_COMPRESSED) return ps_fail(err, "the model has full attention: there is no gate to cycle");
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    if (head < -1 || head >= c->n_kv_heads)
        return ps_fail(err, "--head %d: out of range (the model has %lld KV heads, 0..%lld)", head,
                       (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
    if ((params & PS_CYCLE_GATE) && c->gate == PS_GATE_UNIFORM)
        return ps_fail(err, "--params %s: the model's gate is uniform; it has no per-offset gate parameters to cycle",
                       params == PS_CYCLE_GATE ? "gate" : "all");
    if ((params & PS_CYCLE_PAYLOAD) && c->payload == PS_PAYLOAD_SHARED)
        return ps_fail(err, "--params %s: the model's payload is shared across offsets; there is nothing to cycle",
                       params == PS_CYCLE_PAYLOAD ? "payload" : "all");
    int64_t W = c->window, nkv = c->n_kv_heads, d = c->d_model, hd = c->head_dim;
    k = ((k % W) + W) % W;
    ps_layer_params p = ps_model_layer(m, m->params, layer);
    int g0 = head < 0 ? 0 : head, g1 = head < 0 ? (int)nkv : head + 1;
    /* the parameters live on the model's context: the roll is an op there (ps_roll_blocks) */
    ps_ctx *ctx = m->ctx;
    for (int br = 0; br < 2; br++) {
        if (!(branches & (br ? PS_CYCLE_VALUE : PS_CYCLE_KEY))) continue;
        for (int g = g0; g < g1; g++) {
            int bad = 0;
            if (params & PS_CYCLE_GATE)
                bad = ps_roll_blocks(ctx, br ? p.value_gate_w : p.key_gate_w, W, nkv * d, g * d, d, k) ||
                      ps_roll_blocks(ctx, br ? p.value_gate_b : p.key_gate_b, W, nkv, g, 1, k);
            if (!bad && (params & PS_CYCLE_PAYLOAD))
                bad = ps_roll_blocks(ctx, br ? p.value_payload : p.key_payload, W, nkv * hd * d, g * hd * d, hd * d, k);
            if (bad) {
                ps_ctx_check(ctx, err);
                return ps_fail_prefix(err, "cycling layer %d's per-offset parameters (W = %lld): ", layer, (long long)W);
            }
        }
    }
    return 0;
}

double ps_task_chance(const ps_task *t) {
    if (t->kind == PS_TASK_BIGRAM) return t->n_context > 0 ? 1.0 / (double)t->n_context : 0.0;
    if (t->n_values <= 0) return 0.0;
    return pow(1.0 / (double)t->n_values, (double)(t->value_len > 0 ? t->value_len : 1));
}

void ps_cycle_analysis_free(ps_cycle_analysis *a) {
    free(a->moves);
    free(a->new_dips);
    free(a->excluded);
    memset(a, 0, sizeof *a);
}

/* dips of a curve: residues at or below the midpoint of a curve whose gap is at least 5 pp */
static int64_t find_dips(const double *y, int64_t P, int *is_dip) {
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t r = 0; r < P; r++) {
        mn = fmin(mn, y[r]);
        mx = fmax(mx, y[r]);
    }
    int64_t n = 0;
    for (int64_t r = 0; r < P; r++) {
        is_dip[r] = mx - mn >= PS_PHASE_GAP_MIN_PP / 100.0 && y[r] <= (mx + mn) / 2;
        n += is_dip[r];
    }
    return n;
}

/* indices with flag set, deepest (lowest y) first, ties by index */
static int64_t sorted_by_depth(const double *y, const int *flag, int64_t P, int64_t *out) {
    int64_t n = 0;
    for (int64_t r = 0; r < P; r++)
        if (flag[r]) out[n++] = r;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++)
            if (y[out[j]] < y[out[i]] || (y[out[j]] == y[out[i]] && out[j] < out[i])) {
                int64_t t = out[i];
                out[i] = out[j];
                out[j] = t;
            }
    return n;
}

int ps_cycle_analyse(const double *before, const double *after, int64_t P, double chance, ps_cycle_analysis *out,
                     ps_error *err) {
    memset(out, 0, sizeof *out);
    out->P = P;
    out->chance = chance;
    int *db = calloc((size_t)P, sizeof(int)), *da = calloc((size_t)P, sizeof(int)), *fresh = calloc((size_t)P, sizeof(int));
    int *keep = calloc((size_t)P, sizeof(int));
    int64_t *ob = malloc((size_t)P * sizeof(int64_t)), *oa = malloc((size_t)P * sizeof(int64_t));
    out->moves = calloc((size_t)P, sizeof *out->moves);
    out->new_dips = malloc((size_t)P * sizeof(int64_t));
    out->excluded = malloc((size_t)P * sizeof(int64_t));
    int rc = 0;
    if (!db || !da || !fresh || !keep || !ob || !oa || !out->moves || !out->new_dips || !out->excluded) {
        rc = ps_fail(err, "out of memory for the comparison of two curves of %lld residues", (long long)P);
        ps_cycle_analysis_free(out);
        goto done;
    }
    double thr = chance + PS_NEAR_CHANCE_PP / 100.0, mb = 0, ma = 0;
    for (int64_t r = 0; r < P; r++) {
        mb += before[r] / (double)P;
        ma += after[r] / (double)P;
        keep[r] = !(before[r] <= thr && after[r] <= thr);
        if (!keep[r]) out->excluded[out->n_excluded++] = r;
    }
    out->before_near_chance = mb <= thr;
    out->after_near_chance = ma <= thr;
    find_dips(before, P, db);
    find_dips(after, P, da);
    for (int64_t r = 0; r < P; r++) fresh[r] = da[r] && !db[r];
    int64_t nb = sorted_by_depth(before, db, P, ob), na = sorted_by_depth(after, fresh, P, oa);
    for (int64_t i = 0; i < nb; i++) {
        ps_dip_move *mv = &out->moves[out->n_moves++];
        mv->before = ob[i];
        mv->acc_before = before[ob[i]];
        mv->still_dips = da[ob[i]];
        mv->after = i < na ? oa[i] : -1;
        mv->acc_after = i < na ? after[oa[i]] : after[ob[i]];
    }
    for (int64_t i = nb; i < na; i++) out->new_dips[out->n_new++] = oa[i];
    out->best_shift = ps_best_shift_masked(before, after, out->n_excluded ? keep : NULL, P, &out->best_shift_correlation);
    out->best_shift_signed = out->best_shift > P / 2 ? out->best_shift - P : out->best_shift;
done:
    free(db);
    free(da);
    free(fresh);
    free(keep);
    free(ob);
    free(oa);
    return rc;
}

int64_t ps_signed_mod(int64_t d, int64_t P) {
    int64_t m = ((d % P) + P) % P;
    return m > P / 2 ? m - P : m;
}

/* the live residue with the largest hurt (ties: the smallest rho); -1 when none is live */
static int64_t worst_live(const double *hurt, const unsigned char *dead, int64_t P) {
    int64_t w = -1;
    for (int64_t r = 0; r < P; r++)
        if (!(dead && dead[r]) && (w < 0 || hurt[r] > hurt[w])) w = r;
    return w;
}

void ps_head_shift_measure(const double *hurt_before, const double *hurt_after, const unsigned char *dead, int64_t P, int64_t k,
                           double min_hurt, ps_head_shift *out) {
    memset(out, 0, sizeof *out);
    out->worst_before = worst_live(hurt_before, dead, P);
    out->worst_after = worst_live(hurt_after, dead, P);
    out->hurt_before = out->worst_before >= 0 ? hurt_before[out->worst_before] : 0;
    out->hurt_after = out->worst_after >= 0 ? hurt_after[out->worst_after] : 0;
    if (out->worst_before < 0 || !(out->hurt_before >= min_hurt)) {
        out->status = PS_HEAD_NO_PROFILE;
        return;
    }
    if (out->worst_after < 0 || !(out->hurt_after >= min_hurt)) {
        out->status = PS_HEAD_LOST;
        return;
    }
    out->status = PS_HEAD_MEASURED;
    out->shift_worst = ps_signed_mod(out->worst_after - out->worst_before, P);
    double best = -1;
    int64_t bs = 0;
    /* candidate shifts in the order 0, 1, -1, 2, -2, ...: ties go to the smallest |s|, then the positive */
    for (int64_t i = 0; i < P; i++) {
        int64_t s = (i + 1) / 2 * (i % 2 ? 1 : -1);
        s = ps_signed_mod(s, P);
        double c = 0;
        for (int64_t r = 0; r < P; r++) {
            int64_t q = ((r - s) % P + P) % P;
            if (dead && (dead[r] || dead[q])) continue;
            c += fmax(0, hurt_after[r]) * fmax(0, hurt_before[q]);
        }
        if (c > best + 1e-12) {
            best = c;
            bs = s;
        }
    }
    out->shift_xcorr = bs;
    out->error_worst = ps_signed_mod(out->shift_worst - k, P);
    out->error_xcorr = ps_signed_mod(out->shift_xcorr - k, P);
}

/* ---- the per-head measure (--measure knockout) ---- */

json_t *ps_gatecycle_per_head_json(const ps_grid_result *kb, const ps_grid_result *ka, int64_t k, double chance,
                                   double min_hurt, ps_error *err) {
    int nh = kb->n_heads;
    const int *heads = kb->heads;
    json_t *out = NULL;
    int64_t P = kb->P;
    if (ka->n_heads != nh || ka->P != P || kb->n_layers != 1 || ka->n_layers != 1) {
        ps_fail(err, "the per-head measure's two knockout grids differ in their heads or period");
        return NULL;
    }
    double *hb = malloc((size_t)P * sizeof(double)), *ha = malloc((size_t)P * sizeof(double));
    unsigned char *dead = calloc((size_t)P, 1);
    if (!hb || !ha || !dead) {
        ps_fail(err, "out of memory for the per-head measure");
        goto done;
    }
    json_t *ex = json_array(), *hl = json_array();
    for (int64_t r = 0; r < P; r++) {
        double cb = ps_residue_accuracy(&kb->clean, r), ca = ps_residue_accuracy(&ka->clean, r);
        int db = !(cb > chance + PS_NEAR_CHANCE_PP / 100), da = !(ca > chance + PS_NEAR_CHANCE_PP / 100);
        dead[r] = (unsigned char)(db && da);
        if (dead[r]) json_array_append_new(ex, json_integer(r));
    }
    int n_meas = 0, n_lost = 0, n_none = 0, exact_w = 0, exact_x = 0;
    double abs_w = 0, abs_x = 0;
    for (int i = 0; i < nh; i++) {
        for (int64_t r = 0; r < P; r++) {
            double v = -100 * (ps_residue_accuracy(&kb->cells[i], r) - ps_residue_accuracy(&kb->clean, r));
            hb[r] = isfinite(v) ? v : 0;
            v = -100 * (ps_residue_accuracy(&ka->cells[i], r) - ps_residue_accuracy(&ka->clean, r));
            ha[r] = isfinite(v) ? v : 0;
        }
        ps_head_shift hs;
        ps_head_shift_measure(hb, ha, dead, P, k, min_hurt, &hs);
        json_t *e = json_object(), *pb = json_array(), *pa = json_array();
        for (int64_t r = 0; r < P; r++) {
            json_array_append_new(pb, json_real(hb[r]));
            json_array_append_new(pa, json_real(ha[r]));
        }
        static const char *const ST[] = {"measured", "no_profile", "lost"};
        json_object_set_new(e, "head", json_integer(heads[i]));
        json_object_set_new(e, "status", json_string(ST[hs.status]));
        json_object_set_new(e, "hurt_before_pp", pb);
        json_object_set_new(e, "hurt_after_pp", pa);
        json_object_set_new(e, "worst_before", hs.worst_before >= 0 ? json_integer(hs.worst_before) : json_null());
        json_object_set_new(e, "worst_after", hs.worst_after >= 0 ? json_integer(hs.worst_after) : json_null());
        int m = hs.status == PS_HEAD_MEASURED;
        json_object_set_new(e, "shift_worst", m ? json_integer(hs.shift_worst) : json_null());
        json_object_set_new(e, "error_worst", m ? json_integer(hs.error_worst) : json_null());
        json_object_set_new(e, "shift_xcorr", m ? json_integer(hs.shift_xcorr) : json_null());
        json_object_set_new(e, "error_xcorr", m ? json_integer(hs.error_xcorr) : json_null());
        json_array_append_new(hl, e);
        if (m) {
            n_meas++;
            abs_w += llabs(hs.error_worst);
            abs_x += llabs(hs.error_xcorr);
            exact_w += hs.error_worst == 0;
            exact_x += hs.error_xcorr == 0;
        }
        n_lost += hs.status == PS_HEAD_LOST;
        n_none += hs.status == PS_HEAD_NO_PROFILE;
    }
    json_t *sum = json_object();
    json_object_set_new(sum, "n_heads", json_integer(nh));
    json_object_set_new(sum, "n_measured", json_integer(n_meas));
    json_object_set_new(sum, "n_lost", json_integer(n_lost));
    json_object_set_new(sum, "n_no_profile", json_integer(n_none));
    json_object_set_new(sum, "mean_abs_error_worst", n_meas ? json_real(abs_w / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_worst", n_meas ? json_real((double)exact_w / n_meas) : json_null());
    json_object_set_new(sum, "mean_abs_error_xcorr", n_meas ? json_real(abs_x / n_meas) : json_null());
    json_object_set_new(sum, "fraction_exact_xcorr", n_meas ? json_real((double)exact_x / n_meas) : json_null());
    out = json_object();
    json_object_set_new(out, "measure", json_string("knockout"));
    json_object_set_new(out, "target", json_string("compressed"));
    json_object_set_new(out, "min_hurt_pp", json_real(min_hurt));
    json_object_set_new(out, "excluded_residues", ex);
    json_object_set_new(out, "heads", hl);
    json_object_set_new(out, "summary", sum);
done:
    free(hb);
    free(ha);
    free(dead);
    return out;
}

/* ---- the controlled model's gate cycling ops (grid.c's table) ---- */

static int usage(ps_error *err) {
    if (err) err->usage = 1;
    return -1;
}

int ps_cycle_choice(const char *flag, const char *v, const char *const *choices, int *idx, ps_error *err) {
    int n = 0;
    for (; choices[n]; n++)
        if (!strcmp(choices[n], v)) {
            *idx = n;
            return 0;
        }
    char list[512];
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    ps_fail(err, "%s %s: expected %s", flag, v, list);
    return usage(err);
}

int ps_model_gc_check(const ps_runtime *rt, ps_cycle_req *q, ps_error *err) {
    static const char *const BRANCHES[] = {"key", "value", "both", NULL}, *const PARAMS[] = {"gate", "payload", "all", NULL};
    ps_model *m = rt->model;
    const ps_config *c = &m->cfg;
    int bi = 2, pi = -1;
    if ((q->branch && ps_cycle_choice("--branch", q->branch, BRANCHES, &bi, err)) || (q->params && ps_cycle_choice("--params", q->params, PARAMS, &pi, err)))
        return -1;
    int64_t layer = q->layer, head = q->head;
    int branches = bi == 0 ? PS_CYCLE_KEY : bi == 1 ? PS_CYCLE_VALUE : PS_CYCLE_KEY | PS_CYCLE_VALUE;
    int params = pi < 0 ? 0 : pi == 0 ? PS_CYCLE_GATE : pi == 1 ? PS_CYCLE_PAYLOAD : PS_CYCLE_GATE | PS_CYCLE_PAYLOAD;
    /* a layer or head the model does not have is a usage error; without --model, say which model that is */
    const char *note = q->note ? q->note : "";
    if (c->kind != PS_ATTN_FULL && (layer < 0 || layer >= c->n_layers)) {
        if (note[0]) {
            char valid[64];
            if (c->n_layers == 1) snprintf(valid, sizeof valid, "--layer 0");
            else snprintf(valid, sizeof valid, "--layer 0..%lld", (long long)c->n_layers - 1);
            ps_fail(err, "--layer %lld: out of range: no --model given, so this is %s, which has %lld layer%s: valid %s (or pass --model DIR)",
                    (long long)layer, note, (long long)c->n_layers, c->n_layers == 1 ? "" : "s", valid);
        } else
            ps_fail(err, "--layer %lld: out of range (the model has %lld layers, 0..%lld)", (long long)layer, (long long)c->n_layers,
                    (long long)c->n_layers - 1);
        return usage(err);
    }
    if (c->kind != PS_ATTN_FULL && head >= c->n_kv_heads) {
        if (note[0])
            ps_fail(err, "--head %lld: out of range: no --model given, so this is %s, which has %lld KV heads: valid --head 0..%lld (or pass --model DIR)",
                    (long long)head, note, (long long)c->n_kv_heads, (long long)c->n_kv_heads - 1);
        else
            ps_fail(err, "--head %lld: out of range (the model has %lld KV heads, 0..%lld)", (long long)head, (long long)c->n_kv_heads,
                    (long long)c->n_kv_heads - 1);
        return usage(err);
    }
    /* default: every per-offset parameter the model has (gates and payloads move together) */
    if (!params && c->kind == PS_ATTN_COMPRESSED) {
        if (c->gate != PS_GATE_UNIFORM) params |= PS_CYCLE_GATE;
        if (c->payload != PS_PAYLOAD_SHARED) params |= PS_CYCLE_PAYLOAD;
        if (!params)
            return ps_fail(err, "--model %s: the model's gate is uniform and its payload shared: it has no per-offset parameters to cycle",
                           q->model_dir);
    }
    if (!params) params = PS_CYCLE_GATE;
    /* the cycle's preconditions (a bad model fails before any sweep): cycling by 0 checks them and changes nothing */
    if (ps_gate_cycle(m, (int)layer, (int)head, branches, params, 0, err)) {
        if (strncmp(err->msg, "--", 2)) return ps_fail_prefix(err, "--model %s: ", q->model_dir);
        return usage(err);
    }
    if (q->per_head && c->kind != PS_ATTN_COMPRESSED) {
        ps_fail(err, "--measure knockout: the model has no compressed cache to cycle");
        return usage(err);
    }
    q->branches = branches;
    q->params_mask = params;
    return 0;
}

int ps_model_gc_cycle(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err) {
    return ps_gate_cycle(rt->model, (int)q->layer, (int)q->head, q->branches, q->params_mask, k, err);
}

int ps_model_gc_meta(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err) {
    const ps_config *c = &ps_runtime_controlled(rt)->cfg;
    int64_t layer = q->layer, head = q->head, nkv = c->n_kv_heads;
    int branches = q->branches, params = q->params_mask;
    json_t *hl = json_array();
    for (int64_t g = head < 0 ? 0 : head; g < (head < 0 ? nkv : head + 1); g++) json_array_append_new(hl, json_integer(g));
    const char *br = branches == 3 ? "both" : branches == 1 ? "key" : "value";
    const char *pa = params == 3 ? "all" : params == 1 ? "gate" : "payload";
    json_t *cy = json_pack("{s:I, s:I, s:o, s:o, s:s, s:s}", "layer", (json_int_t)layer, "shift", (json_int_t)q->shift, "head",
                           head < 0 ? json_string("all") : json_integer(head), "heads", hl, "branch", br, "params", pa);
    /* the summary line: what was cycled */
    char line[512], hs[64];
    if (head >= 0) snprintf(hs, sizeof hs, "KV head %lld", (long long)head);
    else if (nkv == 1) snprintf(hs, sizeof hs, "KV head 0 (all)");
    else snprintf(hs, sizeof hs, "KV heads 0-%lld (all)", (long long)nkv - 1);
    if (c->kind == PS_ATTN_CHANNEL) /* the channel attention: its position bias is the per-slot parameter */
        snprintf(line, sizeof line, "cycled layer %lld: the compressor's position bias (ape) rolled by %lld (mod the rate %lld)",
                 (long long)layer, (long long)q->shift, (long long)c->rate);
    else
        snprintf(line, sizeof line, "cycled layer %lld, %s, %s %s by %lld", (long long)layer, hs, branches == 3 ? "key and value" : br,
                 params == 3 ? "gates and payloads" : params == 1 ? "gates" : "payloads", (long long)q->shift);
    if (!cy || json_object_set_new(meta, "cycle", cy) || json_object_set_new(meta, "summary", json_string(line)) ||
        json_object_set_new(meta, "summary_means", json_false()) ||
        json_object_set_new(meta, "gates_without_payloads",
                            json_boolean(params == PS_CYCLE_GATE && c->kind == PS_ATTN_COMPRESSED && c->payload != PS_PAYLOAD_SHARED)))
        return ps_fail(err, "out of memory for the cycle's description");
    return 0;
}
