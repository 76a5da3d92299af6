/* run_hooks.c — the hook list of include/phasescope.h: host callbacks and backend-side actions on named
 * points, in the order given; turned into a core hook set (core/hooks.h) for one run by
 * ps_api_hooks_register (api/run_pass.c). */
#define _POSIX_C_SOURCE 200809L
#include "api/run_hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

PS_API ps_api_hooks *ps_api_hooks_new(void) { return calloc(1, sizeof(ps_api_hooks)); }

PS_API void ps_api_hooks_clear(ps_api_hooks *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) {
        free(h->e[i].name);
        free(h->e[i].src);
    }
    h->n = 0;
    h->fail_msg[0] = '\0';
}

PS_API void ps_api_hooks_free(ps_api_hooks *h) {
    if (!h) return;
    ps_api_hooks_clear(h);
    free(h->e);
    free(h);
}

PS_API int ps_api_hooks_count(const ps_api_hooks *h) { return h ? h->n : 0; }

PS_API void ps_api_hooks_fail(ps_api_hooks *h, const char *message) {
    if (h) snprintf(h->fail_msg, sizeof h->fail_msg, "%s", message ? message : "");
}

static ps_api_hook_entry *push(ps_api_hooks *h, const char *name, char *err, size_t errlen) {
    if (!h) {
        ps_api_say(err, errlen, PS_API_EINPUT, "no hook list given");
        return NULL;
    }
    if (!name || !*name) {
        ps_api_say(err, errlen, PS_API_EINPUT, "a hook needs a name (ps_api_hook_names_json lists the model's)");
        return NULL;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 8;
        ps_api_hook_entry *ne = realloc(h->e, (size_t)cap * sizeof *ne);
        if (!ne) {
            ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
            return NULL;
        }
        h->e = ne;
        h->cap = cap;
    }
    ps_api_hook_entry *e = &h->e[h->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) {
        ps_api_say(err, errlen, PS_API_EFAIL, "out of memory");
        return NULL;
    }
    e->list = h;
    h->n++;
    return e;
}

PS_API int ps_api_hooks_add_fn(ps_api_hooks *h, const char *name, ps_api_hook_fn fn, void *user, char *err, size_t errlen) {
    if (!fn) return ps_api_say(err, errlen, PS_API_EINPUT, "hook %s: no callback given", name ? name : "(null)");
    ps_api_hook_entry *e = push(h, name, err, errlen);
    if (!e) return h && name && *name ? PS_API_EFAIL : PS_API_EINPUT;
    e->fn = fn;
    e->user = user;
    return PS_API_OK;
}

PS_API int ps_api_hooks_add_action(ps_api_hooks *h, const char *name, int kind, int head, int64_t seq0, int64_t seq1,
                                   int64_t pos0, int64_t pos1, const float *src, const int64_t *src_shape, int src_rank,
                                   float scale, char *err, size_t errlen) {
    const char *nm = name ? name : "(null)";
    if (kind < PS_API_ZERO || kind > PS_API_PATCH)
        return ps_api_say(err, errlen, PS_API_EINPUT, "hook %s: unknown action %d (zero 1, set 2, add 3, mean_replace 4, patch 5)",
                          nm, kind);
    int64_t n = 0;
    if (kind != PS_API_ZERO) {
        if (!src || !src_shape || src_rank < 1 || src_rank > 4)
            return ps_api_say(err, errlen, PS_API_EINPUT, "hook %s: the action needs a source array of rank 1-4", nm);
        n = 1;
        for (int k = 0; k < src_rank; k++) {
            if (src_shape[k] < 1) return ps_api_say(err, errlen, PS_API_EINPUT, "hook %s: the source's axis %d is empty", nm, k);
            n *= src_shape[k];
        }
    }
    if (seq0 < 0 || seq1 < 0 || pos0 < 0 || pos1 < 0 || (seq1 && seq1 <= seq0) || (pos1 && pos1 <= pos0))
        return ps_api_say(err, errlen, PS_API_EINPUT, "hook %s: negative or empty range (sequences %lld-%lld, positions %lld-%lld)",
                          nm, (long long)seq0, (long long)seq1, (long long)pos0, (long long)pos1);
    ps_api_hook_entry *e = push(h, name, err, errlen);
    if (!e) return h && name && *name ? PS_API_EFAIL : PS_API_EINPUT;
    e->kind = kind, e->head = head, e->seq0 = seq0, e->seq1 = seq1, e->pos0 = pos0, e->pos1 = pos1, e->scale = scale;
    if (n) {
        if (!(e->src = malloc((size_t)n * sizeof(float)))) {
            free(e->name);
            h->n--;
            return ps_api_say(err, errlen, PS_API_EFAIL, "out of memory for the source of hook %s", nm);
        }
        memcpy(e->src, src, (size_t)n * sizeof(float));
        e->src_rank = src_rank;
        for (int k = 0; k < src_rank; k++) e->src_shape[k] = src_shape[k];
    }
    return PS_API_OK;
}
