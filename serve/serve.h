/* serve.h — `phasescope serve` (docs/served-models.md): an OpenAI-compatible HTTP server in front of any model
 * phasescope runs, so that `phasescope probe`, lm-evaluation-harness's local-completions and the OpenAI
 * client libraries evaluate phasescope's models. It owns the HTTP side (libmicrohttpd: one thread per
 * connection), request parsing (jansson), the limits, streaming, and the batching of concurrent requests
 * step by step; the model is reached through core's family table (core/runtime.h: ps_runtime_open, the
 * family's `rows`: logits at chosen rows; its `meta`: a text-kv model's tokenizer), as every instrument.
 *
 * Endpoints:
 *   POST /v1/completions  prompt: a string, a token-id list, or a list of either (one choice each);
 *                         max_tokens (default 16), temperature (0: greedy; > 0: sampled with `seed`),
 *                         echo, logprobs N (tokens / token_logprobs / top_logprobs / text_offset as the
 *                         OpenAI completions format has them), vLLM's prompt_logprobs N (per prompt position
 *                         {id: {logprob, rank, decoded_token}}) and return_tokens_as_token_ids ("token_id:N");
 *                         top_logprobs list the N best and the token itself (as vLLM does);
 *                         "stream": true answers with server-sent events (text/event-stream: one
 *                         "data: {chunk}" per choice and step that brought tokens, the OpenAI completions
 *                         chunk shape, stream_options.include_usage, then "data: [DONE]");
 *   GET /v1/models        the one model;   GET /health   {"status": "ok", "running", "cache_sequences",
 *                         "cache_bytes", "steps", "dropped": [while queued, while running]}.
 * Refusals are JSON {"error": {"message", "type", "param", "code"}} with a 4xx status naming the limit or
 * field: 413 body too large, 400 bad JSON / field / too many prompt tokens / logprobs above the limit,
 * 404 unknown path or model, 405 method, 429 too many open connections, 503 while shutting down. A
 * streamed request is answered with its error the same way until its first step has run; after that a
 * failure is an event {"error": ...} before data: [DONE].
 *
 * Continuous batching: one worker thread runs steps. Between two steps the requests whose client went
 * away leave (their KV cache sequences dropped), the queued requests join while the running sequences
 * stay within max_batch (a request larger than that runs alone), the finished ones leave. A step gives
 * every running sequence that needs logits its rows: a joining sequence its prompt (its last row, or
 * every row for echo with logprobs and prompt_logprobs), the others one new token each — through the KV
 * cache (serve/decode.h: one batched append; a second for the sequences whose every prompt row is asked
 * for) for the controlled model on the CPU, else a forward of each
 * whole sequence (the family's rows, padded at the end to the longest; DeepSeek-V4, device backends).
 * The worker publishes each step's tokens under the lock; a streaming connection's thread sends them as
 * they come. A connection notices a client that went away (a poll of its socket every 100 ms while it
 * waits, or a failed write), and the worker drops that request at its next step. */
#ifndef PS_SERVE_H
#define PS_SERVE_H

#include <stdint.h>

#include "core/error.h"
#include "core/runtime.h"
#include "tasks/tasks.h"
#include "text/tokenizer.h"

/* ---- the server ---- */
typedef struct ps_serve_opts {
    const char *model_dir;
    const char *backend;        /* NULL: cpu */
    const char *tokenizer;      /* tokenizer.json: string prompts and token texts; NULL: the text-kv model's, DIR/tokenizer.json, or none (ids only) */
    const char *name;           /* the model's API name (NULL: the directory's base name) */
    const char *host;           /* NULL: 127.0.0.1 */
    int port;                   /* default 8000; 0: a free port (ps_serve_port says which) */
    int64_t max_body;           /* bytes of a request body (default 64 MiB) */
    int64_t max_prompt_tokens;  /* per prompt (default: the model's max_seq_len) */
    int64_t max_logprobs;       /* logprobs / prompt_logprobs N (default 20) */
    int64_t max_tokens;         /* max_tokens (default 1024) */
    int64_t max_prompts;        /* prompts in one request (default 256) */
    int max_connections;        /* open connections (default 64) */
    int64_t max_batch;          /* sequences in the running batch (default 32) */
    double max_logit_bytes;     /* logits a request may need at once (echo with logprobs: prompt × vocab × 4; default 2 GiB) */
    const ps_family *const *families; /* the families the checkpoint is tried with (NULL: core's ps_families; a list with a
                                       * family of the caller's own serves it: ps_runtime_open_in) */
} ps_serve_opts;

/* The defaults (the ones `phasescope serve` and ps_api_serve_start start from). instruments/exec_serve.c's
 * table sets the options by name (the CLI's flags, the API's options JSON). */
void ps_serve_defaults(ps_serve_opts *o);

typedef struct ps_server ps_server;
/* Load the model, start the worker and the listener. */
int ps_serve_start(const ps_serve_opts *o, ps_server **out, ps_error *err);
int ps_serve_port(const ps_server *s);
const char *ps_serve_name(const ps_server *s);
/* Stop accepting, fail the queued and running requests with 503 (a stream that has begun: an error event
 * before data: [DONE]), let the open streams send that (at most 5 s), close every connection, free. */
void ps_serve_stop(ps_server *s);
/* `phasescope serve`: start, say where it listens (and write the port to port_file, when given), serve
 * until SIGINT or SIGTERM, stop. The calling thread blocks those two signals for the server's threads. */
int ps_serve_run(const ps_serve_opts *o, const char *port_file, ps_error *err);

#endif
