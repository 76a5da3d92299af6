/* gates.h — gate concentration statistics (SPEC §6 "effective offsets"): per layer, KV head and branch,
 * pooled over every window of every prompt seen: mean_gate = E[alpha] (a distribution over the W
 * offsets), N_static = exp(H(mean_gate)), N_input = E[exp(H(alpha))] (natural log, 0·log 0 = 0), and
 * the peak offset argmax mean_gate (ties to the lowest offset). Fed by the gate hooks of forward passes. */
#ifndef PS_GATES_H
#define PS_GATES_H

#include <jansson.h>
#include <stdint.h>

#include "core/config.h"
#include "core/error.h"
#include "core/hooks.h"

typedef enum { PS_BRANCH_KEY = 0, PS_BRANCH_VALUE = 1 } ps_branch;

typedef struct {
    int64_t n_layers, nkv, W;
    double *sum_alpha;  /* [L, nkv, 2, W] */
    double *sum_neff;   /* [L, nkv, 2] */
    int64_t *n_windows; /* [L, nkv, 2] windows pooled (a head's grid may lack a window: offset grids) */
} ps_gate_acc;

typedef struct {
    double mean_gate[4096];
    int64_t W;
    double N_static, N_input;
    int peak;
    int64_t n_windows;
} ps_gate_stat;

/* Fails for a full-attention model (no gates). */
int ps_gate_acc_init(ps_gate_acc *acc, const ps_config *cfg, ps_error *err);
void ps_gate_acc_free(ps_gate_acc *acc);
void ps_gate_acc_reset(ps_gate_acc *acc);

/* Register hooks on every layer's hook_gate_k and hook_gate_v that pool into acc. */
int ps_gate_acc_watch(ps_gate_acc *acc, ps_hooks *hooks, const ps_config *cfg, ps_error *err);

/* Pool alpha [n, nkv, W] (n = B·nW windows) of one layer and branch. */
void ps_gate_acc_add(ps_gate_acc *acc, int layer, ps_branch br, const float *alpha, int64_t n);

void ps_gate_acc_stat(const ps_gate_acc *acc, int layer, int head, ps_branch br, ps_gate_stat *out);

/* Concentration label (docs/results-schema.md): "static" when N_static <= PS_GATE_CONCENTRATED and
 * N_input <= PS_GATE_CONCENTRATED (one fixed offset for every window), "input-dependent" when only
 * N_input <= PS_GATE_CONCENTRATED (each window picks few offsets, but not the same ones), else "diffuse". */
#define PS_GATE_CONCENTRATED 2.0
const char *ps_gate_label(const ps_gate_stat *s);
/* Every label ps_gate_label gives, ending with NULL (the result validator accepts exactly these). */
extern const char *const ps_gate_labels[];

/* The statistics of one gate, shared by the gate accumulator, the idealised model (theory_train.c) and
 * the figures (viz/kind_gates.c, viz/kind_theory.c) — one definition each:
 * exp of the entropy (natural log, 0·log 0 = 0) of a distribution over n entries: its effective number
 * of offsets, from 1 (one-hot) to n (uniform). */
double ps_effective_offsets(const double *p, int64_t n);
/* The peak offset: argmax of p[0..n), ties to the lowest offset. */
int64_t ps_gate_peak(const double *p, int64_t n);

/* {"window", "stride", "gate", "layers": [{"layer", "heads": [{"head", "key": {...}, "value": {...}}]}]}
 * with mean_gate, N_static, N_input, peak, n_windows per branch (the layout of the conformance file). */
json_t *ps_gate_acc_to_json(const ps_gate_acc *acc, const ps_config *cfg);

/* The gate records of a training log (train.jsonl lines with "type": "gates"), per (layer, KV head, branch)
 * in the records' order: {"layer", "head", "branch", "steps", "N_static", "N_input", "peak",
 * "concentrated_at_step" (the first step with N_static <= PS_GATE_CONCENTRATED, or null), "final_peak",
 * "peak_stable_last_3"} (gates.json's "training", docs/results-schema.md). NULL with err naming the file
 * and line when it is not JSON lines or has no gate records. */
json_t *ps_gates_log_summary(const char *path, ps_error *err);

#endif
