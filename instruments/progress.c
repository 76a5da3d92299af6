#define _POSIX_C_SOURCE 200809L
#include "instruments/progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ps_progress_init(ps_progress *p, int64_t plain_every) {
    p->tty = isatty(fileno(stdout));
    p->t0 = now_s();
    p->every = plain_every > 0 ? plain_every : 1;
}

void ps_progress_update(ps_progress *p, int64_t done, int64_t total, const char *note) {
    if (p->silent) return;
    double el = now_s() - p->t0, eta = done > 0 ? el * (double)(total - done) / (double)done : 0;
    if (p->tty) {
        int width = 30, fill = total > 0 ? (int)(width * done / total) : width;
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] %lld/%lld  %.0fs elapsed, ~%.0fs left  %s\033[K", bar, (long long)done, (long long)total, el, eta,
               note ? note : "");
        fflush(stdout);
    } else if (done % p->every == 0 || done == total) {
        printf("%lld/%lld  %.1fs  %s\n", (long long)done, (long long)total, el, note ? note : "");
        fflush(stdout);
    }
}

void ps_progress_end(ps_progress *p) {
    if (p->tty && !p->silent) printf("\n");
}
