#include "gates/gates.h"

#include "core/fileio.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_gate_acc_init(ps_gate_acc *acc, const ps_config *cfg, ps_error *err) {
    memset(acc, 0, sizeof *acc);
    if (cfg->kind != PS_ATTN_COMPRESSED)
        return ps_fail(err, "gate statistics need a compressed-attention model (this one has full attention)");
    acc->n_layers = cfg->n_layers;
    acc->nkv = cfg->n_kv_heads;
    acc->W = cfg->window;
    acc->sum_alpha = calloc((size_t)(acc->n_layers * acc->nkv * 2 * acc->W), sizeof(double));
    acc->sum_neff = calloc((size_t)(acc->n_layers * acc->nkv * 2), sizeof(double));
    acc->n_windows = calloc((size_t)(acc->n_layers * acc->nkv * 2), sizeof(int64_t));
    if (!acc->sum_alpha || !acc->sum_neff || !acc->n_windows) {
        ps_gate_acc_free(acc);
        return ps_fail(err, "out of memory for gate statistics");
    }
    return 0;
}

void ps_gate_acc_free(ps_gate_acc *acc) {
    free(acc->sum_alpha);
    free(acc->sum_neff);
    free(acc->n_windows);
    memset(acc, 0, sizeof *acc);
}

void ps_gate_acc_reset(ps_gate_acc *acc) {
    memset(acc->sum_alpha, 0, (size_t)(acc->n_layers * acc->nkv * 2 * acc->W) * sizeof(double));
    memset(acc->sum_neff, 0, (size_t)(acc->n_layers * acc->nkv * 2) * sizeof(double));
    memset(acc->n_windows, 0, (size_t)(acc->n_layers * acc->nkv * 2) * sizeof(int64_t));
}

const char *const ps_gate_labels[] = {"static", "input-dependent", "diffuse", NULL};

const char *ps_gate_label(const ps_gate_stat *s) {
    if (s->N_input <= PS_GATE_CONCENTRATED) return ps_gate_labels[s->N_static <= PS_GATE_CONCENTRATED ? 0 : 1];
    return ps_gate_labels[2];
}

double ps_effective_offsets(const double *p, int64_t n) {
    double h = 0;
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 0) h -= p[i] * log(p[i]);
    return exp(h);
}

int64_t ps_gate_peak(const double *p, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 1; i < n; i++)
        if (p[i] > p[k]) k = i;
    return k;
}

void ps_gate_acc_add(ps_gate_acc *acc, int layer, ps_branch br, const float *alpha, int64_t n) {
    int64_t W = acc->W, nkv = acc->nkv;
    double tmp[4096];
    for (int64_t w = 0; w < n; w++)
        for (int64_t g = 0; g < nkv; g++) {
            const float *a = alpha + (w * nkv + g) * W;
            double *s = acc->sum_alpha + (((int64_t)layer * nkv + g) * 2 + br) * W, tot = 0;
            for (int64_t i = 0; i < W; i++) tot += a[i];
            if (tot <= 0) continue; /* a window this head's grid does not have (offset grids: alpha = 0) */
            for (int64_t i = 0; i < W; i++) {
                s[i] += a[i];
                tmp[i] = a[i];
            }
            acc->sum_neff[((int64_t)layer * nkv + g) * 2 + br] += ps_effective_offsets(tmp, W);
            acc->n_windows[((int64_t)layer * nkv + g) * 2 + br]++;
        }
}

static int gate_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    ps_gate_acc_add(user, ev->layer, ev->point == PS_HOOK_GATE_K ? PS_BRANCH_KEY : PS_BRANCH_VALUE, ev->data,
                    ev->shape[0] * ev->shape[1]);
    return 0;
}

int ps_gate_acc_watch(ps_gate_acc *acc, ps_hooks *hooks, const ps_config *cfg, ps_error *err) {
    for (int l = 0; l < cfg->n_layers; l++)
        for (int b = 0; b < 2; b++) {
            char name[96];
            ps_hook_name(name, sizeof name, l, b ? PS_HOOK_GATE_V : PS_HOOK_GATE_K);
            if (ps_hooks_add(hooks, cfg, name, gate_hook, acc, err)) return -1;
        }
    return 0;
}

void ps_gate_acc_stat(const ps_gate_acc *acc, int layer, int head, ps_branch br, ps_gate_stat *out) {
    int64_t W = acc->W, n = acc->n_windows[((int64_t)layer * acc->nkv + head) * 2 + br];
    const double *s = acc->sum_alpha + (((int64_t)layer * acc->nkv + head) * 2 + br) * W;
    out->W = W;
    out->n_windows = n;
    for (int64_t i = 0; i < W; i++) out->mean_gate[i] = n ? s[i] / (double)n : 0.0;
    out->peak = (int)ps_gate_peak(out->mean_gate, W);
    out->N_static = n ? ps_effective_offsets(out->mean_gate, W) : 0.0;
    out->N_input = n ? acc->sum_neff[((int64_t)layer * acc->nkv + head) * 2 + br] / (double)n : 0.0;
}

json_t *ps_gate_acc_to_json(const ps_gate_acc *acc, const ps_config *cfg) {
    json_t *root = json_object(), *layers = json_array();
    json_object_set_new(root, "window", json_integer(cfg->window));
    json_object_set_new(root, "stride", json_integer(cfg->stride));
    json_object_set_new(root, "gate", json_string(cfg->gate == PS_GATE_UNIFORM ? "uniform" : "learned"));
    ps_gate_stat *st = malloc(sizeof *st); /* 32 KiB: not on the stack */
    if (!st) {
        json_decref(root);
        json_decref(layers);
        return NULL;
    }
    for (int l = 0; l < acc->n_layers; l++) {
        json_t *lo = json_object(), *heads = json_array();
        json_object_set_new(lo, "layer", json_integer(l));
        for (int g = 0; g < acc->nkv; g++) {
            json_t *ho = json_object();
            json_object_set_new(ho, "head", json_integer(g));
            /* offset grids: offset i of this head's windows is absolute phase (grid_offset + i) mod S, with this
             * layer's offset o_{l,g} (a per-layer grid differs by layer) */
            if (cfg->any_head_offset) json_object_set_new(ho, "grid_offset", json_integer(ps_config_grid_offset(cfg, l, g)));
            for (int b = 0; b < 2; b++) {
                ps_gate_acc_stat(acc, l, g, (ps_branch)b, st);
                json_t *bo = json_object(), *mg = json_array();
                for (int64_t i = 0; i < st->W; i++) json_array_append_new(mg, json_real(st->mean_gate[i]));
                json_object_set_new(bo, "mean_gate", mg);
                json_object_set_new(bo, "N_static", json_real(st->N_static));
                json_object_set_new(bo, "N_input", json_real(st->N_input));
                json_object_set_new(bo, "peak", json_integer(st->peak));
                json_object_set_new(bo, "n_windows", json_integer(st->n_windows));
                json_object_set_new(bo, "label", json_string(ps_gate_label(st)));
                json_object_set_new(ho, b ? "value" : "key", bo);
            }
            json_array_append_new(heads, ho);
        }
        json_object_set_new(lo, "heads", heads);
        json_array_append_new(layers, lo);
    }
    free(st);
    json_object_set_new(root, "layers", layers);
    return root;
}

/* ---- a training log's gate records ---- */

/* Summarise the gate records of a training log: per (layer, head, branch) first/last values, the first
 * step where N_static <= 2, and whether the peak stayed put over the last three records. */
json_t *ps_gates_log_summary(const char *path, ps_error *err) {
    json_t *all = ps_read_jsonl(path, err);
    if (!all) return NULL;
    json_t *recs = json_array(), *o;
    size_t i;
    json_array_foreach(all, i, o) {
        if (json_is_string(json_object_get(o, "type")) && !strcmp(json_string_value(json_object_get(o, "type")), "gates"))
            json_array_append(recs, o);
    }
    json_decref(all);
    size_t nr = json_array_size(recs);
    if (nr == 0) {
        json_decref(recs);
        ps_fail(err, "%s: no gate records (a compressed model's training log has \"type\": \"gates\" lines)", path);
        return NULL;
    }
    json_t *out = json_array(), *first = json_array_get(recs, 0);
    json_t *layers = json_object_get(first, "layers");
    for (size_t li = 0; li < json_array_size(layers); li++) {
        json_t *heads = json_object_get(json_array_get(layers, li), "heads");
        for (size_t hi = 0; hi < json_array_size(heads); hi++)
            for (int b = 0; b < 2; b++) {
                const char *br = b ? "value" : "key";
                json_t *e = json_object(), *steps = json_array(), *ns = json_array(), *ni = json_array(), *pk = json_array();
                json_t *conc = json_null();
                for (size_t r = 0; r < nr; r++) {
                    json_t *rec = json_array_get(recs, r);
                    json_t *bo = json_object_get(
                        json_array_get(json_object_get(json_array_get(json_object_get(rec, "layers"), li), "heads"), hi), br);
                    double s = json_number_value(json_object_get(bo, "N_static"));
                    json_array_append_new(steps, json_integer(json_integer_value(json_object_get(rec, "step"))));
                    json_array_append_new(ns, json_real(s));
                    json_array_append_new(ni, json_real(json_number_value(json_object_get(bo, "N_input"))));
                    json_array_append_new(pk, json_integer(json_integer_value(json_object_get(bo, "peak"))));
                    if (json_is_null(conc) && s <= PS_GATE_CONCENTRATED)
                        conc = json_integer(json_integer_value(json_object_get(rec, "step")));
                }
                int stable = 1;
                json_int_t last_peak = json_integer_value(json_array_get(pk, nr - 1));
                for (size_t r = nr >= 3 ? nr - 3 : 0; r < nr; r++) stable &= json_integer_value(json_array_get(pk, r)) == last_peak;
                json_object_set_new(e, "layer", json_integer((json_int_t)li));
                json_object_set_new(e, "head", json_integer((json_int_t)hi));
                json_object_set_new(e, "branch", json_string(br));
                json_object_set_new(e, "steps", steps);
                json_object_set_new(e, "N_static", ns);
                json_object_set_new(e, "N_input", ni);
                json_object_set_new(e, "peak", pk);
                json_object_set_new(e, "concentrated_at_step", conc);
                json_object_set_new(e, "final_peak", json_integer(last_peak));
                json_object_set_new(e, "peak_stable_last_3", json_boolean(stable));
                json_array_append_new(out, e);
            }
    }
    json_decref(recs);
    return out;
}
