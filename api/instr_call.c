/* instr_call.c — every instrument of the registry (instruments/registry.h) as one call
 * (include/phasescope.h, "instruments"): the request's keys are set as the command's keys (ps_args_set: the same
 * flag table, checks and messages as the CLI's command line, with no command line in between; the words a
 * request stands for are kept for provenance only), the command runs exactly as the CLI runs it
 * (ps_command_run: the same defaults, checks and code path) with a sink (instruments/result_out.h) instead of a directory: the result documents stay in
 * memory (their text bit for bit what the CLI's files hold), nothing is written and nothing printed. The
 * numeric arrays come from that text, the figures are drawn from it on request (in memory, viz/figures.h),
 * and ps_api_result_save writes exactly the files the CLI writes. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "core/ctx.h"
#include "core/fileio.h"
#include "instruments/registry.h"
#include "interventions/promptset.h"
#include "viz/figures.h"

typedef struct {
    char *name;
    int rank;
    int64_t shape[8];
    double *data;
} res_array;

struct ps_api_result {
    char *json, *kind, *dir, *files_json, *figures_json;
    json_t *docs; /* {"NAME.json": "its text", ...}: the run's result documents (the sink's) */
    ps_png_set figs; /* the figures, drawn on the first ps_api_result_figure* call */
    int drawn;
    int n, cap;
    res_array *a;
};

/* ---- the registry as JSON ---- */

PS_API char *ps_api_instruments_json(void) {
    json_t *list = json_array();
    for (int i = 0; i < ps_registry_n; i++) {
        const ps_registry_entry *e = &ps_registry[i];
        if (!e->instrument) continue;
        json_t *flags = json_array();
        for (const ps_flag_spec *f = e->cmd->flags; f && f->name; f++)
            json_array_append_new(flags, json_pack("{s:s, s:s?, s:s, s:b}", "name", f->name + 2, "value", f->value, "help",
                                                   f->help ? f->help : "", "required", f->required));
        json_array_append_new(list, json_pack("{s:s, s:s, s:s?, s:s?, s:b, s:o}", "name", e->cmd->name, "summary",
                                              e->cmd->summary, "kind", e->kind, "result", e->result, "splits", e->splits,
                                              "flags", flags));
    }
    char *s = json_dumps(list, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(list);
    return s;
}

/* ---- the request as a command line ---- */

typedef struct {
    char **v;
    int n, cap;
} argv_t;

static int push(argv_t *a, const char *s) {
    if (a->n + 1 >= a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        char **nv = realloc(a->v, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        a->v = nv, a->cap = cap;
    }
    if (!(a->v[a->n] = strdup(s))) return -1;
    a->v[++a->n] = NULL;
    return 0;
}

static void argv_free(argv_t *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

static const ps_flag_spec *find_flag(const ps_command *cmd, const char *flag) {
    for (const ps_flag_spec *f = cmd->flags; f && f->name; f++)
        if (!strcmp(f->name, flag)) return f;
    return NULL;
}

/* a scalar request value as flag text */
static int scalar_text(json_t *v, char *buf, size_t n) {
    if (json_is_string(v)) snprintf(buf, n, "%s", json_string_value(v));
    else if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, n, "%.17g", json_real_value(v));
    else if (json_is_true(v)) snprintf(buf, n, "true");
    else return -1;
    return 0;
}

/* The request's keys into words (av: the command line they stand for, for provenance) and their (key, value)
 * word indices (kv: 2 ints a key; value -1 for a switch) for ps_args_set. */
static int request_args(const ps_command *cmd, json_t *req, argv_t *av, int *kv, int *n_kv, ps_error *e) {
    const char *key;
    json_t *v;
    json_object_foreach(req, key, v) {
        char flag[128], text[8192];
        if (!strcmp(key, "prompts") && json_is_array(v)) continue; /* a prompt set given inline: ps_call.prompts */
        if (!strcmp(key, "corrupt") && json_is_array(v)) continue; /* corrupt tokens given inline: ps_call.corrupt */
        snprintf(flag, sizeof flag, "--%s", key);
        for (char *c = flag + 2; *c; c++)
            if (*c == '_') *c = '-';
        const ps_flag_spec *f = find_flag(cmd, flag);
        if (!f) {
            ps_fail(e, "request key \"%s\": unknown flag %s of %s (ps_api_instruments_json lists its flags)", key, flag, cmd->name);
            e->usage = 1;
            return -1;
        }
        if (json_is_null(v) || json_is_false(v)) continue; /* absent */
        if (!f->value) { /* a switch */
            if (!json_is_true(v)) {
                ps_fail(e, "request key \"%s\": %s is a switch (true, false or null)", key, flag);
                e->usage = 1;
                return -1;
            }
            if (push(av, flag)) return ps_fail(e, "out of memory");
            kv[2 * *n_kv] = av->n - 1, kv[2 * *n_kv + 1] = -1, (*n_kv)++;
            continue;
        }
        if (json_is_array(v)) {
            size_t o = 0, i;
            json_t *x;
            text[0] = '\0';
            json_array_foreach(v, i, x) {
                char one[4096];
                if (scalar_text(x, one, sizeof one) || json_is_true(x)) {
                    ps_fail(e, "request key \"%s\": item %zu of the list is not a number or a string", key, i);
                    e->usage = 1;
                    return -1;
                }
                o += (size_t)snprintf(text + o, sizeof text - o, "%s%s", i ? "," : "", one);
                if (o >= sizeof text) {
                    ps_fail(e, "request key \"%s\": the list is too long", key);
                    e->usage = 1;
                    return -1;
                }
            }
        } else if (scalar_text(v, text, sizeof text)) {
            ps_fail(e, "request key \"%s\": expected a string, a number, a list or a boolean", key);
            e->usage = 1;
            return -1;
        }
        if (push(av, flag) || push(av, text)) return ps_fail(e, "out of memory");
        kv[2 * *n_kv] = av->n - 2, kv[2 * *n_kv + 1] = av->n - 1, (*n_kv)++;
    }
    return 0;
}

/* ---- the result ---- */

static int add_array(ps_api_result *r, const char *name, int rank, const int64_t *shape, double *data) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        res_array *na = realloc(r->a, (size_t)cap * sizeof *na);
        if (!na) return -1;
        r->a = na, r->cap = cap;
    }
    res_array *a = &r->a[r->n];
    if (!(a->name = strdup(name))) return -1;
    a->rank = rank;
    for (int k = 0; k < rank; k++) a->shape[k] = shape[k];
    a->data = data;
    r->n++;
    return 0;
}

/* The numeric arrays of a result, columnwise: vals[0..n) are the values at one place of the document in
 * every record of the lists above it (outer shape shape[0..rank)). Numbers there (null: NaN) make an
 * array of that shape; objects are descended key by key ("a.b"); lists of one length add an axis (a list
 * of records becomes columns: curve.residues.accuracy [P]; grid.cells.residues.delta_nll [cells, P]).
 * Anything else (strings, booleans, ragged lists, mixed kinds) is left out. */
#define RES_MAX_RANK 8
static int collect(ps_api_result *r, json_t **vals, int64_t n, char *path, size_t cap, int64_t *shape, int rank) {
    size_t l = strlen(path);
    if (n == 0) return 0;
    int all_num = 1, all_obj = 1, all_arr = 1, any_num = 0;
    for (int64_t i = 0; i < n; i++) {
        json_t *v = vals[i];
        all_num &= json_is_number(v) || json_is_null(v);
        any_num |= json_is_number(v);
        all_obj &= json_is_object(v);
        all_arr &= json_is_array(v) && json_array_size(v) == json_array_size(vals[0]);
    }
    if (all_num && any_num) {
        double *d = malloc((size_t)n * sizeof *d);
        if (!d) return -1;
        for (int64_t i = 0; i < n; i++) d[i] = json_is_number(vals[i]) ? json_number_value(vals[i]) : 0.0 / 0.0;
        if (add_array(r, path, rank, shape, d)) return free(d), -1;
        return 0;
    }
    if (all_obj) {
        json_t **sub = malloc((size_t)n * sizeof *sub);
        if (!sub) return -1;
        const char *k;
        json_t *x;
        json_object_foreach(vals[0], k, x) {
            if (l == 0 && !strcmp(k, "provenance")) continue;
            int64_t i = 0;
            for (; i < n && (sub[i] = json_object_get(vals[i], k)); i++) {}
            if (i < n) continue; /* not in every record */
            snprintf(path + l, cap - l, "%s%s", l ? "." : "", k);
            int rc = collect(r, sub, n, path, cap, shape, rank);
            path[l] = '\0';
            if (rc) return free(sub), -1;
        }
        free(sub);
        return 0;
    }
    if (all_arr && rank < RES_MAX_RANK) {
        int64_t m = (int64_t)json_array_size(vals[0]);
        if (m == 0) return 0;
        json_t **sub = malloc((size_t)(n * m) * sizeof *sub);
        if (!sub) return -1;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < m; j++) sub[i * m + j] = json_array_get(vals[i], (size_t)j);
        shape[rank] = m;
        int rc = collect(r, sub, n * m, path, cap, shape, rank + 1);
        free(sub);
        return rc;
    }
    return 0;
}

/* The run's result document (the registry's file name, else the only one): its text, kind and arrays; the
 * documents' names as the files list. */
static int take_result(ps_api_result *r, const char *result, ps_error *e) {
    json_t *files = json_array();
    const char *name, *found = NULL;
    json_t *v;
    int n_docs = 0;
    json_object_foreach(r->docs, name, v) {
        json_array_append_new(files, json_string(name));
        n_docs++;
        if (!result || !strcmp(name, result)) found = name;
    }
    if (!result && n_docs != 1) found = NULL;
    r->files_json = json_dumps(files, JSON_COMPACT);
    json_decref(files);
    if (!r->files_json) return ps_fail(e, "out of memory");
    if (!found) return 0;
    if (!(r->json = strdup(json_string_value(json_object_get(r->docs, found))))) return ps_fail(e, "out of memory");
    json_error_t je;
    json_t *doc = json_loads(r->json, 0, &je); /* what a reader of the file gets */
    if (!doc) return ps_fail(e, "%s: the result is not JSON: %s", found, je.text);
    json_t *k = json_object_get(doc, "kind");
    if (json_is_string(k) && !(r->kind = strdup(json_string_value(k)))) ps_fail(e, "out of memory");
    char p[1024] = "";
    int64_t shape[RES_MAX_RANK];
    json_t *top[1] = {doc};
    if (!e->msg[0] && collect(r, top, 1, p, sizeof p, shape, 0)) ps_fail(e, "out of memory for the result's arrays");
    json_decref(doc);
    return e->msg[0] ? -1 : 0;
}

/* Draw the figures of every result document into dir (NULL: into r->figs, in memory), as `phasescope render`
 * draws them from the files (the text parsed as a reader parses it). */
static int draw(ps_api_result *r, const char *dir, ps_error *e) {
    const char *name;
    json_t *v;
    json_object_foreach(r->docs, name, v) {
        json_t *doc = json_loads(json_string_value(v), 0, NULL);
        if (!doc) return ps_fail(e, "%s: the result is not JSON", name);
        char path[4400];
        if (dir) snprintf(path, sizeof path, "%s/%s", dir, name);
        else snprintf(path, sizeof path, "%s", name);
        const char *paths[1] = {path};
        json_t *docs[1] = {doc};
        ps_render_opts ro = {.mem = dir ? NULL : &r->figs};
        int rc = ps_render_docs(docs, paths, 1, dir ? dir : ".", &ro, 0, e);
        json_decref(doc);
        if (rc) return -1;
    }
    return 0;
}

PS_API const char *ps_api_result_figures_json(ps_api_result *r, char *err, size_t errlen) {
    ps_error e = {0};
    if (!r->drawn) {
        if (draw(r, NULL, &e)) {
            ps_api_report(&e, err, errlen);
            return NULL;
        }
        r->drawn = 1;
        json_t *names = json_array();
        for (int i = 0; i < r->figs.n; i++) json_array_append_new(names, json_string(r->figs.files[i].name));
        r->figures_json = json_dumps(names, JSON_COMPACT);
        json_decref(names);
    }
    if (!r->figures_json) ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
    return r->figures_json;
}

PS_API const unsigned char *ps_api_result_figure(ps_api_result *r, const char *name, size_t *len, char *err, size_t errlen) {
    if (!ps_api_result_figures_json(r, err, errlen)) return NULL;
    const ps_png_file *f = ps_png_set_find(&r->figs, name);
    if (!f) {
        ps_api_say(err, errlen, PS_API_EINPUT, "%s: no such figure (ps_api_result_figures_json lists them)", name ? name : "(null)");
        return NULL;
    }
    if (len) *len = f->len;
    return f->data;
}

PS_API void ps_api_result_free(ps_api_result *r) {
    if (!r) return;
    json_decref(r->docs);
    ps_png_set_free(&r->figs);
    free(r->figures_json);
    for (int i = 0; i < r->n; i++) {
        free(r->a[i].name);
        free(r->a[i].data);
    }
    free(r->a);
    free(r->json);
    free(r->kind);
    free(r->dir);
    free(r->files_json);
    free(r);
}

PS_API int ps_api_instrument(ps_api_model *m, const char *name, const char *request_json, ps_api_result **out, char *err,
                             size_t errlen) {
    return ps_api_instrument_ex(m, name, request_json, NULL, NULL, out, err, errlen);
}

PS_API int ps_api_instrument_ex(ps_api_model *m, const char *name, const char *request_json, ps_api_progress_fn progress,
                                void *progress_user, ps_api_result **out, char *err, size_t errlen) {
    if (!out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_instrument: out is NULL");
    *out = NULL;
    const ps_registry_entry *en = ps_registry_find(name);
    if (!en || !en->instrument) {
        char list[512] = "";
        size_t o = 0;
        for (int i = 0; i < ps_registry_n && o < sizeof list; i++)
            if (ps_registry[i].instrument) {
                int w = snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", ps_registry[i].cmd->name);
                if (w > 0) o += (size_t)w;
            }
        return ps_api_say(err, errlen, PS_API_EINPUT, "%s: not an instrument (the instruments: %s)", name ? name : "(null)", list);
    }
    const ps_command *cmd = en->cmd;
    ps_error e = {0};
    json_error_t je;
    json_t *req = request_json && *request_json ? json_loads(request_json, 0, &je) : json_object();
    if (!req || !json_is_object(req)) {
        json_decref(req);
        return ps_api_say(err, errlen, PS_API_EINPUT, "%s: the request is not a JSON object%s%s", name, req ? "" : ": ",
                          req ? "" : je.text);
    }
    ps_api_result *r = calloc(1, sizeof *r);
    argv_t av = {0};
    ps_args args = {0};
    int *kv = malloc((json_object_size(req) + 3) * 2 * sizeof(int)), n_kv = 0;
    ps_promptset pset = {0};
    ps_token_set cset = {0};
    int have_pset = 0, have_cset = 0;
    ps_result_sink sink = {0};
    ps_api_progress pr = {.fn = progress, .user = progress_user};
    int rc = -1;
    if (!r || !kv || push(&av, cmd->name)) {
        ps_fail(&e, "out of memory");
        goto done;
    }
    if (request_args(cmd, req, &av, kv, &n_kv, &e)) goto done;
    json_t *jp = json_object_get(req, "prompts");
    if (json_is_array(jp)) { /* the caller's prompt set, inline: records as --prompts FILE's lines */
        if (!find_flag(cmd, "--prompts")) {
            ps_fail(&e, "request key \"prompts\": %s takes no prompt set", cmd->name);
            e.usage = 1;
            goto done;
        }
        if (ps_promptset_from_json(jp, "request key \"prompts\"", &pset, &e)) {
            e.usage = 1;
            goto done;
        }
        have_pset = 1;
    }
    json_t *jc = json_object_get(req, "corrupt");
    if (json_is_array(jc)) { /* corrupt tokens, inline: [N, T] token lists (or records with "tokens") */
        if (!find_flag(cmd, "--corrupt")) {
            ps_fail(&e, "request key \"corrupt\": %s takes no corrupt tokens", cmd->name);
            e.usage = 1;
            goto done;
        }
        if (ps_token_set_from_json(jc, "request key \"corrupt\"", &cset, &e)) {
            e.usage = 1;
            goto done;
        }
        have_cset = 1;
    }
    /* the model handle's checkpoint and device, unless the request names its own */
    if (m && find_flag(cmd, "--model") && !json_object_get(req, "model")) {
        if (push(&av, "--model") || push(&av, m->path)) {
            ps_fail(&e, "out of memory");
            goto done;
        }
        kv[2 * n_kv] = av.n - 2, kv[2 * n_kv + 1] = av.n - 1, n_kv++;
    }
    if (m && find_flag(cmd, "--backend") && !json_object_get(req, "backend") && !json_object_get(req, "device")) {
        if (push(&av, "--backend") || push(&av, m->device)) {
            ps_fail(&e, "out of memory");
            goto done;
        }
        kv[2 * n_kv] = av.n - 2, kv[2 * n_kv + 1] = av.n - 1, n_kv++;
    }
    json_t *o = json_object_get(req, "out");
    if (o && json_is_string(o) && !(r->dir = strdup(json_string_value(o)))) { /* the files go there too */
        ps_fail(&e, "out of memory");
        goto done;
    }
    fflush(stdout);
    if (!pr.fn && m) pr.fn = m->progress, pr.user = m->progress_user; /* the model's */
    ps_call call = {.progress = pr.fn ? ps_api_progress_call : NULL, .progress_user = &pr, .prompts = have_pset ? &pset : NULL,
                    .corrupt = have_cset ? &cset : NULL, .sink = &sink};
    if (m) {
        call.families = m->families;
        /* the caller's open model, unless the request asks for another checkpoint, device or precision, or
         * the command changes the weights (gatecycle): then the command opens its own, as the CLI does */
        if (!json_object_get(req, "model") && !json_object_get(req, "backend") && !json_object_get(req, "device") &&
            !json_object_get(req, "precision") && !en->changes_model)
            call.rt = &m->rt;
    }
    int bad = ps_args_init(&args, cmd, &call, &e);
    args.argc = av.n, args.argv = av.v; /* the command line the request stands for: provenance only */
    for (int k = 0; k < n_kv && !bad; k++) bad = ps_args_set(&args, av.v[kv[2 * k]], kv[2 * k + 1] >= 0 ? av.v[kv[2 * k + 1]] : NULL, &e);
    if (bad || ps_command_run(&args, &e)) {
        if (call.rt) { /* the handle stays usable: a failed op's state is cleared, as after a failed run */
            ps_error dummy = {0};
            ps_ctx_check(m->rt.ctx, &dummy);
        }
        goto done;
    }
    r->docs = sink.docs;
    sink.docs = NULL;
    if (take_result(r, en->result, &e)) goto done;
    if (r->dir && r->docs) { /* "out": what the CLI's --out holds, written there as well */
        char msg[PS_ERROR_MAX];
        if (ps_api_result_save(r, r->dir, msg, sizeof msg) != PS_API_OK) {
            ps_fail(&e, "%s", msg);
            goto done;
        }
    }
    if (!r->files_json && !(r->files_json = strdup("[]"))) {
        ps_fail(&e, "out of memory");
        goto done;
    }
    rc = 0;
done:
    ps_args_free(&args);
    free(kv);
    argv_free(&av);
    ps_result_sink_free(&sink);
    if (have_pset) ps_promptset_free(&pset);
    if (have_cset) ps_token_set_free(&cset);
    json_decref(req);
    if (rc) {
        ps_api_result_free(r);
        int code = ps_api_report(&e, err, errlen);
        return pr.stopped ? PS_API_ECANCELLED : code;
    }
    *out = r;
    return PS_API_OK;
}

PS_API const char *ps_api_result_json(const ps_api_result *r) { return r->json; }
PS_API const char *ps_api_result_kind(const ps_api_result *r) { return r->kind; }
PS_API int ps_api_result_count(const ps_api_result *r) { return r->n; }
PS_API const char *ps_api_result_name(const ps_api_result *r, int i) { return i >= 0 && i < r->n ? r->a[i].name : NULL; }
PS_API const double *ps_api_result_data(const ps_api_result *r, int i) { return i >= 0 && i < r->n ? r->a[i].data : NULL; }
PS_API const int64_t *ps_api_result_shape(const ps_api_result *r, int i, int *rank) {
    if (i < 0 || i >= r->n) {
        if (rank) *rank = 0;
        return NULL;
    }
    if (rank) *rank = r->a[i].rank;
    return r->a[i].shape;
}
PS_API int ps_api_result_find(const ps_api_result *r, const char *name) {
    for (int i = 0; name && i < r->n; i++)
        if (!strcmp(r->a[i].name, name)) return i;
    return -1;
}
PS_API const char *ps_api_result_dir(const ps_api_result *r) { return r->dir; }
PS_API const char *ps_api_result_files_json(const ps_api_result *r) { return r->files_json; }

PS_API int ps_api_result_save(const ps_api_result *r, const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir) return ps_api_say(err, errlen, PS_API_EINPUT, "no directory given");
    if (!r->docs || !json_object_size(r->docs)) return ps_api_say(err, errlen, PS_API_EINPUT, "the run has no result to save");
    ps_error e = {0};
    char d[4096];
    snprintf(d, sizeof d, "%s", dir);
    for (char *s = d + 1; *s; s++) /* mkdir -p */
        if (*s == '/') {
            *s = '\0';
            if (ps_mkdir(d, &e)) return ps_api_report(&e, err, errlen);
            *s = '/';
        }
    if (ps_mkdir(d, &e)) return ps_api_report(&e, err, errlen);
    const char *name;
    json_t *v;
    json_object_foreach(r->docs, name, v) { /* the JSON files, byte for byte what the CLI writes */
        char path[4400];
        const char *text = json_string_value(v);
        snprintf(path, sizeof path, "%s/%s", d, name);
        if (ps_write_file_atomic(path, text, strlen(text), &e)) return ps_api_report(&e, err, errlen);
    }
    /* and their figures, drawn from them as the CLI draws them */
    if (draw((ps_api_result *)r, d, &e)) return ps_api_report(&e, err, errlen);
    return PS_API_OK;
}
