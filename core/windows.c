/* windows.c — window tables (core/windows.h). */
#include "core/windows.h"

#include "core/ctx.h"

ps_windows ps_windows_grid(int64_t *start, int64_t *len, int64_t B, int64_t T, int64_t nW, int64_t W, int64_t S, int64_t nkv,
                           const int64_t *woff) {
    int64_t H = woff ? nkv : 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < nW; j++)
            for (int64_t h = 0; h < H; h++) {
                int64_t e = (b * nW + j) * H + h, s = j * S + (woff ? woff[b * nkv + h] : 0);
                start[e] = s;
                len[e] = s + W <= T ? W : 0;
            }
    return (ps_windows){.B = B, .T = T, .nW = nW, .nkv = nkv, .W = W, .H = H, .S = S, .start = start, .len = len};
}

ps_windows ps_windows_chunks(int64_t *start, int64_t *len, const int64_t *cs, const int64_t *cl, int64_t B, int64_t T,
                             int64_t nC, int64_t W, int64_t nkv) {
    for (int64_t e = 0; e < B * nC; e++) {
        len[e] = cl[e];
        start[e] = cl[e] > 0 ? cs[e] : -1;
    }
    return (ps_windows){.B = B, .T = T, .nW = nC, .nkv = nkv, .W = W, .H = 1, .S = 0, .start = start, .len = len};
}

int ps_windows_check(ps_ctx *c, const char *op, const ps_windows *w) {
    if (w->B < 0 || w->T < 0 || w->nW < 0 || w->nkv < 1 || w->W < 1 || (w->H != 1 && w->H != w->nkv) || w->S < 0)
        return ps_ctx_fail(c, "%s: window table B %lld, T %lld, nW %lld, nkv %lld, W %lld, H %lld, S %lld: sizes out of range "
                              "(H must be 1 or nkv)", op, (long long)w->B, (long long)w->T, (long long)w->nW, (long long)w->nkv,
                           (long long)w->W, (long long)w->H, (long long)w->S);
    int64_t n = w->B * w->nW * w->H;
    if (n > 0 && (!w->start || !w->len))
        return ps_ctx_fail(c, "%s: no window table (content boundaries need the tokens of the batch)", op);
    for (int64_t e = 0; e < n; e++) {
        int64_t s = w->start[e], L = w->len[e];
        if (L < 0 || L > w->W || (L > 0 && (s < 0 || s + L > w->T))) {
            int64_t h = e % w->H, bj = e / w->H;
            return ps_ctx_fail(c, "%s: window %lld of sequence %lld, KV head %lld (start %lld, length %lld) is outside [0, T = %lld) "
                                  "or longer than W = %lld", op, (long long)(bj % w->nW), (long long)(bj / w->nW), (long long)h,
                               (long long)s, (long long)L, (long long)w->T, (long long)w->W);
        }
    }
    return 0;
}

int ps_windows_is_base_grid(const ps_windows *w) {
    if (w->H != 1 || w->S <= 0) return 0;
    for (int64_t b = 0; b < w->B; b++)
        for (int64_t j = 0; j < w->nW; j++) {
            int64_t e = b * w->nW + j;
            if (w->start[e] != j * w->S || w->len[e] != w->W) return 0;
        }
    return 1;
}
