/* patching.h — activation patching over the grid engine (grid.h), and TransformerLens-style helpers on the
 * public hook mechanism (core/hooks.h): a forward that caches chosen activations (run_with_cache).
 *
 * One spec patches (ps_patch_spec): the grid's reference pass runs the SOURCE prompts (ps_grid.ref_tokens) and
 * the spec keeps, per chosen layer, the source run's activation at each patched point ([N, npos, ...], collected
 * by host callbacks in prompt order, then put on the model's context); a cell is a PS_ACT_PATCH action per
 * point — the cell's head (or the whole position) of the source run's activation of the same prompt, same
 * positions — on the grid's prompts; the engine scores every cell (the answers, or the spec's metric). Cells
 * batch and restart as the engine does it (grid.h: k cells as k replicas of the prompts in one forward, from the
 * kept state at the layer where the runtime can), a full forward per cell on any other family. Two callers:
 *   - the patch instrument (`phasescope patch`, ps.patch): the family's knockout target (ko.arrays: the points
 *     its cells set; ps_patch_target_spec) patched from the CORRUPT run into the CLEAN prompt set, scored by
 *     the answers (knockout.h: ps_knockout_spec.corrupt runs it through the knockout's grid, work units and
 *     partial results);
 *   - ps_activation_patching (below): one hook point of the controlled model, per head (and position), the
 *     clean run patched into the corrupted prompts, scored by a metric.
 * See docs/hooks.md and docs/prompt-sets.md. */
#ifndef PS_PATCHING_H
#define PS_PATCHING_H

#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/model.h"
#include "interventions/grid.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

/* The activation-patching spec (above). points: the family's point numbers (its hook enumeration) a cell
 * patches together, n_points of them (1 to PS_KO_MAX_ARRAYS; a point a layer lacks at this length is left
 * out there); heads: the cells' heads (-1: whole positions), n_heads; per_position (one point only): n_pos
 * cells per head, one per position of the point's axis 1 (cell ci = head ci / n_pos, position ci % n_pos);
 * restart: where the cells may restart (ps_grid_restart); score, score_user: the per-query outcome (the
 * grid's score with score_user as its self; NULL: the answers). heads and the scorer must outlive the spec. */
typedef struct {
    const int *points;
    int n_points;
    const int *heads;
    int n_heads;
    int per_position;
    int64_t n_pos;
    ps_grid_restart restart;
    void (*score)(void *user, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits, int64_t V,
                  int *ok, double *lp);
    void *score_user;
} ps_patch_spec_opts;
int ps_patch_spec(const ps_runtime *rt, const ps_patch_spec_opts *o, ps_grid_spec *spec, ps_error *err);
/* The spec of the family's knockout target (an index of rt->family->ko.targets): the points its cells set, per
 * head (heads, n_heads) or, for a per-layer target, the whole arrays; restarting where the knockout does. */
int ps_patch_target_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err);
void ps_patch_spec_free(const ps_runtime *rt, ps_grid_spec *spec);

/* One forward of B sequences of T tokens (tokens [B, T]) with a cache watching each of names[0 .. n):
 * afterwards ps_cache_get(cache, name) holds the activation (host memory; the values after any earlier
 * overwrite, which here means none: only the cache's own hooks are registered). The cache may already
 * watch other names (they are not filled by this run) and keeps what it held for names watched again. */
int ps_run_with_cache(const ps_model *m, const int32_t *tokens, int64_t B, int64_t T, const char *const *names, int n,
                      ps_cache *cache, ps_error *err);

/* Metrics of a run, over the queries of the clean batch (answer positions and answer tokens from it):
 *   PS_PATCH_LOGIT_DIFF   mean over queries of logit[clean answer] − logit[corrupted answer] at the row
 *                         that predicts the first answer token (the corrupted answer: the corrupted
 *                         batch's token at the clean query's answer_src). Higher = more like clean.
 *   PS_PATCH_ANSWER_NLL   mean over queries of the query's summed −log p of the clean answer tokens
 *                         (as the knockout's mean_nll). Lower = more like clean. */
typedef enum { PS_PATCH_LOGIT_DIFF = 0, PS_PATCH_ANSWER_NLL = 1 } ps_patch_metric;

typedef struct {
    const char *point;      /* the hook point patched at each chosen layer, by its suffix: "attn.hook_z",
                               "attn.hook_v", "hook_resid_pre", ... (not attn.hook_pattern) */
    const int *layers;      /* NULL (or n_layers 0): every layer */
    int n_layers;
    const int *heads;       /* NULL (or n_heads 0): every head of the point (n_heads for q/z, n_kv for k/v,
                               gates, ck, cv); a point without a head axis ([B, T, d]) has one "head", -1 */
    int n_heads;
    int per_position;       /* 1: one cell per position of the point's axis 1 (tokens, or windows for
                               ck/cv/gates); 0: every position in one cell */
    ps_patch_metric metric;
    int max_cells;          /* most cells per forward; 0: as many as mem_bytes holds (at least 1) */
    double mem_bytes;       /* bytes for the batched cells' activations; 0: ps_patch_default_budget() */
    int naive;              /* 1: a full forward of the corrupted prompts per cell (the reference path) */
} ps_patch_opts;

typedef struct {
    int n_layers, n_heads;
    int64_t n_pos;           /* cells per (layer, head): the point's axis 1 with per_position, else 1 */
    int *layers, *heads;     /* as run (heads[0] = -1 for a point without heads) */
    double clean, corrupted; /* the metric of the clean run and of the corrupted run (nothing patched) */
    double *cells;           /* [n_layers, n_heads, n_pos]: the metric of the corrupted run with that cell
                                patched from the clean run */
    int cells_per_forward;   /* the most cells one forward ran (1 on the naive path) */
} ps_patch_result;

/* The grid engine's default: 1 GiB, at most a quarter of available memory. */
double ps_patch_default_budget(void);

/* clean and corrupted: the same number of prompts and tokens. Errors (naming the option): an unknown or
 * unsupported point, a layer or head out of range, batches of different shapes, a clean batch without
 * queries. progress (may be NULL) is called as the engine reports, with (cells done, cells). */
int ps_activation_patching(const ps_model *m, const ps_batch *clean, const ps_batch *corrupted,
                           const ps_patch_opts *opts, ps_patch_result *out, ps_progress_fn progress, void *user,
                           ps_error *err);
void ps_patch_result_free(ps_patch_result *r);

/* The metric of logits [B, T, V] (host) for the clean batch's queries (see ps_patch_metric). */
double ps_patch_metric_value(ps_patch_metric metric, const ps_batch *clean, const ps_batch *corrupted,
                             const float *logits, int64_t V);

#endif
