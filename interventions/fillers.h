/* fillers.h — text filler experiments (docs/text-experiments.md): a prompt template with a filler slot,
 * filler families cut to exactly L tokens, candidate continuations scored teacher-forced (a candidate's
 * probability is the product of its tokens' probabilities), Δ = P(first) − P(second) against the phase
 * L mod P, and a permutation test of the between-residue variance of Δ, per family and pooled.
 *
 * The prompt of family f and length L, as ids: [before][the first L ids of f's text][after], where
 * before = chat prefix + the template up to the slot and after = the template after the slot + chat
 * suffix, each tokenized as one string on its own. A candidate's ids (its text tokenized on its own, or
 * the ids given) follow the prompt. */
#ifndef PS_FILLERS_H
#define PS_FILLERS_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "core/model.h"
#include "core/runtime.h"
#include "text/textutil.h"
#include "text/tokenizer.h"

/* Limits of an experiment file (the validator enforces the same) */
#define PS_FILLERS_MAX_L ((int64_t)1 << 20)     /* the largest filler length in tokens */
#define PS_FILLERS_MAX_POINTS 100000            /* families × lengths */
#define PS_FILLERS_MAX_CANDIDATES 16
#define PS_FILLERS_MAX_PERMUTATIONS 1000000
#define PS_FILLERS_DEFAULT_PERMUTATIONS 9999

typedef struct {
    char *text; /* the candidate's text, or NULL when given as ids */
    ps_ids ids; /* its ids (after ps_fillexp_prepare) */
} ps_fillexp_cand;

typedef struct {
    char *path, *name, *description;
    char *template_text, *slot, *chat_prefix, *chat_suffix; /* chat_*: NULL without "chat" */
    ps_text_family *fams;
    int n_fams;
    int64_t L_min, L_max;
    ps_fillexp_cand *cands;
    int n_cands;
    int64_t period;       /* 0: the model's stride (or --period) */
    int64_t permutations; /* of the periodicity test */
    int detrend;          /* remove a linear trend in L per family before the test (default true) */
    uint64_t seed;        /* of the permutations */
    /* ps_fillexp_prepare */
    ps_ids before, after;
    ps_ids *fill; /* [n_fams]: at least L_max ids each */
} ps_fillexp;

/* Read and check an experiment file; a relative family "file" is read relative to the experiment file. */
int ps_fillexp_load(const char *path, ps_fillexp *e, ps_error *err);
/* The same from parsed JSON (source names it in errors; base_dir resolves family files). */
int ps_fillexp_parse(json_t *root, const char *source, const char *base_dir, ps_fillexp *e, ps_error *err);
void ps_fillexp_free(ps_fillexp *e);

/* Tokenize the template parts, the candidates and every family's filler (error when a family cannot
 * give L_max tokens). */
int ps_fillexp_prepare(ps_fillexp *e, const ps_tokenizer *tok, ps_error *err);

/* The prompt ids of family f and length L (prepared experiment): [before][filler f, first L ids][after]. */
int ps_fillexp_prompt(const ps_fillexp *e, int f, int64_t L, ps_ids *out, ps_error *err);

/* One (family, L) point. */
typedef struct {
    int64_t L, phase, prompt_tokens;
    double logprob[PS_FILLERS_MAX_CANDIDATES]; /* sum of the candidate's token log-probabilities */
    int all_top1[PS_FILLERS_MAX_CANDIDATES];   /* every token of the candidate was the top-1 prediction */
    int32_t top1;                              /* the top-1 prediction after the prompt */
    double delta;                              /* exp(logprob[0]) - exp(logprob[1]) */
} ps_fillexp_point;

typedef struct {
    int n_fams, n_cands;
    int64_t n_L, P;
    ps_fillexp_point *pts; /* [n_fams × n_L], family-major, L increasing */
} ps_fillexp_result;

/* Run every prompt of a prepared experiment with period P on the model of rt, any family (the prompts' ids
 * are the model's): each candidate's sequences (prompt + candidate ids) through the family's `rows` entry
 * (core/runtime.h), in batches of at most `batch` (fewer when their activations would exceed mem_bytes; 0:
 * the default; the controlled model: 1 GiB, prompts of more than PS_LONG_CONTEXT tokens through the chunked
 * prefill). Logits are read at the candidates' rows only. progress may be NULL. */
typedef int (*ps_fillexp_progress_fn)(int64_t done, int64_t total, void *user); /* non-zero: stop (sweep.h) */
int ps_fillexp_run(const ps_runtime *rt, const ps_fillexp *e, int64_t P, int64_t batch, double mem_bytes,
                   ps_fillexp_result *r, ps_fillexp_progress_fn progress, void *user, ps_error *err);
void ps_fillexp_result_free(ps_fillexp_result *r);

/* ---- the periodicity test ----
 *
 * Points (x_i, y_i), residues r_i = x_i mod P, optional strata s_i (families). Residuals: per stratum,
 * y minus its least-squares line in x (detrend, when the stratum has at least 3 points and 2 distinct
 * x), else y minus the stratum's mean. Statistic: η² = SS_between / SS_total of the residuals, grouped by
 * residue (SS_between = Σ_r n_r (ē_r − ē)²); F = (SS_b / (k − 1)) / ((SS_t − SS_b) / (n − k)) with k
 * non-empty residues (NaN when k < 2 or n ≤ k). p-value: the residuals are permuted within strata
 * `perms` times (seeded xoshiro), p = (1 + #{η²_perm ≥ η²}) / (1 + perms). All residuals equal: η² = 0,
 * p = 1. */
typedef struct {
    int64_t n, groups, permutations;
    int detrended; /* every stratum was detrended */
    double eta2, F, p_value;
} ps_phase_test;

int ps_phase_test_run(const double *y, const int64_t *x, const int *stratum, int64_t n, int64_t P, int detrend,
                      int64_t perms, uint64_t seed, ps_phase_test *out, ps_error *err);
/* η² and F only (the validator recomputes them): residuals e [n] (already detrended), residues of x. */
void ps_phase_eta2(const double *e, const int64_t *x, int64_t n, int64_t P, double *eta2, double *F, int64_t *groups);
/* The residuals the test uses (per stratum detrended or centred) into e [n]; *all_detrended as above. */
void ps_phase_residuals(const double *y, const int64_t *x, const int *stratum, int64_t n, int detrend, double *e,
                        int *all_detrended);

/* ---- result JSON (kind "fillers", docs/results-schema.md) ----
 * Everything but the provenance: "experiment", "period", "statistic", "families", "pooled". tok decodes
 * the top-1 tokens. NULL with err set when memory runs out or a test cannot run. */
json_t *ps_fillexp_json(const ps_fillexp *e, const ps_tokenizer *tok, const ps_fillexp_result *r, ps_error *err);

#endif
