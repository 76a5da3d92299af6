#include "gates/chgates.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "gates/gates.h"

int ps_chgate_acc_init(ps_chgate_acc *acc, int n_layers, int n_branches, const char *const *branch_names, ps_error *err) {
    memset(acc, 0, sizeof *acc);
    if (n_layers < 1 || n_branches < 1 || n_branches > PS_CHGATE_MAX_BRANCHES)
        return ps_fail(err, "per-channel gate statistics: %d layers x %d branches", n_layers, n_branches);
    acc->n_layers = n_layers;
    acc->n_branches = n_branches;
    for (int b = 0; b < n_branches; b++) acc->branch[b] = branch_names[b];
    acc->g = calloc((size_t)n_layers * (size_t)n_branches, sizeof *acc->g);
    if (!acc->g) return ps_fail(err, "out of memory for the gate statistics of %d layers", n_layers);
    return 0;
}

int ps_chgate_acc_set(ps_chgate_acc *acc, int layer, int branch, int64_t S, int64_t d, int skip_first, int64_t rate,
                      const char *attention, ps_error *err) {
    ps_chgate_slot *s = &acc->g[layer * acc->n_branches + branch];
    free(s->sum_alpha);
    free(s->sum_neff);
    memset(s, 0, sizeof *s);
    if (S < 1 || d < 1 || S > 1 << 20 || d > 1 << 20 || S * d > (int64_t)1 << 28)
        return ps_fail(err, "layer %d: a gate of %lld slots x %lld channels", layer, (long long)S, (long long)d);
    s->sum_alpha = calloc((size_t)(S * d), sizeof(double));
    s->sum_neff = calloc((size_t)d, sizeof(double));
    if (!s->sum_alpha || !s->sum_neff) {
        free(s->sum_alpha), free(s->sum_neff);
        memset(s, 0, sizeof *s);
        return ps_fail(err, "out of memory for the gate statistics of layer %d", layer);
    }
    s->S = S, s->d = d, s->skip_first = skip_first, s->rate = rate;
    snprintf(s->attention, sizeof s->attention, "%s", attention ? attention : "");
    return 0;
}

void ps_chgate_acc_free(ps_chgate_acc *acc) {
    if (acc->g)
        for (int i = 0; i < acc->n_layers * acc->n_branches; i++) {
            free(acc->g[i].sum_alpha);
            free(acc->g[i].sum_neff);
        }
    free(acc->g);
    memset(acc, 0, sizeof *acc);
}

void ps_chgate_acc_reset(ps_chgate_acc *acc) {
    for (int i = 0; i < acc->n_layers * acc->n_branches; i++) {
        ps_chgate_slot *s = &acc->g[i];
        if (!s->S) continue;
        memset(s->sum_alpha, 0, (size_t)(s->S * s->d) * sizeof(double));
        memset(s->sum_neff, 0, (size_t)s->d * sizeof(double));
        s->n_windows = 0;
    }
}

void ps_chgate_acc_add(ps_chgate_acc *acc, int layer, int branch, const float *alpha, int64_t B, int64_t nW) {
    ps_chgate_slot *s = &acc->g[layer * acc->n_branches + branch];
    if (!s->S) return;
    int64_t S = s->S, d = s->d;
    for (int64_t b = 0; b < B; b++)
        for (int64_t w = s->skip_first ? 1 : 0; w < nW; w++) {
            const float *a = alpha + (b * nW + w) * S * d;
            for (int64_t k = 0; k < S * d; k++) s->sum_alpha[k] += a[k];
            for (int64_t c = 0; c < d; c++) {
                double h = 0;
                for (int64_t k = 0; k < S; k++) {
                    double p = a[k * d + c];
                    if (p > 0) h -= p * log(p);
                }
                s->sum_neff[c] += exp(h);
            }
            s->n_windows++;
        }
}

static const char *label_of(double ns, double ni) {
    ps_gate_stat st;
    st.N_static = ns;
    st.N_input = ni;
    return ps_gate_label(&st);
}

void ps_chgate_stat_of(const ps_chgate_acc *acc, int layer, int branch, int64_t c, double *mg, ps_chgate_stat *out) {
    const ps_chgate_slot *s = &acc->g[layer * acc->n_branches + branch];
    int64_t S = s->S, d = s->d, n = s->n_windows;
    memset(out, 0, sizeof *out);
    if (c >= 0) {
        for (int64_t k = 0; k < S; k++) mg[k] = n ? s->sum_alpha[k * d + c] / (double)n : 0.0;
        out->N_input = n ? s->sum_neff[c] / (double)n : 0.0;
    } else {
        double ni = 0;
        for (int64_t k = 0; k < S; k++) {
            double t = 0;
            for (int64_t j = 0; j < d; j++) t += s->sum_alpha[k * d + j];
            mg[k] = n ? t / (double)n / (double)d : 0.0;
        }
        for (int64_t j = 0; j < d; j++) ni += s->sum_neff[j];
        out->N_input = n ? ni / (double)n / (double)d : 0.0;
    }
    out->N_static = n ? ps_effective_offsets(mg, S) : 0.0;
    out->peak = ps_gate_peak(mg, S);
    out->label = label_of(out->N_static, out->N_input);
}

#define SET(o, k, v) (bad |= json_object_set_new((o), (k), (v)) != 0)
#define APP(a, v) (bad |= json_array_append_new((a), (v)) != 0)

static json_t *reals(const double *x, int64_t n, int *badp) {
    int bad = 0;
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) APP(a, json_real(x[i]));
    *badp |= bad || !a;
    return a;
}

json_t *ps_chgate_acc_to_json(const ps_chgate_acc *acc) {
    int bad = 0;
    json_t *root = json_object(), *layers = json_array();
    SET(root, "gate", json_string("per_channel"));
    double *mg = NULL;
    for (int l = 0; l < acc->n_layers && !bad; l++) {
        const ps_chgate_slot *s0 = NULL;
        for (int b = 0; b < acc->n_branches; b++)
            if (acc->g[l * acc->n_branches + b].S && !s0) s0 = &acc->g[l * acc->n_branches + b];
        if (!s0) continue;
        json_t *lo = json_object(), *brs = json_array();
        SET(lo, "layer", json_integer(l));
        SET(lo, "attention", json_string(s0->attention));
        SET(lo, "rate", json_integer(s0->rate));
        SET(lo, "slots", json_integer(s0->S));
        SET(lo, "window_0_left_out", json_boolean(s0->skip_first));
        for (int b = 0; b < acc->n_branches; b++) {
            const ps_chgate_slot *s = &acc->g[l * acc->n_branches + b];
            if (!s->S) continue;
            int64_t S = s->S, d = s->d;
            free(mg);
            mg = malloc((size_t)S * sizeof(double));
            json_t *bo = json_object(), *po = json_object(), *cm = json_object(), *lab = json_object(), *pc = json_array();
            json_t *per = json_object(), *pmg = json_array(), *pns = json_array(), *pni = json_array(), *ppk = json_array(), *plb = json_array();
            if (!mg || !bo) {
                bad = 1;
                break;
            }
            ps_chgate_stat st;
            ps_chgate_stat_of(acc, l, b, -1, mg, &st);
            SET(bo, "branch", json_string(acc->branch[b]));
            SET(bo, "channels", json_integer(d));
            SET(bo, "n_windows", json_integer(s->n_windows));
            SET(po, "mean_gate", reals(mg, S, &bad));
            SET(po, "N_static", json_real(st.N_static));
            SET(po, "N_input", json_real(st.N_input));
            SET(po, "peak", json_integer(st.peak));
            SET(po, "label", json_string(st.label));
            int64_t *peaks = calloc((size_t)S, sizeof(int64_t)), nl[3] = {0, 0, 0};
            double sns = 0, sni = 0;
            if (!peaks) bad = 1;
            for (int64_t c = 0; c < d && !bad; c++) {
                ps_chgate_stat cs;
                ps_chgate_stat_of(acc, l, b, c, mg, &cs);
                APP(pmg, reals(mg, S, &bad));
                APP(pns, json_real(cs.N_static));
                APP(pni, json_real(cs.N_input));
                APP(ppk, json_integer(cs.peak));
                APP(plb, json_string(cs.label));
                sns += cs.N_static;
                sni += cs.N_input;
                peaks[cs.peak]++;
                for (int k = 0; k < 3; k++)
                    if (!strcmp(cs.label, ps_gate_labels[k])) nl[k]++;
            }
            SET(cm, "N_static", json_real(sns / (double)d));
            SET(cm, "N_input", json_real(sni / (double)d));
            for (int k = 0; k < 3; k++) SET(lab, ps_gate_labels[k], json_integer(nl[k]));
            for (int64_t k = 0; k < S && peaks; k++) APP(pc, json_integer(peaks[k]));
            free(peaks);
            SET(bo, "pooled", po);
            SET(bo, "channel_mean", cm);
            SET(bo, "labels", lab);
            SET(bo, "peak_counts", pc);
            SET(per, "mean_gate", pmg);
            SET(per, "N_static", pns);
            SET(per, "N_input", pni);
            SET(per, "peak", ppk);
            SET(per, "label", plb);
            SET(bo, "per_channel", per);
            APP(brs, bo);
        }
        SET(lo, "branches", brs);
        APP(layers, lo);
    }
    free(mg);
    SET(root, "layers", layers);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

void ps_chgate_print(const ps_chgate_acc *acc) {
    printf("%-6s %-10s %-5s %5s %9s %9s %5s %-16s %9s %9s  %s\n", "layer", "branch", "attn", "slots", "N_static", "N_input", "peak",
           "label (pooled)", "ch N_s", "ch N_i", "channels static/input-dep/diffuse");
    for (int l = 0; l < acc->n_layers; l++)
        for (int b = 0; b < acc->n_branches; b++) {
            const ps_chgate_slot *s = &acc->g[l * acc->n_branches + b];
            if (!s->S) continue;
            double *mg = malloc((size_t)s->S * sizeof(double));
            if (!mg) return;
            ps_chgate_stat st, cs;
            ps_chgate_stat_of(acc, l, b, -1, mg, &st);
            double sns = 0, sni = 0;
            int64_t nl[3] = {0, 0, 0};
            for (int64_t c = 0; c < s->d; c++) {
                ps_chgate_stat_of(acc, l, b, c, mg, &cs);
                sns += cs.N_static;
                sni += cs.N_input;
                for (int k = 0; k < 3; k++)
                    if (!strcmp(cs.label, ps_gate_labels[k])) nl[k]++;
            }
            printf("%-6d %-10s %-5s %5lld %9.3f %9.3f %5lld %-16s %9.3f %9.3f  %lld/%lld/%lld of %lld\n", l, acc->branch[b], s->attention,
                   (long long)s->S, st.N_static, st.N_input, (long long)st.peak, st.label, sns / (double)s->d, sni / (double)s->d,
                   (long long)nl[0], (long long)nl[1], (long long)nl[2], (long long)s->d);
            free(mg);
        }
}

static const char *const MODEL_BRANCH[] = {"compressor"};

int ps_chgate_init_model(ps_chgate_acc *acc, const ps_config *cfg, ps_error *err) {
    memset(acc, 0, sizeof *acc);
    if (cfg->kind != PS_ATTN_CHANNEL) return ps_fail(err, "per-channel gate statistics need the channel attention");
    if (ps_chgate_acc_init(acc, (int)cfg->n_layers, 1, MODEL_BRANCH, err)) return -1;
    int csa = cfg->v4_mode == PS_V4_MODE_CSA;
    for (int l = 0; l < cfg->n_layers; l++)
        if (ps_chgate_acc_set(acc, l, 0, ps_config_v4_slots(cfg), cfg->head_dim, csa, cfg->rate, csa ? "csa" : "hca", err)) {
            ps_chgate_acc_free(acc);
            return -1;
        }
    return 0;
}

static int model_gate_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    ps_chgate_acc_add(user, ev->layer, 0, ev->data, ev->shape[0], ev->shape[1]);
    return 0;
}

int ps_chgate_watch_model(ps_chgate_acc *acc, ps_hooks *hooks, const ps_config *cfg, ps_error *err) {
    for (int l = 0; l < cfg->n_layers; l++) {
        char name[96];
        ps_hook_name(name, sizeof name, l, PS_HOOK_GATE_K);
        if (ps_hooks_add(hooks, cfg, name, model_gate_hook, acc, err)) return -1;
    }
    return 0;
}

/* ---- a training log's per-channel gate records ---- */

/* The per-channel gate records of a train.jsonl ("gate": "per_channel"): per layer, the pooled
 * statistics over the logged steps, the step where the pooled N_input first reached the concentration
 * threshold, and the channel label counts of the last record. */
json_t *ps_chgate_log_summary(const char *path, ps_error *err) {
    json_t *all = ps_read_jsonl(path, err);
    if (!all) return NULL;
    json_t *recs = json_array(), *o;
    size_t i;
    json_array_foreach(all, i, o) {
        const char *ty = json_string_value(json_object_get(o, "type")), *g = json_string_value(json_object_get(o, "gate"));
        if (ty && !strcmp(ty, "gates") && g && !strcmp(g, "per_channel")) json_array_append(recs, o);
    }
    json_decref(all);
    size_t nr = json_array_size(recs);
    if (!nr) {
        json_decref(recs);
        ps_fail(err, "%s: no per-channel gate records (a v4 model's training log has \"type\": \"gates\", \"gate\": \"per_channel\" lines)", path);
        return NULL;
    }
    json_t *out = json_array(), *layers0 = json_object_get(json_array_get(recs, 0), "layers");
    for (size_t li = 0; li < json_array_size(layers0); li++) {
        json_t *steps = json_array(), *ns = json_array(), *ni = json_array(), *pk = json_array(), *cms = json_array(), *conc = json_null();
        json_t *last = NULL;
        for (size_t r = 0; r < nr; r++) {
            json_t *rec = json_array_get(recs, r), *lo = json_array_get(json_object_get(rec, "layers"), li);
            json_t *bo = json_array_get(json_object_get(lo, "branches"), 0), *po = json_object_get(bo, "pooled");
            json_array_append_new(steps, json_integer(json_integer_value(json_object_get(rec, "step"))));
            json_array_append_new(ns, json_real(json_number_value(json_object_get(po, "N_static"))));
            json_array_append_new(ni, json_real(json_number_value(json_object_get(po, "N_input"))));
            json_array_append_new(pk, json_integer(json_integer_value(json_object_get(po, "peak"))));
            json_array_append_new(cms, json_real(json_number_value(json_object_get(json_object_get(bo, "channel_mean"), "N_static"))));
            if (json_is_null(conc) && json_number_value(json_object_get(po, "N_input")) <= PS_GATE_CONCENTRATED)
                conc = json_integer(json_integer_value(json_object_get(rec, "step")));
            last = bo;
        }
        json_t *e = json_object();
        json_object_set_new(e, "layer", json_integer(json_integer_value(json_object_get(json_array_get(layers0, li), "layer"))));
        json_object_set_new(e, "branch", json_string("compressor"));
        json_object_set_new(e, "steps", steps);
        json_object_set_new(e, "N_static", ns);
        json_object_set_new(e, "N_input", ni);
        json_object_set_new(e, "peak", pk);
        json_object_set_new(e, "channel_mean_N_static", cms);
        json_object_set_new(e, "input_concentrated_at_step", conc);
        json_object_set(e, "final_labels", json_object_get(last, "labels"));
        json_array_append_new(out, e);
    }
    json_decref(recs);
    return out;
}
