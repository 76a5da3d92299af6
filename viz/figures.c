/* figures.c — the figures' entry points (viz/figures.h): a result file's kind picks its module through the
 * registry (viz/kinds.h); each kind's figures live in viz/kind_*.c, their shared pieces in viz/fig_common.c. */
#include "viz/figures.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "viz/kinds.h"

/* A result file, parsed (not validated: ps_render draws what it reads, ps_render_docs what its caller checked). */
static json_t *load(const char *path, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 30, &text, &len, err)) return NULL;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    else if (!json_is_object(o) || !json_is_string(json_object_get(o, "kind"))) {
        json_decref(o);
        o = NULL;
        ps_fail(err, "%s: not a phasescope result file (no \"kind\")", path);
    }
    return o;
}

int ps_render(const char *const *paths, int n, const char *out, const ps_render_opts *o, int verbose, ps_error *err) {
    if (n < 1) return ps_fail(err, "render: no result file given");
    size_t l0 = strlen(paths[0]);
    if (l0 > 6 && !strcmp(paths[0] + l0 - 6, ".jsonl")) {
        if (n > 1) return ps_fail(err, "render: a training log (.jsonl) is drawn on its own");
        return ps_render_training(paths[0], out, o, verbose, err);
    }
    json_t **docs = calloc((size_t)n, sizeof *docs);
    if (!docs) return ps_fail(err, "render: out of memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (!(docs[i] = load(paths[i], err))) rc = -1;
    if (!rc) rc = ps_render_docs(docs, paths, n, out, o, verbose, err);
    for (int i = 0; i < n; i++) json_decref(docs[i]);
    free(docs);
    return rc;
}

int ps_render_docs(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                   int verbose, ps_error *err) {
    if (n < 1) return ps_fail(err, "render: no result given");
    int rc = 0;
    const char *kind = NULL;
    const ps_kind *kd = NULL;
    for (int i = 0; i < n && !rc; i++) {
        const char *k = json_string_value(json_object_get(docs[i], "kind"));
        if (!k) return ps_fail(err, "%s: not a phasescope result file (no \"kind\")", paths[i]);
        if (!kind) {
            kind = k;
            kd = ps_kind_find(k);
        } else if (strcmp(kind, k) && !ps_kind_shares(kd, k))
            rc = ps_fail(err, "%s: a %s result cannot share a figure with a %s result", paths[i], k, kind);
    }
    if (!rc) {
        if (!kd) rc = ps_fail(err, "%s: unknown result kind \"%s\"", paths[0], kind);
        else if (n > 1 && !kd->multi) rc = ps_fail(err, "render: %s are drawn one at a time", kd->several);
        else rc = kd->render(docs, paths, n, out, o, verbose, err);
    }
    return rc;
}