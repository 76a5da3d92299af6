/* decode.c — serve's generation through the KV cache (decode.h). */
#include "serve/decode.h"

#include <stdlib.h>
#include <string.h>

int ps_serve_decoder_create(ps_serve_decoder *d, const ps_runtime *rt, ps_error *err) {
    memset(d, 0, sizeof *d);
    d->V = rt->family->vocab(rt);
    return ps_kvcache_create_rt(&d->kv, rt, NULL, err);
}

void ps_serve_decoder_reset(ps_serve_decoder *d) {
    for (int i = 0; i < d->n; i++) ps_kvcache_drop(&d->kv, d->ids[i]);
    d->n = 0;
}

void ps_serve_decoder_drop(ps_serve_decoder *d, const void *key) {
    for (int i = 0; i < d->n; i++)
        if (d->keys[i] == key) {
            ps_kvcache_drop(&d->kv, d->ids[i]);
            d->keys[i] = d->keys[d->n - 1];
            d->ids[i] = d->ids[d->n - 1];
            d->n--;
            return;
        }
}

int ps_serve_decoder_live(const ps_serve_decoder *d) { return d->n; }

void ps_serve_decoder_free(ps_serve_decoder *d) {
    ps_serve_decoder_reset(d);
    ps_kvcache_free(&d->kv);
    free(d->keys);
    free(d->ids);
    memset(d, 0, sizeof *d);
}

/* The cache sequence of key (a new one the first time). */
static int seq_of(ps_serve_decoder *d, const void *key, ps_error *err) {
    for (int i = 0; i < d->n; i++)
        if (d->keys[i] == key) return d->ids[i];
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 16;
        const void **nk = realloc(d->keys, (size_t)cap * sizeof *nk);
        if (!nk) return ps_fail(err, "out of memory for the decoder's sequences");
        d->keys = nk;
        int *ni = realloc(d->ids, (size_t)cap * sizeof *ni);
        if (!ni) return ps_fail(err, "out of memory for the decoder's sequences");
        d->ids = ni;
        d->cap = cap;
    }
    int id = ps_kvcache_add(&d->kv, err);
    if (id < 0) return -1;
    d->keys[d->n] = key;
    d->ids[d->n++] = id;
    return id;
}

int ps_serve_decode_rows(ps_serve_decoder *d, const void *const *keys, const ps_batch *b, ps_rows_fn fn, void *user, ps_error *err) {
    int64_t B = b->B, V = d->V;
    size_t nb = (size_t)(B ? B : 1);
    int *ids = malloc(nb * sizeof *ids), *grp = malloc(nb * sizeof *grp), *gid = malloc(nb * sizeof *gid);
    int64_t *n = malloc(nb * sizeof *n), *r0 = malloc(nb * sizeof *r0), *nr = malloc(nb * sizeof *nr), *have = malloc(nb * sizeof *have),
            *row = malloc(nb * sizeof *row), *gn = malloc(nb * sizeof *gn);
    int32_t *cat = NULL;
    float *lg[2] = {NULL, NULL};
    int rc = ids && grp && gid && n && r0 && nr && have && row && gn ? 0 : ps_fail(err, "out of memory for a decode step");
    int64_t ntok = 0, rows[2] = {0, 0};
    for (int64_t s = 0; s < B && !rc; s++) {
        if (b->n_q[s] != 1) {
            rc = ps_fail(err, "decode: sequence %lld has %lld queries (one expected)", (long long)s, (long long)b->n_q[s]);
            break;
        }
        const ps_query *q = &b->queries[s * b->max_q];
        if ((ids[s] = seq_of(d, keys[s], err)) < 0) {
            rc = -1;
            break;
        }
        int64_t need = q->answer_pos + q->answer_len;
        have[s] = ps_kvcache_len(&d->kv, ids[s]);
        r0[s] = q->answer_pos;
        nr[s] = q->answer_len;
        n[s] = need - have[s];
        if (n[s] < 0 || (nr[s] > 0 && r0[s] < have[s]) || need > b->T) {
            rc = ps_fail(err, "decode: sequence %lld asks for rows [%lld, %lld) but its cache holds %lld tokens", (long long)s,
                         (long long)r0[s], (long long)need, (long long)have[s]);
            break;
        }
        /* group 0: the last new position only (a generation step); group 1: every new position (an echoed
         * prompt); -1: no rows asked (nothing appended now: a later step appends what the cache lacks) */
        grp[s] = nr[s] == 0 ? -1 : !(nr[s] == 1 && r0[s] == need - 1);
        if (grp[s] < 0) continue;
        row[s] = rows[grp[s]];
        rows[grp[s]] += grp[s] ? n[s] : 1;
        ntok += n[s];
    }
    if (!rc && !(cat = malloc((size_t)(ntok ? ntok : 1) * sizeof *cat))) rc = ps_fail(err, "out of memory for a decode step");
    for (int k = 0; k < 2 && !rc; k++)
        if (rows[k] && !(lg[k] = malloc((size_t)(rows[k] * V) * sizeof(float))))
            rc = ps_fail(err, "out of memory for the logits of %lld rows", (long long)rows[k]);
    /* one append per group for the whole batch */
    for (int k = 0; k < 2 && !rc; k++) {
        int m = 0;
        int64_t tot = 0;
        for (int64_t s = 0; s < B; s++) {
            if (grp[s] != k) continue;
            memcpy(cat + tot, b->tokens + s * b->T + have[s], (size_t)n[s] * sizeof *cat);
            tot += n[s];
            gid[m] = ids[s], gn[m++] = n[s];
        }
        if (m) rc = ps_kvcache_append(&d->kv, m, gid, gn, cat, NULL, lg[k], k == 0, err);
    }
    for (int64_t s = 0; s < B && !rc; s++) {
        if (!nr[s]) {
            rc = fn(b, s, lg[0], 0, user, err);
            continue;
        }
        const float *x = grp[s] ? lg[1] + (row[s] + (r0[s] - have[s])) * V : lg[0] + row[s] * V;
        rc = fn(b, s, x, nr[s], user, err);
    }
    free(grp), free(gid), free(have), free(row), free(gn);
    free(ids), free(n), free(r0), free(nr), free(cat), free(lg[0]), free(lg[1]);
    return rc;
}
