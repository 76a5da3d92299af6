/* theory.h — the idealised bigram-induction model of SPEC §1 (docs/theory.md) and its exact loss and
 * gradients (gradient descent on it, and the check of the gradient: theory_train.h).
 *
 * One-hot token embeddings; a context of C·S distinct tokens cut into C chunks of W = S; H heads, each
 * with static gate logits a_h (key) and b_h (value) over the S offsets, alpha_h = softmax(a_h),
 * beta_h = softmax(b_h). A query token x = the token at context position p (0 <= p < C·S − 1, phase
 * p mod S, chunk c = p / S) scores chunk j by lambda·alpha_{h, p mod S}·[j = c]; head h attends with
 * pi_h = softmax over the C chunks; the output o = sum_h sum_j pi_hj V_hj, V_hj = sum_i beta_hi
 * e(x_{jS+i}), gives logits mu·o over the N tokens (the N − C·S tokens outside the context get logit 0),
 * and the loss is the cross-entropy of x's successor, the token at p + 1. lambda = exp(log_lam) and
 * mu = exp(log_mu) are parameters too (learned or held fixed by the caller).
 *
 * The tokens are distinct and one-hot, so a query's loss depends on its position only: token
 * identities never enter, and all chunks but the query's are alike, so it depends on the phase only.
 * The population loss (uniform p) is therefore an exact finite sum over the S phases. */
#ifndef PS_THEORY_H
#define PS_THEORY_H

#include <stdint.h>

#include "core/error.h"

/* The model's limits (ps_theory_init refuses others; `phasescope theory` and the result validator use the
 * same), and the settings of `phasescope theory` that are not flags. */
#define PS_THEORY_MAX_HEADS 64
#define PS_THEORY_MIN_WINDOW 2
#define PS_THEORY_MAX_WINDOW 64
#define PS_THEORY_MAX_CHUNKS 256
#define PS_THEORY_MIN_VOCAB 2
#define PS_THEORY_MAX_VOCAB 65536
#define PS_THEORY_MAX_STEPS 10000000
#define PS_THEORY_MAX_BATCH (1 << 16)
#define PS_THEORY_MIN_RECORDS 2
#define PS_THEORY_MAX_RECORDS 2000
#define PS_THEORY_INIT_STD 0.01 /* gate logits start N(0, 0.01²) */
/* A head is one-hot when both its gates have N_eff = exp(H) at most this. */
#define PS_THEORY_ONE_HOT_N 1.05

typedef struct {
    int64_t H, S, C, N;
    double *a, *b;          /* [H, S] key / value gate logits */
    double log_lam, log_mu; /* score scale lambda = exp(log_lam), logit scale mu = exp(log_mu) */
    double *alpha, *beta;   /* [H, S] softmaxes of a and b (ps_theory_gates fills them) */
    double *work;           /* scratch for one query */
    int within_chunk;       /* 1: queries only at phases 0 .. S − 2, whose successor lies in their own chunk */
} ps_theory;

typedef struct {
    double *a, *b; /* [H, S] */
    double log_lam, log_mu;
} ps_theory_grad;

/* Allocates a model with gate logits N(0, init_std²) from seed and lambda = mu = temperature. Limits:
 * 1 <= H <= 64, 2 <= S <= 64, 1 <= C <= 256, C·S <= N <= 65536 (the PS_THEORY_ constants above). */
int ps_theory_init(ps_theory *t, int64_t H, int64_t S, int64_t C, int64_t N, double temperature, double init_std, uint64_t seed,
                   ps_error *err);
void ps_theory_free(ps_theory *t);
int ps_theory_grad_init(ps_theory_grad *g, const ps_theory *t, ps_error *err);
void ps_theory_grad_free(ps_theory_grad *g);
void ps_theory_grad_zero(ps_theory_grad *g, const ps_theory *t);

/* alpha, beta = softmax of a, b per head. Call after changing a or b, before the loss functions. */
void ps_theory_gates(ps_theory *t);

/* Loss of the query at context position p; adds weight × its gradient to g (g may be NULL) and sets
 * *correct (the successor's logit strictly above every other token's). */
double ps_theory_query(ps_theory *t, int64_t p, double weight, ps_theory_grad *g, int *correct);

/* 1 when a query at position p is part of the task (within_chunk drops phase S − 1). */
static inline int ps_theory_asked(const ps_theory *t, int64_t p) { return p >= 0 && p < t->C * t->S - 1 && (!t->within_chunk || p % t->S != t->S - 1); }

/* The number of query positions in the task: C·S − 1, or C·(S − 1) with within_chunk. */
static inline int64_t ps_theory_positions(const ps_theory *t) { return t->within_chunk ? t->C * (t->S - 1) : t->C * t->S - 1; }

/* The population loss (p uniform over the task's positions: 0 .. C·S − 2, less phase S − 1 with within_chunk), exactly, as a weighted sum over the S phases; adds
 * its gradient to g (may be NULL), sets *accuracy (the fraction of positions answered correctly). */
double ps_theory_population(ps_theory *t, ps_theory_grad *g, double *accuracy);

/* Phases a head with key peak r and value peak r + 1 can answer: 0 .. S − 2 (the successor of phase
 * S − 1 lies in the next chunk, whose compressed key does not match the query). */
static inline int64_t ps_theory_coverable(int64_t S) { return S - 1; }

/* Training, the summary of the final gates and the gradient check: theory_train.h. */

#endif
