#include "core/tokens.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"

void ps_tokens_free(ps_token_lists *t) {
    for (int i = 0; i < t->n; i++) free(t->seq[i]);
    free(t->seq);
    free(t->len);
    memset(t, 0, sizeof *t);
}

int ps_tokens_load(const char *path, int allow_null, int32_t min_value, ps_token_lists *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 30, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    int rc = -1;
    if (!json_is_array(root) || json_array_size(root) == 0) {
        ps_fail(err, "%s: expected a non-empty JSON list of token lists", path);
        goto done;
    }
    size_t n = json_array_size(root);
    if (n > 10000000) {
        ps_fail(err, "%s: %zu sequences is too many", path, n);
        goto done;
    }
    out->len = calloc(n, sizeof *out->len);
    out->seq = calloc(n, sizeof *out->seq);
    if (!out->len || !out->seq) {
        ps_fail(err, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(root, i);
        if (!json_is_array(s) || json_array_size(s) == 0) {
            ps_fail(err, "%s: sequence %zu is not a non-empty list", path, i);
            goto done;
        }
        size_t m = json_array_size(s);
        out->seq[i] = malloc(m * sizeof(int32_t));
        if (!out->seq[i]) {
            ps_fail(err, "%s: out of memory", path);
            goto done;
        }
        out->len[i] = (int64_t)m;
        out->n = (int)i + 1;
        for (size_t j = 0; j < m; j++) {
            json_t *v = json_array_get(s, j);
            if (allow_null && json_is_null(v)) {
                out->seq[i][j] = -1;
                continue;
            }
            if (!json_is_integer(v)) {
                ps_fail(err, "%s: sequence %zu, position %zu is not an integer", path, i, j);
                goto done;
            }
            json_int_t x = json_integer_value(v);
            if (x < min_value || x > INT32_MAX) {
                ps_fail(err, "%s: sequence %zu, position %zu: value %lld is out of range", path, i, j, (long long)x);
                goto done;
            }
            out->seq[i][j] = (int32_t)x;
        }
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) ps_tokens_free(out);
    return rc;
}
