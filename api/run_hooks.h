/* run_hooks.h — the layout of a hook list (include/phasescope.h, ps_api_hooks): its entries in order, each
 * a host callback or a backend-side action with its source copied; and the message a failing callback
 * left. api/run_pass.c registers them on a core hook set for a run. */
#ifndef PS_API_RUN_HOOKS_H
#define PS_API_RUN_HOOKS_H

#include "api/api_internal.h"

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

#endif
