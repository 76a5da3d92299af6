/* exec_tokenize.c — the body of `phasescope tokenize` (instruments/commands.h): text to token ids (and back)
 * with a model's own tokenizer.json (text/tokenizer.h; docs/tokenizers.md): reads the input list, encodes or
 * decodes every item, writes the output atomically and prints one summary line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fileio.h"
#include "instruments/commands.h"
#include "text/tokenizer.h"

static int encode_all(const ps_tokenizer *tok, json_t *in, const char *path, bool add_special, char **out, size_t *out_len,
                      size_t *n_tokens, ps_error *err) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return ps_fail(err, "out of memory");
    int rc = 0;
#define EMIT(...)                                                                    \
    do {                                                                             \
        int k_ = snprintf(buf + n, cap - n, __VA_ARGS__);                            \
        if (k_ < 0) { rc = ps_fail(err, "output formatting failed"); goto done; }    \
        if ((size_t)k_ >= cap - n) {                                                 \
            while ((size_t)k_ >= cap - n) cap *= 2;                                  \
            char *b_ = realloc(buf, cap);                                            \
            if (!b_) { rc = ps_fail(err, "out of memory"); goto done; }              \
            buf = b_;                                                                \
            snprintf(buf + n, cap - n, __VA_ARGS__);                                 \
        }                                                                            \
        n += (size_t)k_;                                                             \
    } while (0)
    EMIT("[");
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_t *s = json_array_get(in, i);
        if (!json_is_string(s)) {
            rc = ps_fail(err, "%s: item %zu is not a string", path, i);
            goto done;
        }
        int32_t *ids;
        size_t m;
        if (ps_tokenize(tok, json_string_value(s), json_string_length(s), add_special, &ids, &m, err)) {
            rc = ps_fail_prefix(err, "%s: item %zu: ", path, i);
            goto done;
        }
        *n_tokens += m;
        EMIT("%s\n[", i ? "," : "");
        for (size_t j = 0; j < m; j++) {
            int k_ = 0;
            (void)k_;
            if (j) EMIT(",");
            EMIT("%d", (int)ids[j]);
        }
        EMIT("]");
        free(ids);
    }
    EMIT("\n]\n");
done:
#undef EMIT
    if (rc) free(buf);
    else {
        *out = buf;
        *out_len = n;
    }
    return rc;
}

static int decode_all(const ps_tokenizer *tok, json_t *in, const char *path, bool skip, char **out, size_t *out_len,
                      size_t *n_tokens, ps_error *err) {
    json_t *res = json_array();
    int32_t *ids = NULL;
    int rc = 0;
    for (size_t i = 0; i < json_array_size(in) && !rc; i++) {
        json_t *l = json_array_get(in, i);
        if (!json_is_array(l)) {
            rc = ps_fail(err, "%s: item %zu is not a list of ids", path, i);
            break;
        }
        size_t m = json_array_size(l);
        int32_t *nid = realloc(ids, (m ? m : 1) * sizeof *ids);
        if (!nid) {
            rc = ps_fail(err, "out of memory");
            break;
        }
        ids = nid;
        for (size_t j = 0; j < m && !rc; j++) {
            json_t *v = json_array_get(l, j);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                rc = ps_fail(err, "%s: item %zu, position %zu: not a token id", path, i, j);
            else
                ids[j] = (int32_t)json_integer_value(v);
        }
        char *s;
        size_t sl;
        if (rc) break;
        if (ps_detokenize(tok, ids, m, skip, &s, &sl, err)) {
            rc = ps_fail_prefix(err, "%s: item %zu: ", path, i);
            break;
        }
        *n_tokens += m;
        json_array_append_new(res, json_stringn(s, sl));
        free(s);
    }
    free(ids);
    /* one string a line */
    size_t cap = 64, n = 0;
    char *buf = rc ? NULL : malloc(cap);
    if (!rc && !buf) rc = ps_fail(err, "out of memory");
    for (size_t i = 0; !rc && i <= json_array_size(res); i++) {
        char *d = i < json_array_size(res) ? json_dumps(json_array_get(res, i), JSON_ENCODE_ANY | JSON_ALLOW_NUL) : NULL;
        const char *piece = i < json_array_size(res) ? d : "\n]\n";
        if (!piece) {
            rc = ps_fail(err, "out of memory");
            break;
        }
        size_t pl = strlen(piece) + 3;
        if (n + pl + 1 > cap) {
            while (n + pl + 1 > cap) cap *= 2;
            char *b = realloc(buf, cap);
            if (!b) {
                free(d);
                rc = ps_fail(err, "out of memory");
                break;
            }
            buf = b;
        }
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i == 0 ? "[\n" : i < json_array_size(res) ? ",\n" : "", piece);
        free(d);
    }
    if (rc) free(buf);
    else {
        *out = buf;
        *out_len = n;
    }
    json_decref(res);
    return rc;
}

int ps_tokenize_command(const ps_tokenize_req *r, ps_error *err) {
    const char *in_path = r->in, *out_path = r->out;
    ps_tokenizer *tok = NULL;
    json_t *in = NULL;
    char *out = NULL;
    size_t out_len = 0, n_tokens = 0;
    int rc = 1;
    bool decode = r->decode;
    json_error_t je;
    in = json_load_file(in_path, JSON_ALLOW_NUL, &je);
    if (!in) {
        ps_fail(err, "%s: not valid JSON (line %d: %s)", in_path, je.line, je.text);
        goto done;
    }
    if (!json_is_array(in)) {
        ps_fail(err, "%s: expected a JSON list of %s", in_path, decode ? "id lists" : "strings");
        goto done;
    }
    if (ps_tokenizer_load(r->tokenizer, &tok, err)) goto done;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (decode ? decode_all(tok, in, in_path, r->skip_special, &out, &out_len, &n_tokens, err)
               : encode_all(tok, in, in_path, r->add_special, &out, &out_len, &n_tokens, err))
        goto done;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (ps_write_file_atomic(out_path, out, out_len, err)) goto done;
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%s %zu %s, %zu tokens (%.0f tokens/s) -> %s\n", decode ? "decoded" : "encoded", json_array_size(in),
           decode ? "id lists" : "strings", n_tokens, dt > 0 ? (double)n_tokens / dt : 0.0, out_path);
    rc = 0;
done:
    free(out);
    json_decref(in);
    ps_tokenizer_free(tok);
    return rc;
}
