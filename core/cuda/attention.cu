/* attention.cu — attention on the device, fp32, in O(T) memory (the log-sum-exp contract of ops.h).
 *
 * Every query row sees a set of entries: for compressed attention the windows its position has ended
 * (ck/cv) and the raw rows of its local window (k/v), in one softmax; for full attention every raw row up
 * to its own. The kernels are flash-style: a block takes BQ = 64 query rows of one head, walks the
 * entries in tiles of BK = 64 (first the compressed entries, then the raw rows the block can reach)
 * through shared memory, keeps a running maximum and sum per row (online softmax) and writes z and the
 * row log-sum-exp. 256 threads: thread (ty, tx) holds rows 4ty … 4ty+3 and, of a tile, the columns
 * tx + 16j (scores) or the head dimensions tx + 16k (outputs); a row's 16 threads sit in one half-warp.
 *
 * The backward is deterministic (no atomics): D = rowsum(dz ⊙ z); one kernel per query tile for dq
 * (probabilities recomputed from the lse), one per key tile for dk/dv or dck/dcv (looping over the
 * query heads of its KV group and the query tiles that can see the tile). Head dims up to 128 (templates
 * for <= 32, <= 64, <= 128; larger heads fail with a message).
 *
 * Window grids with offsets (ps_attn_geom.woff) and content chunks (.cend): the compressed entries a row
 * sees are still a prefix, of the length d_geom_seen gives per (sequence, KV head, position).
 *
 * attn_chunk (prefill) is the forward kernel on a key frame; attn_rows is one warp per (row, head) with
 * an online softmax; attn_probs / attn_out materialise the probability rows for pattern hooks. */
#include <string.h>

#include "core/cuda/cuda_internal.cuh"
#include "core/cuda/grid_bodies.h"

#define BQ 64
#define BK 64
#define NT 256

typedef struct {
    const float *q, *k, *v, *ck, *cv;
    float *z, *lse;
    const float *dz, *D;
    float *dq, *dk, *dv, *dck, *dcv;
    int64_t B, Tq, Tk, nh, nkv, hd, nW, grp;
    int64_t q_bs, k_bs, c_bs; /* floats between sequences: q/z/dz/dq, k/v, ck/cv */
    int64_t q_off, pos0, W, S, LW;
    int compressed;
    float scale;
    const int64_t *woff, *cend; /* device copies of ps_attn_geom.woff [B, nkv] / .cend [B, nW] (NULL: the base grid) */
} attn_p;

/* Compressed entries position t of sequence b sees through KV head kvh (ops.h ps_geom_seen): the chunks
 * that have ended (cend increasing: the count of entries <= t), else the windows of the head's grid
 * (offset woff[b, kvh]) that have ended. */
__device__ __forceinline__ int64_t d_geom_seen(const attn_p &p, int64_t b, int64_t kvh, int64_t t) {
    return ps_entries_seen(p.cend ? p.cend + b * p.nW : NULL, p.woff ? p.woff[b * p.nkv + kvh] : 0, p.W, p.S, p.nW, t);
}

/* What query row i of sequence b (KV head kvh) sees: windows [0, nc), raw rows [lo, kr]. */
__device__ __forceinline__ void row_range(const attn_p &p, int64_t b, int64_t kvh, int64_t i, int64_t &nc, int64_t &lo,
                                          int64_t &kr) {
    kr = p.q_off + i;
    nc = p.compressed ? d_geom_seen(p, b, kvh, p.pos0 + kr) : 0;
    lo = p.compressed ? (kr - p.LW + 1 > 0 ? kr - p.LW + 1 : 0) : 0;
}

/* rows [r0, r0 + rows) of a [*, stride]-strided source into a [rows, HP] tile; zeros past `end` and hd */
template <int HD>
__device__ __forceinline__ void load_tile(float *dst, const float *src, int64_t stride, int64_t r0, int64_t end, int64_t hd,
                                          int rows) {
    constexpr int HP = HD + 1;
    for (int x = threadIdx.x; x < rows * HD; x += NT) {
        int r = x / HD, e = x % HD;
        int64_t j = r0 + r;
        dst[r * HP + e] = (j < end && e < hd) ? src[j * stride + e] : 0.0f;
    }
}

/* ---------------- forward (and the prefill chunk) ---------------- */

template <int NC> __global__ void __launch_bounds__(NT) k_attn_fwd(attn_p p) {
    constexpr int HD = NC * 16, HP = HD + 1;
    extern __shared__ float sm[];
    float *Qs = sm, *KV = Qs + BQ * HP, *Ps = KV + BK * HP;
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int64_t bn = blockIdx.y, b = bn / p.nh, n = bn % p.nh, kvh = n / p.grp;
    const int64_t i0 = (int64_t)blockIdx.x * BQ;
    if (i0 >= p.Tq) return;
    const int64_t i1 = i0 + BQ < p.Tq ? i0 + BQ : p.Tq, qs = p.nh * p.hd, ks = p.nkv * p.hd;
    load_tile<HD>(Qs, p.q + b * p.q_bs + n * p.hd, qs, i0, i1, p.hd, BQ);
    int64_t rnc[4], rlo[4], rkr[4];
    bool rv[4];
    float m[4], l[4], o[4][NC];
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        int64_t i = i0 + ty * 4 + ii;
        rv[ii] = i < i1;
        row_range(p, b, kvh, i, rnc[ii], rlo[ii], rkr[ii]);
        m[ii] = -INFINITY, l[ii] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NC; kk++) o[ii][kk] = 0.0f;
    }
    int64_t nc_blk, lo_blk, hi_blk, dummy;
    row_range(p, b, kvh, i1 - 1, nc_blk, dummy, hi_blk);
    row_range(p, b, kvh, i0, dummy, lo_blk, dummy);
    for (int phase = 0; phase < 2; phase++) {
        const int64_t s0 = phase == 0 ? 0 : lo_blk, s1 = phase == 0 ? nc_blk : hi_blk + 1;
        if (s0 >= s1) continue;
        const float *Kb = phase == 0 ? p.ck + b * p.c_bs + kvh * p.hd : p.k + b * p.k_bs + kvh * p.hd;
        const float *Vb = phase == 0 ? p.cv + b * p.c_bs + kvh * p.hd : p.v + b * p.k_bs + kvh * p.hd;
        for (int64_t j0 = s0; j0 < s1; j0 += BK) {
            __syncthreads(); /* the previous tile's readers are done */
            load_tile<HD>(KV, Kb, ks, j0, s1, p.hd, BK);
            __syncthreads();
            float s[4][4];
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) s[ii][jj] = 0.0f;
#pragma unroll 4
            for (int e = 0; e < HD; e++) {
                float qv[4], kv[4];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) qv[ii] = Qs[(ty * 4 + ii) * HP + e];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) kv[jj] = KV[(tx + 16 * jj) * HP + e];
#pragma unroll
                for (int ii = 0; ii < 4; ii++)
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) s[ii][jj] += qv[ii] * kv[jj];
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++) {
                float mt = -INFINITY;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    int64_t j = j0 + tx + 16 * jj;
                    bool vis = rv[ii] && j < s1 && (phase == 0 ? j < rnc[ii] : (j >= rlo[ii] && j <= rkr[ii]));
                    s[ii][jj] = vis ? s[ii][jj] * p.scale : -INFINITY;
                    mt = fmaxf(mt, s[ii][jj]);
                }
#pragma unroll
                for (int off = 8; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
                float mn = fmaxf(m[ii], mt);
                float alpha = m[ii] == -INFINITY ? 0.0f : expf(m[ii] - mn);
                float rs = 0.0f;
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    float pv = s[ii][jj] == -INFINITY ? 0.0f : expf(s[ii][jj] - mn);
                    rs += pv;
                    Ps[(ty * 4 + ii) * BK + tx + 16 * jj] = pv;
                }
#pragma unroll
                for (int off = 8; off; off >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, off);
                l[ii] = l[ii] * alpha + rs;
                m[ii] = mn;
#pragma unroll
                for (int kk = 0; kk < NC; kk++) o[ii][kk] *= alpha;
            }
            __syncthreads(); /* scores done with K */
            load_tile<HD>(KV, Vb, ks, j0, s1, p.hd, BK);
            __syncthreads();
#pragma unroll 4
            for (int c = 0; c < BK; c++) {
                float vv[NC];
#pragma unroll
                for (int kk = 0; kk < NC; kk++) vv[kk] = KV[c * HP + tx + 16 * kk];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) {
                    float pv = Ps[(ty * 4 + ii) * BK + c];
#pragma unroll
                    for (int kk = 0; kk < NC; kk++) o[ii][kk] += pv * vv[kk];
                }
            }
        }
    }
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        if (!rv[ii]) continue;
        int64_t i = i0 + ty * 4 + ii;
        float inv = l[ii] > 0.0f ? 1.0f / l[ii] : 0.0f;
        float *zr = p.z + b * p.q_bs + i * qs + n * p.hd;
#pragma unroll
        for (int kk = 0; kk < NC; kk++) {
            int e = tx + 16 * kk;
            if (e < p.hd) zr[e] = o[ii][kk] * inv;
        }
        if (p.lse && tx == 0) p.lse[bn * p.Tq + i] = m[ii] + logf(l[ii]);
    }
}

/* ---------------- backward: D = rowsum(dz ⊙ z) ---------------- */

__global__ void k_attn_D(float *D, const float *dz, const float *z, int64_t B, int64_t T, int64_t nh, int64_t hd) {
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), lane = threadIdx.x & 31;
    for (int64_t wi = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; wi < B * nh * T; wi += warps) {
        int64_t b = wi / (nh * T), n = (wi / T) % nh, t = wi % T;
        const float *a = dz + ((b * T + t) * nh + n) * hd, *c = z + ((b * T + t) * nh + n) * hd;
        float acc = 0.0f;
        for (int64_t e = lane; e < hd; e += 32) acc += a[e] * c[e];
        acc = warp_sum(acc);
        if (lane == 0) D[wi] = acc;
    }
}

/* ---------------- backward: dq, per query tile ---------------- */

template <int NC> __global__ void __launch_bounds__(NT) k_attn_dq(attn_p p) {
    constexpr int HD = NC * 16, HP = HD + 1;
    extern __shared__ float sm[];
    float *Qs = sm, *dZs = Qs + BQ * HP, *Ks = dZs + BQ * HP, *Vs = Ks + BK * HP, *Ps = Vs + BK * HP;
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int64_t bn = blockIdx.y, b = bn / p.nh, n = bn % p.nh, kvh = n / p.grp;
    const int64_t i0 = (int64_t)blockIdx.x * BQ;
    if (i0 >= p.Tq) return;
    const int64_t i1 = i0 + BQ < p.Tq ? i0 + BQ : p.Tq, qs = p.nh * p.hd, ks = p.nkv * p.hd;
    load_tile<HD>(Qs, p.q + b * p.q_bs + n * p.hd, qs, i0, i1, p.hd, BQ);
    load_tile<HD>(dZs, p.dz + b * p.q_bs + n * p.hd, qs, i0, i1, p.hd, BQ);
    int64_t rnc[4], rlo[4], rkr[4];
    bool rv[4];
    float rl[4], rD[4], acc[4][NC];
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        int64_t i = i0 + ty * 4 + ii;
        rv[ii] = i < i1;
        row_range(p, b, kvh, i, rnc[ii], rlo[ii], rkr[ii]);
        rl[ii] = rv[ii] ? p.lse[bn * p.Tq + i] : 0.0f;
        rD[ii] = rv[ii] ? p.D[bn * p.Tq + i] : 0.0f;
#pragma unroll
        for (int kk = 0; kk < NC; kk++) acc[ii][kk] = 0.0f;
    }
    int64_t nc_blk, lo_blk, hi_blk, dummy;
    row_range(p, b, kvh, i1 - 1, nc_blk, dummy, hi_blk);
    row_range(p, b, kvh, i0, dummy, lo_blk, dummy);
    for (int phase = 0; phase < 2; phase++) {
        const int64_t s0 = phase == 0 ? 0 : lo_blk, s1 = phase == 0 ? nc_blk : hi_blk + 1;
        if (s0 >= s1) continue;
        const float *Kb = phase == 0 ? p.ck + b * p.c_bs + kvh * p.hd : p.k + b * p.k_bs + kvh * p.hd;
        const float *Vb = phase == 0 ? p.cv + b * p.c_bs + kvh * p.hd : p.v + b * p.k_bs + kvh * p.hd;
        for (int64_t j0 = s0; j0 < s1; j0 += BK) {
            __syncthreads();
            load_tile<HD>(Ks, Kb, ks, j0, s1, p.hd, BK);
            load_tile<HD>(Vs, Vb, ks, j0, s1, p.hd, BK);
            __syncthreads();
            float s[4][4], dp[4][4];
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) s[ii][jj] = 0.0f, dp[ii][jj] = 0.0f;
#pragma unroll 2
            for (int e = 0; e < HD; e++) {
                float qv[4], dzv[4], kv[4], vv[4];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) qv[ii] = Qs[(ty * 4 + ii) * HP + e], dzv[ii] = dZs[(ty * 4 + ii) * HP + e];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) kv[jj] = Ks[(tx + 16 * jj) * HP + e], vv[jj] = Vs[(tx + 16 * jj) * HP + e];
#pragma unroll
                for (int ii = 0; ii < 4; ii++)
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        s[ii][jj] += qv[ii] * kv[jj];
                        dp[ii][jj] += dzv[ii] * vv[jj];
                    }
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    int64_t j = j0 + tx + 16 * jj;
                    bool vis = rv[ii] && j < s1 && (phase == 0 ? j < rnc[ii] : (j >= rlo[ii] && j <= rkr[ii]));
                    float pv = vis ? expf(s[ii][jj] * p.scale - rl[ii]) : 0.0f;
                    Ps[(ty * 4 + ii) * BK + tx + 16 * jj] = pv * (dp[ii][jj] - rD[ii]) * p.scale;
                }
            __syncthreads();
#pragma unroll 4
            for (int c = 0; c < BK; c++) {
                float kv[NC];
#pragma unroll
                for (int kk = 0; kk < NC; kk++) kv[kk] = Ks[c * HP + tx + 16 * kk];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) {
                    float ds = Ps[(ty * 4 + ii) * BK + c];
#pragma unroll
                    for (int kk = 0; kk < NC; kk++) acc[ii][kk] += ds * kv[kk];
                }
            }
        }
    }
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        if (!rv[ii]) continue;
        float *dq = p.dq + b * p.q_bs + (i0 + ty * 4 + ii) * qs + n * p.hd;
#pragma unroll
        for (int kk = 0; kk < NC; kk++) {
            int e = tx + 16 * kk;
            if (e < p.hd) dq[e] = acc[ii][kk];
        }
    }
}

/* ---------------- backward: dk/dv (raw tiles) and dck/dcv (compressed tiles), per key tile ---------------- */

template <int NC> __global__ void __launch_bounds__(NT) k_attn_dkv(attn_p p, int64_t n_raw_tiles) {
    constexpr int HD = NC * 16, HP = HD + 1;
    extern __shared__ float sm[];
    float *Ks = sm, *Vs = Ks + BK * HP, *Qs = Vs + BK * HP, *dZs = Qs + BQ * HP, *Ps = dZs + BQ * HP, *DSs = Ps + BK * BQ;
    float *lse_s = DSs + BK * BQ, *D_s = lse_s + BQ;
    int64_t *rng = (int64_t *)(D_s + BQ); /* [BQ][3]: nc, lo, kr (8-byte aligned: the floats before are even) */
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int64_t bk = blockIdx.y, b = bk / p.nkv, kvh = bk % p.nkv;
    const int comp = (int64_t)blockIdx.x >= n_raw_tiles;
    const int64_t tile = comp ? (int64_t)blockIdx.x - n_raw_tiles : (int64_t)blockIdx.x;
    const int64_t count = comp ? p.nW : p.Tk, j0 = tile * BK, j1 = j0 + BK < count ? j0 + BK : count;
    if (j0 >= count) return;
    const int64_t qs = p.nh * p.hd, ks = p.nkv * p.hd;
    const float *Kb = comp ? p.ck + b * p.c_bs + kvh * p.hd : p.k + b * p.k_bs + kvh * p.hd;
    const float *Vb = comp ? p.cv + b * p.c_bs + kvh * p.hd : p.v + b * p.k_bs + kvh * p.hd;
    load_tile<HD>(Ks, Kb, ks, j0, j1, p.hd, BK);
    load_tile<HD>(Vs, Vb, ks, j0, j1, p.hd, BK);
    /* the query rows that can see some key of the tile */
    int64_t iq0, iq1 = p.Tq;
    if (comp) /* the first position that sees entry j0 (the entries are seen in order) */
        iq0 = ps_entry_first_seen(p.cend ? p.cend + b * p.nW : NULL, p.woff ? p.woff[b * p.nkv + kvh] : 0, p.W, p.S, j0) - p.pos0 -
              p.q_off;
    else {
        iq0 = j0 - p.q_off;
        if (p.compressed) {
            int64_t last = (j1 - 1) + p.LW - 1 - p.q_off + 1;
            iq1 = last < p.Tq ? last : p.Tq;
        }
    }
    if (iq0 < 0) iq0 = 0;
    float dk[4][NC], dv[4][NC];
#pragma unroll
    for (int ii = 0; ii < 4; ii++)
#pragma unroll
        for (int kk = 0; kk < NC; kk++) dk[ii][kk] = 0.0f, dv[ii][kk] = 0.0f;
    for (int64_t n = kvh * p.grp; n < (kvh + 1) * p.grp; n++) {
        const int64_t bn = b * p.nh + n;
        for (int64_t q0 = iq0; q0 < iq1; q0 += BQ) {
            const int64_t q1 = q0 + BQ < iq1 ? q0 + BQ : iq1;
            __syncthreads();
            load_tile<HD>(Qs, p.q + b * p.q_bs + n * p.hd, qs, q0, q1, p.hd, BQ);
            load_tile<HD>(dZs, p.dz + b * p.q_bs + n * p.hd, qs, q0, q1, p.hd, BQ);
            for (int r = tid; r < BQ; r += NT) {
                int64_t i = q0 + r;
                lse_s[r] = i < q1 ? p.lse[bn * p.Tq + i] : 0.0f;
                D_s[r] = i < q1 ? p.D[bn * p.Tq + i] : 0.0f;
                int64_t nc, lo, kr;
                row_range(p, b, kvh, i, nc, lo, kr);
                if (i >= q1) nc = 0, lo = 1, kr = 0; /* sees nothing */
                rng[3 * r] = nc, rng[3 * r + 1] = lo, rng[3 * r + 2] = kr;
            }
            __syncthreads();
            float s[4][4], dp[4][4];
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) s[ii][jj] = 0.0f, dp[ii][jj] = 0.0f;
#pragma unroll 2
            for (int e = 0; e < HD; e++) {
                float kv[4], vv[4], qv[4], dzv[4];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) kv[ii] = Ks[(ty * 4 + ii) * HP + e], vv[ii] = Vs[(ty * 4 + ii) * HP + e];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) qv[jj] = Qs[(tx + 16 * jj) * HP + e], dzv[jj] = dZs[(tx + 16 * jj) * HP + e];
#pragma unroll
                for (int ii = 0; ii < 4; ii++)
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        s[ii][jj] += kv[ii] * qv[jj];
                        dp[ii][jj] += vv[ii] * dzv[jj];
                    }
            }
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    int r = ty * 4 + ii, cq = tx + 16 * jj;
                    int64_t j = j0 + r;
                    int64_t nc = rng[3 * cq], lo = rng[3 * cq + 1], kr = rng[3 * cq + 2];
                    bool vis = j < j1 && (comp ? j < nc : (j >= lo && j <= kr));
                    float pv = vis ? expf(s[ii][jj] * p.scale - lse_s[cq]) : 0.0f;
                    Ps[r * BQ + cq] = pv;
                    DSs[r * BQ + cq] = pv * (dp[ii][jj] - D_s[cq]) * p.scale;
                }
            __syncthreads();
#pragma unroll 4
            for (int c = 0; c < BQ; c++) {
                float dzv[NC], qv[NC];
#pragma unroll
                for (int kk = 0; kk < NC; kk++) dzv[kk] = dZs[c * HP + tx + 16 * kk], qv[kk] = Qs[c * HP + tx + 16 * kk];
#pragma unroll
                for (int ii = 0; ii < 4; ii++) {
                    float pv = Ps[(ty * 4 + ii) * BQ + c], ds = DSs[(ty * 4 + ii) * BQ + c];
#pragma unroll
                    for (int kk = 0; kk < NC; kk++) {
                        dv[ii][kk] += pv * dzv[kk];
                        dk[ii][kk] += ds * qv[kk];
                    }
                }
            }
        }
    }
    float *dKb = comp ? p.dck + b * p.c_bs + kvh * p.hd : p.dk + b * p.k_bs + kvh * p.hd;
    float *dVb = comp ? p.dcv + b * p.c_bs + kvh * p.hd : p.dv + b * p.k_bs + kvh * p.hd;
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        int64_t j = j0 + ty * 4 + ii;
        if (j >= j1) continue;
#pragma unroll
        for (int kk = 0; kk < NC; kk++) {
            int e = tx + 16 * kk;
            if (e < p.hd) {
                dKb[j * ks + e] += dk[ii][kk];
                dVb[j * ks + e] += dv[ii][kk];
            }
        }
    }
}

/* ---------------- launchers ---------------- */

static size_t smem_fwd(int nc) { return (size_t)(BQ * (nc * 16 + 1) + BK * (nc * 16 + 1) + BQ * BK) * sizeof(float); }
static size_t smem_dq(int nc) { return (size_t)(2 * BQ * (nc * 16 + 1) + 2 * BK * (nc * 16 + 1) + BQ * BK) * sizeof(float); }
static size_t smem_dkv(int nc) {
    return (size_t)(2 * BK * (nc * 16 + 1) + 2 * BQ * (nc * 16 + 1) + 2 * BK * BQ + 2 * BQ) * sizeof(float) +
           (size_t)3 * BQ * sizeof(int64_t) + 8;
}

/* the template for head dim hd: 2 (<= 32), 4 (<= 64), 8 (<= 128); 0 beyond */
static int pick_nc(int64_t hd) { return hd <= 32 ? 2 : hd <= 64 ? 4 : hd <= 128 ? 8 : 0; }

template <typename K> static int launch(ps_ctx *c, K kernel, dim3 grid, size_t smem, const char *what, attn_p p) {
    if (smem > CU(c)->smem_optin)
        return ps_ctx_fail(c, "cuda %s: needs %zu bytes of shared memory per block, the device allows %zu", what, smem,
                           CU(c)->smem_optin);
    if (cu_check(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what)) return -1;
    kernel<<<grid, NT, smem, STREAM(c)>>>(p);
    return CU_LAUNCHED(c, what);
}

template <typename K>
static int launch2(ps_ctx *c, K kernel, dim3 grid, size_t smem, const char *what, attn_p p, int64_t extra) {
    if (smem > CU(c)->smem_optin)
        return ps_ctx_fail(c, "cuda %s: needs %zu bytes of shared memory per block, the device allows %zu", what, smem,
                           CU(c)->smem_optin);
    if (cu_check(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what)) return -1;
    kernel<<<grid, NT, smem, STREAM(c)>>>(p, extra);
    return CU_LAUNCHED(c, what);
}

static int check_hd(ps_ctx *c, int64_t hd, const char *what) {
    if (pick_nc(hd)) return 0;
    return ps_ctx_fail(c, "cuda %s: head_dim %lld is not supported by the device kernels (at most 128)", what, (long long)hd);
}

static int fwd(ps_ctx *c, attn_p p, const char *what) {
    if (check_hd(c, p.hd, what)) return -1;
    int64_t tiles = (p.Tq + BQ - 1) / BQ, bn = p.B * p.nh;
    if (tiles <= 0 || bn <= 0) return 0;
    if (bn > 65535) return ps_ctx_fail(c, "cuda %s: %lld sequence-heads (at most 65535 per launch)", what, (long long)bn);
    dim3 grid((unsigned)tiles, (unsigned)bn);
    switch (pick_nc(p.hd)) {
    case 2: return launch(c, k_attn_fwd<2>, grid, smem_fwd(2), what, p);
    case 4: return launch(c, k_attn_fwd<4>, grid, smem_fwd(4), what, p);
    default: return launch(c, k_attn_fwd<8>, grid, smem_fwd(8), what, p);
    }
}

static attn_p geom_params(const ps_attn_geom *g) {
    attn_p p;
    memset(&p, 0, sizeof p);
    p.B = g->B, p.Tq = g->T, p.Tk = g->T, p.nh = g->nh, p.nkv = g->nkv, p.hd = g->hd, p.grp = g->nh / g->nkv;
    p.nW = g->compressed ? g->nW : 0;
    p.q_bs = g->T * g->nh * g->hd, p.k_bs = g->T * g->nkv * g->hd, p.c_bs = p.nW * g->nkv * g->hd;
    p.compressed = g->compressed, p.W = g->W, p.S = g->S, p.LW = g->LW;
    p.scale = 1.0f / sqrtf((float)g->hd);
    return p;
}

/* Stage the geometry's host arrays woff [B, nkv] and cend [B, nW] (compressed only; and, for attn_rows, the
 * n_rows row indices) in one cu_stage call (the staging area holds one op's arrays); p gets the device
 * copies. */
static int stage_geom(ps_ctx *c, const ps_attn_geom *g, attn_p *p, const int64_t *rows, int64_t n_rows,
                      const int64_t **drows) {
    const void *h[3];
    int64_t by[3];
    void *d[3];
    int n = 0, iw = -1, ic = -1, ir = -1;
    if (g->compressed && g->woff) iw = n, h[n] = g->woff, by[n++] = g->B * g->nkv * (int64_t)sizeof(int64_t);
    if (g->compressed && g->cend) ic = n, h[n] = g->cend, by[n++] = g->B * g->nW * (int64_t)sizeof(int64_t);
    if (rows) ir = n, h[n] = rows, by[n++] = n_rows * (int64_t)sizeof(int64_t);
    if (n == 0) return 0;
    if (cu_stage(c, n, h, by, d)) return -1;
    if (iw >= 0) p->woff = (const int64_t *)d[iw];
    if (ic >= 0) p->cend = (const int64_t *)d[ic];
    if (ir >= 0) *drows = (const int64_t *)d[ir];
    return 0;
}

extern "C" int ps_cuda_attn_forward(ps_ctx *c, float *z, float *lse, const float *q, const float *k, const float *v,
                                    const float *ck, const float *cv, const ps_attn_geom *g) {
    if (cu_geom_check(c, "attention forward", g)) return -1;
    attn_p p = geom_params(g);
    if (stage_geom(c, g, &p, NULL, 0, NULL)) return -1;
    p.q = q, p.k = k, p.v = v, p.ck = ck, p.cv = cv, p.z = z, p.lse = lse;
    return fwd(c, p, "attention forward");
}

extern "C" int ps_cuda_attn_chunk(ps_ctx *c, float *z, const float *q, const float *k, const float *v, const float *ck,
                                  const float *cv, const ps_attn_frame *f) {
    if (f->Tq <= 0) return 0;
    if (f->nh < 1 || f->nkv < 1 || f->hd < 1 || f->nh % f->nkv || f->Tk < 0 ||
        (f->compressed && (f->W < 1 || f->S < 1 || f->LW < 1 || f->nW < 0)))
        return ps_ctx_fail(c, "cuda attention chunk: invalid frame nh=%lld nkv=%lld hd=%lld Tk=%lld compressed=%d W=%lld S=%lld LW=%lld "
                              "nW=%lld (want nh %% nkv == 0)",
                           (long long)f->nh, (long long)f->nkv, (long long)f->hd, (long long)f->Tk, f->compressed, (long long)f->W,
                           (long long)f->S, (long long)f->LW, (long long)f->nW);
    if (f->q_off < 0 || f->q_off + f->Tq > f->Tk)
        return ps_ctx_fail(c, "attention chunk: query rows [%lld, %lld) outside the key frame of %lld rows", (long long)f->q_off,
                           (long long)(f->q_off + f->Tq), (long long)f->Tk);
    attn_p p;
    memset(&p, 0, sizeof p);
    p.B = 1, p.Tq = f->Tq, p.Tk = f->Tk, p.nh = f->nh, p.nkv = f->nkv, p.hd = f->hd, p.grp = f->nh / f->nkv;
    p.nW = f->compressed ? f->nW : 0;
    p.compressed = f->compressed, p.W = f->W, p.S = f->S, p.LW = f->LW, p.q_off = f->q_off, p.pos0 = f->pos0;
    p.scale = 1.0f / sqrtf((float)f->hd);
    p.q = q, p.k = k, p.v = v, p.ck = ck, p.cv = cv, p.z = z, p.lse = NULL;
    if (f->compressed && f->woff) { /* the grid offsets [1, nkv] staged like ps_attn_geom.woff */
        const void *h[1] = {f->woff};
        int64_t by[1] = {f->nkv * (int64_t)sizeof(int64_t)};
        void *d[1];
        if (cu_stage(c, 1, h, by, d)) return -1;
        p.woff = (const int64_t *)d[0];
    }
    return fwd(c, p, "attention chunk");
}

extern "C" int ps_cuda_attn_backward(ps_ctx *c, float *dq, float *dk, float *dv, float *dck, float *dcv, const float *dz,
                                     const float *z, const float *lse, const float *q, const float *k, const float *v,
                                     const float *ck, const float *cv, const ps_attn_geom *g) {
    const char *what = "attention backward";
    if (cu_geom_check(c, what, g) || check_hd(c, g->hd, what)) return -1;
    attn_p p = geom_params(g);
    int64_t rows = p.B * p.nh * p.Tq;
    if (rows <= 0) return 0;
    if (p.B * p.nh > 65535) return ps_ctx_fail(c, "cuda %s: %lld sequence-heads (at most 65535)", what, (long long)(p.B * p.nh));
    if (stage_geom(c, g, &p, NULL, 0, NULL)) return -1;
    float *D = ps_ctx_workspace(c, rows);
    if (!D) return -1;
    k_attn_D<<<cu_grid(rows * 32, 256), 256, 0, STREAM(c)>>>(D, dz, z, p.B, p.Tq, p.nh, p.hd);
    if (CU_LAUNCHED(c, what)) return -1;
    p.q = q, p.k = k, p.v = v, p.ck = ck, p.cv = cv, p.z = (float *)z, p.lse = (float *)lse;
    p.dz = dz, p.D = D, p.dq = dq, p.dk = dk, p.dv = dv, p.dck = dck, p.dcv = dcv;
    int nc = pick_nc(p.hd);
    dim3 gq((unsigned)((p.Tq + BQ - 1) / BQ), (unsigned)(p.B * p.nh));
    int64_t raw_tiles = (p.Tk + BK - 1) / BK, comp_tiles = (p.nW + BK - 1) / BK;
    dim3 gk((unsigned)(raw_tiles + comp_tiles), (unsigned)(p.B * p.nkv));
    switch (nc) {
    case 2:
        return launch(c, k_attn_dq<2>, gq, smem_dq(2), what, p) || launch2(c, k_attn_dkv<2>, gk, smem_dkv(2), what, p, raw_tiles)
                   ? -1
                   : 0;
    case 4:
        return launch(c, k_attn_dq<4>, gq, smem_dq(4), what, p) || launch2(c, k_attn_dkv<4>, gk, smem_dkv(4), what, p, raw_tiles)
                   ? -1
                   : 0;
    default:
        return launch(c, k_attn_dq<8>, gq, smem_dq(8), what, p) || launch2(c, k_attn_dkv<8>, gk, smem_dkv(8), what, p, raw_tiles)
                   ? -1
                   : 0;
    }
}

/* ---------------- chosen rows: one warp per (row, head), online softmax ---------------- */

#define ROWS_MAXU 8 /* head dims up to 256 */

__global__ void k_attn_rows(float *zr, const int64_t *rows, int64_t nrows, attn_p p) {
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    int lane = threadIdx.x & 31;
    for (int64_t wi = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; wi < nrows * p.nh; wi += warps) {
        int64_t rk = wi / p.nh, n = wi % p.nh, r = rows[rk], b = r / p.Tq, t = r % p.Tq, kvh = n / p.grp;
        const float *qt = p.q + b * p.q_bs + (t * p.nh + n) * p.hd;
        float qv[ROWS_MAXU], acc[ROWS_MAXU];
#pragma unroll
        for (int u = 0; u < ROWS_MAXU; u++) {
            int64_t e = lane + 32 * u;
            qv[u] = e < p.hd ? qt[e] : 0.0f;
            acc[u] = 0.0f;
        }
        int64_t nc, lo, kr;
        row_range(p, b, kvh, t, nc, lo, kr);
        int64_t ne = nc + (kr - lo + 1);
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t en = 0; en < ne; en++) {
            const float *key = en < nc ? p.ck + b * p.c_bs + (en * p.nkv + kvh) * p.hd
                                       : p.k + b * p.k_bs + ((lo + en - nc) * p.nkv + kvh) * p.hd;
            const float *val = en < nc ? p.cv + b * p.c_bs + (en * p.nkv + kvh) * p.hd
                                       : p.v + b * p.k_bs + ((lo + en - nc) * p.nkv + kvh) * p.hd;
            float d = 0.0f;
#pragma unroll
            for (int u = 0; u < ROWS_MAXU; u++) {
                int64_t e = lane + 32 * u;
                if (e < p.hd) d += qv[u] * key[e];
            }
            float sc = warp_sum(d) * p.scale;
            if (sc > mx) {
                float f = expf(mx - sc);
                sum *= f;
#pragma unroll
                for (int u = 0; u < ROWS_MAXU; u++) acc[u] *= f;
                mx = sc;
            }
            float pv = expf(sc - mx);
            sum += pv;
#pragma unroll
            for (int u = 0; u < ROWS_MAXU; u++) {
                int64_t e = lane + 32 * u;
                if (e < p.hd) acc[u] += pv * val[e];
            }
        }
        float *out = zr + rk * p.nh * p.hd + n * p.hd;
#pragma unroll
        for (int u = 0; u < ROWS_MAXU; u++) {
            int64_t e = lane + 32 * u;
            if (e < p.hd) out[e] = acc[u] / sum;
        }
    }
}

extern "C" int ps_cuda_attn_rows(ps_ctx *c, float *z_rows, const int64_t *rows, int64_t n, const float *q, const float *k,
                                 const float *v, const float *ck, const float *cv, const ps_attn_geom *g) {
    if (n <= 0) return 0;
    if (cu_geom_check(c, "attention rows", g)) return -1;
    if (g->hd > 32 * ROWS_MAXU)
        return ps_ctx_fail(c, "cuda attention rows: head_dim %lld (at most %d)", (long long)g->hd, 32 * ROWS_MAXU);
    attn_p p = geom_params(g);
    const int64_t *drows = NULL;
    if (stage_geom(c, g, &p, rows, n, &drows)) return -1;
    p.q = q, p.k = k, p.v = v, p.ck = ck, p.cv = cv;
    k_attn_rows<<<cu_grid(n * g->nh * 32, 256), 256, 0, STREAM(c)>>>(z_rows, drows, n, p);
    return CU_LAUNCHED(c, "attention rows");
}

/* ---------------- materialised probabilities (pattern hooks) ---------------- */

/* column c of row (b, n, t): its key (NULL when the query does not see it) */
__device__ __forceinline__ const float *col_key(const attn_p &p, const float *kb, const float *ckb, int64_t t, int64_t c,
                                                int64_t nwin, int64_t kvh) {
    if (!p.compressed) return c <= t ? kb + (c * p.nkv + kvh) * p.hd : NULL;
    if (c < p.nW) return c < nwin ? ckb + (c * p.nkv + kvh) * p.hd : NULL;
    int64_t tp = t - p.LW + 1 + (c - p.nW);
    return tp >= 0 ? kb + (tp * p.nkv + kvh) * p.hd : NULL;
}

__global__ void k_attn_probs(float *probs, attn_p p, int64_t nc) {
    extern __shared__ float qsh[];
    __shared__ float sh[32];
    for (int64_t row = blockIdx.x; row < p.B * p.nh * p.Tq; row += gridDim.x) {
        int64_t b = row / (p.nh * p.Tq), n = (row / p.Tq) % p.nh, t = row % p.Tq, kvh = n / p.grp;
        const float *qt = p.q + b * p.q_bs + (t * p.nh + n) * p.hd;
        const float *kb = p.k + b * p.k_bs, *ckb = p.compressed && p.nW ? p.ck + b * p.c_bs : NULL;
        int64_t nwin = p.compressed ? d_geom_seen(p, b, kvh, t) : 0;
        __syncthreads();
        for (int64_t e = threadIdx.x; e < p.hd; e += blockDim.x) qsh[e] = qt[e];
        __syncthreads();
        float *pr = probs + row * nc;
        float mx = -INFINITY;
        for (int64_t col = threadIdx.x; col < nc; col += blockDim.x) {
            const float *key = col_key(p, kb, ckb, t, col, nwin, kvh);
            float s = -INFINITY;
            if (key) {
                float d = 0.0f;
                for (int64_t e = 0; e < p.hd; e++) d += qsh[e] * key[e];
                s = d * p.scale;
            }
            pr[col] = s;
            mx = fmaxf(mx, s);
        }
        mx = block_max(mx, sh);
        float acc = 0.0f;
        for (int64_t col = threadIdx.x; col < nc; col += blockDim.x) {
            float s = pr[col], e = s == -INFINITY ? 0.0f : expf(s - mx);
            pr[col] = e;
            acc += e;
        }
        float sum = block_sum(acc, sh), inv = 1.0f / sum;
        for (int64_t col = threadIdx.x; col < nc; col += blockDim.x) pr[col] *= inv;
    }
}

extern "C" int ps_cuda_attn_probs(ps_ctx *c, float *probs, const float *q, const float *k, const float *ck,
                                  const ps_attn_geom *g) {
    /* probs [B, nh, T, ncols]: ncols is the row stride, checked against the geometry before the launch */
    if (cu_geom_check(c, "attention probabilities", g)) return -1;
    attn_p p = geom_params(g);
    int64_t rows = p.B * p.nh * p.Tq;
    if (rows <= 0) return 0;
    if (stage_geom(c, g, &p, NULL, 0, NULL)) return -1;
    p.q = q, p.k = k, p.ck = ck;
    k_attn_probs<<<cu_grid(rows, 1), 128, (size_t)g->hd * sizeof(float), STREAM(c)>>>(probs, p, g->ncols);
    return CU_LAUNCHED(c, "attention probabilities");
}

__global__ void k_attn_out(float *z, const float *probs, attn_p p, int64_t nc) {
    for (int64_t row = blockIdx.x; row < p.B * p.nh * p.Tq; row += gridDim.x) {
        int64_t b = row / (p.nh * p.Tq), n = (row / p.Tq) % p.nh, t = row % p.Tq, kvh = n / p.grp;
        const float *pr = probs + row * nc;
        for (int64_t e = threadIdx.x; e < p.hd; e += blockDim.x) {
            float acc = 0.0f;
            if (!p.compressed)
                for (int64_t col = 0; col <= t; col++) acc += pr[col] * p.v[b * p.k_bs + (col * p.nkv + kvh) * p.hd + e];
            else {
                for (int64_t col = 0; col < p.nW; col++) acc += pr[col] * p.cv[b * p.c_bs + (col * p.nkv + kvh) * p.hd + e];
                for (int64_t col = p.nW; col < nc; col++) {
                    int64_t tp = t - p.LW + 1 + (col - p.nW);
                    if (tp >= 0) acc += pr[col] * p.v[b * p.k_bs + (tp * p.nkv + kvh) * p.hd + e];
                }
            }
            z[b * p.q_bs + (t * p.nh + n) * p.hd + e] = acc;
        }
    }
}

extern "C" int ps_cuda_attn_out(ps_ctx *c, float *z, const float *probs, const float *v, const float *cv,
                                const ps_attn_geom *g) {
    if (cu_geom_check(c, "attention output", g)) return -1; /* ncols: the row stride of probs */
    attn_p p = geom_params(g);
    int64_t rows = p.B * p.nh * p.Tq;
    if (rows <= 0) return 0;
    p.v = v, p.cv = cv;
    k_attn_out<<<cu_grid(rows, 1), cu_row_threads(g->hd), 0, STREAM(c)>>>(z, probs, p, g->ncols);
    return CU_LAUNCHED(c, "attention output");
}
