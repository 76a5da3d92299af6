/* minicpm_ko_targets.c — the MiniCPM4 family's knockout targets as data (runtime.h: ps_ko_array and the family's
 * ko_* entries, in its table core/minicpm/minicpm_family.c), the meaning of the controlled model's `select` kind:
 *   raw        hook_k and hook_v of a KV head: the keys and values the selected blocks are read from (the
 *              level-1 pooled keys are then pooled from the replaced keys, unless use_nope pools un-roped ones);
 *   compressed hook_ck of a KV head: the level-1 pooled keys that stage 1 scores, so the blocks the head selects
 *              change (no compressed values: InfLLM-v2 attends raw keys only; hook_ck2 only normalises).
 * A cell is one KV head (hook_k, hook_v, hook_ck share the head axis 2); the forward has no restart: a forward per
 * cell. The compressed keys exist only on the sparse path (T >= dense_len, or dense_len <= 0) once a level-1
 * window is complete (T >= kernel_size): at other prompt lengths the target is missing (missing_at). */
#include <stdio.h>

#include "core/family_entries.h"
#include "core/minicpm/minicpm.h"
#include "core/runtime.h"

/* ---- target index t = raw 0, compressed 1 ---- */

const char *const ps_minicpm_ko_targets[] = {"raw", "compressed", NULL};
enum { KO_RAW = 0, KO_COMPRESSED = 1 };

static const ps_minicpm_config *cfg_of(const ps_runtime *rt) { return &((const ps_minicpm_model *)rt->model)->cfg; }

/* prompts of T tokens have level-1 compressed keys: the sparse path, and at least one complete window */
static int has_compressed(const ps_minicpm_config *c, int64_t T) {
    return ps_minicpm_sparse(c, T) && ps_select_n_windows(T, c->sel.kernel, c->sel.stride) > 0;
}

/* the model as a whole: compressed when some prompt it takes (up to max_position_embeddings) has compressed keys */
int ps_minicpm_ko_default(const ps_runtime *rt) {
    const ps_minicpm_config *c = cfg_of(rt);
    return has_compressed(c, c->max_position_embeddings) ? KO_COMPRESSED : KO_RAW;
}

/* prompts of T tokens: compressed when they take the sparse path with a complete window, else raw */
int ps_minicpm_ko_default_at(const ps_runtime *rt, int64_t T) { return has_compressed(cfg_of(rt), T) ? KO_COMPRESSED : KO_RAW; }

int64_t ps_minicpm_ko_heads(const ps_runtime *rt, int target) {
    (void)target;
    return cfg_of(rt)->n_kv_heads;
}

const char *ps_minicpm_ko_unit(const ps_runtime *rt, int target) {
    (void)rt, (void)target;
    return NULL; /* a KV head, as the controlled model's */
}

/* a layer (-1: the model as a whole) at any length: compressed keys need a sparse path within max_position_embeddings */
const char *ps_minicpm_ko_missing(const ps_runtime *rt, int target, int layer, char *buf, size_t n) {
    const ps_minicpm_config *c = cfg_of(rt);
    if (layer >= c->n_layers) {
        snprintf(buf, n, "knockout grid: layer %d out of range (the model has %lld layers)", layer, (long long)c->n_layers);
        return buf;
    }
    if (target != KO_COMPRESSED || has_compressed(c, c->max_position_embeddings)) return NULL;
    snprintf(buf, n,
             "--target compressed: this MiniCPM4 model runs dense at every length it takes (sparse_config.dense_len %lld, "
             "max_position_embeddings %lld), so it has no compressed keys (use --target raw)",
             (long long)c->dense_len, (long long)c->max_position_embeddings);
    return buf;
}

/* prompts of T tokens: the dense path (T < dense_len) and a prompt shorter than a window have no compressed keys */
const char *ps_minicpm_ko_missing_at(const ps_runtime *rt, int target, int layer, int64_t T, char *buf, size_t n) {
    const ps_minicpm_config *c = cfg_of(rt);
    const char *m = ps_minicpm_ko_missing(rt, target, layer, buf, n);
    if (m || target != KO_COMPRESSED || has_compressed(c, T)) return m;
    if (!ps_minicpm_sparse(c, T))
        snprintf(buf, n,
                 "--target compressed: prompts of %lld tokens run dense (below sparse_config.dense_len %lld), which has no "
                 "compressed keys (use --target raw, or prompts of at least %lld tokens)",
                 (long long)T, (long long)c->dense_len, (long long)c->dense_len);
    else
        snprintf(buf, n,
                 "--target compressed: prompts of %lld tokens have no complete level-1 window (sparse_config.kernel_size %lld), "
                 "so no compressed keys (use --target raw)",
                 (long long)T, (long long)c->sel.kernel);
    return buf;
}

/* raw: hook_k, hook_v; compressed: hook_ck (no host step; no restart: a forward per cell) */
int ps_minicpm_ko_arrays(const ps_runtime *rt, int target, ps_ko_array arr[PS_KO_MAX_ARRAYS], int *restart) {
    (void)rt;
    int n = 0;
    if (target == KO_RAW) {
        arr[n++] = (ps_ko_array){PS_MCH_K, PS_MCH_K, 0};
        arr[n++] = (ps_ko_array){PS_MCH_V, PS_MCH_V, 0};
    } else
        arr[n++] = (ps_ko_array){PS_MCH_CK, PS_MCH_CK, 0};
    *restart = PS_KO_RESTART_NONE;
    return n;
}
