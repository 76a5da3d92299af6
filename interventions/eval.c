/* eval.c — scoring prompts on the controlled model (eval.h). */
#include "interventions/eval.h"

#include <stdlib.h>
#include <string.h>

#include "core/forward.h"
#include "core/prefill.h"

typedef struct {
    int *correct;
    double *logprob;
} eval_out;

static int score_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    eval_out *o = user;
    return ps_acts_score(a, view, o->correct + i0 * view->max_q, o->logprob + i0 * view->max_q, err);
}

/* Long prompts: one at a time through the chunked prefill, logits at the answer rows only. */
static int eval_long(const ps_model *m, const ps_batch *b, int *correct, double *logprob, ps_error *err) {
    int64_t V = m->cfg.vocab_size, most = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    ps_prefill p;
    if (ps_prefill_create(&p, m, b->T, PS_PREFILL_CHUNK, err)) return -1;
    int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
    float *rows = malloc((size_t)((most ? most : 1) * V) * sizeof(float));
    int rc = pos && rows ? 0 : ps_fail(err, "out of memory for the logits of %lld answer rows", (long long)most);
    for (int64_t s = 0; s < b->B && !rc; s++) {
        int64_t n = ps_answer_rows(b, s, pos);
        rc = ps_prefill_logits(&p, b->tokens + s * b->T, b->T, pos, n, rows, err);
        if (!rc) ps_score_query_rows(b, s, rows, V, correct + s * b->max_q, logprob + s * b->max_q);
    }
    free(pos);
    free(rows);
    ps_prefill_free(&p);
    return rc;
}

int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err) {
    if (s->b.T > PS_LONG_CONTEXT) {
        if (hooks) return ps_fail(err, "hooks on prompts of %lld tokens: long prompts run in chunks (prefill), which fires no hooks (at most %d tokens)",
                                  (long long)s->b.T, PS_LONG_CONTEXT);
        return eval_long(m, &s->b, correct, logprob, err);
    }
    eval_out o = {correct, logprob};
    return ps_forward_batches(m, &s->b, batch, false, hooks, score_batch, &o, err);
}

/* ---- text prompts: batches sized to a memory budget (core/rows.h's answer rows) ---- */

typedef struct {
    int *correct;
    double *logprob;
    int64_t V;
} fit_out;

static int score_rows(const ps_batch *b, int64_t s, const float *rows, int64_t n, void *user, ps_error *err) {
    (void)n;
    (void)err;
    fit_out *o = user;
    ps_score_query_rows(b, s, rows, o->V, o->correct + s * b->max_q, o->logprob + s * b->max_q);
    return 0;
}

int ps_eval_shifted_fit(const ps_model *m, const ps_shifted *s, int64_t batch, double mem_bytes, int *correct,
                        double *logprob, ps_error *err) {
    fit_out o = {correct, logprob, m->cfg.vocab_size};
    return ps_eval_rows(m, &s->b, batch, mem_bytes, score_rows, &o, err);
}
