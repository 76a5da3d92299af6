/* sweep.c — the phase sweep over shifts (sweep.h). */
#include "interventions/sweep.h"

#include <stdlib.h>

int ps_sweep_run(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam,
                 ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, ps_residue_stats *stats,
                 ps_progress_fn progress, void *user, ps_error *err) {
    if (ps_residue_stats_init(stats, P, err)) return -1;
    int *ok = malloc((size_t)(base->B * base->max_q) * sizeof(int));
    double *lp = malloc((size_t)(base->B * base->max_q) * sizeof(double));
    int rc = ok && lp ? 0
                      : ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries",
                                (long long)base->B, (long long)base->max_q);
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        rc = ps_make_shifted(base, task, fam, mode, P, p, seed, m->cfg.max_seq_len, &s, err);
        if (rc) break;
        rc = ps_eval_shifted(m, &s, batch, NULL, ok, lp, err);
        if (!rc) ps_residue_stats_add(stats, &s, ok, lp);
        ps_shifted_free(&s);
        if (!rc && progress && progress(p + 1, P, user))
            rc = ps_fail(err, "cancelled after %lld of %lld shifts", (long long)(p + 1), (long long)P);
    }
    free(ok);
    free(lp);
    return rc;
}

