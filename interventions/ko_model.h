/* ko_model.h — the controlled model's mean-replacement knockout as a grid spec (grid.h): what its runtime's
 * ops (ps_runtime_model) give the knockout (knockout.h) and what the attribution-patching estimate
 * (atp.h) builds on. For layer l and KV head g, that head's raw entries (hook_k, hook_v), compressed
 * entries (hook_ck, hook_cv) or both are replaced by their mean over the prompts of the same shift,
 * position by position: the sources are sum actions (PS_ACT_SUM) on the reference pass divided into
 * means, a cell is a PS_ACT_SET action per replaced array from the mean [npos, nkv, hd]. The cells
 * restart at their layer's attention (PS_GRID_RESTART_ATTENTION) except on the per-channel compressor
 * (attention.kind channel), where they run a full forward each.
 *
 * Below both knockout.c and atp.c (the knockout's --method atp dispatch reads atp.h; the estimate reads
 * the means here), so neither includes the other's module circularly. */
#ifndef PS_KO_MODEL_H
#define PS_KO_MODEL_H

#include "interventions/grid.h"

/* The controlled model's targets (bit 1: raw k/v, bit 2: compressed ck/cv); the runtime's target index
 * is ps_ko_target − 1 (ps_model_ko_target_names). */
typedef enum { PS_KO_RAW = 1, PS_KO_COMPRESSED = 2, PS_KO_BOTH = 3 } ps_ko_target;
const char *ps_ko_target_name(ps_ko_target t);

extern const char *const ps_model_ko_target_names[];
int ps_model_ko_default_target(const ps_runtime *rt);
int64_t ps_model_ko_target_heads(const ps_runtime *rt, int target);
const char *ps_model_ko_unit(const ps_runtime *rt, int target);
const char *ps_model_ko_layer_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
int ps_model_ko_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err);
void ps_model_ko_spec_free(ps_grid_spec *spec);
/* After its sources_done: the mean the spec replaces layer index li's array `pt` with ([npos, nkv, hd] on the
 * model's context), or NULL when its target does not replace that array. */
const float *ps_model_ko_mean(const ps_grid_spec *spec, int li, ps_hook_point pt);

#endif
