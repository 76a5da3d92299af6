/* promptset.h — a caller's own prompts for the instruments (knockout, sweep): N token sequences of one
 * length T, each scored at one position. Prompt i is tokens [i, 0..T), its query position query[i] (the row
 * whose next-token prediction is scored, 0 <= query < T), the expected token answer[i] there, its phase label
 * residue[i] (0 <= residue < P) and, optionally, a second answer alt[i] (the logit difference answer − alt is
 * reported beside the NLL). The set is read from JSON lines (`--prompts FILE`: one object a line,
 * {"tokens": [...], "query": t, "answer": id, "residue": r, "alt": id, "needle": n}) or from the same records in a JSON
 * list (the API's "prompts" key); every bad record is an error naming its line (or item) and key.
 *
 * As the grid engine and the sweep see it, the set is one ps_shifted (interventions/shifted.h) without
 * shifts: a batch whose queries carry their answer as a token id (ps_query.answer_src = -1), one query per
 * prompt at residue[i], and with alt a second query at the same row answering alt, labelled residue + P, which
 * the per-residue statistics leave out (they count residues [0, P)) and the logit-difference columns pair with
 * the first (ps_promptset_logit_diff). A query's key_pos is the prompt's needle (its query position without one). */
#ifndef PS_PROMPTSET_H
#define PS_PROMPTSET_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "interventions/shifted.h"
#include "interventions/stats.h"

typedef struct ps_promptset_s {
    int64_t N, T;
    int32_t *tokens;                  /* [N, T] */
    int64_t *query, *answer, *residue; /* [N] */
    int64_t *alt;                     /* [N], or NULL: no second answer */
    int64_t *needle;                  /* [N], or NULL: the position of the fact the query retrieves (0 <= needle <=
                                       * query; the selection-recall instrument asks whether its block is selected) */
    int64_t max_residue;              /* the largest residue */
    char source[512];                 /* the file, or "request" (provenance) */
} ps_promptset;

/* The prompts of a JSON-lines file (blank lines skipped). Errors name the file, the line and the key: a
 * missing key, a value of the wrong type, a query outside [0, T), a negative id or residue, a length that
 * differs from the first line's, an alt on some lines but not others. */
int ps_promptset_read(const char *path, ps_promptset *s, ps_error *err);
/* The same from a JSON list of such records (what = "request key \"prompts\"", named in errors with the item). */
int ps_promptset_from_json(const json_t *list, const char *what, ps_promptset *s, ps_error *err);
/* Checks the set against the model and the period: every id (tokens, answer, alt) below vocab, T within
 * max_pos, every residue below P. *P = 0: P becomes max residue + 1. */
int ps_promptset_check(const ps_promptset *s, int64_t vocab, int64_t max_pos, int64_t *P, ps_error *err);
/* The set as the grid engine's and the sweep's prompt set (queries as above; residues [N, max_q]). */
int ps_promptset_shifted(const ps_promptset *s, int64_t P, ps_shifted *out, ps_error *err);
/* provenance: {"source", "n", "T", "alt", "tokens_hash"} (a 64-bit FNV-1a of tokens, queries, answers, residues
 * and alts, as 16 hex digits) */
json_t *ps_promptset_json(const ps_promptset *s);
void ps_promptset_free(ps_promptset *s);
/* The scored queries of a sweep's shifted prompts as a prompt set, one record per query (every answer one token,
 * else an error): tokens padded after their end with `pad` to the longest shift (a causal model's rows up to the
 * query do not see them), mapped through token_map when given (a task file's ids: the set is in the model's
 * ids). What `sweep --save-prompts FILE` writes. */
int ps_promptset_from_shifts(const ps_shifted *const *shifts, int n_shifts, const int32_t *token_map, int64_t n_map, int32_t pad,
                             ps_promptset *out, ps_error *err);
/* Write the set as JSON lines (what ps_promptset_read reads), atomically. */
int ps_promptset_save(const ps_promptset *s, const char *path, ps_error *err);

/* Other tokens for the same prompts: activation patching's corrupt run (`patch --corrupt FILE`, the API's
 * "corrupt" key). N sequences of T tokens, read from JSON lines whose records have "tokens" (the other keys
 * of a prompt-set record may be there and are not read: a prompt-set file serves) or from a JSON list of
 * such records or of bare token lists. Errors name the file's line (or the item) and the key. */
typedef struct ps_token_set_s {
    int64_t N, T;
    int32_t *tokens; /* [N, T] */
    char source[512]; /* the file, or "request" */
} ps_token_set;
int ps_token_set_read(const char *path, ps_token_set *s, ps_error *err);
int ps_token_set_from_json(const json_t *list, const char *what, ps_token_set *s, ps_error *err);
/* The same N and T as the prompts they go with (what: "the clean prompts"), every id below vocab. */
int ps_token_set_check(const ps_token_set *s, int64_t N, int64_t T, const char *what, int64_t vocab, ps_error *err);
/* provenance: {"source", "n", "T", "tokens_hash"} (a 64-bit FNV-1a of the tokens, 16 hex digits) */
json_t *ps_token_set_json(const ps_token_set *s);
void ps_token_set_free(ps_token_set *s);

/* Per-residue logit differences from per-query outcomes in the one-process order (rho as the sweep and the
 * knockout record them: an alt query at rho + P follows its prompt's answer query): sum[P] += lp(answer) −
 * lp(alt) (= logit[answer] − logit[alt]), n[P] += 1. */
void ps_promptset_logit_diff(const double *lp, const int32_t *rho, int64_t n_items, int64_t P, double *sum, int64_t *n);

/* The per-residue means sum / n into residues[r]["mean_logit_diff"] (null where n is 0) and, base [P] given,
 * minus base into "delta_logit_diff"; mean [P] (may be NULL) gets them. */
void ps_promptset_put_logit_diff(json_t *residues, const double *sum, const int64_t *n, int64_t P, const double *base, double *mean);
/* The logit-difference column of a curve's residues (JSON [{"rho", ...}], P of them) from per-query outcomes as
 * above, when they hold alt queries: "mean_logit_diff" per residue (null where none), and with base [P] (the clean
 * run's means) "delta_logit_diff" too; mean [P] (may be NULL) gets the means. 1 when added, 0 when the
 * outcomes have no alt query (nothing added), -1 on an error. */
int ps_promptset_residue_logit_diff(json_t *residues, const double *lp, const int32_t *rho, int64_t n_items, int64_t P,
                                    const double *base, double *mean, ps_error *err);

#endif
