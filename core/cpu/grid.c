/* grid.c — the CPU gate regulariser (docs/mitigations.md): the entropy of each KV head's mean gate over its
 * present windows (absent windows, whose alpha is 0, are skipped), and its gradient. */
#include <math.h>
#include <string.h>

#include "core/cpu/cpu.h"

int ps_cpu_gate_entropy(ps_ctx *ctx, double *value, float *dalpha, const float *alpha, int64_t B, int64_t nW, int64_t nkv,
                        int64_t W, double weight) {
    double *m = (double *)(void *)ps_ctx_workspace(ctx, 2 * W); /* 2W floats: room for W doubles */
    if (!m) return -1;
    for (int64_t g = 0; g < nkv; g++) {
        memset(m, 0, (size_t)W * sizeof(double));
        int64_t n = 0;
        for (int64_t bj = 0; bj < B * nW; bj++) {
            const float *al = alpha + (bj * nkv + g) * W;
            double s = 0;
            for (int64_t i = 0; i < W; i++) s += al[i];
            if (s <= 0) continue; /* an absent window */
            for (int64_t i = 0; i < W; i++) m[i] += al[i];
            n++;
        }
        if (n == 0) continue;
        double H = 0;
        for (int64_t i = 0; i < W; i++) {
            m[i] /= (double)n;
            if (m[i] > 0) H -= m[i] * log(m[i]);
        }
        value[0] += weight * (log((double)W) - H);
        if (!dalpha) continue;
        for (int64_t i = 0; i < W; i++) m[i] = weight * (log(m[i] > 1e-30 ? m[i] : 1e-30) + 1.0) / (double)n;
        for (int64_t bj = 0; bj < B * nW; bj++) {
            const float *al = alpha + (bj * nkv + g) * W;
            double s = 0;
            for (int64_t i = 0; i < W; i++) s += al[i];
            if (s <= 0) continue;
            float *dal = dalpha + (bj * nkv + g) * W;
            for (int64_t i = 0; i < W; i++) dal[i] += (float)m[i];
        }
    }
    return 0;
}
