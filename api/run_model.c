/* run_model.c — opening a checkpoint through its family (core/runtime.h: ps_runtime_open), what the model
 * says about itself, and its hook-point table (include/phasescope.h, "a checkpoint", "hook points"). */
#define _POSIX_C_SOURCE 200809L
#include "api/api_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/ctx.h"

int ps_api_report(const ps_error *e, char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "%s", e->msg[0] ? e->msg : "unknown error");
    return e->usage ? PS_API_EINPUT : PS_API_EFAIL;
}

int ps_api_say(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int ps_api_known_device(const char *v) {
    size_t n = strlen(v);
    for (const char *q = ps_ctx_backends(); *q;) {
        size_t l = strcspn(q, ",");
        if (l == n && !strncmp(q, v, n)) return 1;
        q += l;
        while (*q == ',' || *q == ' ') q++;
    }
    return 0;
}

static char *dump(json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(j);
    return s;
}

/* the point table as JSON, and every concrete name in firing order (the global points the table lists
 * before the first layer point fire before the layers, the others after them) */
static int build_tables(ps_api_model *M, ps_error *e) {
    const ps_runtime *rt = &M->rt;
    const ps_family *f = rt->family;
    json_t *pts = json_array(), *names = json_array();
    int64_t dims[4];
    for (int i = 0; i < f->n_points; i++) {
        const ps_point_info *p = &f->points[i];
        char layers[512];
        ps_runtime_point_layers(rt, i, layers, sizeof layers);
        json_t *ll = json_array();
        if (!ps_point_is_global(p))
            for (int l = 0; l < rt->n_layers; l++)
                if (f->point_shape(rt, i, l, 1, 1, dims)) json_array_append_new(ll, json_integer(l));
        json_array_append_new(pts, json_pack("{s:s, s:s, s:i, s:s, s:o, s:s}", "name", p->pattern, "shape", p->shape,
                                             "head_axis", p->head_axis, "layers", layers, "layer_list", ll, "what",
                                             p->what ? p->what : ""));
    }
    int first_layer_point = f->n_points;
    for (int i = 0; i < f->n_points; i++)
        if (!ps_point_is_global(&f->points[i])) {
            first_layer_point = i;
            break;
        }
    char buf[256];
    for (int i = 0; i < first_layer_point; i++)
        if (f->point_shape(rt, i, -1, 1, 1, dims)) json_array_append_new(names, json_string(f->points[i].pattern));
    for (int l = 0; l < (M->n_run >= 0 ? M->n_run : rt->n_layers); l++)
        for (int i = 0; i < f->n_points; i++)
            if (!ps_point_is_global(&f->points[i]) && f->point_shape(rt, i, l, 1, 1, dims)) {
                ps_runtime_point_name(rt, i, l, buf, sizeof buf);
                json_array_append_new(names, json_string(buf));
            }
    for (int i = first_layer_point; i < f->n_points && M->n_run < 0; i++)
        if (ps_point_is_global(&f->points[i]) && f->point_shape(rt, i, -1, 1, 1, dims))
            json_array_append_new(names, json_string(f->points[i].pattern));
    M->n_names = (int)json_array_size(names);
    M->names = calloc((size_t)(M->n_names ? M->n_names : 1), sizeof *M->names);
    for (int k = 0; M->names && k < M->n_names; k++) M->names[k] = strdup(json_string_value(json_array_get(names, (size_t)k)));
    M->points_json = dump(pts);
    M->names_json = dump(names);
    M->config_json = dump(f->config_json(rt));
    if (!M->names || !M->points_json || !M->names_json || !M->config_json) return ps_fail(e, "out of memory for the model's tables");
    for (int k = 0; k < M->n_names; k++)
        if (!M->names[k]) return ps_fail(e, "out of memory for the model's tables");
    return 0;
}

int ps_api_point_runs(const ps_api_model *m, int i, int layer) {
    if (m->n_run < 0) return 1;
    if (layer >= 0) return layer < m->n_run;
    const ps_family *f = m->rt.family;
    for (int k = 0; k < f->n_points; k++) {
        if (!ps_point_is_global(&f->points[k])) return 0; /* a layer's point comes first */
        if (k == i) return 1;
    }
    return 0;
}

int ps_api_options(const char *text, ps_api_option_fn one, void *user, char *err, size_t errlen) {
    if (!text || !*text) return 0;
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    int rc = 0;
    if (!json_is_object(o)) rc = ps_api_say(err, errlen, PS_API_EINPUT, "options: not a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(o, k, v) {
            if ((rc = one(k, v, user, err, errlen))) break;
        }
    json_decref(o);
    return rc;
}

/* the options of ps_api_open_ex: lazy -1/0/1, layers 0 (all) or N */
typedef struct {
    int lazy;
    int64_t layers;
} open_options;

static int open_option(const char *k, json_t *v, void *user, char *err, size_t errlen) {
    open_options *O = user;
    if (!strcmp(k, "lazy") && json_is_boolean(v)) O->lazy = json_is_true(v);
    else if (!strcmp(k, "layers") && json_is_integer(v) && json_integer_value(v) >= 1) O->layers = json_integer_value(v);
    else
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": %s", k,
                          !strcmp(k, "lazy") ? "expected true or false" : !strcmp(k, "layers") ? "expected an integer >= 1"
                                                                                             : "unknown (lazy, layers)");
    return 0;
}

static int parse_options(const char *text, int *lazy, int64_t *layers, char *err, size_t errlen) {
    open_options O = {.lazy = -1, .layers = 0};
    int rc = ps_api_options(text, open_option, &O, err, errlen);
    *lazy = O.lazy, *layers = O.layers;
    return rc;
}

static int open_model(const ps_family *const *families, const char *path, const char *device, const char *options,
                      ps_api_model **out, char *err, size_t errlen) {
    if (!out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_open: out is NULL");
    *out = NULL;
    if (!path || !*path) return ps_api_say(err, errlen, PS_API_EINPUT, "no checkpoint path given");
    if (!device) device = "cpu";
    int lazy, rc;
    int64_t layers;
    if ((rc = parse_options(options, &lazy, &layers, err, errlen))) return rc;
    if (!ps_api_known_device(device))
        return ps_api_say(err, errlen, PS_API_EINPUT, "device %s: this build has no such backend (it has: %s)", device,
                          ps_ctx_backends());
    struct stat st;
    if (stat(path, &st) != 0) return ps_api_say(err, errlen, PS_API_EINPUT, "%s: no such directory", path);
    if (!S_ISDIR(st.st_mode))
        return ps_api_say(err, errlen, PS_API_EINPUT,
                          "%s: not a directory (a checkpoint is a directory holding config.json and its weights)", path);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (stat(cfg, &st) != 0) return ps_api_say(err, errlen, PS_API_EINPUT, "%s is not a model directory (no config.json)", path);
    ps_api_model *M = calloc(1, sizeof *M);
    if (!M) return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
    M->n_run = -1;
    ps_error e = {0};
    if (families) { /* the caller's list, kept for the instruments (a request naming another checkpoint) */
        int n = 0;
        while (families[n]) n++;
        if (!(M->families = calloc((size_t)n + 1, sizeof *M->families))) {
            ps_api_close(M);
            return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
        }
        for (int i = 0; i < n; i++) M->families[i] = families[i];
    }
    /* the config first (the options are checked against the family before any weight is read) */
    ps_runtime_opts o = {.backend = device, .weights = 0, .lazy = lazy};
    if (ps_runtime_open_in(&M->rt, families, path, &o, &e)) {
        ps_api_close(M);
        return ps_api_report(&e, err, errlen);
    }
    const ps_family *f = M->rt.family;
    if (lazy == 1 && !f->load_weights) rc = ps_api_say(err, errlen, PS_API_EINPUT, "options: \"lazy\": %s checkpoints load every layer at once (lazy loading is for DeepSeek-V4 checkpoints)", f->name);
    else if (layers && !f->early_stop) rc = ps_api_say(err, errlen, PS_API_EINPUT, "options: \"layers\": %s checkpoints run every layer (stopping early is for DeepSeek-V4 checkpoints)", f->name);
    else if (layers > M->rt.n_layers)
        rc = ps_api_say(err, errlen, PS_API_EINPUT, "options: \"layers\": %lld layers asked, but the model has %lld layers", (long long)layers,
                        (long long)M->rt.n_layers);
    if (rc) {
        ps_api_close(M);
        return rc;
    }
    if (layers) M->n_run = (int)layers;
    if (f->load_weights && f->load_weights(&M->rt, lazy, &e)) {
        ps_api_close(M);
        return ps_api_report(&e, err, errlen);
    }
    M->path = strdup(path);
    M->device = strdup(device);
    if (!M->path || !M->device) ps_fail(&e, "out of memory");
    if (e.msg[0] || build_tables(M, &e)) {
        ps_api_close(M);
        return ps_api_report(&e, err, errlen);
    }
    *out = M;
    return PS_API_OK;
}

PS_API void ps_api_set_progress(ps_api_model *m, ps_api_progress_fn fn, void *user) {
    if (!m) return;
    m->progress = fn;
    m->progress_user = fn ? user : NULL;
}

int ps_api_progress_call(int64_t done, int64_t total, void *user) {
    ps_api_progress *p = user;
    if (!p->fn(done, total, p->user)) return 0;
    p->stopped = 1;
    return 1;
}

PS_API int ps_api_open(const char *path, const char *device, ps_api_model **out, char *err, size_t errlen) {
    return open_model(NULL, path, device, NULL, out, err, errlen);
}

PS_API int ps_api_open_ex(const char *path, const char *device, const char *options_json, ps_api_model **out, char *err,
                          size_t errlen) {
    return open_model(NULL, path, device, options_json, out, err, errlen);
}

PS_API const ps_family *const *ps_api_shipped_families(void) { return ps_families; }

PS_API int ps_api_open_in(const ps_family *const *families, const char *path, const char *device, const char *options_json,
                          ps_api_model **out, char *err, size_t errlen) {
    return open_model(families, path, device, options_json, out, err, errlen);
}

PS_API void ps_api_close(ps_api_model *m) {
    if (!m) return;
    if (m->rt.family) ps_runtime_free(&m->rt);
    for (int k = 0; m->names && k < m->n_names; k++) free(m->names[k]);
    free(m->names);
    free(m->path);
    free(m->device);
    free(m->config_json);
    free(m->points_json);
    free(m->names_json);
    free(m->families);
    free(m);
}

PS_API const char *ps_api_family(const ps_api_model *m) { return m->rt.family->name; }
PS_API const char *ps_api_path(const ps_api_model *m) { return m->path; }
PS_API const char *ps_api_device(const ps_api_model *m) { return m->device; }
PS_API int64_t ps_api_n_layers(const ps_api_model *m) { return m->rt.n_layers; }
PS_API int64_t ps_api_vocab_size(const ps_api_model *m) { return m->rt.family->vocab(&m->rt); }
PS_API int64_t ps_api_context_length(const ps_api_model *m) { return m->rt.max_pos; }
PS_API const char *ps_api_context_length_name(const ps_api_model *m) { return m->rt.family->max_pos_name; }
PS_API const char *ps_api_config_json(const ps_api_model *m) { return m->config_json; }
PS_API const char *ps_api_hook_points_json(const ps_api_model *m) { return m->points_json; }
PS_API const char *ps_api_hook_names_json(const ps_api_model *m) { return m->names_json; }

int ps_api_point_of(const ps_api_model *m, const char *name, int *index, int *layer, ps_error *e) {
    const ps_family *f = m->rt.family;
    int slot, point;
    if (f->hook_parse(&m->rt, name, &slot, &point, e)) {
        e->usage = 1;
        return -1;
    }
    /* the family's own check of the point on this checkpoint (e.g. a compressor point on a sliding layer),
     * with its message: a watch registered on a scratch set */
    ps_hooks h;
    ps_cache c;
    ps_hooks_init(&h);
    ps_cache_init(&c);
    int bad = f->cache_watch(&m->rt, &c, &h, name, e);
    ps_cache_free(&c);
    ps_hooks_free(&h);
    if (bad) {
        e->usage = 1;
        return -1;
    }
    for (int i = 0; i < f->n_points; i++)
        if (f->points[i].point == point && ps_point_is_global(&f->points[i]) == (slot >= m->rt.n_layers)) {
            *index = i;
            *layer = slot < m->rt.n_layers ? slot : -1;
            return 0;
        }
    ps_fail(e, "hook \"%s\": not a point of the %s table", name, f->name);
    e->usage = 1;
    return -1;
}

PS_API int ps_api_hook_shape(const ps_api_model *m, const char *name, int64_t B, int64_t T, int64_t dims[4], char *err,
                             size_t errlen) {
    ps_error e = {0};
    int i, l;
    if (!name) return ps_api_say(err, errlen, PS_API_EINPUT, "no hook name given"), 0;
    if (ps_api_point_of(m, name, &i, &l, &e)) return ps_api_report(&e, err, errlen), 0;
    int r = m->rt.family->point_shape(&m->rt, i, l, B, T, dims);
    if (!r) ps_api_say(err, errlen, PS_API_EINPUT, "hook \"%s\": this checkpoint does not have it", name);
    else if (!ps_api_point_runs(m, i, l)) {
        ps_api_say(err, errlen, PS_API_EINPUT, "hook \"%s\" is past the layers this model runs (0..%d)", name, m->n_run - 1);
        r = 0;
    }
    return r;
}
