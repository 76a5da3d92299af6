/* results_check.c — the validator for result JSON; the rules are written out in docs/results-schema.md
 * ("Validation"). Each check names the path of the field at fault (curve.residues[3].correct) and stops at
 * the first fault, in the order the fields appear in the schema. The checks of each kind live in its module
 * (viz/kind_*.c), found through the registry (viz/kinds.h); their shared pieces in viz/check_common.c. */
#include "viz/results_check.h"

#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "viz/check_common.h"
#include "viz/kinds.h"

int ps_results_check(json_t *doc, const char *path, ps_error *err) {
    ps_ck c = {.file = path, .err = err};
    json_t *k = json_is_object(doc) ? json_object_get(doc, "kind") : NULL;
    if (!k) return ps_fail(err, "%s: not a phasescope result file (no \"kind\")", path);
    ps_ck_key(&c, "kind");
    if (ps_ck_want_type(&c, k, json_is_string(k), "a string")) return -1;
    const char *kind = json_string_value(k);
    ps_ck_pop(&c, 0);
    const ps_kind *kd = ps_kind_find(kind);
    if (kd) return kd->check(&c, doc);
    char names[256];
    ps_kind_names(names, sizeof names);
    ps_ck_key(&c, "kind");
    return ps_ck_bad(&c, "\"%.100s\" is not a result kind (%s)", kind, names);
}

int ps_results_load(const char *path, const char *want_kind, json_t **doc, ps_error *err) {
    char *text;
    size_t len;
    *doc = NULL;
    if (ps_read_file(path, PS_RESULT_MAX_BYTES, &text, &len, err)) return -1;
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!o) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    if (want_kind && json_is_object(o) && json_is_string(json_object_get(o, "kind")) &&
        strcmp(json_string_value(json_object_get(o, "kind")), want_kind)) {
        ps_fail(err, "%s: kind: \"%.100s\", expected \"%s\"", path, json_string_value(json_object_get(o, "kind")), want_kind);
        json_decref(o);
        return -1;
    }
    if (ps_results_check(o, path, err)) {
        json_decref(o);
        return -1;
    }
    *doc = o;
    return 0;
}