/* backend.c — the op enums' name tables, and the questions asked of a backend's tables (core/backend.h). */
#include "core/backend.h"

#include <stddef.h>
#include <string.h>

/* Every entry of each table is one function pointer, and PS_CORE_OPS / PS_V4_OPS name each of them once, in
 * order: the offsets below fail to compile for a name the struct does not have, and these sizes fail for a
 * struct field no enum value names. */
typedef int (*ps_any_fn_)(void);
_Static_assert(sizeof(ps_backend_ops) == PS_OP_COUNT * sizeof(ps_any_fn_), "every ps_backend_ops entry is a ps_op");
_Static_assert(sizeof(ps_backend_v4_ops) == PS_V4_OP_COUNT * sizeof(ps_any_fn_), "every ps_backend_v4_ops entry is a ps_v4_op");

#define NAME_(E, f) #f,
static const char *const core_names[PS_OP_COUNT] = {PS_CORE_OPS(NAME_)};
static const char *const v4_names[PS_V4_OP_COUNT] = {PS_V4_OPS(NAME_)};
#undef NAME_
#define CORE_OFF_(E, f) offsetof(ps_backend_ops, f),
static const size_t core_off[PS_OP_COUNT] = {PS_CORE_OPS(CORE_OFF_)};
#undef CORE_OFF_
#define V4_OFF_(E, f) offsetof(ps_backend_v4_ops, f),
static const size_t v4_off[PS_V4_OP_COUNT] = {PS_V4_OPS(V4_OFF_)};
#undef V4_OFF_

const char *ps_op_name(ps_op op) { return (int)op >= 0 && op < PS_OP_COUNT ? core_names[op] : NULL; }
const char *ps_v4_op_name(ps_v4_op op) { return (int)op >= 0 && op < PS_V4_OP_COUNT ? v4_names[op] : NULL; }

/* the entry at byte offset off of a table of function pointers, as an untyped pointer (all function
 * pointers share one representation on the targets this builds for; only compared with NULL) */
static int entry_set(const void *table, size_t off) {
    ps_any_fn_ fn;
    memcpy(&fn, (const char *)table + off, sizeof fn);
    return fn != NULL;
}

int ps_backend_has_op(const ps_backend *be, ps_op op) {
    return be && (int)op >= 0 && op < PS_OP_COUNT && entry_set(&be->ops, core_off[op]);
}

int ps_backend_has_v4_op(const ps_backend *be, ps_v4_op op) {
    return be && be->v4 && (int)op >= 0 && op < PS_V4_OP_COUNT && entry_set(be->v4, v4_off[op]);
}

int ps_backend_supports(const ps_backend *be, ps_op op, const ps_op_params *p, const char **why) {
    static const ps_op_params none = {0};
    const char *w = NULL;
    int ok = ps_backend_has_op(be, op);
    if (!ok) w = "the backend has no such op";
    else if (be->supports && !be->supports(op, p ? p : &none, &w)) ok = 0;
    if (why) *why = ok ? NULL : (w ? w : "not supported");
    return ok;
}
