/* rows.c — the controlled model's logits at answer rows (rows.h). */
#include "core/rows.h"

#include <stdlib.h>
#include <string.h>

#include "core/forward.h"
#include "core/prefill.h"

int64_t ps_eval_batch_fit(const ps_config *c, int64_t T, int64_t want, double mem_bytes) {
    if (T > PS_LONG_CONTEXT) return 0;
    double budget = mem_bytes > 0 ? mem_bytes : PS_EVAL_MEM_DEFAULT;
    double one = 4.0 * (double)ps_acts_size(c, 1, T, false, false);
    if (one > budget) return 0;
    int64_t fit = (int64_t)(budget / one);
    return fit < want ? (fit > 0 ? fit : 1) : want;
}

typedef struct {
    ps_rows_fn fn;
    void *user;
    float *rows;
    int64_t V;
    const ps_batch *whole;
} rows_ctx;

static int rows_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    rows_ctx *x = user;
    const float *lg = ps_acts_logits_host(a, err);
    if (!lg) return -1;
    if (a->max_rows) { /* logits at the answer rows only (a large vocabulary): [n_rows, V], sequence by sequence */
        int64_t off = 0;
        for (int64_t s = 0; s < view->B; s++) {
            int64_t n = ps_answer_rows(view, s, NULL);
            if (x->fn(x->whole, i0 + s, lg + off * x->V, n, x->user, err)) return -1;
            off += n;
        }
        return 0;
    }
    for (int64_t s = 0; s < view->B; s++) {
        int64_t n = 0;
        for (int64_t qi = 0; qi < view->n_q[s]; qi++) {
            const ps_query *q = &view->queries[s * view->max_q + qi];
            memcpy(x->rows + n * x->V, lg + (s * view->T + q->answer_pos) * x->V, (size_t)(q->answer_len * x->V) * sizeof(float));
            n += q->answer_len;
        }
        if (x->fn(x->whole, i0 + s, x->rows, n, x->user, err)) return -1;
    }
    return 0;
}

int ps_eval_rows(const ps_model *m, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                 ps_error *err) {
    int64_t V = m->cfg.vocab_size, most = 0;
    if (b->B == 0) return 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = ps_answer_rows(b, s, NULL);
        most = n > most ? n : most;
    }
    rows_ctx x = {fn, user, malloc((size_t)((most ? most : 1) * V) * sizeof(float)), V, b};
    if (!x.rows) return ps_fail(err, "out of memory for the logits of %lld answer rows", (long long)most);
    int64_t fit = ps_eval_batch_fit(&m->cfg, b->T, batch, mem_bytes);
    int rc = 0;
    if (fit > 0)
        rc = ps_forward_batches(m, b, fit, false, NULL, rows_batch, &x, err);
    else {
        ps_prefill p = {0};
        int64_t *pos = malloc((size_t)(most ? most : 1) * sizeof *pos);
        rc = pos ? ps_prefill_create(&p, m, b->T, PS_PREFILL_CHUNK, err) : ps_fail(err, "out of memory");
        for (int64_t s = 0; s < b->B && !rc; s++) {
            int64_t n = ps_answer_rows(b, s, pos), last = 0;
            for (int64_t k = 0; k < n; k++) last = pos[k] > last ? pos[k] : last;
            rc = ps_prefill_logits(&p, b->tokens + s * b->T, last + 1, pos, n, x.rows, err);
            if (!rc) rc = fn(b, s, x.rows, n, user, err);
        }
        ps_prefill_free(&p);
        free(pos);
    }
    free(x.rows);
    return rc;
}

