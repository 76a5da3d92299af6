/* atp.h — attribution patching: a whole mean-replacement knockout grid estimated from one clean forward
 * and one backward per batch (Nanda 2023; Kramár et al., "AtP*", 2024), as a spec over the grid engine
 * (grid.h: spec->estimate). docs/attribution.md states the math; docs/results.md measures it.
 *
 * For a cell c (layer l, KV head g, the target's arrays: raw k/v, compressed ck/cv or both) and a query q,
 * the exact knockout changes the query's answer NLL by Δ_c(q) = NLL_q(a with c's entries set to their
 * means) − NLL_q(a). The estimate:
 *   fix none (AtP):    Δ̂_c(q) = Σ_{e ∈ c} ∂NLL_q/∂a_e · (mean_e − a_e), the sum over the cell's entries
 *                      (every position, the head's hd values, each replaced array), the gradients of one
 *                      backward of NLL_q read at the hook points (ps_backward_opts.grad_hooks, PS_ACT_DOT).
 *   fix qk (AtP*'s QK fix, here for the whole attention of the patched head): layer l's attention is
 *                      recomputed exactly with c's entries replaced (softmax over the compressed and raw
 *                      keys, and the value sums), z'_c, and only what follows is linear:
 *                      Δ̂_c(q) = Σ_{t, h ∈ group g} ∂NLL_q/∂z[t, h] · (z'_c[t, h] − z[t, h]).
 *                      Exact where the cell's effect runs through the attention it patches (a single-layer
 *                      model's softmax saturation); linear in the later layers' response to it.
 * The means are the knockout's (the same sources: sum actions on the reference pass, per shift). A query
 * index q (queries sharing a prompt) is one backward: max_q backwards per batch. Each cell's estimated
 * log-prob lp − Δ̂ goes through the grid's statistics and records like an exact cell's, so shards and
 * ranks split and merge an estimate as they do a grid; an estimate has no accuracy (the JSON says null).
 *
 * Families: any whose core table has a backward (runtime.h: backward, grad.state_point; fix qk: grad.patch_attention):
 * the controlled model (full, compressed, staggered, per-channel compressor; fix qk for full and compressed
 * attention: core/attribution.c). DeepSeek-V4 checkpoints have no backward pass here: no estimate (an error
 * that says so), and neither has a family without the entries (the toy family of the tests). */
#ifndef PS_ATP_H
#define PS_ATP_H

#include <jansson.h>

#include "interventions/grid.h"

typedef enum { PS_ATP_FIX_NONE = 0, PS_ATP_FIX_QK = 1 } ps_atp_fix;
extern const char *const ps_atp_fix_names[]; /* "none", "qk", NULL */

/* The fix a model takes by default: none (docs/results.md: on the shipped models fix qk recalled no
 * strong cell that fix none missed, missed one it found, and costs more). */
int ps_atp_default_fix(const ps_runtime *rt);
/* NULL, or why the model cannot take `fix` (an error message in buf). */
const char *ps_atp_fix_missing(const ps_runtime *rt, int fix, char *buf, size_t n);

/* NULL, or why the model's knockout target `target` cannot be estimated to first order (an error message in buf:
 * the select attention's compressed target acts only through a discrete choice; runtime.h grad.target_missing). */
const char *ps_atp_target_missing(const ps_runtime *rt, int target, char *buf, size_t n);

/* The estimate spec of any family with gradients at hook points (its core entries backward, grad.backward_free,
 * grad.state_point; fix qk: grad.patch_attention, grad.patch_missing, grad.patch_point — core/runtime.h): target as ps_ko_spec
 * (ko_spec.h, whose means it reads; the cells set the target's ko.arrays' points). An error naming what the
 * family lacks (ps_atp_fix_missing) for a family without them. */
int ps_atp_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, int fix, ps_grid_spec *spec, ps_error *err);
void ps_atp_spec_free(const ps_runtime *rt, ps_grid_spec *spec);

/* An estimate measured against the exact grid: the two knockout.json documents of the same grid (same
 * model, prompts, period, target and cells; errors name what differs), optionally their times
 * ({"wall_s", "user_s", "sys_s", "max_rss_kb"} each, or NULL). The "atp_compare" result:
 *   n_pairs, pearson, spearman: over cells × residues (with prompts) of exact vs estimated Δ NLL;
 *   cell_pearson, cell_spearman: over cells of the worst-residue Δ NLL (each method's own worst);
 *   strong_pp (−30), strong: the exact grid's cells whose worst residue loses ≤ −30 pp, each with its
 *   estimate rank (1 = the largest estimated worst-residue Δ NLL); top_k = 2 × |strong| (at least 1),
 *   recall = |strong ∩ estimated top_k| / |strong| (1 when no cell is strong), max_strong_rank;
 *   false_negatives: the strong cells outside the top_k, worst exact drop first; misses: the 5 cells with
 *   the largest |estimated − exact| worst-residue Δ NLL; times {exact, estimate, wall_ratio, cpu_ratio};
 *   grid {layers, heads, period, exact [cell][rho], estimate [cell][rho] (Δ NLL; null without prompts),
 *   exact_acc [cell] worst Δ pp} for the figure; provenance: the estimate's, command replaced. */
json_t *ps_atp_compare(json_t *exact, json_t *estimate, json_t *t_exact, json_t *t_estimate, const char *command,
                       ps_error *err);

#endif
