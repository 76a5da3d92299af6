/* tokenizer.h — Hugging Face `tokenizer.json` byte-level BPE (Qwen3, DeepSeek-V3 and their kin).
 *
 * The pipeline is the one the Hugging Face `tokenizers` library runs, in its order:
 *   invalid UTF-8 replaced by U+FFFD (maximal subparts, as String::from_utf8_lossy and TextDecoder do)
 *   -> added tokens (normalized: false) split out of the raw text
 *   -> normalizer (NFC, NFD, NFKC, NFKD, Sequence) on each remaining piece
 *   -> added tokens (normalized: true) split out of the normalized pieces
 *   -> pre-tokenizer (Sequence of Split stages and a final ByteLevel)
 *   -> BPE model (ranked merges, heap-based; ignore_merges, byte_fallback, unk_token)
 *   -> post-processor (special tokens, only when asked: TemplateProcessing, Roberta/BertProcessing)
 * Anything the loader does not support is refused with a one-line error naming the key.
 * docs/tokenizers.md describes what is supported and how it is checked against a reference.
 *
 * A loaded tokenizer is read-only: one may be shared by several threads. */
#ifndef PS_TOKENIZER_H
#define PS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ps_tokenizer ps_tokenizer;

/* Load a tokenizer.json file. On failure *tok is NULL and err names the file and key at fault. */
int ps_tokenizer_load(const char *path, ps_tokenizer **tok, ps_error *err);
/* The same from a buffer (name is used in error messages). */
int ps_tokenizer_parse(const char *json, size_t len, const char *name, ps_tokenizer **tok, ps_error *err);
void ps_tokenizer_free(ps_tokenizer *tok);

/* Encode len bytes of text (need not be valid UTF-8 nor NUL-terminated). add_special: apply the
 * post-processor's special tokens (e.g. a BOS); added tokens written in the text are always
 * recognised. *ids (malloc'd, caller frees; never NULL on success) gets *n ids. */
int ps_tokenize(const ps_tokenizer *tok, const char *utf8, size_t len, bool add_special, int32_t **ids, size_t *n,
                ps_error *err);

/* Decode ids to bytes (the decoder of the file; invalid UTF-8 in the result becomes U+FFFD).
 * skip_special: leave out added tokens marked special. *out (malloc'd, NUL-terminated, caller
 * frees) gets *out_len bytes. An id outside the vocabulary is an error naming its position. */
int ps_detokenize(const ps_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, char **out,
                  size_t *out_len, ps_error *err);

/* One past the largest id (model vocabulary and added tokens). */
int32_t ps_tokenizer_vocab_size(const ps_tokenizer *tok);
/* The id of a token string (added tokens first, then the model vocabulary; the string as it is
 * stored in the file, e.g. "Ġthe"), or -1. */
int32_t ps_tokenizer_token_to_id(const ps_tokenizer *tok, const char *token, size_t len);
/* The stored string of an id (NULL when none); *len gets its length. */
const char *ps_tokenizer_id_to_token(const ps_tokenizer *tok, int32_t id, size_t *len);

/* Replace invalid UTF-8 by U+FFFD, one per maximal subpart (the Unicode / WHATWG rule). Returns a
 * malloc'd NUL-terminated copy (*out_len bytes), or NULL when out of memory. */
char *ps_utf8_lossy(const char *s, size_t len, size_t *out_len);

#endif
