/* phasescope.h — the public C API of phasescope (libphasescope.so): open a checkpoint of any family, run
 * it with TransformerLens-style hooks and caches, take gradients at hook points, and run every instrument
 * of the CLI as one call. This header is the whole interface: it includes only <stddef.h> and <stdint.h>,
 * and libphasescope.so exports only the names declared here (every one starts with ps_api_). docs/api.md
 * describes it at length.
 *
 * Conventions (for C and for a binding such as Python's ctypes):
 *  - Handles are opaque pointers (ps_api_model, ps_api_hooks, ps_api_output, ps_api_cache, ps_api_result, ps_api_server); no struct
 *    crosses the boundary. Arguments are plain C types, arrays of them, NUL-terminated UTF-8 strings, JSON
 *    text, and callbacks with the C signatures below.
 *  - Errors: a function that can fail returns int: 0 on success, PS_API_EINPUT (2) when the caller asked
 *    for something invalid (a bad path, hook name, token, flag or value), PS_API_ECANCELLED (3) when the
 *    caller's progress callback stopped it, PS_API_EFAIL (1) for any other failure (a file, a computation,
 *    memory, a hook callback that aborted). It takes `char *err, size_t errlen`
 *    last: on failure one NUL-terminated line naming what is at fault is written there (truncated to
 *    errlen; err may be NULL). A failure leaves every handle usable (the model runs again).
 *    Functions that cannot fail return the value itself (NULL / -1 for "none").
 *  - Ownership: what a ps_api_*_new / ps_api_open / ps_api_run_* / ps_api_instrument call hands out, the
 *    caller frees with the matching *_free / ps_api_close. Pointers read from a handle (names, arrays,
 *    shapes, JSON text) belong to the handle and stay valid until it is freed: later runs never move or
 *    change them. Strings marked "caller frees" are released with ps_api_free.
 *  - Threads: a handle is used by one thread at a time (calls on distinct handles from several threads
 *    are not tested). There is no global "last error": the message is in err. An instrument call sets
 *    the default matrix precision of new contexts from its request, as the CLI does.
 *  - Versioning: PS_API_VERSION is this header's version; ps_api_version() the library's. They are equal
 *    for a matching pair; a binding checks that they are (a change to any signature or meaning below
 *    increments it; additions increment it too).
 */
#ifndef PHASESCOPE_H
#define PHASESCOPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PS_API_BUILD)
#define PS_API __attribute__((visibility("default")))
#else
#define PS_API
#endif

#define PS_API_VERSION 7

/* return values of the functions that can fail */
#define PS_API_OK 0
#define PS_API_EFAIL 1  /* a file, a computation, memory, an aborted pass */
#define PS_API_EINPUT 2 /* the caller asked for something invalid (path, name, token, flag, value) */
#define PS_API_ECANCELLED 3 /* the progress callback stopped the call (ps_api_set_progress) */

/* ---- the library ---- */

/* PS_API_VERSION of the library (compare with the header's). */
PS_API int ps_api_version(void);
/* phasescope's release, e.g. "0.1.0". Static storage. */
PS_API const char *ps_api_release(void);
/* The compute backends (devices) this build has, comma-separated ("cpu" or "cpu, cuda"). Static storage. */
PS_API const char *ps_api_devices(void);
/* Releases a string marked "caller frees". NULL is fine. */
PS_API void ps_api_free(void *p);

/* ---- a checkpoint ---- */

typedef struct ps_api_model ps_api_model;

/* Open the checkpoint directory `path` of any family phasescope reads (its own checkpoints, Hugging Face
 * Qwen3 checkpoints, DeepSeek-V4 checkpoints) on `device` (NULL: "cpu"; ps_api_devices lists the
 * others), weights included. *out gets the handle (NULL on failure). */
PS_API int ps_api_open(const char *path, const char *device, ps_api_model **out, char *err, size_t errlen);
/* ps_api_open with options: a JSON object (NULL or "" for none) of
 *   "lazy": true|false  true: load each layer's weights when it runs (DeepSeek-V4 checkpoints larger than
 *                       memory); false: every layer at once; absent: the family decides (one layer at a
 *                       time when the float32 weights take more than half of the memory available)
 *   "layers": N         every run stops after layers 0..N-1 (1 <= N <= the model's layers; families that
 *                       can stop early: DeepSeek-V4): no logits then (ps_api_output_logits is NULL), and a
 *                       hook point past them is refused
 * An option the checkpoint's family does not take is a PS_API_EINPUT error naming it. */
PS_API int ps_api_open_ex(const char *path, const char *device, const char *options_json, ps_api_model **out, char *err,
                          size_t errlen);
PS_API void ps_api_close(ps_api_model *m);

/* ---- model families ----
 * A model family is a table of functions (opening a checkpoint, the forward with hooks, scoring, its hook
 * points, its config and description, its knockout targets as data). The table is defined in phasescope's
 * core/runtime.h (struct ps_family, "Adding a model family" in docs/design.md), which a family's implementer
 * includes (and links phasescope's static libraries); here it is opaque. There is no registry: a caller
 * passes its list of families, NULL-terminated, to each open; the first whose detector recognises the
 * directory opens it (the phasescope family's detector takes every directory: put it last). */
typedef struct ps_family ps_family; /* the same typedef as core/runtime.h's */
/* The families this build ships (the DeepSeek-V4 family, then the phasescope family: what ps_api_open tries),
 * NULL-terminated. Static storage. */
PS_API const ps_family *const *ps_api_shipped_families(void);
/* ps_api_open_ex over the caller's family list (families NULL: the shipped ones), e.g. a family of its own
 * followed by the shipped ones. The model handle keeps a copy of the list (not the tables: they must outlive
 * it); an instrument whose request names another "model" opens it with the same list. */
PS_API int ps_api_open_in(const ps_family *const *families, const char *path, const char *device, const char *options_json,
                          ps_api_model **out, char *err, size_t errlen);

/* ---- progress and cancellation ----
 *
 * A long call reports its progress to a callback, from the calling thread, at the end of each unit of its
 * work: done of total units (an instrument's batches, shifts, candidates, requests or training steps,
 * counted from 0 again in each phase of an instrument that has several, e.g. knockout's estimate and its
 * verification; a run's layers: done = the layers finished, called as each layer starts and once more
 * when the forward is over). The callback returns 0 to go on; non-zero stops the call at that point: it
 * fails with PS_API_ECANCELLED and a message saying where ("cancelled after 3 of 16 batches"), keeps
 * nothing it made (no output, no result; a private result directory is removed; a training run keeps a
 * checkpoint at the step it stopped after, which --resume continues), and the model runs again as before.
 * Without a callback nothing is reported and nothing changes: a callback changes no number either. */
typedef int (*ps_api_progress_fn)(int64_t done, int64_t total, void *user);

/* The model's callback (fn NULL: none), for its runs (ps_api_run_with_hooks, ps_api_run_with_cache) and
 * the instruments called with it (ps_api_instrument). It stays until replaced. */
PS_API void ps_api_set_progress(ps_api_model *m, ps_api_progress_fn fn, void *user);

/* The family's name ("phasescope", "deepseek_v4", or a caller's family's), the directory, the device. Owned by
 * the model. */
PS_API const char *ps_api_family(const ps_api_model *m);
PS_API const char *ps_api_path(const ps_api_model *m);
PS_API const char *ps_api_device(const ps_api_model *m);
PS_API int64_t ps_api_n_layers(const ps_api_model *m);
PS_API int64_t ps_api_vocab_size(const ps_api_model *m);
/* The model's context length: the longest token sequence it takes (its max_seq_len /
 * max_position_embeddings; TransformerLens's n_ctx). Not ps_api_generate's max_tokens (new tokens). */
PS_API int64_t ps_api_context_length(const ps_api_model *m);
/* What bounds it, as the config names it ("max_seq_len", "max_position_embeddings"). Static storage. */
PS_API const char *ps_api_context_length_name(const ps_api_model *m);
/* The config as JSON text (what results record as provenance.config). Owned by the model. */
PS_API const char *ps_api_config_json(const ps_api_model *m);

/* ---- tokenizers ----
 * A Hugging Face tokenizer.json (byte-level BPE, as `phasescope tokenize` reads it: docs/tokenizers.md),
 * e.g. the one beside a checkpoint. */
typedef struct ps_api_tokenizer ps_api_tokenizer;
PS_API int ps_api_tokenizer_open(const char *path, ps_api_tokenizer **out, char *err, size_t errlen);
PS_API void ps_api_tokenizer_free(ps_api_tokenizer *t);
/* One past the largest id (model vocabulary and added tokens). */
PS_API int64_t ps_api_tokenizer_vocab_size(const ps_api_tokenizer *t);
/* len bytes of text to ids: *ids (caller frees, ps_api_free) gets *n ids; add_special: the
 * post-processor's special tokens (e.g. a BOS). */
PS_API int ps_api_encode(const ps_api_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, int64_t *n,
                         char *err, size_t errlen);
/* ids to UTF-8 text: *text (NUL-terminated, caller frees, ps_api_free) gets *len bytes; skip_special: leave
 * out the special added tokens. An id outside the vocabulary is PS_API_EINPUT naming its position. */
PS_API int ps_api_decode(const ps_api_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, char **text, size_t *len,
                         char *err, size_t errlen);

/* ---- hook points ----
 * The family's point table (docs/hooks.md), one entry per point pattern, as a JSON list of objects
 * {"name": pattern ("blocks.{L}.attn.hook_k", "embed"), "shape": "[B, T, n_kv, hd]", "head_axis": 2 or
 * -1, "layers": the layers of this checkpoint that have it ("0-3", "once", ...), "layer_list": [0, 1, ...]
 * (empty for a global point), "what": one line}. Owned by the model. */
PS_API const char *ps_api_hook_points_json(const ps_api_model *m);
/* Every concrete hook name of this checkpoint ("blocks.0.attn.hook_q", ...), in firing order, as a JSON
 * list of strings. Owned by the model. */
PS_API const char *ps_api_hook_names_json(const ps_api_model *m);
/* The shape of hook `name`'s activation for B sequences of T tokens: its rank (1-4) with dims[0..rank),
 * or 0 with err set when the name is not a point of this checkpoint (the message lists the valid ones) or
 * lies past the layers the model runs (ps_api_open_ex's "layers"). */
PS_API int ps_api_hook_shape(const ps_api_model *m, const char *name, int64_t B, int64_t T, int64_t dims[4], char *err,
                             size_t errlen);

/* ---- hooks: host callbacks and backend-side actions in one list ----
 *
 * A ps_api_hooks is an ordered list of (hook name, callback or action). On a point, entries fire in the
 * order they were added, each seeing what the earlier ones wrote (TransformerLens's fwd_hooks). A list
 * does not belong to a model: it is checked against the model at each run (a bad name fails the run with
 * a message listing the valid names), and may be reused across runs and models. */
typedef struct ps_api_hooks ps_api_hooks;

/* A host callback: the activation of hook `name` as float32 in the point's layout (docs/hooks.md), shape
 * [rank] dims, C order. It may overwrite data in place (the change flows on through the pass). Return 0
 * to continue; non-zero aborts the pass, which fails with PS_API_EFAIL and the message the callback left
 * with ps_api_hooks_fail (or "hook NAME: the callback returned R"). data is valid during the call only. */
typedef int (*ps_api_hook_fn)(const char *name, float *data, const int64_t *shape, int rank, void *user);

PS_API ps_api_hooks *ps_api_hooks_new(void);
PS_API void ps_api_hooks_free(ps_api_hooks *h);
/* Drop every entry (the list is empty again). */
PS_API void ps_api_hooks_clear(ps_api_hooks *h);
/* Add a host callback on hook `name`. */
PS_API int ps_api_hooks_add_fn(ps_api_hooks *h, const char *name, ps_api_hook_fn fn, void *user, char *err, size_t errlen);
/* A callback about to return non-zero leaves its message here (copied); the pass fails with
 * "hook NAME: MESSAGE". */
PS_API void ps_api_hooks_fail(ps_api_hooks *h, const char *message);

/* Backend-side actions (core/hooks.h, TransformerLens names): they run inside the backend, with no copy
 * of the activation to the host.
 *   ZERO          x[b, t, head] = 0
 *   SET           x[b, t, head] = src[t, head] (src [npos, <inner>]), or src[head] at every position
 *                 (src [<inner>]: one position's values)
 *   ADD           x[b, t, head] += scale * src[t, head] (or src[head] at every position, as SET)
 *   MEAN_REPLACE  x[b, t, head] = mean over s of src[s, t, head] (src [S, npos, <inner>]: activations of
 *                 S sequences at this point, e.g. from a cache; the mean is taken in double, in order)
 *   PATCH         x[b, t, head] = src[b - seq0, t, head] (src [S, npos, <inner>]: another run's activation
 *                 at this point, S >= the sequences patched)
 * <inner> is the point's layout after the position axis ([n_kv, hd] for hook_k; [d] for hook_resid_pre):
 * src always holds every head, `head` >= 0 picks one of a 4-d point's axis-2 heads (-1: the whole
 * position). The action touches sequences [seq0, seq1) and positions [pos0, pos1) (seq1 = 0, pos1 = 0: to
 * the end). src (src_rank dims src_shape) is copied when the action is added. */
#define PS_API_ZERO 1
#define PS_API_SET 2
#define PS_API_ADD 3
#define PS_API_MEAN_REPLACE 4
#define PS_API_PATCH 5
PS_API int ps_api_hooks_add_action(ps_api_hooks *h, const char *name, int kind, int head, int64_t seq0, int64_t seq1,
                                   int64_t pos0, int64_t pos1, const float *src, const int64_t *src_shape, int src_rank,
                                   float scale, char *err, size_t errlen);
/* The number of entries in the list. */
PS_API int ps_api_hooks_count(const ps_api_hooks *h);

/* ---- running: logits, caches, gradients ----
 *
 * tokens: [B, T] int32 token ids, C order (every sequence T long; 1 <= T <= ps_api_context_length, each id in
 * [0, vocab)). A run hands out a ps_api_output: the logits [B, T, vocab] and the cached activations, each
 * a named float32 array with its shape, owned by the output (freed with ps_api_output_free; a later run
 * never changes them). */
typedef struct ps_api_output ps_api_output;

/* A names filter as a predicate: non-zero keeps hook `name`. */
typedef int (*ps_api_filter_fn)(const char *name, void *user);

/* Forward with hooks (NULL: none); the output holds the logits only. */
PS_API int ps_api_run_with_hooks(ps_api_model *m, const int32_t *tokens, int64_t B, int64_t T, ps_api_hooks *hooks,
                                 ps_api_output **out, char *err, size_t errlen);

/* Forward caching the activations of the chosen hook points: the names in names[0..n_names) (every one a
 * concrete point name; an invalid one fails with the valid ones listed; names non-NULL with n_names 0:
 * none, the output holds the logits only), else the names `filter` keeps, else (names NULL and filter
 * NULL) every point of the checkpoint. hooks (may be NULL) run in the same
 * pass; a cached activation is copied after every hook on its point has run (what later layers saw).
 *
 * grads non-zero: also the gradient of the loss with respect to each cached activation, through the
 * backward hooks (TransformerLens's backward hooks; the controlled model's blocks.{l}.attn.hook_z, hook_k,
 * hook_v, hook_ck, hook_cv — a named point the backward does not reach is an error naming those it
 * does; with a filter or every point, the points it does not reach get no gradient). The loss is the mean
 * cross-entropy over the targets: targets [B, T] int32 (-1: no target at that position), or NULL for the
 * next token (targets[b, t] = tokens[b, t + 1], none at the last position). */
PS_API int ps_api_run_with_cache(ps_api_model *m, const int32_t *tokens, int64_t B, int64_t T, const char *const *names,
                                 int n_names, ps_api_filter_fn filter, void *filter_user, ps_api_hooks *hooks, int grads,
                                 const int32_t *targets, ps_api_output **out, char *err, size_t errlen);

PS_API void ps_api_output_free(ps_api_output *o);
/* The logits [B, T, vocab]: shape written to shape[3]; NULL (shape zeros) when the model stops early
 * (ps_api_open_ex's "layers"). */
PS_API const float *ps_api_output_logits(const ps_api_output *o, int64_t shape[3]);
/* The cached arrays: their count, the i-th's name, data and shape (rank written to *rank, dims returned). */
PS_API int ps_api_output_count(const ps_api_output *o);
PS_API const char *ps_api_output_name(const ps_api_output *o, int i);
PS_API const float *ps_api_output_data(const ps_api_output *o, int i);
PS_API const int64_t *ps_api_output_shape(const ps_api_output *o, int i, int *rank);
/* The gradient at the i-th cached point (same shape), or NULL when the run took none there. */
PS_API const float *ps_api_output_grad(const ps_api_output *o, int i);
/* The index of a cached name, or -1. */
PS_API int ps_api_output_find(const ps_api_output *o, const char *name);
/* With grads: the mean loss and the number of target positions (0 without grads). */
PS_API double ps_api_output_loss(const ps_api_output *o);
PS_API int64_t ps_api_output_n_targets(const ps_api_output *o);

/* ---- the KV cache: prefill and decode, its entries read and edited between steps ----
 *
 * The model's inference-time cache (docs/kvcache.md): sequences that grow by appends (a prompt is one long
 * append, a decode step an append of one token), each append returning the logits of the new positions,
 * equal to ps_api_run_with_hooks's whole-sequence logits at those positions up to float rounding. The
 * families that have a cache: the phasescope family (every attention kind) and DeepSeek-V4; another is
 * a PS_API_EINPUT error naming it. The cache lives on the model's device and uses the model: free it
 * before closing the model. Pages are allocated as sequences grow; fork shares a prefix (copy on write).
 *
 * Its entries are hook points of their own: blocks.{l}.attn.cache_ck / cache_cv (the compressed key and
 * value of every window that has ended, per KV head; DeepSeek-V4: layers.{L}.attn.cache_kv / cache_ik,
 * head 0). Entry j of a head can be read (ps_api_cache_entry), or edited for the rest of the cache's life
 * (ps_api_cache_edit: "zero", or "set" to a vector, e.g. the mean of entries for mean replacement) — now
 * when it exists, and when its window closes otherwise. */
typedef struct ps_api_cache ps_api_cache;

/* A cache on the model (ps_api_open_ex's "layers" refused: an append needs the logits). */
PS_API int ps_api_cache_new(ps_api_model *m, ps_api_cache **out, char *err, size_t errlen);
PS_API void ps_api_cache_free(ps_api_cache *c);
/* A new empty sequence: its id in *seq. */
PS_API int ps_api_cache_add(ps_api_cache *c, int *seq, char *err, size_t errlen);
/* A new sequence sharing everything of sequence src: its id in *seq. */
PS_API int ps_api_cache_fork(ps_api_cache *c, int src, int *seq, char *err, size_t errlen);
/* Drop a sequence and its pages (its id may be reused by a later add or fork). */
PS_API int ps_api_cache_drop(ps_api_cache *c, int seq, char *err, size_t errlen);
/* Cut sequence seq back to its first T tokens (0 <= T <= its length; a compressed model's cache goes back
 * only as far as it still holds the local window and open windows of position T: an error says so). */
PS_API int ps_api_cache_truncate(ps_api_cache *c, int seq, int64_t T, char *err, size_t errlen);
/* The tokens of sequence seq (-1: no such sequence). */
PS_API int64_t ps_api_cache_len(const ps_api_cache *c, int seq);
/* Bytes the cache holds now (its pages, each shared page once, and tables). */
PS_API int64_t ps_api_cache_bytes(const ps_api_cache *c);
/* Append tokens[0..n) to sequence seq and run them; hooks (NULL: none) fire as in a forward of the n new
 * tokens (B = 1, T = n; the shapes of a forward: an action's positions are the appended ones, counted from
 * 0; attn.hook_pattern does not fire: an error), and a compressed entry's points (attn.hook_ck ...) when
 * its window closes ([1, 1, n_kv, hd]). logits_out (NULL: none) gets the logits [n, vocab] of the new
 * positions. The sequence's length plus n must be within ps_api_context_length. */
PS_API int ps_api_cache_append(ps_api_cache *c, int seq, const int32_t *tokens, int64_t n, ps_api_hooks *hooks,
                               float *logits_out, char *err, size_t errlen);
/* The entries sequence seq holds at layer `layer`, KV head `head` (0 for an invalid argument or a model
 * without compressed entries; -1: no such sequence). */
PS_API int64_t ps_api_cache_n_entries(const ps_api_cache *c, int seq, int layer, int head);
/* The floats of one entry of the cache point point_name (-1: not a cache point of this model). */
PS_API int64_t ps_api_cache_entry_width(const ps_api_cache *c, const char *point_name);
/* Copy entry j of KV head `head` at cache point point_name of sequence seq into out[width]. */
PS_API int ps_api_cache_entry(ps_api_cache *c, int seq, const char *point_name, int head, int64_t j, float *out, char *err,
                              size_t errlen);
/* Edit entry j of KV head `head` at cache point point_name of sequence seq (-1: every sequence, those
 * added later too) for the rest of the cache's life: kind "zero", or "set" to vec[width] (copied). */
PS_API int ps_api_cache_edit(ps_api_cache *c, int seq, const char *point_name, int head, int64_t j, const char *kind,
                             const float *vec, char *err, size_t errlen);

/* Generate for n prompts together through a KV cache of their own (the CLI's `generate`, docs/kvcache.md):
 * every prompt prefilled, the edits applied, then one decode step for every sequence at a time, each step
 * picking a sequence's next token from its last logits. tokens: the n prompts one after another, prompt i
 * lens[i] >= 1 tokens long. options_json (NULL or "": greedy, no edits) is a JSON object of
 *   "temperature": T  0 (default): greedy, the first maximum of the logits; > 0 (at most 100): sampled from
 *                     softmax(logits / T)
 *   "top_p": P        in (0, 1] (default 1): sample from the smallest set of tokens whose probability
 *                     reaches P (nucleus)
 *   "seed": S         the sampler's seed (integer >= 0, default 0): the same seed, the same tokens
 *   "stop": [ids]     token ids: a sequence that generates one stops there (the token kept; e.g. the
 *                     checkpoint's EOS id)
 *   "edits": [...]    cache edits holding from the first generated token on, in every sequence (the
 *                     prompts' last tokens run after them): a string "POINT:HEAD:ENTRY:zero|mean" (the
 *                     CLI's --edit; mean: the entry's mean over the prompts that hold it before their last
 *                     token), or an object {"point": POINT,
 *                     "head": G, "entry": J, "value": [the entry's width of numbers]} (set to that vector)
 * hooks (NULL: none) fire during every append as in ps_api_cache_append, a sequence at a time (B = 1): at
 * the prefill each prompt in order (T = its tokens; with edits, T = its tokens but the last, then after the
 * edits T = 1 for its last token), then at each step each sequence still generating (T = 1). Out: row i of tokens_out
 * [n, max_tokens] and logprobs_out [n, max_tokens] (NULL: not wanted) holds prompt i's tokens and their
 * log-probabilities under the model (softmax of the logits at temperature 1), n_gen[i] how many it got:
 * max_tokens, or fewer when it generated a stop token or reached ps_api_context_length (the rest of the row:
 * -1 and 0). The
 * model's progress callback is called after the prefill and after each step (done: steps of max_tokens).
 * Equal to the CLI's generate for the same model, prompts and options (tokens and log-probabilities). */
PS_API int ps_api_generate(ps_api_model *m, const int32_t *tokens, const int64_t *lens, int n, int64_t max_tokens,
                           const char *options_json, ps_api_hooks *hooks, int32_t *tokens_out, double *logprobs_out,
                           int64_t *n_gen, char *err, size_t errlen);

/* ---- instruments ----
 *
 * Every command of the CLI's instrument registry (sweep, knockout, gatecycle, gates, fillers, probe,
 * train, ...) as one call. The request is a JSON object of the command's flags without their dashes, '-'
 * inside a name written '-' or '_' ({"n": 16, "layers": [10, 11], "method": "atp", "verify": 4}): a
 * string, a number, true (a switch, or the value "true"), a list (joined with ',': "10,11"), null or false
 * (absent). "model" and "backend" default to the model handle's path and device (m may be NULL: then the
 * request's "model", else the shipped default). The defaults, checks and error messages are the CLI's
 * (an unknown key is "unknown flag --KEY"). The call writes no file and prints nothing: the result stays in
 * memory (its JSON text, arrays and figures below); with "out" the files the CLI writes are written there too.
 * knockout and sweep also take "prompts": a list of records {"tokens": [...], "query": t, "answer": id,
 * "residue": r[, "alt": id]} (the caller's prompt set, as the lines of the CLI's --prompts FILE).
 *
 * The instrument runs on the model handle itself: its weights, context and family as opened (no second
 * load of the checkpoint; a family of the caller's own, ps_api_open_in, runs every instrument it supports),
 * and every run of the whole model (ps_api_open_ex's "layers" applies to ps_api_run_* only). It opens a
 * copy of the checkpoint instead when the request names its own "model", "backend"/"device" or "precision",
 * and for an instrument that changes the weights (gatecycle, whose --save writes the cycled model): the
 * handle's model is never changed by an instrument.
 *
 * The result: the JSON the CLI writes (the same text, bit for bit), the numeric arrays in it (the curve,
 * the grid), and its figures, drawn from it on request. */
typedef struct ps_api_result ps_api_result;

/* The registry as JSON: a list of {"name", "summary", "kind" (the result's kind, or null), "result"
 * (file name, or null), "splits" (its work splits over shards and ranks), "flags": [{"name", "value"
 * (placeholder, null for a switch), "help", "required"}]}. Caller frees (ps_api_free). */
PS_API char *ps_api_instruments_json(void);

PS_API int ps_api_instrument(ps_api_model *m, const char *name, const char *request_json, ps_api_result **out,
                             char *err, size_t errlen);
/* ps_api_instrument with its own progress callback (NULL: the model's, ps_api_set_progress); the way to
 * follow and stop an instrument called without a model (train). */
PS_API int ps_api_instrument_ex(ps_api_model *m, const char *name, const char *request_json, ps_api_progress_fn progress,
                                void *progress_user, ps_api_result **out, char *err, size_t errlen);
PS_API void ps_api_result_free(ps_api_result *r);
/* The result's JSON text as the CLI writes it (NULL for a command that writes no result JSON, e.g. train),
 * and its kind ("sweep", "knockout", ...). Owned by the result. */
PS_API const char *ps_api_result_json(const ps_api_result *r);
PS_API const char *ps_api_result_kind(const ps_api_result *r);
/* The numeric arrays of the result JSON (provenance aside), columnwise: every number of the document that
 * sits at the same place in every record of the lists above it becomes one float64 array (C order; null
 * is NaN) whose axes are those lists, named by its keys joined with '.': sweep.json's
 * "curve.residues.accuracy" [P], knockout.json's "grid.cells.residues.delta_nll" [cells, P] and
 * "grid.cells.layer" [cells]; a plain number is an array of rank 0 ("curve.gap_pp"). Strings, booleans and
 * ragged lists are left out. At most 8 axes. */
PS_API int ps_api_result_count(const ps_api_result *r);
PS_API const char *ps_api_result_name(const ps_api_result *r, int i);
PS_API const double *ps_api_result_data(const ps_api_result *r, int i);
PS_API const int64_t *ps_api_result_shape(const ps_api_result *r, int i, int *rank);
/* The index of an array by name, or -1. */
PS_API int ps_api_result_find(const ps_api_result *r, const char *name);
/* The request's "out" (NULL without one) and the result documents' file names, as a JSON list ("[\"knockout.json\"]").
 * Owned by the result. */
PS_API const char *ps_api_result_dir(const ps_api_result *r);
PS_API const char *ps_api_result_files_json(const ps_api_result *r);
/* The figures of the result (the PNGs the CLI draws beside its JSON), drawn in memory on the first call: their
 * names as a JSON list, and one's bytes (*len its size). Owned by the result; NULL with err on an error. */
PS_API const char *ps_api_result_figures_json(ps_api_result *r, char *err, size_t errlen);
PS_API const unsigned char *ps_api_result_figure(ps_api_result *r, const char *name, size_t *len, char *err, size_t errlen);
/* Write what the CLI's --out DIR holds after the same run into dir (created when absent): the result JSON byte
 * for byte and its figures. */
PS_API int ps_api_result_save(const ps_api_result *r, const char *dir, char *err, size_t errlen);

/* ---- serving: `phasescope serve` as calls ----
 *
 * An OpenAI-compatible HTTP server in front of a checkpoint (docs/served-models.md): POST /v1/completions
 * (echo, logprobs, prompt_logprobs, streaming), GET /v1/models, GET /health, with continuous batching of
 * concurrent requests. ps_api_serve_start opens the checkpoint `path` of any family on `device` (NULL:
 * "cpu"), starts the server on threads of its own and returns once it listens; the caller's thread goes on,
 * and ps_api_serve_stop ends it. The server leaves the process's signals alone (the CLI's serve stops on
 * SIGINT / SIGTERM; a caller stops its server itself).
 *
 * options_json (NULL or "": none) is a JSON object of the server's options: `phasescope serve`'s flags
 * without their dashes ('-' inside a name written '_' or '-'), the same set, defaults, ranges and checks
 * (one table: instruments/commands.h, ps_serve_options):
 *   "host": "127.0.0.1"        IPv4 address to listen on ("0.0.0.0": every interface; "localhost")
 *   "port": 8000               0: a free port (ps_api_serve_port says which)
 *   "tokenizer": "FILE"        tokenizer.json for text prompts and token texts (default: the one a text-kv
 *                              model trained with, else PATH/tokenizer.json, else none: token-id prompts only)
 *   "name": "NAME"             the model's name in the API (default: the directory's name)
 *   "max_body": 67108864       bytes of a request body (larger: 413)
 *   "max_prompt_tokens": N     tokens of one prompt (default: the model's context)
 *   "max_logprobs": 20         largest logprobs / prompt_logprobs N
 *   "max_tokens": 1024         largest max_tokens
 *   "max_prompts": 256         prompts in one request
 *   "max_connections": 64      open connections (more: 429)
 *   "max_batch": 32            sequences decoded per step
 * Strings for host, tokenizer and name, integers for the others. An unknown key, a value of the wrong type
 * or out of range is PS_API_EINPUT naming the key ("options: \"port\": --port 70000: must be in [0, 65535]").
 * A build without libmicrohttpd has no server: ps_api_serve_start fails (PS_API_EFAIL) saying so. */
typedef struct ps_api_server ps_api_server;

PS_API int ps_api_serve_start(const char *path, const char *device, const char *options_json, ps_api_server **out, char *err,
                              size_t errlen);
/* ps_api_serve_start over the caller's family list (families NULL: the shipped ones), as ps_api_open_in: a
 * family of the caller's own is served (its table must outlive the server). */
PS_API int ps_api_serve_start_in(const ps_family *const *families, const char *path, const char *device, const char *options_json,
                                 ps_api_server **out, char *err, size_t errlen);
/* The port the server listens on (the one picked when "port" was 0). */
PS_API int ps_api_serve_port(const ps_api_server *s);
/* The model's name in the API (what /v1/models lists and a request's "model" names). Owned by the server. */
PS_API const char *ps_api_serve_name(const ps_api_server *s);
/* Stop: no new connections; the queued and running requests are answered with 503 (a stream that has begun:
 * an error event, then data: [DONE]; at most 5 s for clients that do not read); every connection closed, the
 * model freed, the handle too. NULL is fine. */
PS_API void ps_api_serve_stop(ps_api_server *s);

#ifdef __cplusplus
}
#endif
#endif
