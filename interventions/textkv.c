/* textkv.c — the phase sweep's text key-value prompts (textkv.h). */
#include "interventions/textkv.h"

#include <stdlib.h>
#include <string.h>

int ps_textkv_shifted(const ps_textkv *kv, ps_sweep_mode mode, int64_t P, int64_t p, uint64_t seed, int64_t N,
                      int64_t max_seq_len, ps_shifted *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    if (P < 1 || p < 0 || p >= P || N < 1) return ps_fail(err, "text-kv: shift %lld of period %lld", (long long)p, (long long)P);
    int64_t pre = mode == PS_SWEEP_PAD ? p : 0, before = mode == PS_SWEEP_MOVE ? p : 0,
            after = mode == PS_SWEEP_MOVE ? P - 1 - p : 0, nq = kv->n_queries;
    ps_ids *pr = calloc((size_t)N, sizeof *pr);
    ps_query *qs = malloc((size_t)(N * nq) * sizeof *qs);
    int rc = pr && qs ? 0 : ps_fail(err, "out of memory for %lld text-kv prompts", (long long)N);
    int64_t T = 0;
    for (int64_t i = 0; i < N && !rc; i++) {
        rc = ps_textkv_prompt(kv, ps_textkv_prompt_seed(seed, i), pre, before, after, &pr[i], qs + i * nq, err);
        T = pr[i].n > T ? pr[i].n : T;
    }
    if (!rc && T > max_seq_len)
        rc = ps_fail(err, "text-kv prompts of up to %lld tokens (shift %lld) exceed the model's max_seq_len %lld by %lld (use "
                          "fewer --pairs)",
                     (long long)T, (long long)p, (long long)max_seq_len, (long long)(T - max_seq_len));
    if (!rc) rc = ps_batch_alloc(&out->b, N, T, nq, err);
    if (!rc && !(out->residue = malloc((size_t)(N * nq) * sizeof *out->residue)))
        rc = ps_fail(err, "out of memory for the residues of %lld prompts", (long long)N);
    for (int64_t i = 0; i < N && !rc; i++) {
        int32_t *dst = out->b.tokens + i * T, pad = ps_textkv_pad(kv, &pr[i]);
        memcpy(dst, pr[i].v, (size_t)pr[i].n * sizeof *dst);
        for (int64_t t = pr[i].n; t < T; t++) dst[t] = pad;
        for (int64_t t = 0; t < T; t++) out->b.targets[i * T + t] = -1;
        out->b.n_q[i] = nq;
        for (int64_t k = 0; k < nq; k++) {
            ps_query q = qs[i * nq + k];
            out->b.queries[i * nq + k] = q;
            out->residue[i * nq + k] = mode == PS_SWEEP_MOVE && k > 0 ? -1 : q.key_pos % P;
            for (int64_t a = 0; a < q.answer_len; a++) out->b.targets[i * T + q.answer_pos + a] = dst[q.answer_src + a];
        }
    }
    out->p = p;
    out->P = P;
    if (pr)
        for (int64_t i = 0; i < N; i++) ps_ids_free(&pr[i]);
    free(pr);
    free(qs);
    if (rc) ps_shifted_free(out);
    return rc;
}

