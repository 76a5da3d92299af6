/* filler_families.c — loading the filler families (filler_families.h). */
#include "interventions/filler_families.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/names.h"

int ps_fillers_load(const char *path, ps_filler_family **out, int *n, ps_error *err) {
    *out = NULL;
    *n = 0;
    char *text;
    size_t len;
    if (ps_read_file(path, 1 << 20, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    json_t *fams = json_object_get(root, "families");
    int rc = -1;
    if (!json_is_array(fams) || json_array_size(fams) == 0 || json_array_size(fams) > 1000) {
        ps_fail(err, "%s: key \"families\" must be a non-empty list", path);
        goto done;
    }
    *out = calloc(json_array_size(fams), sizeof **out);
    if (!*out) {
        ps_fail(err, "%s: out of memory for %zu filler families", path, json_array_size(fams));
        goto done;
    }
    for (size_t i = 0; i < json_array_size(fams); i++) {
        json_t *f = json_array_get(fams, i), *nm = json_object_get(f, "name"), *kind = json_object_get(f, "kind");
        ps_filler_family *ff = &(*out)[i];
        if (!json_is_string(nm) || strlen(json_string_value(nm)) >= sizeof ff->name || !json_is_string(kind)) {
            ps_fail(err, "%s: family %zu needs a string \"name\" (< 64 chars) and \"kind\"", path, i);
            goto done;
        }
        snprintf(ff->name, sizeof ff->name, "%s", json_string_value(nm));
        if (!strcmp(json_string_value(kind), "random")) ff->random = 1;
        else if (!strcmp(json_string_value(kind), "pattern")) {
            json_t *pat = json_object_get(f, "pattern");
            if (!json_is_array(pat) || json_array_size(pat) == 0 || json_array_size(pat) > 64) {
                ps_fail(err, "%s: family \"%s\": \"pattern\" must be a list of 1..64 filler indices", path, ff->name);
                goto done;
            }
            ff->n_pattern = (int64_t)json_array_size(pat);
            for (int64_t k = 0; k < ff->n_pattern; k++) {
                json_t *x = json_array_get(pat, (size_t)k);
                if (!json_is_integer(x) || json_integer_value(x) < 0) {
                    ps_fail(err, "%s: family \"%s\": pattern entries must be non-negative integers", path, ff->name);
                    goto done;
                }
                ff->pattern[k] = (int64_t)json_integer_value(x);
            }
        } else {
            ps_fail(err, "%s: family \"%s\": kind must be \"pattern\" or \"random\"", path, ff->name);
            goto done;
        }
        (*n)++;
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

static const char *filler_name(const void *f, int i) { return ((const ps_filler_family *)f)[i].name; }

int ps_fillers_find(const ps_filler_family *f, int n, const char *name, const ps_filler_family **out, ps_error *err) {
    int i;
    if (ps_family_by_name(f, n, filler_name, name, "filler family", &i, err)) return -1;
    *out = &f[i];
    return 0;
}
