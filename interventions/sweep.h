/* sweep.h — the phase sweep (docs/results-schema.md): an evaluation set from the model's stored task, shifted copies
 * (prefix padding, or move mode), scoring, and per-residue statistics. Knockout and gate cycling reuse
 * the same shifted prompts and statistics. */
#ifndef PS_SWEEP_H
#define PS_SWEEP_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "core/forward.h"
#include "core/hooks.h"
#include "core/model.h"
#include "tasks/tasks.h"

typedef enum { PS_SWEEP_PAD = 0, PS_SWEEP_MOVE = 1 } ps_sweep_mode;

/* A filler family (data/fillers.json): a pattern of filler indices (mod n_fillers), or random. */
typedef struct {
    char name[64];
    int random;
    int64_t n_pattern;
    int64_t pattern[64];
} ps_filler_family;

/* Load the families; *n gets their count (the first is the default). Caller frees *out. */
int ps_fillers_load(const char *path, ps_filler_family **out, int *n, ps_error *err);
/* Find a family by name (NULL name: the first); the error lists the names. */
int ps_fillers_find(const ps_filler_family *f, int n, const char *name, const ps_filler_family **out, ps_error *err);

/* The task stored in a checkpoint's metadata ("phasescope.task"). */
int ps_model_task(const ps_model *m, const char *model_dir, ps_task *t, ps_error *err);

/* Prompts of one shift p: every prompt has the same length, queries carry shifted positions, and
 * residue[i·max_q + q] is the query's phase coordinate (t_K mod P), or -1 for a query not scored. */
typedef struct {
    ps_batch b;
    int64_t p, P;
    int64_t *residue;
} ps_shifted;

/* Build the prompts of shift p from base (pad: p fillers after BOS; move: the first query's pair moves,
 * with p fillers before it and P-1-p after it). Errors when a prompt would exceed max_seq_len. */
int ps_make_shifted(const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                    int64_t P, int64_t p, uint64_t seed, int64_t max_seq_len, ps_shifted *out, ps_error *err);
void ps_shifted_free(ps_shifted *s);

/* Per-residue accumulators. */
typedef struct {
    int64_t P;
    int64_t *n, *k;  /* [P] evaluations, correct */
    double *lp;      /* [P] summed target log-probabilities */
} ps_residue_stats;

int ps_residue_stats_init(ps_residue_stats *r, int64_t P, ps_error *err);
void ps_residue_stats_free(ps_residue_stats *r);
/* Add the outcomes of one shifted set (correct / logprob per query, [N · max_q]). */
void ps_residue_stats_add(ps_residue_stats *r, const ps_shifted *s, const int *correct, const double *logprob);

/* Prompts longer than this run one at a time through the chunked prefill (core/prefill.h) in chunks of
 * PS_PREFILL_CHUNK tokens, with logits at the answer rows only (no [T, vocab] array); shorter ones in
 * batches through ps_forward (where hooks fire). */
#define PS_LONG_CONTEXT 4096
#define PS_PREFILL_CHUNK 2048

/* Run the shifted prompts through the model in batches of `batch` (hooks may be NULL); per-query
 * outcomes go to correct / logprob ([N · max_q]). */
int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err);

/* The summary of a curve: per residue n, accuracy, Wilson 95% interval, mean log-prob; overall mean,
 * min, max, gap (pp), chi-square test, the verdict (phase_sensitive: p < 0.01 and gap >= 5 pp) and the
 * dominant period (null unless phase sensitive). NULL with err set when memory runs out. */
json_t *ps_residue_stats_json(const ps_residue_stats *r, ps_error *err);
double ps_residue_accuracy(const ps_residue_stats *r, int64_t rho);

/* A whole sweep over shifts 0..P-1: fills stats. progress(done, total, user) may be NULL. */
typedef void (*ps_progress_fn)(int64_t done, int64_t total, void *user);
int ps_sweep_run(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                 ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, ps_residue_stats *stats,
                 ps_progress_fn progress, void *user, ps_error *err);

/* ---- text prompts (interventions/textkv.h, interventions/fillers.h) ----
 * Real vocabularies make [B, T, vocab] logits large (151,936 × 4 bytes per position for Qwen3), so text
 * prompts are run in batches sized to a memory budget, and a prompt whose activations alone exceed it
 * goes through the chunked prefill like a long one. */
#define PS_EVAL_MEM_DEFAULT ((double)(1 << 30))
/* Sequences of T tokens per forward batch (at most want) whose activations fit mem_bytes (0: the
 * default, 1 GiB); 0 when T > PS_LONG_CONTEXT or one sequence alone does not fit (use the prefill). */
int64_t ps_eval_batch_fit(const ps_config *c, int64_t T, int64_t want, double mem_bytes);
/* The logits at the answer rows of every sequence of b (ps_answer_rows order), handed to fn one sequence
 * at a time: rows [n, V]. Batches as ps_eval_batch_fit says, else the chunked prefill, which runs each
 * sequence only up to its last answer row. Stops at fn's first failure. */
typedef int (*ps_rows_fn)(const ps_batch *b, int64_t s, const float *rows, int64_t n, void *user, ps_error *err);
int ps_eval_rows(const ps_model *m, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                 ps_error *err);
/* ps_eval_shifted without hooks, batched by ps_eval_batch_fit (the same outcomes, per query). */
int ps_eval_shifted_fit(const ps_model *m, const ps_shifted *s, int64_t batch, double mem_bytes, int *correct,
                        double *logprob, ps_error *err);

#endif
