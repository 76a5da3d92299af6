/* textkv.h — the phase sweep's text key-value prompts (`phasescope sweep --task text-kv`, pad and move
 * modes; docs/text-experiments.md). The prompt builder itself (ps_textkv, ps_textkv_prompt, the training
 * batches) is text/textkv_prompt.h, shared with the "text-kv" training task (text/textkv_task.h). */
#ifndef PS_TEXTKV_H
#define PS_TEXTKV_H

#include <stdint.h>

#include <jansson.h>

#include "core/model.h"
#include "core/runtime.h"
#include "interventions/sweep.h"
#include "text/textkv_prompt.h"
#include "tasks/textkv_task.h"

/* The prompts of shift p of a phase sweep with period P: N prompts (prompt i from seed and i), pad mode
 * pre = p, move mode before = p, after = P − 1 − p (the length is the same for every p). Prompts are
 * padded at the end with pad_id to the longest (never read: attention is causal). residue: pad mode
 * every query's t_K mod P, move mode the first query's (the others −1). Errors when the longest prompt
 * exceeds max_seq_len. */
int ps_textkv_shifted(const ps_textkv *kv, ps_sweep_mode mode, int64_t P, int64_t p, uint64_t seed, int64_t N,
                      int64_t max_seq_len, ps_shifted *out, ps_error *err);

/* The filler ids of shift p (pad mode: pre = p; move mode: before = p, after = P - 1 - p). */
void ps_textkv_shift_fill(ps_sweep_mode mode, int64_t P, int64_t p, int64_t *pre, int64_t *before, int64_t *after);

/* The text-kv task a checkpoint was trained on ("phasescope.task" of text/textkv_task.h): 1 and *t filled, 0
 * when its task is another (or none), -1 on error. dir names the checkpoint in errors. */
int ps_textkv_checkpoint_task(const ps_model *m, const char *dir, ps_textkv_task *t, ps_error *err);
/* The same from an opened checkpoint of any family (its stored "phasescope.task", core/runtime.h meta). */
int ps_textkv_runtime_task(const ps_runtime *rt, const char *dir, ps_textkv_task *t, ps_error *err);

/* ---- the text-kv sweep's prompt set (`sweep --task text-kv` and `probe --task text-kv` build it alike) ----
 * What the flags say (NULL / -1: not given) and the checkpoint's stored layout (trained, may be NULL). As
 * `sweep --model DIR` has always done: without --tokenizer the checkpoint's layout (tokenizer, words, values,
 * pairs, queries, filler family) gives the defaults and --words, --family, --pairs, --values override them;
 * with --tokenizer the flags alone. No tokenizer from either: a usage error naming `need`. */
typedef struct {
    const char *tokenizer, *words, *family;
    int64_t pairs;  /* -1: default (8, or the checkpoint's) */
    int values;     /* -1: default (numbers, or the checkpoint's); 0 numbers, 1 words */
    const ps_textkv_task *trained;
    int64_t value_digits; /* 0: default (4, or the checkpoint's): digits of a number value */
} ps_textkv_layout;

typedef struct {
    ps_textkv kv;
    ps_tokenizer *tok;
    ps_text_family *fams;
    int n_fams;
    const ps_text_family *fam;
    char **words;
    int64_t n_words;
    ps_ids fill;
    int value_words, from_checkpoint;
    char *tok_path, *words_path; /* resolved (owned) */
    int64_t P;
} ps_textkv_set;

/* Load the tokenizer, words and filler family (the first P - 1 ids of its text) and build the prompt
 * builder. Errors name the file or flag; a bad --family is a usage error (err->usage). */
int ps_textkv_set_open(ps_textkv_set *s, const ps_textkv_layout *lay, int64_t P, ps_error *err);
void ps_textkv_set_free(ps_textkv_set *s);
/* Prompt i (of N, from seed) of shift p: its ids (out is overwritten), its n_queries queries, and each
 * query's phase coordinate rho (pad: t_K mod P for every query; move: the first query's, the others -1),
 * exactly the prompts and residues of ps_textkv_shifted. */
int ps_textkv_set_prompt(const ps_textkv_set *s, ps_sweep_mode mode, int64_t p, uint64_t seed, int64_t i, ps_ids *out,
                         ps_query *q, int64_t *rho, ps_error *err);
/* The prompt's own length: its last answer token and the closing text (what a prompt needs to be scored;
 * the rest of a padded row is never read). */
int64_t ps_textkv_set_prompt_len(const ps_textkv_set *s, const ps_query *q);
/* provenance.task of a text-kv sweep (docs/results-schema.md): the layout and the prompt lengths seen. */
json_t *ps_textkv_set_task_json(const ps_textkv_set *s, int64_t tmin, int64_t tmax);

/* The plan of a text-kv sweep of N prompts per shift over shifts 0..P-1 (the set's P): every shift's
 * padded length T[p] (what ps_textkv_shifted pads to, with its max_seq_len error) and the shortest and
 * longest prompt (ps_textkv_set_prompt_len) over every shift, for provenance. */
int ps_textkv_sweep_lengths(const ps_textkv_set *s, ps_sweep_mode mode, uint64_t seed, int64_t N, int64_t max_seq_len, int64_t *T,
                            int64_t *tmin, int64_t *tmax, ps_error *err);

#endif
