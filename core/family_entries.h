/* family_entries.h — the shipped families' entries defined outside their tables' files (core's internal header):
 * the config descriptions (describe.c), the knockout targets (ko_targets.c), gradients and the patch fix
 * (attribution.c), the gate records (gate_records.c), and the byte and memory wording of `info` (runtime.c). The
 * tables: the controlled model's in runtime.c, DeepSeek-V4's in core/v4/v4_family.c, MiniCPM4's in
 * core/minicpm/minicpm_family.c (its knockout targets: core/minicpm/minicpm_ko_targets.c). */
#ifndef PS_FAMILY_ENTRIES_H
#define PS_FAMILY_ENTRIES_H

#include <jansson.h>

#include "core/runtime.h"

/* the families' descriptions of their configs (describe.c) */
extern const char *const ps_model_attention_kinds[], *const ps_v4_attention_kinds[];
int ps_model_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err);
/* the families' knockout targets as data (ko_targets.c) */
extern const char *const ps_model_ko_target_names[];
int ps_model_ko_default(const ps_runtime *rt);
int64_t ps_model_ko_heads(const ps_runtime *rt, int target);
const char *ps_model_ko_unit(const ps_runtime *rt, int target);
const char *ps_model_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
int ps_model_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
int ps_model_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                     int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err);
int ps_v4_ko_default(const ps_runtime *rt);
int64_t ps_v4_ko_heads(const ps_runtime *rt, int target);
const char *ps_v4_ko_unit(const ps_runtime *rt, int target);
const char *ps_v4_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
int ps_v4_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
int ps_v4_ko_mean(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                  int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err);
int ps_v4_describe_config(const json_t *cfg, ps_model_desc *d, ps_error *err);
/* MiniCPM4's knockout targets (core/minicpm/minicpm_ko_targets.c): raw, compressed */
extern const char *const ps_minicpm_ko_targets[];
int ps_minicpm_ko_default(const ps_runtime *rt);
int ps_minicpm_ko_default_at(const ps_runtime *rt, int64_t T);
int64_t ps_minicpm_ko_heads(const ps_runtime *rt, int target);
const char *ps_minicpm_ko_unit(const ps_runtime *rt, int target);
const char *ps_minicpm_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
const char *ps_minicpm_ko_missing_at(const ps_runtime *rt, int target, int layer, int64_t T, char *buf, size_t n);
int ps_minicpm_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
/* the controlled model's gradients at hook points (attribution.c) */
int ps_model_backward(const ps_runtime *rt, void *state, void **scratch, const int32_t *tokens, const int32_t *targets,
                      const ps_hooks *grad_hooks, int stop_layer, double *loss, ps_error *err);
void ps_model_backward_free(const ps_runtime *rt, void *scratch);
const float *ps_model_state_point(const ps_runtime *rt, void *state, int layer, int point, int64_t dims[4]);
const char *ps_model_atp_target_missing(const ps_runtime *rt, int target, char *buf, size_t n);
const char *ps_model_patch_missing(const ps_runtime *rt, char *buf, size_t n);
int ps_model_patch_attention(const ps_runtime *rt, void *state, void **scratch, int layer, int head, const int *points,
                             const float *const *means, int n, float *dz, ps_error *err);
/* the families' gate statistics as data (gate_records.c) */
int ps_model_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n);
int ps_model_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps);
int ps_v4_gates(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n);
int ps_v4_gate_taps(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps);

/* A gate layout for ps_gate_info (gate_records.c): {"model", "branches", "n_layers", "gates": [...]}, and one gate. */
json_t *ps_gate_layout_new(const char *model, const char *const *branches, int n_branches, int n_layers);
void ps_gate_layout_add(json_t *layout, int l, int b, int64_t S, int64_t d, int skip_first, int64_t rate, const char *attention);
/* "1.50 GiB"; "X available now on cpu" / "X free of Y on cuda" (the memory of the context the model runs on) */
void ps_runtime_human_bytes(char *buf, size_t n, double bytes);
void ps_runtime_mem_now(char *buf, size_t n, ps_ctx *ctx);

#endif
