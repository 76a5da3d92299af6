/* chgates.h — effective offsets of per-channel gates: DeepSeek-V4's compressor (V4 checkpoints: the
 * attention's compressor and the lightning indexer's; the controlled model's attention kind "channel": its
 * one compressor). There every channel of a compressed entry has its own softmax over the S slots of
 * its window (HCA: the m tokens; CSA: 2m slots, the previous window's first-half series then the
 * window's own second-half series), so the statistics of gates.h are taken per channel, then pooled:
 *
 *   per channel c:  mean_gate_c = E_windows[alpha[:, c]] (over the S slots), N_static = exp(H(mean_gate_c)),
 *                   N_input = E_windows[exp(H(alpha[:, c]))], peak = argmax mean_gate_c, label (gates.h)
 *   pooled:         mean_gate = mean over channels of mean_gate_c, its N_static and peak; N_input = mean
 *                   over channels of N_input; the label of those two; plus the channel means of N_static
 *                   and N_input, the count of channels per label and per peak slot.
 *
 * A uniform gate has N = S (HCA: the rate m; CSA: 2m). CSA's window 0 is left out of the pooling: its
 * first-half slots are dead by construction (they would lie before the sequence), so it has no choice
 * over them. Fed by the gate hooks of forward passes ([B, nW, S, d]: blocks.L.attn.hook_gate_k of a v4
 * model, layers.L.attn.compressor.alpha / indexer.compressor.alpha of a V4 checkpoint). */
#ifndef PS_CHGATES_H
#define PS_CHGATES_H

#include <jansson.h>
#include <stdint.h>

#include "core/config.h"
#include "core/error.h"
#include "core/hooks.h"

#define PS_CHGATE_MAX_BRANCHES 2

typedef struct {
    int64_t S, d;        /* slots, channels (0: the layer has no such gate) */
    int skip_first;      /* leave window 0 out (CSA) */
    int64_t rate;        /* m, for the JSON */
    char attention[16];  /* "csa", "hca" (the JSON's layers[].attention) */
    double *sum_alpha;   /* [S, d] */
    double *sum_neff;    /* [d] */
    int64_t n_windows;
} ps_chgate_slot;

typedef struct {
    int n_layers, n_branches;
    const char *branch[PS_CHGATE_MAX_BRANCHES]; /* "compressor", "indexer" */
    ps_chgate_slot *g;   /* [n_layers * n_branches] */
} ps_chgate_acc;

int ps_chgate_acc_init(ps_chgate_acc *acc, int n_layers, int n_branches, const char *const *branch_names, ps_error *err);
/* Give (layer, branch) a gate of S slots and d channels. */
int ps_chgate_acc_set(ps_chgate_acc *acc, int layer, int branch, int64_t S, int64_t d, int skip_first, int64_t rate,
                      const char *attention, ps_error *err);
void ps_chgate_acc_free(ps_chgate_acc *acc);
void ps_chgate_acc_reset(ps_chgate_acc *acc);
/* Pool alpha [B, nW, S, d] of (layer, branch). */
void ps_chgate_acc_add(ps_chgate_acc *acc, int layer, int branch, const float *alpha, int64_t B, int64_t nW);

/* The statistics of one channel (c >= 0) or pooled (c = -1); mean_gate gets S values. */
typedef struct {
    double N_static, N_input;
    int64_t peak;
    const char *label;
} ps_chgate_stat;
void ps_chgate_stat_of(const ps_chgate_acc *acc, int layer, int branch, int64_t c, double *mean_gate, ps_chgate_stat *out);

/* {"gate": "per_channel", "layers": [{"layer", "attention", "rate", "slots", "window_0_left_out",
 * "branches": [{"branch", "channels", "n_windows", "pooled": {"mean_gate", "N_static", "N_input", "peak",
 * "label"}, "channel_mean": {"N_static", "N_input"}, "labels": {"static": n, ...}, "peak_counts": [S],
 * "per_channel": {"mean_gate": [[S] x d], "N_static": [d], "N_input": [d], "peak": [d], "label": [d]}}]}]}
 * — the layers that have gates, in order. NULL when memory runs out. */
json_t *ps_chgate_acc_to_json(const ps_chgate_acc *acc);

/* The controlled model's attention kind v4: one branch ("compressor") per layer, fed by the forward's
 * blocks.L.attn.hook_gate_k (ps_chgate_watch_model registers the hooks). */
int ps_chgate_init_model(ps_chgate_acc *acc, const ps_config *cfg, ps_error *err);
int ps_chgate_watch_model(ps_chgate_acc *acc, ps_hooks *hooks, const ps_config *cfg, ps_error *err);

/* A one-line summary per (layer, branch) for the commands' stdout. */
void ps_chgate_print(const ps_chgate_acc *acc);

/* The per-channel gate records of a training log (train.jsonl lines with "type": "gates", "gate":
 * "per_channel": a model with the channel attention), per layer: {"layer", "branch", "steps", "N_static",
 * "N_input", "peak" (pooled), "channel_mean_N_static", "input_concentrated_at_step", "final_labels"}.
 * NULL with err naming the file and line when it is not JSON lines or has no such records. */
json_t *ps_chgate_log_summary(const char *path, ps_error *err);

#endif
