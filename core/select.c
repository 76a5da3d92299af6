/* select.c — InfLLM-v2 block-sparse selection attention over plain arrays (select.h). The fast paths run
 * rows in parallel (OpenMP) in float32; the references (*_ref) follow the definitions in double. */
#include "core/select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

int64_t ps_select_n_windows(int64_t L, int64_t K, int64_t S) { return L < K || K < 1 || S < 1 ? 0 : (L - K) / S + 1; }

int64_t ps_select_n_blocks(const ps_select_cfg *c, int64_t L) { return L <= 0 ? 0 : (L + c->block - 1) / c->block; }

int ps_select_cfg_check(const ps_select_cfg *c, const char *src, const char *const nm[6], ps_error *err) {
    if (c->stride < 1) return ps_fail(err, "%s: key \"%s\" is %lld (must be >= 1)", src, nm[1], (long long)c->stride);
    if (c->kernel < c->stride)
        return ps_fail(err, "%s: key \"%s\" is %lld, less than \"%s\" %lld (windows must cover every token)", src, nm[0],
                       (long long)c->kernel, nm[1], (long long)c->stride);
    if (c->block < 1 || c->block % c->stride)
        return ps_fail(err, "%s: key \"%s\" is %lld, not a positive multiple of \"%s\" %lld", src, nm[2], (long long)c->block,
                       nm[1], (long long)c->stride);
    if (c->init_blocks < 0) return ps_fail(err, "%s: key \"%s\" is %lld (must be >= 0)", src, nm[3], (long long)c->init_blocks);
    if (c->local_blocks < 0) return ps_fail(err, "%s: key \"%s\" is %lld (must be >= 0)", src, nm[4], (long long)c->local_blocks);
    if (c->topk < 0) return ps_fail(err, "%s: key \"%s\" is %lld (must be >= 0)", src, nm[5], (long long)c->topk);
    if (c->topk + c->local_blocks < 1)
        return ps_fail(err, "%s: key \"%s\" is %lld with no local blocks: a row would attend nothing", src, nm[5], (long long)c->topk);
    return 0;
}

/* keys of a level visible to position t: windows j with jS + K − 1 <= t, at most N */
static int64_t n_visible(int64_t t, int64_t N, int64_t K, int64_t S) {
    if (t < K - 1) return 0;
    int64_t v = (t - K + 1) / S + 1;
    return v < N ? v : N;
}

static float dotf(const float *a, const float *b, int64_t D) {
    float s = 0;
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* a·b over D floats in 16 partial sums (two vector registers' worth: the compiler turns the inner loop into
 * vector multiply-adds, and the two chains hide their latency); the tail one by one */
static inline float dotv(const float *a, const float *b, int64_t D) {
    float acc[16] = {0}, s = 0;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
        for (int u = 0; u < 16; u++) acc[u] += a[d + u] * b[d + u];
    for (; d < D; d++) s += a[d] * b[d];
    for (int u = 0; u < 8; u++) acc[u] += acc[u + 8];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + s;
}

/* out[0..4) = sc · q·k_r for the four keys k_r = k0 + r·stride: the four sums run side by side (AVX2: one
 * vector multiply-add chain per key, q loaded once for the four, and the four vectors summed across together) */
static inline void dots4(float *out, const float *q, const float *k0, int64_t stride, int64_t D, float sc) {
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *k1 = k0 + stride, *k2 = k1 + stride, *k3 = k2 + stride;
        for (int64_t d = 0; d < D; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
        }
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        _mm_storeu_ps(out, _mm_mul_ps(r, _mm_set1_ps(sc)));
        return;
    }
#endif
    for (int r = 0; r < 4; r++) out[r] = dotv(q, k0 + r * stride, D) * sc;
}

/* ---------------- forward ---------------- */

// ck: [N, Hkv, D]; k: [L, Hkv, D]
void ps_select_compress_forward(float *ck, const float *k, int64_t L, int64_t Hkv, int64_t D, int64_t K, int64_t S) {
    int64_t N = ps_select_n_windows(L, K, S), W = Hkv * D;
#pragma omp parallel for schedule(static) if (N * K * W > 65536)
    for (int64_t j = 0; j < N; j++) {
        float *o = ck + j * W;
        memset(o, 0, (size_t)W * sizeof(float));
        for (int64_t r = 0; r < K; r++) {
            const float *x = k + (j * S + r) * W;
            for (int64_t c = 0; c < W; c++) o[c] += x[c];
        }
        for (int64_t c = 0; c < W; c++) o[c] /= (float)K;
    }
}

// P: [n, Hkv, N1]; q: [n, H, D]; k1: [N1, Hkv, D]; k2: [N2, Hkv, D]
void ps_select_scores_forward(float *P, const float *q, int64_t n, int64_t pos0, const float *k1, int64_t N1,
                              const float *k2, int64_t N2, int64_t H, int64_t Hkv, int64_t D, int64_t K, int64_t S) {
    int64_t G = H / Hkv;
    float sc = 1.0f / sqrtf((float)D);
    if (N1 <= 0) return; /* no level-1 key yet: P is empty (and may be NULL) */
    /* (row, KV head) pairs in parallel: a decode row's KV heads on different threads */
#pragma omp parallel for schedule(static) if (n * N1 * H * D > 65536)
    for (int64_t ih = 0; ih < n * Hkv; ih++) {
        int64_t i = ih / Hkv, h = ih % Hkv, t = pos0 + i, v1 = n_visible(t, N1, K, S), v2 = n_visible(t, N2, 4 * K, 4 * S);
        float *p = P + (i * Hkv + h) * N1;
        memset(p, 0, (size_t)N1 * sizeof(float));
        if (!v2) continue;
        for (int64_t g = h * G; g < (h + 1) * G; g++) {
            const float *qg = q + (i * H + g) * D;
            float mx = -INFINITY, sum = 0;
            for (int64_t v = 0; v < v2; v++) {
                float s = dotv(qg, k2 + (v * Hkv + h) * D, D) * sc;
                mx = s > mx ? s : mx;
            }
            for (int64_t v = 0; v < v2; v++) sum += expf(dotv(qg, k2 + (v * Hkv + h) * D, D) * sc - mx);
            float lse = mx + logf(sum);
            for (int64_t j = 0; j < v1; j++) p[j] += expf(dotv(qg, k1 + (j * Hkv + h) * D, D) * sc - lse);
        }
    }
}

static int forced(int64_t b, int64_t t, const ps_select_cfg *c) {
    int64_t qb = t / c->block;
    return b < c->init_blocks || (b >= qb - c->local_blocks && b <= qb);
}

// bs: [n, Hkv, nb]; P: [n, Hkv, N1]
void ps_select_block_scores_forward(float *bs, const float *P, int64_t n, int64_t pos0, int64_t N1, int64_t nb, int64_t Hkv,
                                    const ps_select_cfg *c) {
    int64_t m = c->block / c->stride;
#pragma omp parallel for schedule(static) if (n * nb * Hkv * m > 65536)
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < Hkv; h++) {
            const float *p = P + (i * Hkv + h) * N1;
            float *o = bs + (i * Hkv + h) * nb;
            for (int64_t b = 0; b < nb; b++) {
                int64_t lo = m * b - 1, hi = m * b + m; /* [lo, hi) */
                lo = lo < 0 ? 0 : lo;
                hi = hi > N1 ? N1 : hi;
                float mx = 0;
                for (int64_t j = lo; j < hi; j++) mx = p[j] > mx ? p[j] : mx;
                o[b] = forced(b, pos0 + i, c) ? INFINITY : mx;
            }
        }
}

/* a ranks before b: the higher score, then the lower index (NaN as the lowest score) */
static int before(float sa, int64_t ia, float sb, int64_t ib) {
    if (isnan(sa)) sa = -INFINITY;
    if (isnan(sb)) sb = -INFINITY;
    return sa > sb || (sa == sb && ia < ib);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// blocks: [n, Hkv, slots]; bs: [n, Hkv, nb]
void ps_select_topk_forward(float *blocks, const float *bs, int64_t n, int64_t pos0, int64_t nb, int64_t Hkv,
                            const ps_select_cfg *c) {
    int64_t K = ps_select_slots(c), keep = K < nb ? K : nb;
#pragma omp parallel for schedule(static) if (n * Hkv * nb > 16384)
    for (int64_t i = 0; i < n; i++) {
        int64_t qb = (pos0 + i) / c->block;
        for (int64_t h = 0; h < Hkv; h++) {
            const float *s = bs + (i * Hkv + h) * nb;
            float *o = blocks + (i * Hkv + h) * K;
            /* o[0..cnt) holds the best blocks so far in rank order (insertion into a sorted list) */
            int64_t cnt = 0;
            for (int64_t b = 0; b < nb && keep > 0; b++) {
                if (cnt == keep && !before(s[b], b, s[(int64_t)o[cnt - 1]], (int64_t)o[cnt - 1])) continue;
                int64_t at = cnt < keep ? cnt++ : keep - 1;
                while (at > 0 && before(s[b], b, s[(int64_t)o[at - 1]], (int64_t)o[at - 1])) {
                    o[at] = o[at - 1];
                    at--;
                }
                o[at] = (float)b;
            }
            int64_t w = 0;
            for (int64_t r = 0; r < cnt; r++)
                if ((int64_t)o[r] <= qb) o[w++] = o[r];
            qsort(o, (size_t)w, sizeof(float), cmp_f);
            for (; w < K; w++) o[w] = -1.0f;
        }
    }
}

int ps_select_blocks_check(const float *blocks, int64_t n, int64_t Hkv, int64_t slots, int64_t nb, const char *what,
                           ps_error *err) {
    for (int64_t i = 0; i < n * Hkv * slots; i++) {
        float b = blocks[i];
        if (!(b >= -1.0f && b < (float)nb) || b != floorf(b))
            return ps_fail(err, "%s: row %lld, KV head %lld, slot %lld holds %g (a block id in [0, %lld) or -1 for an empty slot)",
                           what, (long long)(i / (Hkv * slots)), (long long)(i / slots % Hkv), (long long)(i % slots),
                           (double)b, (long long)nb);
    }
    return 0;
}

void ps_select_slot_keys(const float *row, int64_t r, int64_t t, int64_t block, int64_t *j0, int64_t *j1) {
    int64_t b = (int64_t)row[r];
    *j0 = *j1 = 0;
    if (b < 0) return;
    for (int64_t e = 0; e < r; e++)
        if ((int64_t)row[e] == b) return;
    int64_t a = b * block, z = a + block;
    z = z > t + 1 ? t + 1 : z;
    if (a < z) *j0 = a, *j1 = z;
}

/* Row i, KV head h, plainly: two passes over the keys the row attends (the fallback when attn_tile's workspace
 * cannot be had) */
static void attn_row_nobuf(float *z, float *lse, const float *q, const float *k, const float *v, const float *row, int64_t ns,
                           int64_t i, int64_t t, int64_t h, int64_t block, int64_t H, int64_t Hkv, int64_t D, float sc) {
    int64_t G = H / Hkv;
    for (int64_t g = h * G; g < (h + 1) * G; g++) {
        const float *qg = q + (i * H + g) * D;
        float *o = z + (i * H + g) * D, mx = -INFINITY, sum = 0;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int64_t r = 0; r < ns; r++) {
            int64_t j0 = 0, j1 = t + 1;
            if (row) ps_select_slot_keys(row, r, t, block, &j0, &j1);
            for (int64_t j = j0; j < j1; j++) {
                float s = dotv(qg, k + (j * Hkv + h) * D, D) * sc;
                mx = s > mx ? s : mx;
            }
        }
        for (int64_t r = 0; r < ns && mx > -INFINITY; r++) {
            int64_t j0 = 0, j1 = t + 1;
            if (row) ps_select_slot_keys(row, r, t, block, &j0, &j1);
            for (int64_t j = j0; j < j1; j++) {
                float p = expf(dotv(qg, k + (j * Hkv + h) * D, D) * sc - mx);
                const float *vj = v + (j * Hkv + h) * D;
                sum += p;
                for (int64_t d = 0; d < D; d++) o[d] += p * vj[d];
            }
        }
        if (sum > 0)
            for (int64_t d = 0; d < D; d++) o[d] /= sum;
        if (lse) lse[i * H + g] = sum > 0 ? mx + logf(sum) : -INFINITY;
    }
}

/* Rows i0 .. i1 - 1 (positions pos0 + i), KV head h, with an online softmax over key chunks in ascending order
 * (chunks of `block` keys, or 64 on the dense path): each chunk of keys and values is read once for all the
 * tile's rows that attend it, while it is in cache — a row reading every key it attends on its own streams them
 * from memory. ws holds [R·G] running maxima, [R·G] sums and a chunk's logits; mark [R, nbk] which chunks each
 * row attends. The same keys, weights and sums as attn_row, in another order. */
static void attn_tile(float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks, int64_t slots,
                      int64_t i0, int64_t i1, int64_t pos0, int64_t L, int64_t block, int64_t h, int64_t H, int64_t Hkv,
                      int64_t D, float sc, float *ws, unsigned char *mark, int64_t nbk) {
    int64_t G = H / Hkv, R = i1 - i0, chunk = blocks ? block : 64;
    float *mrow = ws, *lrow = ws + R * G, *sv = ws + 2 * R * G;
    int64_t tlast = pos0 + i1 - 1 < L - 1 ? pos0 + i1 - 1 : L - 1, bmax = tlast / chunk;
    memset(mark, 0, (size_t)(R * nbk));
    for (int64_t i = i0; i < i1; i++) {
        int64_t t = pos0 + i < L ? pos0 + i : L - 1;
        unsigned char *mk = mark + (i - i0) * nbk;
        if (!blocks)
            for (int64_t b = 0; b <= t / chunk; b++) mk[b] = 1;
        else
            for (int64_t r = 0; r < slots; r++) {
                int64_t b = (int64_t)blocks[(i * Hkv + h) * slots + r];
                if (b >= 0 && b * block <= t && b < nbk) mk[b] = 1; /* repeats count once */
            }
        for (int64_t g = 0; g < G; g++) {
            mrow[(i - i0) * G + g] = -INFINITY, lrow[(i - i0) * G + g] = 0;
            memset(z + (i * H + h * G + g) * D, 0, (size_t)D * sizeof(float));
        }
    }
    for (int64_t b = 0; b <= bmax; b++)
        for (int64_t i = i0; i < i1; i++) {
            if (!mark[(i - i0) * nbk + b]) continue;
            int64_t t = pos0 + i < L ? pos0 + i : L - 1, j0 = b * chunk, j1 = j0 + chunk < t + 1 ? j0 + chunk : t + 1, n = j1 - j0;
            if (n <= 0) continue;
            for (int64_t g = 0; g < G; g++) {
                const float *qg = q + (i * H + h * G + g) * D;
                int64_t c = 0;
                for (; c + 4 <= n; c += 4) dots4(sv + c, qg, k + ((j0 + c) * Hkv + h) * D, Hkv * D, D, sc);
                for (; c < n; c++) sv[c] = dotv(qg, k + ((j0 + c) * Hkv + h) * D, D) * sc;
                float *m = mrow + (i - i0) * G + g, *l = lrow + (i - i0) * G + g, mx = *m, sum = 0;
                for (c = 0; c < n; c++) mx = sv[c] > mx ? sv[c] : mx;
                float alpha = *m > -INFINITY ? expf(*m - mx) : 0;
                for (c = 0; c < n; c++) sum += (sv[c] = expf(sv[c] - mx));
                *l = *l * alpha + sum, *m = mx;
                float *o = z + (i * H + h * G + g) * D;
                for (int64_t d0 = 0; d0 < D; d0 += 32) {
                    int64_t w = D - d0 < 32 ? D - d0 : 32;
                    float acc[32];
                    for (int64_t u = 0; u < w; u++) acc[u] = o[d0 + u] * alpha;
                    if (w == 32)
                        for (c = 0; c < n; c++) {
                            const float *vj = v + ((j0 + c) * Hkv + h) * D + d0;
                            float p = sv[c];
                            for (int u = 0; u < 32; u++) acc[u] += p * vj[u];
                        }
                    else
                        for (c = 0; c < n; c++) {
                            const float *vj = v + ((j0 + c) * Hkv + h) * D + d0;
                            for (int64_t u = 0; u < w; u++) acc[u] += sv[c] * vj[u];
                        }
                    memcpy(o + d0, acc, (size_t)w * sizeof(float));
                }
            }
        }
    for (int64_t i = i0; i < i1; i++)
        for (int64_t g = 0; g < G; g++) {
            float l = lrow[(i - i0) * G + g], inv = l > 0 ? 1.0f / l : 0, *o = z + (i * H + h * G + g) * D;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
            if (lse) lse[i * H + h * G + g] = l > 0 ? mrow[(i - i0) * G + g] + logf(l) : -INFINITY;
        }
}

#define ATTN_TILE 64 /* rows per tile of attn_tile */

// z: [n, H, D]; q: [n, H, D]; k, v: [L, Hkv, D]; blocks: [n, Hkv, slots] or NULL; lse: [n, H] or NULL
void ps_select_attn_forward(float *z, float *lse, const float *q, const float *k, const float *v, const float *blocks,
                            int64_t slots, int64_t n, int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv,
                            int64_t D) {
    int64_t G = H / Hkv, ns = blocks ? slots : 1;
    float sc = 1.0f / sqrtf((float)D);
    if (n < 1 || L < 1) return;
    /* tiles of rows (a decode row is a tile of one: the same sums in the same order as the whole pass's last row) */
    int64_t chunk = blocks ? block : 64, nbk = (L + chunk - 1) / chunk, ntile = (n + ATTN_TILE - 1) / ATTN_TILE;
#pragma omp parallel if (n * H * D * (blocks ? slots * block : (pos0 + n + 1) / 2) > 262144)
    {
        int64_t R = n < ATTN_TILE ? n : ATTN_TILE; /* a decode row: one row's marks, nbk bytes */
        float *ws = malloc((size_t)(2 * R * G + chunk) * sizeof(float));
        unsigned char *mark = malloc((size_t)(R * nbk));
#pragma omp for schedule(dynamic, 1)
        for (int64_t th = 0; th < ntile * Hkv; th++) {
            int64_t i0 = th / Hkv * ATTN_TILE, i1 = i0 + ATTN_TILE < n ? i0 + ATTN_TILE : n, h = th % Hkv;
            if (ws && mark) attn_tile(z, lse, q, k, v, blocks, slots, i0, i1, pos0, L, block, h, H, Hkv, D, sc, ws, mark, nbk);
            else
                for (int64_t i = i0; i < i1; i++) /* no workspace on this thread: row by row */
                    attn_row_nobuf(z, lse, q, k, v, blocks ? blocks + (i * Hkv + h) * slots : NULL, ns, i,
                                   pos0 + i < L ? pos0 + i : L - 1, h, block, H, Hkv, D, sc);
        }
        free(ws), free(mark);
    }
}

/* ---------------- backward ---------------- */

void ps_select_attn_backward(float *dq, float *dk, float *dv, const float *dz, const float *z, const float *lse,
                             const float *q, const float *k, const float *v, const float *blocks, int64_t slots, int64_t n,
                             int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv, int64_t D) {
    int64_t G = H / Hkv, ns = blocks ? slots : 1;
    float sc = 1.0f / sqrtf((float)D);
    /* one KV head per iteration: its keys' gradients are written by its own query heads only */
#pragma omp parallel for schedule(static) if (n * H * D * 64 > 65536)
    for (int64_t h = 0; h < Hkv; h++)
        for (int64_t i = 0; i < n; i++) {
            int64_t t = pos0 + i < L ? pos0 + i : L - 1;
            const float *row = blocks ? blocks + (i * Hkv + h) * slots : NULL;
            for (int64_t g = h * G; g < (h + 1) * G; g++) {
                float l = lse[i * H + g];
                if (!(l > -INFINITY)) continue;
                const float *qg = q + (i * H + g) * D, *dzg = dz + (i * H + g) * D, *zg = z + (i * H + g) * D;
                float *dqg = dq + (i * H + g) * D, Di = dotf(dzg, zg, D);
                for (int64_t r = 0; r < ns; r++) {
                    int64_t j0 = 0, j1 = t + 1;
                    if (row) ps_select_slot_keys(row, r, t, block, &j0, &j1);
                    for (int64_t j = j0; j < j1; j++) {
                        const float *kj = k + (j * Hkv + h) * D, *vj = v + (j * Hkv + h) * D;
                        float p = expf(dotf(qg, kj, D) * sc - l), ds = p * (dotf(dzg, vj, D) - Di) * sc;
                        float *dkj = dk + (j * Hkv + h) * D, *dvj = dv + (j * Hkv + h) * D;
                        for (int64_t d = 0; d < D; d++) {
                            dqg[d] += ds * kj[d];
                            dkj[d] += ds * qg[d];
                            dvj[d] += p * dzg[d];
                        }
                    }
                }
            }
        }
}

/* ---------------- naive references ---------------- */

void ps_select_compress_ref(double *ck, const float *k, int64_t L, int64_t Hkv, int64_t D, int64_t K, int64_t S) {
    for (int64_t j = 0; j * S + K <= L; j++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t d = 0; d < D; d++) {
                double s = 0;
                for (int64_t t = j * S; t < j * S + K; t++) s += k[(t * Hkv + h) * D + d];
                ck[(j * Hkv + h) * D + d] = s / (double)K;
            }
}

static double dotd(const float *a, const float *b, int64_t D) {
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += (double)a[d] * b[d];
    return s;
}

void ps_select_scores_ref(double *P, const float *q, int64_t n, int64_t pos0, const float *k1, int64_t N1, const float *k2,
                          int64_t N2, int64_t H, int64_t Hkv, int64_t D, int64_t K, int64_t S) {
    int64_t G = H / Hkv;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = pos0 + i;
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < N1; j++) {
                double acc = 0;
                int any2 = 0;
                for (int64_t v = 0; v < N2; v++) any2 |= 4 * S * v + 4 * K - 1 <= t;
                if (j * S + K - 1 <= t && any2)
                    for (int64_t g = 0; g < H; g++) {
                        if (g / G != h) continue;
                        const float *qg = q + (i * H + g) * D;
                        double z = 0; /* the level-2 partition function, unshifted */
                        for (int64_t v = 0; v < N2; v++)
                            if (4 * S * v + 4 * K - 1 <= t) z += exp(dotd(qg, k2 + (v * Hkv + h) * D, D) / sqrt((double)D));
                        acc += exp(dotd(qg, k1 + (j * Hkv + h) * D, D) / sqrt((double)D)) / z;
                    }
                P[(i * Hkv + h) * N1 + j] = acc;
            }
    }
}

void ps_select_block_scores_ref(double *bs, const float *P, int64_t n, int64_t pos0, int64_t N1, int64_t nb, int64_t Hkv,
                                const ps_select_cfg *c) {
    int64_t m = c->block / c->stride;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t b = 0; b < nb; b++) {
                /* max pooling: kernel m + 1, stride m, padding 1 (padded and invisible entries count as 0) */
                double mx = 0;
                for (int64_t e = 0; e <= m; e++) {
                    int64_t j = b * m - 1 + e;
                    if (j >= 0 && j < N1 && P[(i * Hkv + h) * N1 + j] > mx) mx = P[(i * Hkv + h) * N1 + j];
                }
                int64_t t = pos0 + i, qb = t / c->block;
                int f = 0;
                for (int64_t e = 0; e < c->init_blocks; e++) f |= b == e;
                for (int64_t e = 0; e <= c->local_blocks; e++) f |= b == qb - e;
                bs[(i * Hkv + h) * nb + b] = f ? INFINITY : mx;
            }
}

void ps_select_topk_ref(int64_t *blocks, const float *bs, int64_t n, int64_t pos0, int64_t nb, int64_t Hkv,
                        const ps_select_cfg *c) {
    int64_t K = ps_select_slots(c);
    char *taken = calloc((size_t)(nb > 0 ? nb : 1), 1);
    if (!taken) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < Hkv; h++) {
            const float *s = bs + (i * Hkv + h) * nb;
            int64_t *o = blocks + (i * Hkv + h) * K;
            memset(taken, 0, (size_t)(nb > 0 ? nb : 1));
            /* repeated argmax (the first of equal maxima: ties to the lower index) */
            for (int64_t r = 0; r < K && r < nb; r++) {
                int64_t best = -1;
                for (int64_t b = 0; b < nb; b++) {
                    double x = isnan(s[b]) ? -INFINITY : s[b];
                    if (!taken[b] && (best < 0 || x > (isnan(s[best]) ? -INFINITY : s[best]))) best = b;
                }
                if (best < 0) break;
                taken[best] = 1;
            }
            int64_t w = 0;
            for (int64_t b = 0; b < nb; b++)
                if (taken[b] && b <= (pos0 + i) / c->block) o[w++] = b;
            for (; w < K; w++) o[w] = -1;
        }
    free(taken);
}

void ps_select_attn_ref(double *z, const float *q, const float *k, const float *v, const float *blocks, int64_t slots,
                        int64_t n, int64_t pos0, int64_t L, int64_t block, int64_t H, int64_t Hkv, int64_t D) {
    int64_t G = H / Hkv;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = pos0 + i;
        for (int64_t g = 0; g < H; g++) {
            int64_t h = g / G;
            const float *qg = q + (i * H + g) * D;
            double mx = -INFINITY, sum = 0;
            double *o = z + (i * H + g) * D;
            for (int64_t d = 0; d < D; d++) o[d] = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int64_t j = 0; j < L && j <= t; j++) {
                    int in = !blocks;
                    for (int64_t r = 0; blocks && r < slots; r++) in |= blocks[(i * Hkv + h) * slots + r] == (float)(j / block);
                    if (!in) continue;
                    double s = dotd(qg, k + (j * Hkv + h) * D, D) / sqrt((double)D);
                    if (!pass) mx = s > mx ? s : mx;
                    else {
                        double p = exp(s - mx);
                        sum += p;
                        for (int64_t d = 0; d < D; d++) o[d] += p * v[(j * Hkv + h) * D + d];
                    }
                }
            for (int64_t d = 0; d < D && sum > 0; d++) o[d] /= sum;
        }
    }
}
