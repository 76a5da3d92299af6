#include "core/batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ps_batch_alloc(ps_batch *b, int64_t B, int64_t T, int64_t max_q, ps_error *err) {
    memset(b, 0, sizeof *b);
    b->B = B;
    b->T = T;
    b->max_q = max_q;
    b->tokens = malloc((size_t)(B * T) * sizeof(int32_t));
    b->targets = malloc((size_t)(B * T) * sizeof(int32_t));
    b->n_q = calloc((size_t)B, sizeof(int64_t));
    b->queries = calloc((size_t)(B * max_q), sizeof(ps_query));
    if (!b->tokens || !b->targets || !b->n_q || !b->queries) {
        ps_batch_free(b);
        return ps_fail(err, "out of memory for a batch of %lld x %lld tokens", (long long)B, (long long)T);
    }
    return 0;
}

void ps_batch_free(ps_batch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->n_q);
    free(b->queries);
    memset(b, 0, sizeof *b);
}

ps_batch ps_batch_view(const ps_batch *b, int64_t i0, int64_t n) {
    ps_batch v = *b;
    v.B = n;
    v.tokens = b->tokens + i0 * b->T;
    v.targets = b->targets ? b->targets + i0 * b->T : NULL;
    v.n_q = b->n_q + i0;
    v.queries = b->queries + i0 * b->max_q;
    return v;
}

/* One query from the logits of its answer rows: row k (answer token k) at first + k·V. */
static void score_query(const ps_query *q, const int32_t *seq, const float *first, int64_t V, int *correct, double *logprob) {
    int ok = 1;
    double lp = 0;
    for (int64_t k = 0; k < q->answer_len; k++) {
        const float *x = first + k * V;
        int32_t y = ps_query_answer(q, seq, k);
        float mx = x[0];
        int64_t arg = 0;
        for (int64_t i = 1; i < V; i++)
            if (x[i] > mx) {
                mx = x[i];
                arg = i;
            }
        double sum = 0;
        for (int64_t i = 0; i < V; i++) sum += exp((double)(x[i] - mx));
        lp += (double)(x[y] - mx) - log(sum);
        if (arg != y) ok = 0;
    }
    *correct = ok;
    *logprob = lp;
}

void ps_score_queries(const ps_batch *b, const float *logits, int64_t V, int *correct, double *logprob) {
    for (int64_t s = 0; s < b->B; s++)
        for (int64_t qi = 0; qi < b->n_q[s]; qi++) {
            const ps_query *q = &b->queries[s * b->max_q + qi];
            score_query(q, b->tokens + s * b->T, logits + (s * b->T + q->answer_pos) * V, V, &correct[s * b->max_q + qi],
                        &logprob[s * b->max_q + qi]);
        }
}

int64_t ps_answer_rows(const ps_batch *b, int64_t s, int64_t *pos) {
    int64_t n = 0;
    for (int64_t qi = 0; qi < b->n_q[s]; qi++) {
        const ps_query *q = &b->queries[s * b->max_q + qi];
        for (int64_t k = 0; k < q->answer_len; k++) {
            if (pos) pos[n] = q->answer_pos + k;
            n++;
        }
    }
    return n;
}

void ps_score_query_rows(const ps_batch *b, int64_t s, const float *rows, int64_t V, int *correct, double *logprob) {
    int64_t r = 0;
    for (int64_t qi = 0; qi < b->n_q[s]; qi++) {
        const ps_query *q = &b->queries[s * b->max_q + qi];
        score_query(q, b->tokens + s * b->T, rows + r * V, V, &correct[qi], &logprob[qi]);
        r += q->answer_len;
    }
}
