/* run_hooks.h — the layout of a hook list (include/phasescope.h, ps_api_hooks): its entries in order, each
 * a host callback or a backend-side action with its source copied; and the message a failing callback
 * left. api/run_pass.c registers them on a core hook set for a run. */
#ifndef PS_API_RUN_HOOKS_H
#define PS_API_RUN_HOOKS_H

#include "api/api_internal.h"
#include "core/hooks.h"

typedef struct {
    char *name;
    ps_api_hook_fn fn; /* a callback, or NULL for an action */
    void *user;
    int kind, head;    /* the action (PS_API_ZERO ...) */
    int64_t seq0, seq1, pos0, pos1;
    float *src, scale;
    int64_t src_shape[4];
    int src_rank;
    struct ps_api_hooks *list; /* for the failure message */
} ps_api_hook_entry;

struct ps_api_hooks {
    int n, cap;
    ps_api_hook_entry *e;
    char fail_msg[PS_ERROR_MAX - 128]; /* ps_api_hooks_fail */
};

/* The list's entries registered on h for a run of B sequences of T tokens (each name checked against the
 * model, each action's source against the point's shape): api/run_pass.c (a forward) and
 * api/kvcache_call.c (an append to the KV cache, B = 1, T = the tokens appended). 0, or -1 and err. */
int ps_api_hooks_register(const ps_api_model *M, ps_hooks *h, ps_api_hooks *list, int64_t B, int64_t T, ps_error *err);

#endif
