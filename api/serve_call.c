/* serve_call.c — `phasescope serve` as calls of the public API (include/phasescope.h, "serving"): the
 * options JSON read through the table the CLI reads its flags through (instruments/commands.h:
 * ps_serve_options, ps_serve_option_set), then the server of serve/serve.h started on threads of its own. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "core/ctx.h"
#include "instruments/commands.h"
#ifdef PS_HAVE_SERVE /* the serve layer: built when libmicrohttpd is found (CMakeLists.txt) */
#include "serve/serve.h"
#endif

#define N_TEXT 8 /* the string options' copies a server keeps */

struct ps_api_server {
#ifdef PS_HAVE_SERVE
    ps_server *s;
#endif
    char *path, *device;
    char *text[N_TEXT]; /* the string options (ps_serve_opts keeps pointers; the server reads them while it runs) */
    int n_text;
};

PS_API void ps_api_serve_stop(ps_api_server *S) {
    if (!S) return;
#ifdef PS_HAVE_SERVE
    ps_serve_stop(S->s);
#endif
    for (int i = 0; i < S->n_text; i++) free(S->text[i]);
    free(S->path);
    free(S->device);
    free(S);
}

#ifdef PS_HAVE_SERVE
typedef struct {
    ps_serve_opts *o;
    ps_api_server *S;
} setup;

/* one key of the options JSON: its entry in the table, its type, then the CLI's checks and messages */
static int serve_option(const char *key, json_t *v, void *user, char *err, size_t errlen) {
    setup *u = user;
    const ps_serve_option *p = ps_serve_option_find(key);
    if (!p) {
        char keys[512] = "";
        size_t o = 0;
        for (const ps_serve_option *q = ps_serve_options; q->key && o < sizeof keys; q++) {
            int w = snprintf(keys + o, sizeof keys - o, "%s%s", o ? ", " : "", q->key);
            if (w > 0) o += (size_t)w;
        }
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": unknown (the server's options: %s)", key, keys);
    }
    char num[32];
    const char *text = num;
    if (p->kind == PS_SERVE_OPT_TEXT) {
        if (!json_is_string(v)) return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": expected a string", key);
        if (u->S->n_text == N_TEXT || !(u->S->text[u->S->n_text] = strdup(json_string_value(v))))
            return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
        text = u->S->text[u->S->n_text++];
    } else {
        if (!json_is_integer(v))
            return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": expected an integer in [%lld, %lld]", key, (long long)p->lo,
                              (long long)p->hi);
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
    }
    ps_error e = {0};
    if (ps_serve_option_set(u->o, p, text, &e))
        return ps_api_say(err, errlen, PS_API_EINPUT, "options: \"%s\": %s", key, e.msg);
    return 0;
}
#endif

static int serve_start(const ps_family *const *families, const char *path, const char *device, const char *options_json,
                       ps_api_server **out, char *err, size_t errlen) {
    if (!out) return ps_api_say(err, errlen, PS_API_EINPUT, "ps_api_serve_start: out is NULL");
    *out = NULL;
#ifdef PS_HAVE_SERVE
    if (!path || !*path) return ps_api_say(err, errlen, PS_API_EINPUT, "no checkpoint path given");
    if (!device) device = "cpu";
    if (!ps_api_known_device(device))
        return ps_api_say(err, errlen, PS_API_EINPUT, "device %s: this build has no such backend (it has: %s)", device,
                          ps_ctx_backends());
    ps_api_server *S = calloc(1, sizeof *S);
    if (!S || !(S->path = strdup(path)) || !(S->device = strdup(device))) {
        ps_api_serve_stop(S);
        return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
    }
    ps_serve_opts o;
    ps_serve_defaults(&o);
    setup u = {.o = &o, .S = S};
    int rc = ps_api_options(options_json, serve_option, &u, err, errlen);
    if (rc) {
        ps_api_serve_stop(S);
        return rc;
    }
    o.model_dir = S->path;
    o.backend = S->device;
    o.families = families;
    ps_error e = {0};
    if (ps_serve_start(&o, &S->s, &e)) {
        ps_api_serve_stop(S);
        return ps_api_report(&e, err, errlen);
    }
    *out = S;
    return PS_API_OK;
#else
    (void)families, (void)path, (void)device, (void)options_json;
    return ps_api_say(err, errlen, PS_API_EFAIL,
                      "ps_api_serve_start: this build has no server: it was built without libmicrohttpd (Debian "
                      "libmicrohttpd-dev); install it and configure again (cmake -S . -B build)");
#endif
}

PS_API int ps_api_serve_start(const char *path, const char *device, const char *options_json, ps_api_server **out, char *err,
                              size_t errlen) {
    return serve_start(NULL, path, device, options_json, out, err, errlen);
}

PS_API int ps_api_serve_start_in(const ps_family *const *families, const char *path, const char *device, const char *options_json,
                                 ps_api_server **out, char *err, size_t errlen) {
    return serve_start(families, path, device, options_json, out, err, errlen);
}

#ifdef PS_HAVE_SERVE
PS_API int ps_api_serve_port(const ps_api_server *S) { return S ? ps_serve_port(S->s) : -1; }
PS_API const char *ps_api_serve_name(const ps_api_server *S) { return S ? ps_serve_name(S->s) : NULL; }
#else
PS_API int ps_api_serve_port(const ps_api_server *S) { return (void)S, -1; }
PS_API const char *ps_api_serve_name(const ps_api_server *S) { return (void)S, NULL; }
#endif
