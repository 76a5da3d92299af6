/* grid.h — the one cell-grid engine of the instruments: mean-replacement knockout of every family and
 * target (knockout.h, ko_model.h, v4_instr.h), gatecycle's per-head measure, attribution patching
 * (atp.h) and activation patching (patching.h) run as specs over it.
 *
 * A grid is cells (layer, cell) over the prefix-padding sweep (or one given prompt set: ps_grid.prompts):
 * for every shift p the engine
 *   1. runs the reference pass over every prompt of the shift (or over other tokens: ps_grid.ref_tokens,
 *      e.g. patching's clean run), in its batches, with the spec's source hooks (sum actions into
 *      buffers of the model's context: the clean run's sums; or caches), and then lets the spec turn
 *      them into sources (sums into means, a mean pattern's choice, a cache on the context, ...);
 *   2. per batch: the clean outcomes, then per selected layer (top-down) its cells: each cell's
 *      intervention is the spec's hooks on sequences [seq0, seq1) of a forward (backend-side actions:
 *      no host copy), scored per query (the answer, or the spec's score) and added per residue, against
 *      the clean run.
 * Cells run in one of two ways: a full forward per cell (the naive path: any family, the reference), or,
 * when the runtime can restart where the spec's interventions lie (the controlled model), k cells × m
 * prompts as k·m sequences of one restarted forward from the kept state of the batch's run, as many as
 * the memory budget holds (ps_acts_size is the one source of the sizes): at the layer's attention
 * (PS_GRID_RESTART_ATTENTION: ps_forward_from_attention_rows, the last layer on the answer rows only)
 * or from the layer's input residual (PS_GRID_RESTART_LAYER: ps_forward_from, every row).
 *
 * Work units: unit (p, b, li) = (p · n_batches + b) · n_layers + li is one selected layer's cells on
 * batch b of shift p, in the one-process order (ps_grid_unit). A slice [unit0, unit1) runs only those
 * units (a shift with a unit in the slice runs its whole reference pass); `record` receives every scored
 * set's outcomes, so a split run's parts merge into what one process computes (docs/scale-out.md).
 *
 * A spec is: how to build the cells' sources (sources, sources_done, shift_end), what to run per cell
 * batch (cell: the hooks of one cell on a sequence range; restart: whether and where the restart path
 * applies), and how to score and reduce (score: a per-query outcome, NULL for the answer's; the engine's
 * per-residue statistics, or `record` for a split run). An
 * estimate that needs no forward per cell (attribution patching: one backward pass, cell effects from
 * gradients × (source − clean)) fits the same three parts: its sources are the clean and corrupted
 * activations and the gradients from the reference pass, its per-batch step scores every cell of a
 * layer from them, its reduction the same per-residue statistics. */
#ifndef PS_GRID_H
#define PS_GRID_H

#include "core/hooks.h"
#include "core/model.h"
#include "core/runtime.h"
#include "gates/chgates.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

typedef struct ps_runtime ps_runtime;

/* The prompts of one shift, as the spec sees them. */
typedef struct {
    int64_t p;             /* the shift */
    const ps_shifted *s;   /* its prompts (all N) */
    int64_t N, T;
    const int *layers;     /* the grid's layers, top-down (li indexes this) */
    int n_layers;
} ps_grid_shift;

/* Where a batch of cells restarts from the kept state of its batch's run (the controlled model only;
 * anything else, or the naive path: a full forward per cell). */
typedef enum {
    PS_GRID_RESTART_NONE = 0,
    /* every cell's hooks lie on its layer's attention inputs (q, k, v, ck, cv): restart at that layer's
     * attention (ps_forward_from_attention_rows: the layer's projections are not recomputed, the last
     * layer runs on the answer rows only) */
    PS_GRID_RESTART_ATTENTION = 1,
    /* every cell's hooks lie on its layer or later: restart from the layer's input residual
     * (ps_forward_from: every point of the layer fires) */
    PS_GRID_RESTART_LAYER = 2
} ps_grid_restart;

typedef struct {
    void *self;
    ps_grid_restart restart; /* whether and where the cells may restart (when the runtime can) */
    /* before the reference pass of a shift: register on `ref` what collects the sources */
    int (*sources)(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_hooks *ref, ps_error *err);
    /* after it (every prompt of the shift seen): turn what was collected into the sources */
    int (*sources_done)(void *self, const ps_runtime *rt, const ps_grid_shift *sh, ps_error *err);
    /* cell ci of layer index li on sequences [seq0, seq1) of a forward (seq1 = 0: every sequence), which
     * hold the shift's prompts from prompt0 on */
    int (*cell)(void *self, const ps_runtime *rt, const ps_grid_shift *sh, int li, int ci, int64_t seq0, int64_t seq1,
                int64_t prompt0, ps_hooks *h, ps_error *err);
    /* after a shift: free its sources (may be NULL) */
    void (*shift_end)(void *self, const ps_runtime *rt);
    /* An estimate instead of a forward per cell (attribution patching; NULL for an exact grid): once per
     * batch, from its clean state `state` (what the runtime's backward takes: the controlled model's kept
     * activations), the estimated log-prob of every query under every cell of every selected layer:
     * cell_lp [n_layers · n_cells, sv->b.B · max_q] (layer index major, as the result's cells), given the
     * clean run's clean_lp [sv->b.B · max_q]. `cell` is not used then. */
    int (*estimate)(void *self, const ps_runtime *rt, const ps_grid_shift *sh, const ps_shifted *sv, void *state,
                    const double *clean_lp, double *cell_lp, ps_error *err);
    /* The per-query outcome (NULL: ps_score_queries, ok = the answer is the top-1, lp its log-prob; the
     * controlled model only otherwise): the queries of the prompts [prompt0, prompt0 + set->b.B) of the
     * shift (set: their view) from their logits [set->b.B, T, V] (host) into ok and lp [set->b.B ·
     * max_q]. The engine's statistics add them per residue as they add accuracies and log-probs (a mean
     * of lp over queries: the spec's metric, e.g. activation patching's logit difference). */
    void (*score)(void *self, const ps_grid_shift *sh, const ps_shifted *set, int64_t prompt0, const float *logits, int64_t V,
                  int *ok, double *lp);
} ps_grid_spec;

/* struct ps_runtime (ctx, max_pos, n_layers, model, family, ...): core/runtime.h. Everything the instruments need of
 * a family is its core table (rt->family): evaluation, knockout targets, gates, gate cycling, gradients. */

/* The controlled model's runtime (ps_runtime_wrap_model). */
void ps_runtime_model(ps_runtime *rt, const ps_model *m);



/* The outcomes of one scored set of prompts: `unit` the work unit, cell -1 the clean run, PS_GRID_REF (-2) the
 * reference run of other tokens (ps_grid.ref_tokens: on the batch's li = 0 unit), else li · n_cells + ci; the
 * set is prompts [first, first + set->b.B) of the unit's batch; ok, lp: [set->b.B · max_q]. */
#define PS_GRID_REF (-2)
typedef void (*ps_grid_record_fn)(void *user, int64_t unit, int cell, int64_t first, const ps_shifted *set, const int *ok,
                                  const double *lp);

/* A grid's result: per residue, the clean run and every cell. */
typedef struct {
    int64_t P;
    int n_layers, n_heads;   /* selected layers; cells per layer (heads, or 1 for a per-layer target) */
    int *layers, *heads;     /* layers top-down; the cells' labels */
    ps_residue_stats clean;
    ps_residue_stats ref;    /* a reference run of other prompts (ps_grid.ref_tokens): its outcomes; else empty */
    ps_residue_stats *cells; /* [n_layers · n_heads], layer-major */
    int cells_per_forward;   /* restart path: the most cells one forward ran (0: a forward per cell) */
    int64_t prompts_per_forward; /* restart path: prompts per cell in one forward */
} ps_grid_result;

typedef struct {
    const ps_runtime *rt;
    const ps_batch *base;          /* the evaluation prompts (shift 0) */
    /* A prompt set without shifts (NULL: the sweep of base over P shifts, from task, fam and seed): its
     * prompts as they are, one "shift" 0 whose queries count in residues [0, P) by prompts->residue
     * (base, task, fam and seed unused). */
    const ps_shifted *prompts;
    /* The reference pass's tokens [N, T] when they are not the prompts' own (NULL: the prompts'; any
     * family): the sources come from a run of other prompts (activation patching: the source run, the cells
     * on the other prompts), scored against the prompts' queries as the cells are; its outcomes go to the
     * result's `ref` and to `record` as cell PS_GRID_REF. The clean run is then a forward of its own. */
    const int32_t *ref_tokens;
    const ps_task *task;
    const ps_filler_family *fam;
    int64_t P;
    uint64_t seed;
    int64_t batch;                 /* prompts per forward batch */
    const int *layers;             /* any order (the engine visits them top-down) */
    int n_layers;
    const int *cells;              /* the cells' labels (heads), n_cells of them */
    int n_cells;
    const ps_grid_spec *spec;
    int naive;                     /* 1: a full forward per cell even where the restart applies */
    int max_cells;                 /* restart path: most cells per forward; 0: as the budget holds */
    double mem_bytes;              /* restart path: bytes for the cells' activations; 0: ps_grid_default_budget() */
    const unsigned char *cell_mask; /* [n_layers · n_cells] in the caller's layer order (layers[i]); NULL: every
                                     * cell. Only the masked cells run (the others keep empty statistics). */
    int64_t unit0, unit1;          /* the work slice (unit1 = 0: every unit) */
    ps_grid_record_fn record;      /* may be NULL */
    void *record_user;
    ps_progress_fn progress;       /* may be NULL */
    void *progress_user;
} ps_grid;

/* Default memory for the restarted cells' activations: 1 GiB, at most a quarter of available memory. */
#define PS_GRID_DEFAULT_BUDGET (1024.0 * 1024.0 * 1024.0)
double ps_grid_default_budget(void);

/* Whether the grid visits a shift's batches from the last one (the runtime keeps the clean state of the
 * reference pass's last batch: the controlled model) or from the first. */
int ps_grid_last_first(const ps_runtime *rt);
/* The work list of a grid over N prompts in batches of `batch`, P shifts and n_layers layers: its unit
 * count, and what unit u is: shift *p, batch of prompts [*i0, *i0 + *n), layer index *li (top-down). */
int64_t ps_grid_n_units(int64_t N, int64_t batch, int64_t P, int n_layers);
void ps_grid_unit(int64_t N, int64_t batch, int n_layers, int last_first, int64_t u, int64_t *p, int64_t *i0, int64_t *n,
                  int *li);

/* Work weights of the units for the split (docs/scale-out.md), in 1/64 of a prompt's forward: a shift's
 * reference pass (on its first unit, which is a snap point: a range beginning inside a shift pays the
 * pass again), a batch's clean run (its li = 0 unit), a cell a full forward, or restarted at layer l
 * about (L − 1 − l) / L of one plus its answer rows. layers: top-down; nc cells per layer; L the model's
 * layers. w, snap: [ps_grid_n_units]. */
void ps_grid_unit_weights(const ps_runtime *rt, int64_t N, int64_t batch, int64_t P, const int *layers, int n_layers, int nc,
                          int64_t L, int64_t *w, unsigned char *snap);
/* The same for an estimate (spec->estimate): per batch one backward pass (about two forwards) on its
 * li = 0 unit and nothing per cell. */
void ps_grid_unit_weights_estimate(int64_t N, int64_t batch, int64_t P, int n_layers, int64_t *w, unsigned char *snap);

/* layers[0..n) into the order the engine visits them (top-down), as its result and work units list them. */
void ps_grid_sort_topdown(int *layers, int n);

int ps_grid_run(const ps_grid *g, ps_grid_result *out, ps_error *err);
void ps_grid_result_free(ps_grid_result *r);
/* An empty result (zero statistics) of P residues, layers in top-down order, cells. */
int ps_grid_result_init(ps_grid_result *r, int64_t P, const int *layers_topdown, int n_layers, const int *cells, int n_cells,
                        ps_error *err);

#endif
