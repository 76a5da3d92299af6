/* probe.h — phase sweeps of a served model (`phasescope probe`, docs/served-models.md): the text-kv needle
 * sweep and the fillers experiment sent to an OpenAI-compatible /v1/completions endpoint (vLLM, SGLang,
 * `phasescope serve`) as token-id lists, so every position, and so every phase, is exact.
 *
 * The prompts are the local instruments' (interventions/textkv.h, interventions/fillers.h) and so are the
 * statistics (ps_residue_stats_json, ps_fillexp_json): only the scoring differs. Scoring, per answer (or
 * candidate) token t of a sequence:
 *   prompt-logprobs  vLLM's "prompt_logprobs": 1 — the sent id's log-probability and rank at every prompt
 *                    position (ids as keys); top-1 when its rank is 1;
 *   echo             "echo": true with "logprobs": 1 — token_logprobs and top_logprobs of the echoed prompt
 *                    (OpenAI completions format); top-1 when its log-probability is the largest listed;
 *   greedy           no prompt log-probabilities: the prompt up to the answer, "max_tokens" the answer's
 *                    length at temperature 0; correct when the continuation is the answer (its log-probability
 *                    is then known; otherwise it is not, and the curve's mean_logprob is null).
 * auto asks for both log-probability forms with the first request and takes what the server gives.
 * Every reply is checked: a missing field, a wrong number of log-probabilities, an echoed token other than
 * the one sent is an error naming the request.
 *
 * Resume: every finished request is appended to a journal (OUT/probe-journal.jsonl: a header line with the
 * plan, then one line per request), so the same command with the same --out continues where a killed run
 * stopped and ends with the same JSON as an unbroken run (the numbers are read back exactly). */
#ifndef PS_PROBE_H
#define PS_PROBE_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "interventions/fillers.h"
#include "interventions/sweep.h"
#include "interventions/textkv.h"
#include "probe/http_client.h"
#include "text/tokenizer.h"

typedef enum { PS_PROBE_AUTO = 0, PS_PROBE_PROMPT_LOGPROBS = 1, PS_PROBE_ECHO = 2, PS_PROBE_GREEDY = 3 } ps_probe_scoring;
/* "auto", "prompt-logprobs", "echo", "greedy" */
const char *ps_probe_scoring_name(ps_probe_scoring s);

typedef struct {
    ps_http_opts http;
    char endpoint[2048];  /* as given, without user:password@ */
    char model[512];      /* the API model name */
    ps_probe_scoring scoring;
    int max_tokens;       /* with echo / prompt-logprobs: 0 or 1 (default 1, what every server accepts) */
    const ps_tokenizer *tok; /* decodes ids for the text checks (echoed tokens without ids, greedy text) */
    int dry_run;          /* count requests and tokens, send nothing */
    ps_progress_fn progress;
    void *user;
} ps_probe;

/* The API model: o->model when set, else the first one GET /v1/models lists. */
int ps_probe_resolve_model(ps_probe *p, ps_error *err);

/* One scored span of a sequence: ids[src .. src + len) are the answer (candidate) tokens. */
typedef struct {
    int64_t src, len;
} ps_probe_span;

/* The outcome of one span: every token top-1, the summed log-probability (NaN when not known: greedy and
 * a wrong continuation), the top-1 id at the span's first position (-1 when the server gives no ids). */
typedef struct {
    int ok;
    double lp;
    int32_t top;
} ps_probe_out;

/* What a run cost (or, with dry_run, would cost). */
typedef struct {
    int64_t requests, prompt_tokens, max_prompt_tokens, generated_tokens, resumed;
    ps_probe_scoring scoring;
} ps_probe_cost;

/* The text-kv sweep of a served model: P shifts × N prompts of set (ps_textkv_set_prompt, prompt i from
 * seed), each prompt cut to its own length. Fills st (initialised here with set->P) in the local sweep's
 * order, and the prompts' shortest and longest length. journal: the journal's path (NULL: none); plan:
 * what the journal's header must match (the run's parameters). */
int ps_probe_textkv(ps_probe *p, const ps_textkv_set *set, ps_sweep_mode mode, int64_t N, uint64_t seed, const char *journal,
                    json_t *plan, ps_residue_stats *st, int64_t *tmin, int64_t *tmax, ps_probe_cost *cost, ps_error *err);

/* The fillers experiment of a served model (prepared e, period P): r as ps_fillexp_run fills it. */
int ps_probe_fillers(ps_probe *p, const ps_fillexp *e, int64_t P, const char *journal, json_t *plan, ps_fillexp_result *r,
                     ps_probe_cost *cost, ps_error *err);

/* provenance.probe: endpoint, API model, scoring, max_tokens, requests and tokens. */
json_t *ps_probe_json(const ps_probe *p, const ps_probe_cost *c);

/* The endpoint without any user:password@ (for provenance and messages) into out. */
void ps_probe_clean_url(const char *url, char *out, size_t n);

#endif
