/* check.h — a minimal test harness: CHECK records a failure and continues; each test program ends
 * with CHECK_DONE(), which prints "N passed, M failed" and returns non-zero on any failure. */
#ifndef PS_CHECK_H
#define PS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_pass_ = 0, check_fail_ = 0;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) check_pass_++;                                              \
        else {                                                                \
            check_fail_++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

/* The call must succeed; prints its error otherwise. */
#define CHECK_OK(call, errp) CHECK((call) == 0, "%s", (errp)->msg)

/* The call must succeed, or the enclosing void function returns at once (a missing input is a failed
 * check, never a crash on the data it would have produced). */
#define REQUIRE_OK(call, errp)                                                \
    do {                                                                      \
        if ((call) == 0) check_pass_++;                                       \
        else {                                                                \
            check_fail_++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: %s (giving up on this test)\n",  \
                    __FILE__, __LINE__, #call, (errp)->msg);                  \
            return;                                                           \
        }                                                                     \
    } while (0)

/* The call must fail with a message containing every given substring. */
#define CHECK_ERR(call, errp, ...)                                                               \
    do {                                                                                         \
        (errp)->msg[0] = '\0';                                                                   \
        int rc_ = (call);                                                                        \
        const char *subs_[] = {__VA_ARGS__};                                                     \
        int ok_ = rc_ != 0;                                                                      \
        for (size_t i_ = 0; ok_ && i_ < sizeof subs_ / sizeof subs_[0]; i_++)                    \
            ok_ = strstr((errp)->msg, subs_[i_]) != NULL;                                        \
        CHECK(ok_, "rc=%d, message \"%s\"", rc_, (errp)->msg);                                   \
    } while (0)

/* Add a helper's tally (testutil.h tu_tally: checks made, failed) to this program's counters. */
#define CHECK_TALLY(t)                                                        \
    do {                                                                      \
        tu_tally t_ = (t);                                                    \
        check_pass_ += t_.checks - t_.failed;                                 \
        check_fail_ += t_.failed;                                             \
    } while (0)

#define CHECK_DONE()                                                          \
    do {                                                                      \
        printf("%d passed, %d failed\n", check_pass_, check_fail_);           \
        return check_fail_ ? 1 : 0;                                           \
    } while (0)

/* max|a - b| / max|b| */
static inline double rel_err_f(const float *a, const float *b, long long n) {
    double num = 0, den = 0;
    for (long long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}

#endif
