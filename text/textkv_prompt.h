/* textkv_prompt.h — key-value retrieval as text (docs/text-experiments.md): key-value pairs written as lines,
 * a question for one key, the value as the answer, all as token ids of a real tokenizer. One builder
 * serves the phase sweep (interventions/textkv.h: `phasescope sweep --task text-kv`, pad and move modes) and
 * training (a batch of sequences with queries, ps_textkv_batch; the "text-kv" task of textkv_task.h). It lives in
 * text/ so that train/ can use it (layering: train -> text -> core).
 *
 * A prompt (the default texts; each piece is tokenized on its own and the ids concatenated):
 *
 *   intro          "Below is a list of keys and their values. Remember them.\n"
 *   [pre filler]   pad mode: the first `pre` ids of the filler text
 *   per pair:      [move mode, the queried pair: `before` filler ids]
 *                  "The value of" + " KEY" + " is" + " VALUE" + ".\n"
 *                  [move mode, the queried pair: the next `after` filler ids]
 *   per query:     "Question: what is the value of" + " KEY" + "?\nAnswer: The value of" + " KEY" + " is"
 *                  + " VALUE" (the answer, teacher-forced) + ".\n"
 *
 * " KEY" and " VALUE" are a word with a space before it (keys from a word list; values a word, or a
 * number of value_digits digits), tokenized on their own, so the answer's ids are exactly the ids of the
 * value in its pair line, and the question's key ids those of the key there. Keys are distinct within a
 * prompt, and so are values. A query's key_pos (t_K) is the position of the first id of the key in its
 * pair line; answer_src the first id of the answer, answer_pos = answer_src − 1, answer_len the value's
 * ids. The first query is the one the move mode moves. Everything is drawn from the prompt's seed alone,
 * so the pad / move parameters change positions and nothing else. */
#ifndef PS_TEXTKV_PROMPT_H
#define PS_TEXTKV_PROMPT_H

#include <stdint.h>

#include "core/error.h"
#include "core/batch.h"
#include "text/textutil.h"
#include "text/tokenizer.h"

typedef struct {
    /* what the caller sets (ps_textkv_defaults fills the texts and the sizes) */
    char **keys;            /* key words (borrowed) */
    int64_t n_keys;
    char **value_words;     /* value words (borrowed), or NULL: values are numbers */
    int64_t n_value_words;
    int64_t value_digits;   /* numbers: uniform over the value_digits-digit numbers (default 4) */
    int64_t n_pairs, n_queries;
    const char *intro, *pair_lead, *pair_mid, *pair_end, *q_lead, *q_mid, *q_end;
    const int32_t *filler;  /* filler ids (borrowed): pad, move, and the training pre-fill */
    int64_t n_filler;
    int32_t pad_id;         /* the ids after a sequence's end (never scored; targets -1); -1: the filler's first */
    /* ps_textkv_init */
    const ps_tokenizer *tok;
    ps_ids intro_ids, lead_ids, mid_ids, end_ids, ql_ids, qm_ids, qe_ids;
    ps_ids *key_ids, *value_ids; /* [n_keys], [n_value_words] */
} ps_textkv;

/* The default texts (above), 8 pairs, 1 query, 4-digit values, pad_id -1; keys, values and filler unset. */
void ps_textkv_defaults(ps_textkv *kv);
/* Tokenize the texts and the words with tok (kept: it tokenizes the numbers). Checks the sizes: enough
 * keys (and value words, or numbers) for n_pairs distinct ones, 1 <= n_queries <= n_pairs. */
int ps_textkv_init(ps_textkv *kv, const ps_tokenizer *tok, ps_error *err);
void ps_textkv_free(ps_textkv *kv);

/* One prompt from seed (out is overwritten): `pre` filler ids after the intro, `before` filler ids before
 * the first query's pair line and the next `after` after it. q gets n_queries queries. Errors when the
 * filler has fewer than pre or before + after ids. */
int ps_textkv_prompt(const ps_textkv *kv, uint64_t seed, int64_t pre, int64_t before, int64_t after, ps_ids *out,
                     ps_query *q, ps_error *err);

/* Training sequences: B sequences of exactly T tokens (b is allocated here; free with ps_batch_free).
 * Sequence i (from seed and i) is a prompt with a pre-fill drawn uniformly from 0 .. min(n_filler,
 * T − its length without pre-fill), so t_K takes every phase, then pad_id to T. targets: the answer ids
 * at the answer rows (targets[answer_pos + k] = answer id k), −1 elsewhere; loss_all: the next id at
 * every position before the sequence's end. Errors when a prompt without pre-fill exceeds T. */
int ps_textkv_batch(const ps_textkv *kv, uint64_t seed, int64_t B, int64_t T, int loss_all, ps_batch *b, ps_error *err);

/* The seed of prompt i of a set drawn from seed (the sweep's prompts and the training sequences). */
uint64_t ps_textkv_prompt_seed(uint64_t seed, int64_t i);
/* The id after a prompt's end: pad_id, else the filler's first id, else the prompt's last id. */
int32_t ps_textkv_pad(const ps_textkv *kv, const ps_ids *prompt);
/* The most ids an answer (a value) can have, and the most ids a prompt without pre-fill can have. */
int64_t ps_textkv_max_value_ids(const ps_textkv *kv, ps_error *err);
int64_t ps_textkv_max_prompt_ids(const ps_textkv *kv, ps_error *err);

#endif
