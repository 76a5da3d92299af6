/* progress.h — a one-line progress bar on a terminal (stdout is a tty), plain lines otherwise. */
#ifndef PS_PROGRESS_H
#define PS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool tty;
    double t0;
    int64_t every; /* plain mode: print every `every` units */
    int silent; /* a library call: nothing printed (ps_progress_init leaves it as it is) */
} ps_progress;

void ps_progress_init(ps_progress *p, int64_t plain_every);
/* done of total units; note is appended (e.g. "loss 1.23"). */
void ps_progress_update(ps_progress *p, int64_t done, int64_t total, const char *note);
void ps_progress_end(ps_progress *p);

#endif
