/* runtime.h — the one interface every model family implements (the controlled model: core/model.h,
 * forward.h, hooks.h; DeepSeek-V4: core/v4/), and opening a checkpoint, which picks the family.
 *
 * A family is a table (ps_family): its name; a detector of its checkpoint directories; open / free; an
 * activation set and a forward over a batch of token sequences with hooks (and, where the family has
 * one, a restart from a layer); the scoring of answer rows (core/batch.h); its hook points as a table
 * (name pattern, shape for B sequences of T tokens, head axis, the layers that have it); its config as
 * JSON and the config hash for provenance; its default phase period; the description of a config it
 * wrote (display label, attention kind, what readers of its results need: ps_model_desc); where the instruments'
 * prompts come from and its knockout targets, as data; its gate statistics as data (the records and the points
 * they fire at); gate cycling (core/cycle.h); its gradients at hook points (attribution patching). An opened
 * checkpoint is a ps_runtime: the family, its context, its layers and longest prompt, its model. The instruments
 * reach the model through the family alone; they add the prompts' mapping (rt->token_map), which core's
 * entries never read.
 *
 * ps_runtime_open(rt, dir, opts, err) asks every registered family (ps_families) whether it recognises
 * DIR/config.json and opens it with the one that does. Adding a family: docs/design.md, "Adding a model
 * family". */
#ifndef PS_RUNTIME_H
#define PS_RUNTIME_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/batch.h"
#include "core/ctx.h"
#include "core/error.h"
#include "core/hooks.h"
#include "core/model.h"
#include "core/rows.h"
#include "core/select.h"

typedef struct ps_family ps_family;
typedef struct ps_runtime ps_runtime;
typedef struct ps_cycle_req ps_cycle_req; /* gatecycle's request (core/cycle.h) */

/* What a result's reader (viz, the validator, tables) needs to know of the model that produced it, decided
 * by the family whose config it is: nothing above core compares family or attention-kind names. */
typedef struct {
    char label[224];       /* display label: "W8/S8, staggered 0–7", "full attention", "DeepSeek-V4, compress rates 0,4" */
    char kind[32];         /* the attention kind as the config names it ("full", "compressed", "channel", "deepseek_v4") */
    int kv_shared;         /* keys are the values (one K=V entry per position: no separate key and value branches) */
    int slot_bias;         /* the compressor's position bias is a per-slot parameter (ape; gate cycling rolls it) */
    int indexer;           /* the model has a lightning indexer with a compressor of its own */
    const char *raw_what;  /* a knockout of the raw entries, in words (NULL: the usual "raw keys and values" wording) */
    const char *comp_what; /* a knockout of the compressed entries, in words (NULL: the usual wording) */
    double kv_factor;      /* the cache's bytes per token over full attention's (1; a compressed model's 1 / S; select
                            * ps_select_kv_factor: the raw entries plus the pooled keys) */
} ps_model_desc;

/* An opened checkpoint: `family` is the core table every caller reaches the model through; `model` is the
 * family's own (only its family's code reads it: ps_runtime_controlled for the controlled model's). */
struct ps_runtime {
    ps_ctx *ctx;           /* the model's context (activations and action sources live there) */
    int64_t max_pos;       /* longest prompt the model takes */
    int64_t n_layers;      /* the model's layers */
    void *model;           /* the family's model (ps_model, ps_v4_model, ...) */
    const int32_t *token_map; /* the instruments' prompt mapping: task token id -> model id (a task file's "ids"), or NULL */
    int64_t n_token_map;
    const ps_family *family; /* the family's table */
    int owns_model;        /* ps_runtime_free frees `model` (and its storage when the family allocated it) */
    int model_allocated;   /* `model` was allocated by the open (no caller storage) */
    int lazy;              /* the weights are loaded one layer at a time (as forward --lazy) */
    double weight_bytes;   /* the float32 parameters' bytes */
    char config_hash[17];  /* provenance: the family's config hash (filled by the open) */
};

/* ---- hook points as a table ---- */

/* One hook point of a family. Its name pattern has "{L}" where the layer goes; a pattern without it is a
 * point of the model as a whole (it fires once per forward). The shape for B sequences of T tokens is
 * `shape` in words (what `phasescope info` prints) and, exactly, the family's point_shape. */
typedef struct {
    const char *pattern;   /* "blocks.{L}.attn.hook_k", "embed" */
    const char *shape;     /* "[B, T, n_kv, hd]" */
    int head_axis;         /* the axis an action's `head` picks (heads, compressor slots, streams), -1: none */
    const char *layers;    /* which layers have it, in words ("every layer", "CSA/HCA layers", "once") */
    int point;             /* the point's number in the family's hook enumeration (ps_hook_point, ps_v4_hook_point) */
    const char *what;      /* one line */
} ps_point_info;

/* ---- knockout targets as data (what interventions/' one mean-replacement spec reads) ----
 * A family's knockout target replaces, at each chosen layer, one to four arrays by their mean over the prompts of
 * the same shift, position by position: the clean run sums the array at `sum_point` (a backend-side sum action),
 * and a cell sets `set_point` from the mean (a set action on the cell's head, or on the whole array for a
 * per-layer target). The sizes come from the family's point_shape ([B, npos, ...]: the mean is [npos, ...]). */
#define PS_KO_MAX_ARRAYS 4
typedef struct {
    int sum_point;   /* the point (its number in the family's hook enumeration) whose values the clean run sums */
    int set_point;   /* the point a cell sets from the mean (the sum point, or where a choice made from it goes) */
    int fix;         /* 1: the family finishes the mean on the host (ko_mean: content chunk counts, a choice) */
} ps_ko_array;
/* where the cells of a target may restart from the kept state of their batch's run (interventions/grid.h's
 * ps_grid_restart has the same values) */
enum { PS_KO_RESTART_NONE = 0, PS_KO_RESTART_ATTENTION = 1 };

/* ---- gate statistics as data (what interventions/' one gate-records path reads: units.h, ps_gate_units) ----
 * A family's gate distributions fire at hook points during a forward; each firing is one record of the
 * partial result: `ints` ints (PS_GATE_REC_WINDOWS: layer, branch, the event's B·nW windows — per-head gates
 * [B, nW, n_kv, W]; PS_GATE_REC_SEQ_WINDOWS: layer, branch, B, nW — per-channel gates [B, nW, S, d]) and the
 * event's floats as they fired. The finish pools them: per-head gates into gates/gates.h's accumulator made from
 * provenance.config, per-channel ones into gates/chgates.h's made from `layout`. */
enum { PS_GATE_REC_WINDOWS = 3, PS_GATE_REC_SEQ_WINDOWS = 4 };
/* the training log's gate records: none (a family without phasescope training logs), per (layer, KV head,
 * branch) gates (gates/gates.h's summary), per-channel gates (gates/chgates.h's) */
enum { PS_GATE_LOG_NONE = 0, PS_GATE_LOG_HEADS = 1, PS_GATE_LOG_CHANNELS = 2 };
typedef struct {
    const char *records;           /* the partial result's record array: "events", "ch_events", "v4_events" */
    int ints;                      /* ints per record: PS_GATE_REC_* */
    int log;                       /* PS_GATE_LOG_* */
    int64_t log_layers, log_heads; /* PS_GATE_LOG_HEADS: the layers and KV heads a log of this model covers */
    json_t *layout;                /* per-channel gates: the accumulator's layout ({"model": the result's
                                    * "gates.model", "branches", "n_layers", "gates": [[layer, branch, S, d,
                                    * skip_first, rate, attention]]}: a new reference); NULL: per-head gates */
} ps_gate_info;
/* One gate distribution a forward fires: at hook point number `point` of `layer`, recorded as `branch`, with
 * `floats` values for the forward's batch. */
typedef struct {
    int layer, point, branch;
    int64_t floats;
} ps_gate_tap;
#define PS_GATE_MAX_TAPS_PER_LAYER 2

/* Options of an open. */
typedef struct {
    const char *backend;   /* NULL: "cpu" */
    int weights;           /* 0: the config and the weight files' headers only (info); 1: the weights too */
    int lazy;              /* -1: the family decides (DeepSeek-V4: one layer at a time when the float32 weights
                            * take more than half of the memory available); 0: every layer; 1: one at a time.
                            * rt->lazy says what was chosen (the caller may say so: core prints nothing) */
} ps_runtime_opts;

/* The instruments' entries of a family (struct ps_family below), grouped by instrument. */
typedef struct {
    /* knockout (docs/design.md, "Knockout grid"): the targets (names, NULL-terminated; NULL: the family has
     * none), what --heads counts ("KV heads"), the default target of this model, how many heads a target's
     * cells choose from (0: one cell per layer), what a cell is in the result ("query head", "layer"; NULL: not
     * recorded), whether a layer (-1: the model as a whole) has what a target replaces (NULL, or why not in
     * buf), the arrays it replaces (ps_ko_array; returns how many, *restart a PS_KO_RESTART_*), and the host
     * step of a `fix` array: sum [n_sum] the clean run's sums over the N prompts tokens [N, T] of the shift,
     * mean [n_mean] in: ps_sum_to_mean's means when the set point is the sum point, out: the mean the cells set */
    const char *const *targets;
    const char *heads_what;
    int (*default_target)(const ps_runtime *rt);
    int64_t (*heads)(const ps_runtime *rt, int target);
    const char *(*unit)(const ps_runtime *rt, int target);
    const char *(*missing)(const ps_runtime *rt, int target, int layer, char *buf, size_t n);
    int (*arrays)(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart);
    int (*mean)(const ps_runtime *rt, int target, const ps_ko_array *a, int layer, const int32_t *tokens, int64_t N,
                   int64_t T, const double *sum, int64_t n_sum, float *mean, int64_t n_mean, ps_error *err);
    /* where what a target replaces depends on the prompts' length T (every prompt of a shift has it; a task
     * sweep's shifts run T .. T + P - 1; MiniCPM4: the dense path below dense_len, no compressed keys before the
     * first complete window): the default target at that length, and whether layer has what the target
     * replaces at that length (NULL, or why not in buf). NULL entries: the length does not matter
     * (default_target, missing). */
    int (*default_at)(const ps_runtime *rt, int64_t T);
    const char *(*missing_at)(const ps_runtime *rt, int target, int layer, int64_t T, char *buf, size_t n);

} ps_family_knockout;

typedef struct {
    /* gate cycling (core/cycle.h; NULL: the family does not cycle its gates): gatecycle's flags checked against
     * the model (fills q's masks; a usage error for a flag the model cannot take), the roll by k (by 0: checks
     * only), and the family's keys of the instrument's meta (the "cycle" block, the summary line, its hints) */
    int (*check)(const ps_runtime *rt, ps_cycle_req *q, ps_error *err);
    int (*roll)(const ps_runtime *rt, const ps_cycle_req *q, int64_t k, ps_error *err);
    int (*meta)(const ps_runtime *rt, const ps_cycle_req *q, json_t *meta, ps_error *err);

} ps_family_cycle;

typedef struct {
    /* gate statistics (ps_gate_info above; NULL: the family has none): 0 with g filled, or 1 when this model has
     * no gates (why in buf); and the distributions a forward of n sequences of T tokens fires, in firing order,
     * into taps (room for PS_GATE_MAX_TAPS_PER_LAYER per layer): how many */
    int (*info)(const ps_runtime *rt, ps_gate_info *g, char *why, size_t n);
    int (*taps)(const ps_runtime *rt, int64_t n, int64_t T, ps_gate_tap *taps);

} ps_family_gates;

typedef struct {
    /* gradients at hook points (attribution patching, interventions/atp.h; NULL: the family has no backward pass,
     * so no estimate). `state` is the kept activations of a batch's forward that the grid engine hands an estimate
     * (a keep_all pass: the family's restart state); `*scratch` the family's backward scratch (NULL at first; made
     * for the state's batch shape, remade when it changes; backward_free frees it).
     *   backward: one backward of the summed NLL of targets [B, T] (-1: not scored; tokens [B, T] the pass's) down
     *     to layer stop_layer, activation gradients only, firing grad_hooks (the forward's hook names, the
     *     gradient as the event's data: actions such as PS_ACT_DOT read it); *loss the NLL.
     *   state_point: the clean activation of point number `point` at layer in the state (on rt->ctx) and its
     *     event shape in dims (NULL: the state has no such array).
     *   target_missing: why a first-order estimate of knockout target `target` would be meaningless on this model
     *     (NULL: it is not; NULL entry: every target with cells is estimated) — the controlled model's select
     *     attention: its compressed target acts only through a discrete top-k choice, whose gradient is 0.
     *   patch_missing / patch_attention (AtP*'s QK fix; patch_attention NULL: the family has none): why this model
     *     cannot take it (NULL: it can); layer's attention recomputed exactly with KV head `head`'s entries at
     *     points[i] set to means[i] (as the knockout's means, [npos, ...]; NULL: not replaced), and dz at the
     *     head's query group of `patch_point` (the attention output, [B, T, heads, hd]) = z' − z. */
    int (*backward)(const ps_runtime *rt, void *state, void **scratch, const int32_t *tokens, const int32_t *targets,
                    const ps_hooks *grad_hooks, int stop_layer, double *loss, ps_error *err);
    void (*backward_free)(const ps_runtime *rt, void *scratch);
    const float *(*state_point)(const ps_runtime *rt, void *state, int layer, int point, int64_t dims[4]);
    const char *(*target_missing)(const ps_runtime *rt, int target, char *buf, size_t n);
    const char *(*patch_missing)(const ps_runtime *rt, char *buf, size_t n);
    int (*patch_attention)(const ps_runtime *rt, void *state, void **scratch, int layer, int head, const int *points,
                           const float *const *means, int n, float *dz, ps_error *err);
    int patch_point;
} ps_family_grad;

/* ---- block selection as data (what the selection-recall instrument reads: interventions/recall.h) ----
 * A layer that selects blocks (core/select.h) fires a point with its chosen blocks, [B, T, n_kv, slots] (block ids as
 * floats, ascending, -1 for an empty slot); the instrument reads the answer rows there. */
typedef struct {
    ps_select_cfg cfg;    /* the layer's geometry: kernel, stride, block, forced blocks, top-k */
    int64_t n_kv;         /* KV heads (the point's axis 2) */
    int blocks_point;     /* the point's number in the family's hook enumeration (hook_blocks) */
} ps_select_geom;

typedef struct {
    /* block selection (NULL: the family selects no blocks): 1 with *g filled when `layer` selects blocks in a
     * forward of T tokens; 0 when it attends every key there (why in buf: full attention, fewer than dense_len
     * tokens) */
    int (*layer)(const ps_runtime *rt, int layer, int64_t T, ps_select_geom *g, char *why, size_t n);
} ps_family_select;

struct ps_family {
    const char *name;                    /* "phasescope", "deepseek_v4" (provenance, messages) */
    size_t model_size;                   /* bytes of the family's model (caller storage for ps_runtime_open_into) */
    /* 1 when DIR/config.json is this family's checkpoint, 0 otherwise (an unreadable file is 0) */
    int (*detect)(const char *dir);
    /* open DIR into `model` (model_size bytes, zeroed) and fill rt (ctx, max_pos, n_layers, m, model) */
    int (*open)(ps_runtime *rt, void *model, const char *dir, const ps_runtime_opts *o, ps_error *err);
    void (*free_model)(void *model);

    /* activation sets and the forward */
    int64_t (*acts_bytes)(const ps_runtime *rt, int64_t B, int64_t T, int keep_all); /* ps_acts_size for the family */
    void *(*acts_create)(const ps_runtime *rt, int64_t B, int64_t T, int keep_all, ps_error *err);
    void (*acts_free)(void *acts);
    /* tokens [B, T] (the model's ids); n_run layers (-1: all, and the logits) */
    int (*forward)(const ps_runtime *rt, void *acts, const int32_t *tokens, const ps_hooks *h, int n_run, ps_error *err);
    const float *(*logits)(void *acts, ps_error *err); /* [B, T, V] readable on the host */
    /* restart at layer l from the kept residual of a keep_all pass (NULL: the family has none) */
    int (*restart)(const ps_runtime *rt, void *acts, int layer, const ps_hooks *h, ps_error *err);
    /* scoring of answer rows: the sequences of b (model ids) in batches of `batch`, forward with hooks,
     * every query's correct / summed log-prob (ps_score_queries) */
    int (*score)(const ps_runtime *rt, const ps_batch *b, int64_t batch, const ps_hooks *h, int *ok, double *lp,
                 ps_error *err);

    /* the logits at the answer rows of every sequence of b (model ids; ps_answer_rows order), handed to fn
     * one sequence at a time as rows [n, vocab] (core/rows.h): in forward batches of at most `batch` whose
     * activations fit mem_bytes (0: the default), or one sequence at a time where they do not */
    int (*rows)(const ps_runtime *rt, const ps_batch *b, int64_t batch, double mem_bytes, ps_rows_fn fn, void *user,
                ps_error *err);

    /* the KV cache at inference (core/kvcache.h: create and every ps_kvcache_* function; NULL: the family has
     * none, and generate and serve say so) */
    const struct ps_kvcache_ops *kvcache;

    /* hook points */
    const ps_point_info *points;
    int n_points;
    const ps_hook_family *hook_family;   /* whose point numbers these are (core/hooks.h) */
    /* the shape of point i (an index of `points`) at `layer` (ignored for a global point) for B sequences of
     * T tokens: its rank, or 0 when that layer (or this model) does not have the point */
    int (*point_shape)(const ps_runtime *rt, int i, int layer, int64_t B, int64_t T, int64_t dims[4]);
    /* register by name: a host callback, a backend-side action, a cache watch (the family's parsers: an
     * invalid name is an error listing the valid ones) */
    int (*hook_add)(const ps_runtime *rt, ps_hooks *h, const char *name, ps_hook_fn fn, void *user, ps_error *err);
    int (*hook_add_action)(const ps_runtime *rt, ps_hooks *h, const char *name, const ps_hook_action *act, ps_error *err);
    int (*cache_watch)(const ps_runtime *rt, ps_cache *c, ps_hooks *h, const char *name, ps_error *err);
    /* the slot (layer, or the global slot) and point number of a name */
    int (*hook_parse)(const ps_runtime *rt, const char *name, int *slot, int *point, ps_error *err);

    /* provenance */
    json_t *(*config_json)(const ps_runtime *rt);        /* provenance.config */
    void (*config_hash)(const ps_runtime *rt, char out[17]);
    int64_t (*step)(const ps_runtime *rt);               /* the training step the checkpoint records, -1: none */
    int64_t (*default_period)(const ps_runtime *rt);     /* the instruments' default --period */
    int64_t (*vocab)(const ps_runtime *rt);
    /* write the (possibly modified: gate cycling) model as a checkpoint in dir, with key = value added to its
     * metadata; NULL: the family does not write checkpoints */
    int (*save)(const ps_runtime *rt, const char *dir, const char *key, const char *value, ps_error *err);
    /* a value the checkpoint stores in its metadata ("phasescope.task": the task it was trained on), NULL:
     * none (or a family whose checkpoints store none) */
    const char *(*meta)(const ps_runtime *rt, const char *key);

    /* what bounds a prompt's length, as the config names it ("max_seq_len", "max_position_embeddings") */
    const char *max_pos_name;
    /* the weights after an open with weights = 0 (lazy as ps_runtime_opts); NULL: the open always loads them */
    int (*load_weights)(ps_runtime *rt, int lazy, ps_error *err);
    /* `phasescope info`'s account of the model for a batch of B sequences (config, parameters by group, cache
     * and memory estimates), written to out */
    int (*describe)(const ps_runtime *rt, int64_t B, FILE *out, ps_error *err);
    /* 1: forward's n_run may stop after the first n_run layers (no logits then); 0: every layer runs */
    int early_stop;

    /* results: what a reader needs of the model whose config (provenance.config, as config_json writes it)
     * this is — 1: this family's (d filled), 0: another family's, -1: this family's with a bad field (err:
     * "KEY: what is wrong", KEY the path within the config, e.g. "attention.rate: missing") */
    int (*describe_config)(const json_t *config, ps_model_desc *d, ps_error *err);
    const char *const *kinds;            /* the attention kinds (config.attention.kind) describe_config knows */
    /* its name in messages ("DeepSeek-V4"; NULL: `name`), and where the instruments' prompts come from: 0 the task
     * the checkpoint stores (meta "phasescope.task"), 1 a task file (--task FILE.json or DIR/phasescope_task.json,
     * its "ids" mapping the task's tokens to the model's: interventions/shifted.h, ps_task_file_load) */
    const char *title;
    int task_file;

    /* the instruments' entries, one sub-table each (NULL members: the family has not that instrument) */
    ps_family_knockout ko;   /* knockout targets (f->ko.targets, f->ko.arrays, ...) */
    ps_family_cycle cycle;   /* gate cycling (f->cycle.check, f->cycle.roll, f->cycle.meta) */
    ps_family_gates gates;   /* gate statistics (f->gates.info, f->gates.taps) */
    ps_family_grad grad;     /* gradients and attribution patching (f->grad.backward, ...) */
    ps_family_select sel;    /* block selection (f->sel.layer: the selection-recall instrument) */
};

/* The registered families, in the order a checkpoint is tried; NULL-terminated. */
extern const ps_family *const ps_families[];
extern const ps_family ps_family_model; /* the controlled model (phasescope checkpoints, Hugging Face Qwen3) */
extern const ps_family ps_family_v4;    /* DeepSeek-V4 checkpoints */
extern const ps_family ps_family_minicpm; /* MiniCPM4 checkpoints with InfLLM-v2 sparse attention (core/minicpm/) */

/* A checkpoint's provenance hash: FNV-1a 64 of the file as stored (config.json), 16 hex digits. */
int ps_runtime_hash_file(const char *path, char out[17], ps_error *err);

/* The family whose detector recognises DIR (the controlled model when none does: its loader says what is
 * wrong with the directory). */
const ps_family *ps_runtime_detect(const char *dir);
/* Open DIR with its family; the runtime owns the model. ps_runtime_free releases it, after a failed open
 * too. */
int ps_runtime_open(ps_runtime *rt, const char *dir, const ps_runtime_opts *o, ps_error *err);
/* The same into caller storage: storage(f, user) returns where family f's model goes (f->model_size
 * bytes), or NULL to allocate it. ps_runtime_free frees the model but not caller storage. */
int ps_runtime_open_into(ps_runtime *rt, const char *dir, const ps_runtime_opts *o,
                         void *(*storage)(const ps_family *f, void *user), void *user, ps_error *err);
/* The same over a list of families (NULL-terminated; NULL: ps_families), e.g. the shipped ones and a family
 * defined by the caller: the first whose detector recognises DIR opens it (the controlled model when none
 * does). No registry is kept: the caller passes its list to each open (serve: ps_serve_opts.families). */
const ps_family *ps_runtime_detect_in(const ps_family *const *families, const char *dir);
int ps_runtime_open_in(ps_runtime *rt, const ps_family *const *families, const char *dir, const ps_runtime_opts *o,
                       ps_error *err);
/* Open DIR with the given family table (one that ps_families does not list: a family defined by its
 * user, e.g. the toy family of tests/test_toy_family.c). */
int ps_runtime_open_family(ps_runtime *rt, const ps_family *f, const char *dir, const ps_runtime_opts *o, ps_error *err);
void ps_runtime_free(ps_runtime *rt);
/* The controlled model of a runtime of that family (its instruments' own code: knockout specs, gates,
 * the restart path), NULL for any other family. */
const ps_model *ps_runtime_controlled(const ps_runtime *rt);
/* A runtime over a controlled model opened elsewhere (not owned). */
void ps_runtime_wrap_model(ps_runtime *rt, const ps_model *m);

/* The instruments' default --period of the model (the family's default_period): the one place it is
 * computed (the controlled model: a compressed model's stride, the channel attention's rate, else 8;
 * DeepSeek-V4: the smallest compression rate). */
int64_t ps_runtime_default_period(const ps_runtime *rt);
/* The model's description (its family's describe_config of its config_json); -1 with err when the family
 * cannot describe it. */
int ps_runtime_desc(const ps_runtime *rt, ps_model_desc *d, ps_error *err);
/* The model's display label into buf (n bytes), returned ("" when the family cannot describe it). */
const char *ps_runtime_label(const ps_runtime *rt, char *buf, size_t n);

/* A result's model description from its provenance: the families decide from provenance.config (so a
 * result written before labels existed is labelled as a new one), and a provenance "label" / "kind" the
 * writer stored wins for those two; a config no shipped family knows (a family its user defined) is
 * described by that label and kind alone (the other fields 0) when the kind is the config's attention.kind. -1 with err when there is no config, a field
 * is bad, or no family knows it and the provenance has no label and kind (err: "KEY: what is wrong", KEY the
 * path within provenance.config). */
int ps_model_desc_from_config(const json_t *config, ps_model_desc *d, ps_error *err);
int ps_model_desc_from_provenance(const json_t *prov, ps_model_desc *d, ps_error *err);
/* The label and kind alone (either pointer may be NULL); 0, or -1 when the provenance has none. */
int ps_label_from_provenance(const json_t *prov, char *label, size_t ln, char *kind, size_t kn);
/* What a config or result field held, for messages: "an object", ..., "a fractional number", "nothing (the
 * field is missing)" (the result validator's wording; core/fileio.h's ps_json_type_name is the files'). */
const char *ps_config_type_name(const json_t *v);

/* The layers of point i, as "0-3", "1, 3", "none" or "once" (global points). */
void ps_runtime_point_layers(const ps_runtime *rt, int i, char *buf, size_t n);
/* The hook name of point i at layer l (the pattern with {L} replaced). */
void ps_runtime_point_name(const ps_runtime *rt, int i, int layer, char *buf, size_t n);
/* The index in the family's points table of point number `point` (-1: none). */
int ps_runtime_point_index(const ps_runtime *rt, int point);
/* Whether a point's pattern has a layer. */
int ps_point_is_global(const ps_point_info *p);

#endif
