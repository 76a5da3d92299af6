/* generate.h — text generation through the KV cache (core/kvcache.h): the prompts are prefilled (one
 * append), then every sequence decodes one token per step, all sequences in one append (a batch of
 * different lengths). Cache edits (zero, a given vector, or mean replacement: the mean of that entry over
 * the prompts that hold it, as the knockout's mean over prompts at the same position) hold from the first
 * generated token on: with edits the prefill runs every prompt but its last token, the edits are made (a
 * mean over the entries held then), and the last tokens run in one append whose logits give the first
 * pick; an entry whose window closes later is edited when it closes. Greedy by default (the first maximum of the logits); temperature > 0 samples from
 * softmax(logits / temperature), restricted to the smallest set of tokens whose probability reaches top_p
 * (nucleus), with a seeded generator (core/rng.h). The log-probability of each generated token is under
 * the model's own distribution (softmax of the logits at temperature 1). */
#ifndef PS_GENERATE_H
#define PS_GENERATE_H

#include <stdint.h>

#include "core/error.h"
#include "core/hooks.h"
#include "core/kvcache.h"
#include "core/rng.h"

typedef struct {
    int64_t max_tokens;  /* tokens generated per sequence (stops earlier at max_seq_len) */
    double temperature;  /* 0: greedy */
    double top_p;        /* (0, 1]; 1: the whole vocabulary */
    uint64_t seed;
    const int32_t *stop; /* [n_stop] token ids: a sequence that generates one of them stops there (the token
                          * kept, as Hugging Face's eos_token_id); NULL / 0: none */
    int n_stop;
    /* called after the prefill (done 0) and after each decode step (done = steps so far, total = max_tokens);
     * non-zero stops the generation: it fails with "cancelled after D of N tokens" (NULL: none) */
    int (*progress)(int64_t done, int64_t total, void *user);
    void *progress_user;
} ps_generate_opts;

/* A cache edit asked for by name: blocks.{layer}.attn.cache_{ck|cv}, KV head, entry, zero, mean or a
 * given vector. */
typedef struct {
    int layer, head, value;
    int64_t entry;
    int mean;         /* 1: mean replacement over the prompts; 0: zero (or vec) */
    const float *vec; /* non-NULL (mean 0): set to this vector (the point's entry width; the caller's memory) */
} ps_generate_edit;

typedef struct {
    int n;            /* sequences */
    int64_t *n_gen;   /* [n] tokens generated */
    int32_t **tok;    /* [n][n_gen] */
    double **logprob; /* [n][n_gen] */
} ps_generate_result;

/* Parse one edit "blocks.L.attn.cache_ck:G:J:zero|mean". */
int ps_generate_edit_parse(const ps_config *c, const char *spec, ps_generate_edit *e, ps_error *err);

/* The same for the cache's model (any family: DeepSeek-V4's layers.L.attn.cache_kv|cache_ik:0:ENTRY:MODE). */
int ps_generate_edit_parse_kv(const ps_kvcache *kv, const char *spec, ps_generate_edit *e, ps_error *err);

/* Generate for n prompts (prompt[i] of len[i] >= 1 tokens) on kv (fresh: no sequences yet; hooks fire
 * during its appends). out is filled (ps_generate_result_free). */
int ps_generate(ps_kvcache *kv, int n, int32_t *const *prompt, const int64_t *len, const ps_generate_opts *o,
                const ps_generate_edit *edits, int n_edits, const ps_hooks *hooks, ps_generate_result *out, ps_error *err);
void ps_generate_result_free(ps_generate_result *r);

/* The next token from one logits row (greedy, or sampled as above with r: top_p >= 1 draws over every token
 * in token order, top_p < 1 over the nucleus sorted by logit); *logprob (NULL: not wanted) its
 * log-probability at temperature 1. One uniform draw per sampled token; no allocation but for a nucleus of
 * more than 256 tokens. */
int32_t ps_generate_pick(const float *x, int64_t V, double temperature, double top_p, ps_rng *r, double *logprob);

#endif
