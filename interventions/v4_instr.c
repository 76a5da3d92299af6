/* v4_instr.c — a DeepSeek-V4 checkpoint's runtime over a model opened elsewhere and its evaluation (v4_instr.h);
 * everything else the instruments do on it is the family's core table. */
#include "interventions/v4_instr.h"

#include <string.h>

#include "interventions/eval.h"

/* ---- evaluation ---- */

int ps_v4_eval(ps_v4_model *m, const ps_v4_task *t, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct,
               double *logprob, ps_error *err) {
    ps_runtime rt;
    ps_v4_runtime(&rt, m, t);
    return ps_eval_mapped(&rt, b, batch, hooks, correct, logprob, err);
}

/* ---- the DeepSeek-V4 runtime (its knockout targets are core's data: core/ko_targets.c) ---- */

void ps_v4_runtime(ps_runtime *rt, ps_v4_model *m, const ps_v4_task *t) {
    memset(rt, 0, sizeof *rt);
    rt->ctx = m->ctx;
    rt->max_pos = m->cfg.max_position_embeddings;
    rt->n_layers = m->cfg.n_layers;
    rt->model = m;
    rt->token_map = t ? t->ids : NULL;
    rt->n_token_map = t ? t->n_ids : 0;
    rt->family = &ps_family_v4;
}
