#include "core/chunks.h"

#include <math.h>

uint32_t ps_chunk_hash(int32_t prev, int32_t cur) {
    uint32_t u = (uint32_t)cur * 0x9E3779B1u + ((uint32_t)prev + 1u) * 0x85EBCA77u + 0x27D4EB2Fu;
    u ^= u >> 16; /* murmur3's finaliser */
    u *= 0x85EBCA6Bu;
    u ^= u >> 13;
    u *= 0xC2B2AE35u;
    u ^= u >> 16;
    return u;
}

/* E[L] for a boundary chance q per eligible position. */
static double mean_len(double q, int64_t m, int64_t W) {
    double e = (double)m, p = 1.0;
    for (int64_t k = 1; k <= W - m; k++) e += (p *= 1.0 - q);
    return e;
}

uint64_t ps_chunk_threshold(const ps_config *c) {
    int64_t m = c->chunk_min, W = c->window, S = c->stride;
    double lo = 0.0, hi = 1.0; /* mean_len falls from W (q = 0) to m (q = 1) */
    for (int it = 0; it < 200; it++) {
        double mid = 0.5 * (lo + hi);
        if (mean_len(mid, m, W) > (double)S) lo = mid;
        else hi = mid;
    }
    double th = floor(0.5 * (lo + hi) * 4294967296.0 + 0.5);
    return th < 0 ? 0 : th > 4294967296.0 ? (uint64_t)1 << 32 : (uint64_t)th;
}

double ps_chunk_expected_len(const ps_config *c) {
    return mean_len((double)ps_chunk_threshold(c) / 4294967296.0, c->chunk_min, c->window);
}

int64_t ps_content_chunks(const ps_config *c, const int32_t *tok, int64_t T, int64_t nC, int64_t *cs, int64_t *cl) {
    uint64_t th = ps_chunk_threshold(c);
    int64_t m = c->chunk_min, W = c->window, n = 0, s = 0;
    for (int64_t t = 0; t < T && n < nC; t++) {
        int64_t len = t - s + 1;
        if (len < m) continue;
        if (len >= W || (uint64_t)ps_chunk_hash(t > 0 ? tok[t - 1] : -1, tok[t]) < th) {
            cs[n] = s, cl[n] = len, n++;
            s = t + 1;
        }
    }
    for (int64_t j = n; j < nC; j++) cs[j] = cl[j] = 0;
    return n;
}
