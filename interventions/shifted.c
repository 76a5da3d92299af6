/* shifted.c — a checkpoint's stored task and the shifted prompts (shifted.h). */
#include "interventions/shifted.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

int ps_runtime_task(const ps_runtime *rt, const char *dir, ps_task *t, ps_error *err) {
    const char *js = rt->family->meta ? rt->family->meta(rt, "phasescope.task") : NULL;
    if (!js)
        return ps_fail(err, "%s: the checkpoint has no task layout (phasescope.task in its metadata); models trained "
                            "with phasescope train carry one",
                       dir);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    if (!o) return ps_fail(err, "%s: phasescope.task metadata is not valid JSON", dir);
    char src[4200];
    snprintf(src, sizeof src, "%s/model.safetensors (phasescope.task)", dir);
    int rc = ps_task_from_json(o, src, t, err);
    json_decref(o);
    if (!rc) rc = ps_task_validate(t, rt->family->vocab(rt), INT64_MAX / 4, src, err);
    return rc;
}

int ps_model_task(const ps_model *m, const char *dir, ps_task *t, ps_error *err) {
    ps_runtime rt;
    ps_runtime_wrap_model(&rt, m);
    return ps_runtime_task(&rt, dir, t, err);
}

static void filler(const ps_filler_family *f, const ps_task *t, ps_rng *r, int32_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t idx = f->random ? ps_rng_below(r, t->n_fillers) : f->pattern[i % f->n_pattern] % t->n_fillers;
        dst[i] = (int32_t)(ps_task_fill0(t) + idx);
    }
}

void ps_shifted_free(ps_shifted *s) {
    ps_batch_free(&s->b);
    free(s->residue);
    memset(s, 0, sizeof *s);
}

int ps_make_shifted(const ps_batch *base, const ps_task *task, const ps_filler_family *fam, ps_sweep_mode mode,
                    int64_t P, int64_t p, uint64_t seed, int64_t max_seq_len, ps_shifted *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    int64_t T = base->T, N = base->B, add = mode == PS_SWEEP_PAD ? p : P - 1, Tp = T + add;
    if (mode == PS_SWEEP_PAD && T + P - 1 > max_seq_len)
        return ps_fail(err, "prompts of %lld tokens padded by up to %lld fillers need %lld positions, more than max_seq_len "
                            "%lld by %lld",
                       (long long)T, (long long)(P - 1), (long long)(T + P - 1), (long long)max_seq_len,
                       (long long)(T + P - 1 - max_seq_len));
    if (mode == PS_SWEEP_MOVE && Tp > max_seq_len)
        return ps_fail(err, "move mode adds %lld fillers to prompts of %lld tokens: %lld positions, more than max_seq_len "
                            "%lld by %lld",
                       (long long)(P - 1), (long long)T, (long long)Tp, (long long)max_seq_len, (long long)(Tp - max_seq_len));
    if (ps_batch_alloc(&out->b, N, Tp, base->max_q, err)) return -1;
    out->residue = malloc((size_t)(N * base->max_q) * sizeof(int64_t));
    if (!out->residue) {
        ps_shifted_free(out);
        return ps_fail(err, "out of memory for the residues of %lld shifted prompts", (long long)N);
    }
    out->p = p;
    out->P = P;
    int64_t pair_len = task->kind == PS_TASK_KV ? task->key_len + task->value_len : 2;
    for (int64_t i = 0; i < N; i++) {
        ps_rng r;
        ps_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)i << 20) ^ (uint64_t)p);
        const int32_t *src = base->tokens + i * T;
        int32_t *dst = out->b.tokens + i * Tp;
        out->b.n_q[i] = base->n_q[i];
        for (int64_t t = 0; t < Tp; t++) out->b.targets[i * Tp + t] = -1;
        if (mode == PS_SWEEP_PAD) {
            dst[0] = src[0];
            filler(fam, task, &r, dst + 1, p);
            memcpy(dst + 1 + p, src + 1, (size_t)(T - 1) * sizeof(int32_t));
            for (int64_t q = 0; q < base->n_q[i]; q++) {
                ps_query qq = base->queries[i * base->max_q + q];
                qq.key_pos += p;
                qq.answer_pos += p;
                qq.answer_src += p;
                out->b.queries[i * base->max_q + q] = qq;
                out->residue[i * base->max_q + q] = qq.key_pos % P;
            }
        } else {
            /* move the first query's pair: [kp, kp + pair_len) gets p fillers before it, P-1-p after it */
            ps_query q0 = base->queries[i * base->max_q];
            int64_t kp = q0.key_pos, w = 0;
            memcpy(dst, src, (size_t)kp * sizeof(int32_t));
            w = kp;
            filler(fam, task, &r, dst + w, p);
            w += p;
            memcpy(dst + w, src + kp, (size_t)pair_len * sizeof(int32_t));
            w += pair_len;
            filler(fam, task, &r, dst + w, P - 1 - p);
            w += P - 1 - p;
            memcpy(dst + w, src + kp + pair_len, (size_t)(T - kp - pair_len) * sizeof(int32_t));
            for (int64_t q = 0; q < base->n_q[i]; q++) {
                ps_query qq = base->queries[i * base->max_q + q];
                /* a position before the pair stays, inside the pair moves by p, after it by P-1 */
#define MOVED(x) ((x) < kp ? (x) : (x) < kp + pair_len ? (x) + p : (x) + P - 1)
                qq.key_pos = MOVED(qq.key_pos);
                qq.answer_src = MOVED(qq.answer_src);
                qq.answer_pos += P - 1; /* queries follow the context */
#undef MOVED
                out->b.queries[i * base->max_q + q] = qq;
                out->residue[i * base->max_q + q] = q == 0 ? qq.key_pos % P : -1;
            }
        }
        /* answer targets (for the loss-free scorer they only document the answers) */
        for (int64_t q = 0; q < out->b.n_q[i]; q++) {
            const ps_query *qq = &out->b.queries[i * base->max_q + q];
            for (int64_t k = 0; k < qq->answer_len; k++) out->b.targets[i * Tp + qq->answer_pos + k] = dst[qq->answer_src + k];
        }
    }
    return 0;
}

