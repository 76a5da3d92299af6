/* serve.h — `phasescope serve` (docs/served-models.md): an OpenAI-compatible HTTP server in front of any model
 * phasescope runs, so that `phasescope probe`, lm-evaluation-harness's local-completions and the OpenAI
 * client libraries evaluate phasescope's models. It owns the HTTP side (libmicrohttpd: one thread per
 * connection), request parsing (jansson), the limits, and the batching of concurrent requests into one
 * forward pass; the model is reached through core's family table (core/runtime.h: ps_runtime_open, the
 * family's `rows`: logits at chosen rows; its `meta`: a text-kv model's tokenizer), as every instrument.
 *
 * Endpoints:
 *   POST /v1/completions  prompt: a string, a token-id list, or a list of either (one choice each);
 *                         max_tokens (default 16), temperature (0: greedy; > 0: sampled with `seed`),
 *                         echo, logprobs N (tokens / token_logprobs / top_logprobs / text_offset as the
 *                         OpenAI completions format has them), vLLM's prompt_logprobs N (per prompt position
 *                         {id: {logprob, rank, decoded_token}}) and return_tokens_as_token_ids ("token_id:N");
 *                         top_logprobs list the N best and the token itself (as vLLM does);
 *   GET /v1/models        the one model;   GET /health   {"status": "ok"}.
 * Refusals are JSON {"error": {"message", "type", "param", "code"}} with a 4xx status naming the limit or
 * field: 413 body too large, 400 bad JSON / field / too many prompt tokens / logprobs above the limit,
 * 404 unknown path or model, 405 method, 429 too many open connections, 503 while shutting down.
 *
 * Batching: requests that arrive while a forward runs wait in a queue; the next forward takes every
 * queued sequence (up to max_batch), padded at the end to the longest (never read: attention is causal),
 * in batches that fit the activation budget (the family's rows; the controlled model's: ps_eval_rows, core/rows.h). Generation runs one
 * forward per new token (no KV cache: fine for the 1-token and answer-length continuations of scoring). */
#ifndef PS_SERVE_H
#define PS_SERVE_H

#include <stdint.h>

#include "core/error.h"
#include "core/runtime.h"
#include "tasks/tasks.h"
#include "text/tokenizer.h"

/* ---- the server ---- */
typedef struct {
    const char *model_dir;
    const char *backend;        /* NULL: cpu */
    const char *tokenizer;      /* tokenizer.json: string prompts and token texts; NULL: the text-kv model's, DIR/tokenizer.json, or none (ids only) */
    const char *name;           /* the model's API name (NULL: the directory's base name) */
    const char *host;           /* NULL: 127.0.0.1 */
    int port;                   /* 0: a free port (ps_serve_port says which) */
    int64_t max_body;           /* bytes of a request body (default 64 MiB) */
    int64_t max_prompt_tokens;  /* per prompt (default: the model's max_seq_len) */
    int64_t max_logprobs;       /* logprobs / prompt_logprobs N (default 20) */
    int64_t max_tokens;         /* max_tokens (default 1024) */
    int64_t max_prompts;        /* prompts in one request (default 256) */
    int max_connections;        /* open connections (default 64) */
    int64_t max_batch;          /* sequences per forward (default 32) */
    double max_logit_bytes;     /* logits a request may need at once (echo with logprobs: prompt × vocab × 4; default 2 GiB) */
    const ps_family *const *families; /* the families the checkpoint is tried with (NULL: core's ps_families; a list with a
                                       * family of the caller's own serves it: ps_runtime_open_in) */
} ps_serve_opts;

void ps_serve_defaults(ps_serve_opts *o);

typedef struct ps_server ps_server;
/* Load the model, start the worker and the listener. */
int ps_serve_start(const ps_serve_opts *o, ps_server **out, ps_error *err);
int ps_serve_port(const ps_server *s);
const char *ps_serve_name(const ps_server *s);
/* Stop accepting, fail queued requests with 503, finish, free. */
void ps_serve_stop(ps_server *s);
/* `phasescope serve`: start, say where it listens (and write the port to port_file, when given), serve
 * until SIGINT or SIGTERM, stop. The calling thread blocks those two signals for the server's threads. */
int ps_serve_run(const ps_serve_opts *o, const char *port_file, ps_error *err);

#endif
