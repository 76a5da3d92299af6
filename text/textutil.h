/* textutil.h — what text prompts are built from (docs/text-experiments.md): growable id arrays filled from
 * text with a tokenizer, the model/tokenizer vocabulary check, line files (word lists, sentences), and
 * text filler families (named lists of sentences) cut to an exact number of tokens.
 *
 * Text is always tokenized segment by segment, and prompts are concatenations of ids: the phase of every
 * token is then known exactly, whatever the tokenizer would do at a segment boundary. */
#ifndef PS_TEXTUTIL_H
#define PS_TEXTUTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "text/tokenizer.h"

/* ---- id arrays ---- */

typedef struct {
    int32_t *v;
    int64_t n, cap;
} ps_ids;

/* Append n ids (the array grows as needed). */
int ps_ids_push(ps_ids *a, const int32_t *v, int64_t n, ps_error *err);
/* Append the tokens of len bytes of text (no special tokens added; added tokens written in the text,
 * e.g. "<|im_start|>", are recognised). */
int ps_ids_text(ps_ids *a, const ps_tokenizer *tok, const char *s, size_t len, ps_error *err);
void ps_ids_free(ps_ids *a);

/* ---- model and tokenizer ---- */

/* A model may have more rows than its tokenizer has ids (Qwen3: 151,936 rows for 151,669 ids; DeepSeek-V3
 * 129,280 for 128,815), but at most this many more: a larger difference means another tokenizer. */
#define PS_TEXT_VOCAB_SLACK 1024

/* The model's vocabulary (model_vocab rows, model named by model_dir) must cover every id of the
 * tokenizer (tok_path) and exceed it by at most PS_TEXT_VOCAB_SLACK; the error names both. */
int ps_text_check_vocab(const ps_tokenizer *tok, const char *tok_path, int64_t model_vocab, const char *model_dir,
                        ps_error *err);

/* Text of one id for people: the decoded bytes (invalid UTF-8 replaced), "<id N>" for an id the tokenizer
 * does not know. Caller frees. NULL when out of memory. */
char *ps_text_id_string(const ps_tokenizer *tok, int32_t id);

/* ---- line files ---- */

/* The lines of a UTF-8 text file (at most 64 MB), without their line ends ("\n" or "\r\n"); empty lines
 * and lines that are only white space are skipped. *lines (and each line) malloc'd; free with
 * ps_text_lines_free. An empty result is an error naming the file. */
int ps_text_read_lines(const char *path, char ***lines, int64_t *n, ps_error *err);
void ps_text_lines_free(char **lines, int64_t n);

/* ---- filler families ----
 *
 * A family is a list of sentences, joined by its separator ("\n" unless given), tokenized as one string.
 * The filler of length L is the first L ids of that tokenization: the cut is in ids, so every L gives
 * exactly L tokens, and the fillers of one family are prefixes of each other. A family with "repeat"
 * cycles its sentences: its text is k rounds of the sentences (joined by the separator, rounds joined by
 * it too), k = 1, 2, 4, 8, ... the first whose tokenization has at least as many ids as needed. */
typedef struct {
    char *name;
    char **sentences;
    int64_t n_sentences;
    char *separator;
    int repeat;
    char *source; /* where the sentences came from: the file, or "inline" */
} ps_text_family;

/* Parse a JSON list of families, each {"name": ..., "sentences": [...] | "file": "path", "separator": s,
 * "repeat": bool}; a relative "file" is read relative to base_dir. source names the JSON (file and path)
 * in errors. Names must be unique. */
int ps_text_families_parse(json_t *arr, const char *base_dir, const char *source, ps_text_family **out, int *n,
                           ps_error *err);
/* A file {"families": [...]} (data/text/fillers.json). */
int ps_text_families_load(const char *path, ps_text_family **out, int *n, ps_error *err);
void ps_text_families_free(ps_text_family *f, int n);
/* A family by name (NULL: the first); the error lists the names. */
int ps_text_family_find(const ps_text_family *f, int n, const char *name, const ps_text_family **out, ps_error *err);

/* At least `need` ids of the family's text (see above; *out gets the whole tokenization, which may be
 * longer). Error, naming the family, when the sentences give fewer ids and the family does not repeat. */
int ps_text_family_ids(const ps_text_family *f, const ps_tokenizer *tok, int64_t need, ps_ids *out, ps_error *err);

/* The directory part of a path ("." when none), into out. */
void ps_text_dirname(const char *path, char *out, size_t n);

#endif
