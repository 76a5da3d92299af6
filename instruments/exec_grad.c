/* exec_grad.c — the body of `phasescope grad` (SPEC §7; instruments/commands.h): the mean next-token
 * cross-entropy over every target position of every sequence, and its gradient for every checkpoint tensor,
 * to a safetensors file. */
#include <stdio.h>
#include <stdlib.h>

#include "core/backward.h"
#include "core/forward.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "core/tokens.h"
#include "instruments/command.h"
#include "instruments/commands.h"

/* err is this function's own (copied out on failure), so the calls below read as they always have */
int ps_grad_command(const ps_grad_req *r, ps_error *out_err) {
    const char *tokens = r->tokens, *targets = r->targets, *out_path = r->out;
    ps_error err = {0};
    ps_model m = {0};
    ps_token_lists toks = {0}, tgts = {0};
    float *grads = NULL;
    ps_st_tensor *t = NULL;
    int rc = 1;
    char dir[4096];
    if (ps_cli_model_dir(r->model, dir, sizeof dir, &err) || ps_model_load(&m, dir, &err) ||
        ps_model_to_backend(&m, r->backend, &err) || ps_tokens_load(tokens, 0, 0, &toks, &err) || ps_tokens_load(targets, 1, -1, &tgts, &err))
        goto done;
    if (tgts.n != toks.n) {
        ps_fail(&err, "%s: %d sequences, but %s has %d", targets, tgts.n, tokens, toks.n);
        goto done;
    }
    int64_t total = 0;
    for (int s = 0; s < toks.n; s++) {
        if (tgts.len[s] != toks.len[s]) {
            ps_fail(&err, "%s: sequence %d has %lld targets for %lld tokens", targets, s, (long long)tgts.len[s],
                    (long long)toks.len[s]);
            goto done;
        }
        if (toks.len[s] > m.cfg.max_seq_len) {
            ps_fail(&err, "%s: sequence %d has %lld tokens, more than max_seq_len %lld by %lld", tokens, s,
                    (long long)toks.len[s], (long long)m.cfg.max_seq_len, (long long)(toks.len[s] - m.cfg.max_seq_len));
            goto done;
        }
        for (int64_t i = 0; i < tgts.len[s]; i++) total += tgts.seq[s][i] >= 0;
    }
    if (total == 0) {
        ps_fail(&err, "%s: no target positions (every entry is -1 or null)", targets);
        goto done;
    }
    grads = calloc((size_t)m.n_params, sizeof(float));
    t = calloc((size_t)m.n_tensors + 1, sizeof *t);
    if (!grads || !t) {
        ps_fail(&err, "out of memory");
        goto done;
    }
    double loss_sum = 0;
    int64_t n_targets = 0;
    for (int s = 0; s < toks.n; s++) {
        ps_acts a, g;
        if (ps_acts_create(&a, m.ctx, &m.cfg, 1, toks.len[s], true, &err)) goto done;
        if (ps_acts_create(&g, m.ctx, &m.cfg, 1, toks.len[s], false, &err)) {
            ps_acts_free(&a);
            goto done;
        }
        int bad = ps_forward(&m, &a, toks.seq[s], NULL, &err) ||
                  ps_backward(&m, &a, &g, toks.seq[s], tgts.seq[s], 1.0f / (float)total, grads, &loss_sum, &n_targets, &err);
        ps_acts_free(&a);
        ps_acts_free(&g);
        if (bad) {
            ps_fail_prefix(&err, "sequence %d: ", s);
            goto done;
        }
    }
    float loss = (float)(loss_sum / (double)n_targets);
    t[0] = (ps_st_tensor){.name = "loss", .ndim = 1, .shape = {1}, .data = &loss};
    for (int i = 0; i < m.n_tensors; i++) {
        t[i + 1] = (ps_st_tensor){.name = m.table[i].name, .ndim = m.table[i].ndim, .data = grads + m.table[i].offset};
        for (int k = 0; k < 3; k++) t[i + 1].shape[k] = m.table[i].shape[k];
    }
    if (ps_st_save(out_path, t, m.n_tensors + 1, NULL, NULL, 0, &err)) goto done;
    printf("loss %.6f over %lld target positions; wrote %d gradients to %s\n", (double)loss, (long long)n_targets,
           m.n_tensors, out_path);
    rc = 0;
done:
    if (rc) *out_err = err;
    free(t);
    free(grads);
    ps_tokens_free(&toks);
    ps_tokens_free(&tgts);
    ps_model_free(&m);
    return rc;
}
