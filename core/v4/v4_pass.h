/* v4_pass.h — internal to core/v4: the macros the DeepSeek-V4 passes share (v4_forward.c's whole-sequence
 * forward and v4_kvcache.c's appends), so the two fire hooks and check ops the same way. Not for use outside
 * core/v4 (generic names). */
#ifndef PS_V4_PASS_H
#define PS_V4_PASS_H

#include "core/ctx.h"
#include "core/v4/v4_hooks.h"

/* Inside the V4 passes (v4_forward.c, v4_kvcache.c; a function with `hooks`, `ctx` and `err` in scope and an
 * int status): HOOKED, whether point pt of slot (layer, or n_layers for the model-level points) has a hook;
 * FIRE, fire it with the tensor's shape (returns -1 from the caller on failure); OPS, an op's status (the
 * context's error). */
#define HOOKED(slot, pt) ps_hooks_on_point(hooks, &ps_v4_hook_family, (slot), (pt))
#define FIRE(slot, pt, data, nd, ...)                                                                 \
    do {                                                                                              \
        if (HOOKED(slot, pt)) {                                                                       \
            int64_t shp_[4] = {__VA_ARGS__};                                                          \
            if (ps_hooks_fire_point(ctx, hooks, (slot), (pt), (data), (nd), shp_, err)) return -1;   \
        }                                                                                             \
    } while (0)
#define OPS(expr)                                                                                     \
    do {                                                                                              \
        if (expr) return ps_ctx_check(ctx, err);                                                      \
    } while (0)

#endif
