/* compressor.cu — the compressor of compressed attention on the device (SPEC §2): per-offset gate logits
 * (one warp per logit) and their softmax over the window, payloads as strided-batched GEMMs (one batch
 * entry per window offset; the shared payload is one GEMM and a gather), pooling, and the backward of
 * each. Sums into shared gradients run in a fixed order (the CPU's order), never with atomics. */
#include "core/cuda/cuda_internal.cuh"

#define T256 256

/* ---------------- gate ---------------- */

/* z[idx, i] = bias[i, g] + u[i, g, :] · a[b, jS + i, :], one warp per logit (idx = (b, j, g)) */
__global__ void k_gate_logits(float *z, const float *a, const float *u, const float *bias, int64_t B, int64_t T, int64_t d,
                              int64_t nW, int64_t W, int64_t S, int64_t nkv) {
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), lane = threadIdx.x & 31;
    for (int64_t wi = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; wi < B * nW * nkv * W; wi += warps) {
        int64_t idx = wi / W, i = wi % W, b = idx / (nW * nkv), j = (idx / nkv) % nW, g = idx % nkv;
        const float *x = a + (b * T + j * S + i) * d, *w = u + (i * nkv + g) * d;
        float acc = 0.0f;
        for (int64_t e = lane; e < d; e += 32) acc += w[e] * x[e];
        acc = warp_sum(acc);
        if (lane == 0) z[wi] = bias[i * nkv + g] + acc;
    }
}

__global__ void k_gate_softmax(float *z, float *alpha, int64_t n, int64_t W, int uniform) {
    GS_LOOP(idx, n) {
        float *zz = z + idx * W, *al = alpha + idx * W;
        if (uniform) {
            for (int64_t i = 0; i < W; i++) zz[i] = 0.0f, al[i] = 1.0f / (float)W;
            continue;
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < W; i++) mx = fmaxf(mx, zz[i]);
        for (int64_t i = 0; i < W; i++) sum += (al[i] = expf(zz[i] - mx));
        for (int64_t i = 0; i < W; i++) al[i] /= sum;
    }
}

extern "C" int ps_cuda_gate_base(ps_ctx *c, float *z, float *alpha, const float *a, const float *u, const float *bias, int64_t B,
                            int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkv) {
    int64_t n = B * nW * nkv;
    if (n <= 0 || W <= 0) return 0;
    if (u) {
        k_gate_logits<<<cu_grid(n * W * 32, T256), T256, 0, STREAM(c)>>>(z, a, u, bias, B, T, d, nW, W, S, nkv);
        if (CU_LAUNCHED(c, "gate")) return -1;
    }
    k_gate_softmax<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(z, alpha, n, W, !u);
    return CU_LAUNCHED(c, "gate softmax");
}

/* dalpha becomes the logit gradient: alpha ⊙ (dalpha − Σ alpha·dalpha) */
__global__ void k_gate_softmax_backward(float *dalpha, const float *alpha, int64_t n, int64_t W) {
    GS_LOOP(idx, n) {
        const float *al = alpha + idx * W;
        float *dal = dalpha + idx * W;
        double dot = 0;
        for (int64_t i = 0; i < W; i++) dot += (double)al[i] * dal[i];
        for (int64_t i = 0; i < W; i++) dal[i] = al[i] * (dal[i] - (float)dot);
    }
}

/* du[i, g, e] += Σ_{b, j} dz[b, j, g, i] · a[b, jS + i, e] (sequences and windows in order) */
__global__ void k_gate_du(float *du, const float *dz, const float *a, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                          int64_t S, int64_t nkv) {
    GS_LOOP(idx, W * nkv * d) {
        int64_t ig = idx / d, e = idx % d, i = ig / nkv, g = ig % nkv;
        float acc = du[idx];
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nW; j++) acc += dz[((b * nW + j) * nkv + g) * W + i] * a[(b * T + j * S + i) * d + e];
        du[idx] = acc;
    }
}

__global__ void k_gate_dbias(float *dc, const float *dz, int64_t B, int64_t nW, int64_t W, int64_t nkv) {
    GS_LOOP(ig, W * nkv) {
        int64_t i = ig / nkv, g = ig % nkv;
        float acc = dc[ig];
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < nW; j++) acc += dz[((b * nW + j) * nkv + g) * W + i];
        dc[ig] = acc;
    }
}

/* da[b, t, e] += Σ over the windows j holding t (offset i = t − jS), heads g: dz · u[i, g, e] */
__global__ void k_gate_da(float *da, const float *dz, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                          int64_t S, int64_t nkv) {
    GS_LOOP(idx, B * T * d) {
        int64_t e = idx % d, t = (idx / d) % T, b = idx / (d * T);
        int64_t j0 = t - W + 1 > 0 ? (t - W + 1 + S - 1) / S : 0, j1 = t / S < nW - 1 ? t / S : nW - 1;
        if (j0 > j1) continue;
        float acc = da[idx];
        for (int64_t j = j0; j <= j1; j++) {
            int64_t i = t - j * S;
            for (int64_t g = 0; g < nkv; g++) acc += dz[((b * nW + j) * nkv + g) * W + i] * u[(i * nkv + g) * d + e];
        }
        da[idx] = acc;
    }
}

extern "C" int ps_cuda_gate_base_backward(ps_ctx *c, float *da, float *du, float *dc, float *dalpha, const float *alpha,
                                     const float *a, const float *u, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                                     int64_t S, int64_t nkv) {
    int64_t n = B * nW * nkv;
    if (n <= 0 || W <= 0) return 0;
    k_gate_softmax_backward<<<cu_grid(n, T256), T256, 0, STREAM(c)>>>(dalpha, alpha, n, W);
    k_gate_du<<<cu_grid(W * nkv * d, T256), T256, 0, STREAM(c)>>>(du, dalpha, a, B, T, d, nW, W, S, nkv);
    k_gate_dbias<<<cu_grid(W * nkv, T256), T256, 0, STREAM(c)>>>(dc, dalpha, B, nW, W, nkv);
    k_gate_da<<<cu_grid(B * T * d, T256), T256, 0, STREAM(c)>>>(da, dalpha, u, B, T, d, nW, W, S, nkv);
    return CU_LAUNCHED(c, "gate backward");
}

/* ---------------- payloads ---------------- */

/* P[b, j, i, :] = scratch[b, jS + i, :] */
__global__ void k_payload_gather(float *P, const float *scratch, int64_t B, int64_t T, int64_t nW, int64_t W, int64_t S,
                                 int64_t n) {
    GS_LOOP(idx, B * nW * W * n) {
        int64_t e = idx % n, i = (idx / n) % W, bj = idx / (n * W), b = bj / nW, j = bj % nW;
        P[idx] = scratch[(b * T + j * S + i) * n + e];
    }
}

/* scratch[b, t, :] = Σ over the windows j holding t: dP[b, j, t − jS, :] (windows in order) */
__global__ void k_payload_scatter(float *scratch, const float *dP, int64_t B, int64_t T, int64_t nW, int64_t W, int64_t S,
                                  int64_t n) {
    GS_LOOP(idx, B * T * n) {
        int64_t e = idx % n, t = (idx / n) % T, b = idx / (n * T);
        int64_t j0 = t - W + 1 > 0 ? (t - W + 1 + S - 1) / S : 0, j1 = t / S < nW - 1 ? t / S : nW - 1;
        float acc = 0.0f;
        for (int64_t j = j0; j <= j1; j++) acc += dP[((b * nW + j) * W + (t - j * S)) * n + e];
        scratch[idx] = acc;
    }
}

extern "C" int ps_cuda_payload_base(ps_ctx *c, float *P, const float *a, const float *C, int shared, float *scratch, int64_t B,
                               int64_t T, int64_t d, int64_t nW, int64_t W, int64_t S, int64_t nkvhd) {
    if (nW <= 0 || B <= 0) return 0;
    if (shared) {
        if (ps_cuda_matmul(c, scratch, a, C, B * T, d, nkvhd, 0)) return -1;
        k_payload_gather<<<cu_grid(B * nW * W * nkvhd, T256), T256, 0, STREAM(c)>>>(P, scratch, B, T, nW, W, S, nkvhd);
        return CU_LAUNCHED(c, "payload (shared)");
    }
    /* per offset i: P_i [rows (b, j), nkvhd] (row stride W·nkvhd) = A_i [rows, d] (row stride S·d) · C_i^T; one
     * batched GEMM over the offsets, for all sequences at once when T = nW·S, else per sequence */
    int batched = T == nW * S;
    int64_t M = batched ? B * nW : nW, nb = batched ? 1 : B;
    for (int64_t b = 0; b < nb; b++)
        if (cu_gemm(c, "payload", 0, 1, M, nkvhd, d, 1.0f, a + b * T * d, S * d, d, C, d, nkvhd * d, 0.0f, P + b * nW * W * nkvhd,
                    W * nkvhd, nkvhd, W))
            return -1;
    return 0;
}

extern "C" int ps_cuda_payload_base_backward(ps_ctx *c, float *da, float *dC, const float *dP, const float *a, const float *C,
                                        int shared, float *scratch, int64_t B, int64_t T, int64_t d, int64_t nW, int64_t W,
                                        int64_t S, int64_t nkvhd) {
    if (nW <= 0 || B <= 0) return 0;
    if (shared) {
        k_payload_scatter<<<cu_grid(B * T * nkvhd, T256), T256, 0, STREAM(c)>>>(scratch, dP, B, T, nW, W, S, nkvhd);
        if (CU_LAUNCHED(c, "payload backward (shared)")) return -1;
        return ps_cuda_matmul_backward(c, da, dC, scratch, a, C, B * T, d, nkvhd);
    }
    int batched = T == nW * S;
    int64_t M = batched ? B * nW : nW, nb = batched ? 1 : B;
    /* dC_i [nkvhd, d] += dP_i^T · A_i */
    for (int64_t b = 0; b < nb; b++)
        if (cu_gemm(c, "payload backward (weight)", 1, 0, nkvhd, d, M, 1.0f, dP + b * nW * W * nkvhd, W * nkvhd, nkvhd,
                    a + b * T * d, S * d, d, 1.0f, dC, d, nkvhd * d, W))
            return -1;
    /* A_i rows += dP_i · C_i: offsets own disjoint rows when W <= S (one batched GEMM); overlapping windows
     * add offset by offset, in order */
    for (int64_t b = 0; b < nb; b++) {
        if (W <= S) {
            if (cu_gemm(c, "payload backward (input)", 0, 0, M, d, nkvhd, 1.0f, dP + b * nW * W * nkvhd, W * nkvhd, nkvhd, C,
                        d, nkvhd * d, 1.0f, da + b * T * d, S * d, d, W))
                return -1;
            continue;
        }
        for (int64_t i = 0; i < W; i++)
            if (cu_gemm(c, "payload backward (input)", 0, 0, M, d, nkvhd, 1.0f, dP + b * nW * W * nkvhd + i * nkvhd, W * nkvhd,
                        0, C + i * nkvhd * d, d, 0, 1.0f, da + b * T * d + i * d, S * d, 0, 1))
                return -1;
    }
    return 0;
}

/* ---------------- pooling ---------------- */

__global__ void k_pool(float *out, const float *alpha, const float *P, int64_t n, int64_t W, int64_t nkv, int64_t hd) {
    GS_LOOP(o, n * hd) {
        int64_t idx = o / hd, e = o % hd, bj = idx / nkv, g = idx % nkv;
        const float *al = alpha + idx * W;
        float acc = 0.0f;
        for (int64_t i = 0; i < W; i++) acc += al[i] * P[(bj * W + i) * nkv * hd + g * hd + e];
        out[o] = acc;
    }
}

extern "C" int ps_cuda_pool(ps_ctx *c, float *out, const float *alpha, const float *P, int64_t B, int64_t nW, int64_t W,
                            int64_t nkv, int64_t hd) {
    int64_t n = B * nW * nkv;
    if (n <= 0) return 0;
    k_pool<<<cu_grid(n * hd, T256), T256, 0, STREAM(c)>>>(out, alpha, P, n, W, nkv, hd);
    return CU_LAUNCHED(c, "pool");
}

/* dP[b, j, i, g·hd + e] = alpha[b, j, g, i] · dout[b, j, g, e] */
__global__ void k_pool_dP(float *dP, const float *dout, const float *alpha, int64_t n_bj, int64_t W, int64_t nkv, int64_t hd) {
    GS_LOOP(o, n_bj * W * nkv * hd) {
        int64_t e = o % hd, g = (o / hd) % nkv, i = (o / (hd * nkv)) % W, bj = o / (hd * nkv * W);
        int64_t idx = bj * nkv + g;
        dP[o] = alpha[idx * W + i] * dout[idx * hd + e];
    }
}

/* dalpha[b, j, g, i] = dout[b, j, g, :] · P[b, j, i, g·hd ...], one warp each */
__global__ void k_pool_dalpha(float *dalpha, const float *dout, const float *P, int64_t n, int64_t W, int64_t nkv, int64_t hd) {
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), lane = threadIdx.x & 31;
    for (int64_t wi = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; wi < n * W; wi += warps) {
        int64_t idx = wi / W, i = wi % W, bj = idx / nkv, g = idx % nkv;
        const float *dy = dout + idx * hd, *p = P + (bj * W + i) * nkv * hd + g * hd;
        float acc = 0.0f;
        for (int64_t e = lane; e < hd; e += 32) acc += dy[e] * p[e];
        acc = warp_sum(acc);
        if (lane == 0) dalpha[wi] = acc;
    }
}

extern "C" int ps_cuda_pool_backward(ps_ctx *c, float *dalpha, float *dP, const float *dout, const float *alpha,
                                     const float *P, int64_t B, int64_t nW, int64_t W, int64_t nkv, int64_t hd) {
    int64_t n = B * nW * nkv;
    if (n <= 0) return 0;
    k_pool_dP<<<cu_grid(B * nW * W * nkv * hd, T256), T256, 0, STREAM(c)>>>(dP, dout, alpha, B * nW, W, nkv, hd);
    k_pool_dalpha<<<cu_grid(n * W * 32, T256), T256, 0, STREAM(c)>>>(dalpha, dout, P, n, W, nkv, hd);
    return CU_LAUNCHED(c, "pool backward");
}
