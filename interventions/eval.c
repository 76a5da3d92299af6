/* eval.c — scoring prompts on the controlled model (eval.h). */
#include "interventions/eval.h"

#include <stdlib.h>
#include <string.h>


int ps_eval_shifted(const ps_model *m, const ps_shifted *s, int64_t batch, const ps_hooks *hooks, int *correct,
                    double *logprob, ps_error *err) {
    ps_runtime rt; /* the family's score: forward batches, long prompts through the chunked prefill */
    ps_runtime_wrap_model(&rt, m);
    return rt.family->score(&rt, &s->b, batch, hooks, correct, logprob, err);
}

int ps_eval_mapped(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct, double *logprob,
                   ps_error *err) {
    if (!rt->token_map) return rt->family->score(rt, b, batch, hooks, correct, logprob, err);
    int64_t N = b->B, T = b->T, n_ids = rt->n_token_map;
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    if (N == 0) return 0;
    /* the mapped copy: tokens (and the answer tokens scoring reads from them) in the model's ids */
    ps_batch mb;
    if (ps_batch_alloc(&mb, N, T, b->max_q, err)) return -1;
    for (int64_t i = 0; i < N * T; i++) {
        int32_t x = b->tokens[i], y = b->targets[i];
        if (x < 0 || x >= n_ids) {
            ps_batch_free(&mb);
            return ps_fail(err, "token %d outside the task's %lld ids", x, (long long)n_ids);
        }
        mb.tokens[i] = rt->token_map[x];
        mb.targets[i] = y >= 0 && y < n_ids ? rt->token_map[y] : -1;
    }
    memcpy(mb.n_q, b->n_q, (size_t)N * sizeof *b->n_q);
    memcpy(mb.queries, b->queries, (size_t)(N * b->max_q) * sizeof *b->queries);
    int rc = rt->family->score(rt, &mb, batch, hooks, correct, logprob, err);
    ps_batch_free(&mb);
    return rc;
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
