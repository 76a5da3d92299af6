/* decode.h — serve's generation through the KV cache (core/kvcache.h): the logits a generation step asks
 * for, from each sequence's cache (the tokens it has not seen yet appended) instead of a forward pass of
 * the whole sequence per step. Sequences are named by the caller's keys (serve's per-sequence state), live
 * while their request runs and are dropped one by one when it ends or its client goes away
 * (ps_serve_decoder_drop), so that requests join and leave the batch between steps. Any checkpoint
 * with a cache (ps_kvcache_create_rt: the controlled model, DeepSeek-V4), on any backend; create fails
 * otherwise (a family without one) and serve keeps the whole-sequence path. */
#ifndef PS_SERVE_DECODE_H
#define PS_SERVE_DECODE_H

#include "core/batch.h"
#include "core/kvcache.h"
#include "core/runtime.h"
#include "interventions/sweep.h"

typedef struct {
    ps_kvcache kv;
    int n, cap;
    const void **keys; /* [n] */
    int *ids;          /* [n] the cache's sequence of each key */
    int64_t V;
} ps_serve_decoder;

int ps_serve_decoder_create(ps_serve_decoder *d, const ps_runtime *rt, ps_error *err);
void ps_serve_decoder_free(ps_serve_decoder *d);
/* Drop every sequence. */
void ps_serve_decoder_reset(ps_serve_decoder *d);
/* Drop the sequence of key (its cache pages freed); nothing when key has none. */
void ps_serve_decoder_drop(ps_serve_decoder *d, const void *key);
/* Sequences held (their bytes: ps_kvcache_bytes(&d->kv)). */
int ps_serve_decoder_live(const ps_serve_decoder *d);

/* What sm.rows gives for batch b (sequence i named keys[i]): the logits at each sequence's answer rows
 * [r0, r0 + n) (one query per sequence, as serve builds them), handed to fn one sequence at a time, in
 * order. All sequences of the batch go through one ps_kvcache_append of their new tokens with the last
 * row's logits (generation steps and the prefills of sequences that join now), plus one of every new row
 * for the sequences whose every prompt row is asked for (echo with logprobs, prompt_logprobs). The sequence's tokens before r0 + n must extend what its cache holds, and r0 must not be before
 * what the cache holds (serve asks for each row once). */
int ps_serve_decode_rows(ps_serve_decoder *d, const void *const *keys, const ps_batch *b, ps_rows_fn fn, void *user, ps_error *err);

#endif
