/* hd_math.h — the arithmetic the CPU backend and the CUDA kernels share term for term: the fixed-order dot
 * products and the window/chunk visibility counts. Valid C11 and CUDA C++: PS_HD is __host__ __device__
 * under nvcc and nothing in C, so the CPU reference (core/ops.h, core/cpu/) and the device bodies
 * (core/cuda/grid_bodies.h, v4_bodies.h) call the same functions. Owns nothing else; no state. */
#ifndef PS_HD_MATH_H
#define PS_HD_MATH_H

#include <stdint.h>

#ifndef PS_HD
#ifdef __CUDACC__
#define PS_HD __host__ __device__
#else
#define PS_HD
#endif
#endif

/* Dot product of a[n] and b[n] in float with 16 interleaved partial sums added in a fixed order: the same
 * result on every call and thread count, and the loop vectorises (an in-order float sum does not). */
static inline PS_HD float ps_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* Σ a[i]·b[i] in double with 8 interleaved accumulators added in a fixed order (vectorises; the same
 * result on every call). */
static inline PS_HD double ps_dot_d(const float *a, const float *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* Number of compressed windows ended by position t: windows j with jS + W - 1 <= t, capped at nW. */
static inline PS_HD int64_t ps_windows_seen(int64_t t, int64_t W, int64_t S, int64_t nW) {
    if (t < W - 1) return 0;
    int64_t n = (t - W + 1) / S + 1;
    return n < nW ? n : nW;
}

/* Windows ended by position t on a grid that starts at offset `off` (windows cover jS + off + i). */
static inline PS_HD int64_t ps_windows_seen_at(int64_t t, int64_t off, int64_t W, int64_t S, int64_t nW) {
    return ps_windows_seen(t - off, W, S, nW);
}

/* Window start offset of (sequence b, KV head g) under woff [B, nkv] (NULL: 0). */
static inline PS_HD int64_t ps_woff(const int64_t *woff, int64_t b, int64_t nkv, int64_t g) {
    return woff ? woff[b * nkv + g] : 0;
}

/* Compressed entries position t sees: with chunk ends cend [nW] of its sequence (increasing), the count of
 * ends <= t; else (cend NULL) the windows of the grid at offset off that have ended. */
static inline PS_HD int64_t ps_entries_seen(const int64_t *cend, int64_t off, int64_t W, int64_t S, int64_t nW, int64_t t) {
    if (cend) {
        int64_t lo = 0, hi = nW;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (cend[mid] <= t) lo = mid + 1;
            else hi = mid;
        }
        return lo;
    }
    return ps_windows_seen_at(t, off, W, S, nW);
}

/* The first position that sees entry j (chunk end cend[j], or jS + off + W − 1). */
static inline PS_HD int64_t ps_entry_first_seen(const int64_t *cend, int64_t off, int64_t W, int64_t S, int64_t j) {
    return cend ? cend[j] : j * S + off + W - 1;
}

#endif
