/* cmd_grad.c — `phasescope grad` (SPEC §7): the mean next-token cross-entropy over every target position
 * of every sequence, and its gradient for every checkpoint tensor, to a safetensors file. */
#include <stdio.h>
#include <stdlib.h>

#include "backward.h"
#include "cli.h"
#include "forward.h"
#include "model.h"
#include "safetensors.h"
#include "tokens.h"

static const char HELP[] =
    "usage: phasescope grad [--model DIR] --tokens T.json --targets Y.json --out GRADS.safetensors\n"
    "\n"
    "Runs every sequence of T.json on its own; Y.json has the same shape, with the target token id\n"
    "of each position or -1 / null where a position has no target. Writes `loss` (shape [1]: mean\n"
    "cross-entropy over all target positions of all sequences) and the gradient of that loss for every\n"
    "checkpoint tensor, under the tensor's own name.\n"
    "\n"
    "  --model DIR     checkpoint directory (default: the shipped model)\n"
    "  --tokens FILE   token sequences\n"
    "  --targets FILE  targets, same shape as the tokens\n"
    "  --out FILE      output safetensors file (written atomically)\n";

int ps_cmd_grad(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--model", true), PS_FLAG("--tokens", true), PS_FLAG("--targets", true),
                       PS_FLAG("--out", true)};
    int npos;
    const char *pos[1];
    ps_error err = {0};
    ps_model m = {0};
    ps_token_lists toks = {0}, tgts = {0};
    float *grads = NULL;
    ps_st_tensor *t = NULL;
    int rc = 1;
    char dir[4096];
    if (ps_cli_parse(argc, argv, flags, 4, pos, 0, &npos, &err)) goto done;
    if (ps_cli_require(flags, 4, &err, "--tokens", "--targets", "--out", NULL)) goto done;
    if (ps_cli_model_dir(flags[0].value, dir, sizeof dir, &err) || ps_model_load(&m, dir, &err) ||
        ps_tokens_load(flags[1].value, 0, 0, &toks, &err) || ps_tokens_load(flags[2].value, 1, -1, &tgts, &err))
        goto done;
    if (tgts.n != toks.n) {
        ps_fail(&err, "%s: %d sequences, but %s has %d", flags[2].value, tgts.n, flags[1].value, toks.n);
        goto done;
    }
    int64_t total = 0;
    for (int s = 0; s < toks.n; s++) {
        if (tgts.len[s] != toks.len[s]) {
            ps_fail(&err, "%s: sequence %d has %lld targets for %lld tokens", flags[2].value, s, (long long)tgts.len[s],
                    (long long)toks.len[s]);
            goto done;
        }
        if (toks.len[s] > m.cfg.max_seq_len) {
            ps_fail(&err, "%s: sequence %d has %lld tokens, more than max_seq_len %lld by %lld", flags[1].value, s,
                    (long long)toks.len[s], (long long)m.cfg.max_seq_len, (long long)(toks.len[s] - m.cfg.max_seq_len));
            goto done;
        }
        for (int64_t i = 0; i < tgts.len[s]; i++) total += tgts.seq[s][i] >= 0;
    }
    if (total == 0) {
        ps_fail(&err, "%s: no target positions (every entry is -1 or null)", flags[2].value);
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
    if (ps_st_save(flags[3].value, t, m.n_tensors + 1, NULL, NULL, 0, &err)) goto done;
    printf("loss %.6f over %lld target positions; wrote %d gradients to %s\n", (double)loss, (long long)n_targets,
           m.n_tensors, flags[3].value);
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope grad: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    free(t);
    free(grads);
    ps_tokens_free(&toks);
    ps_tokens_free(&tgts);
    ps_model_free(&m);
    return rc;
}
