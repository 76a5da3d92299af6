/* theory_train.h — gradient descent on the idealised bigram-induction model (theory.h, docs/theory.md):
 * the training loop of `phasescope theory` with its log-spaced records, the summary of the final gates
 * (peaks, effective offsets, which phases the heads answer), and the check of the exact gradient against
 * finite differences. Library code: nothing here prints; the command writes the records as JSON. */
#ifndef PS_THEORY_TRAIN_H
#define PS_THEORY_TRAIN_H

#include <stdint.h>

#include "core/error.h"
#include "gates/theory.h"

typedef struct {
    int64_t H, S, C, N;    /* heads, window W = S, chunks, vocabulary */
    int64_t steps;         /* gradient steps K */
    double lr;             /* learning rate */
    double temperature;    /* lambda = mu at the start */
    int learn_temperature; /* 1: log lambda and log mu descend too */
    int within_chunk;      /* 1: queries at phases 0 .. S - 2 only (theory.h) */
    int64_t batch;         /* 0: the exact population gradient; B > 0: B query positions sampled per step */
    int64_t records;       /* R: log-spaced records of the gates */
    uint64_t seed;         /* of the init and of the sampled positions */
    double init_std;       /* gate logits start N(0, init_std²) */
} ps_theory_opts;

/* The defaults of `phasescope theory`: H 7, S 8, C 8, N 128, 1e5 steps, lr 1, temperature 8 (fixed),
 * within_chunk, the population gradient, 80 records, seed 0, init_std PS_THEORY_INIT_STD. */
void ps_theory_opts_default(ps_theory_opts *o);

/* The steps recorded: 0 and round(K^(k/R)) for k = 0 .. R, without repeats, and K. out holds at least
 * R + 3 entries. Returns the count. */
int64_t ps_theory_record_steps(int64_t K, int64_t R, int64_t *out);

/* Called at every recorded step, before that step's update: t holds the gates (alpha, beta) and the
 * temperatures; loss and accuracy are that step's (population, or of the sampled positions). */
typedef void (*ps_theory_record_fn)(const ps_theory *t, int64_t step, int64_t steps, double loss, double accuracy, void *user);

/* Initialises t from o (free it with ps_theory_free, also after a failure) and runs o->steps steps of
 * gradient descent on the gate logits (and the log-temperatures with learn_temperature); the gradient of
 * step k is taken at the parameters after k updates, so step K is evaluated but not applied. Calls rec
 * (may be NULL) at every step of ps_theory_record_steps. *loss and *accuracy get step K's. Fails when the
 * loss is not finite (the learning rate too large). */
int ps_theory_train(ps_theory *t, const ps_theory_opts *o, ps_theory_record_fn rec, void *user, double *loss,
                    double *accuracy, ps_error *err);

/* The final gates of one head: peaks (argmax, ties to the lowest offset) and effective offsets
 * N = exp(H(gate)). aligned: value_peak = key_peak + 1, so the head answers the queries at phase key_peak. */
typedef struct {
    int64_t key_peak, value_peak;
    double N_key, N_value;
    int aligned;
} ps_theory_head;

typedef struct {
    ps_theory_head head[PS_THEORY_MAX_HEADS];
    int64_t aligned;                     /* heads with value_peak = key_peak + 1 */
    int64_t one_hot;                     /* heads with N_key, N_value <= PS_THEORY_ONE_HOT_N */
    double max_N;                        /* the largest N_key or N_value */
    int64_t cover[PS_THEORY_MAX_WINDOW]; /* per phase r: the aligned heads with key_peak r */
    int64_t n_covered;                   /* phases 0 .. S - 2 answered by at least one head */
} ps_theory_summary;

void ps_theory_summarise(const ps_theory *t, ps_theory_summary *s);

/* The check of the exact gradient, at random gate logits (N(0, 1)) and lambda != mu: relative errors
 * against central finite differences and of the phase sum against the sum over every position. */
typedef struct {
    int64_t n_params;    /* 2·H·S gate logits and the two log-temperatures */
    double gates;        /* max |exact - finite difference| / max |gradient|, gate logits */
    double temperatures; /* the same for log lambda and log mu */
    double phase_loss;   /* |phase-sum loss - every-position loss| / |loss| */
    double phase_grad;   /* max |phase-sum gradient - every-position gradient| / max |gradient| */
} ps_theory_gradcheck;

/* Tolerances of the check. */
#define PS_THEORY_GRADCHECK_FD_TOL 1e-5
#define PS_THEORY_GRADCHECK_SUM_TOL 1e-12

/* Runs the check for the model of o (H, S, C, N, temperature, within_chunk, seed). Fills r (n_params = 0
 * when it could not run) and fails with "gradient check failed (...)" when a tolerance is exceeded. */
int ps_theory_check_grad(const ps_theory_opts *o, ps_theory_gradcheck *r, ps_error *err);

#endif
