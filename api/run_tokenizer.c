/* run_tokenizer.c — tokenizer.json through the API (include/phasescope.h, "tokenizers"): text/tokenizer.h
 * underneath, the same encoder `phasescope tokenize` runs. */
#include <stdlib.h>

#include "api/api_internal.h"
#include "text/tokenizer.h"

struct ps_api_tokenizer {
    ps_tokenizer *tok;
};

PS_API int ps_api_tokenizer_open(const char *path, ps_api_tokenizer **out, char *err, size_t errlen) {
    if (!out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_tokenizer_open: out is NULL");
    *out = NULL;
    if (!path || !*path) return ps_api_say(err, errlen, PS_API_EINPUT, "no tokenizer path given");
    ps_api_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
    ps_error e = {0};
    if (ps_tokenizer_load(path, &t->tok, &e)) {
        free(t);
        e.usage = 1; /* a missing or malformed file the caller named */
        return ps_api_report(&e, err, errlen);
    }
    *out = t;
    return PS_API_OK;
}

PS_API void ps_api_tokenizer_free(ps_api_tokenizer *t) {
    if (!t) return;
    ps_tokenizer_free(t->tok);
    free(t);
}

PS_API int64_t ps_api_tokenizer_vocab_size(const ps_api_tokenizer *t) { return ps_tokenizer_vocab_size(t->tok); }

PS_API int ps_api_encode(const ps_api_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, int64_t *n,
                         char *err, size_t errlen) {
    if (!t || !ids || !n || (!text && len)) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_encode: NULL argument");
    *ids = NULL, *n = 0;
    ps_error e = {0};
    size_t k = 0;
    if (ps_tokenize(t->tok, text ? text : "", len, add_special != 0, ids, &k, &e)) return ps_api_report(&e, err, errlen);
    *n = (int64_t)k;
    return PS_API_OK;
}

PS_API int ps_api_decode(const ps_api_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, char **text, size_t *len,
                         char *err, size_t errlen) {
    if (!t || !text || !len || n < 0 || (!ids && n)) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_decode: NULL argument");
    *text = NULL, *len = 0;
    ps_error e = {0};
    if (ps_detokenize(t->tok, ids, (size_t)n, skip_special != 0, text, len, &e)) {
        e.usage = 1; /* the ids the caller gave */
        return ps_api_report(&e, err, errlen);
    }
    return PS_API_OK;
}
