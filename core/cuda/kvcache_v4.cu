/* kvcache_v4.cu — the DeepSeek-V4 KV cache's ops on the device (core/ops.h: ps_v4_kv_attend, ps_v4_kv_slots;
 * the CPU's core/cpu/kv_v4.c is the reference). Thin kernels: a grid-stride loop over the op's index space
 * calling the body of core/cuda/kvcache_v4_bodies.h for each index — one thread per (query row, head) with
 * sequential loops over its keys (the raw rows of its sliding window, then the entries the indexer selected,
 * topk a device buffer, or every visible one) in three passes; one thread per channel for a closing window's
 * gates. The bodies are checked against the CPU on the host by tests/test_v4_kvcache.c; these launchers add
 * the staging of the page tables (host arrays of device pointers, cu_stage) and the CPU's argument checks.
 * Not yet run on a GPU (docs/kvcache.md). */
#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/kvcache_v4_bodies.h"

/* a: the geometry with its page tables' device copies */
__global__ void k_v4_kv_attend(float *out, float *sinkp, const float *q, const float *topk, const float *sink, ps_v4_kv_attn a) {
    GS_LOOP(task, a.n * a.H) ps_v4kb_kv_attend(out, sinkp, q, topk, sink, &a, task);
}

extern "C" int ps_cuda_v4_kv_attend(ps_ctx *c, float *out, float *sinkp, const float *q, const float *topk, const float *sink,
                                    const ps_v4_kv_attn *a) {
    if (ps_v4_kv_attn_check(c, a)) return -1;
    if (a->K > 0 && !topk) return ps_ctx_fail(c, "v4_kv_attend: K = %lld entries per query and no topk", (long long)a->K);
    if (a->n == 0) return 0;
    const void *h[2] = {a->kv.page, a->ent.page};
    int64_t by[2] = {cu_kv_n_pages(&a->kv) * (int64_t)sizeof(float *), a->nE > 0 ? cu_kv_n_pages(&a->ent) * (int64_t)sizeof(float *) : 0};
    void *d[2];
    if (cu_stage(c, 2, h, by, d)) return -1;
    ps_v4_kv_attn x = *a;
    x.kv.page = (float *const *)d[0];
    x.ent.page = a->nE > 0 ? (float *const *)d[1] : NULL;
    return cu_launch(c, "v4_kv_attend", k_v4_kv_attend, a->n * a->H, 64, out, sinkp, q, topk, sink, x);
}

/* k: the window with its page table's device copy */
__global__ void k_v4_kv_slots(float *gate, const float *ape, ps_kv_chan k) {
    GS_LOOP(i, k.hd) ps_v4kb_kv_slots(gate, ape, &k, i);
}

extern "C" int ps_cuda_v4_kv_slots(ps_ctx *c, float *gate, const float *ape, const ps_kv_chan *k) {
    if (ps_kv_slots_check(c, "v4_kv_slots", k)) return -1;
    void *d;
    if (cu_stage_pages(c, &k->ln, &d)) return -1;
    ps_kv_chan x = *k;
    x.ln.page = (float *const *)d;
    return cu_launch(c, "v4_kv_slots", k_v4_kv_slots, k->hd, 64, gate, ape, x);
}
