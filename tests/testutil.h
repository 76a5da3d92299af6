/* testutil.h — helpers shared by the tests: small configs, models with every tensor random (gates and
 * norms included, so they matter), random token sequences, temp directories. */
#ifndef PS_TESTUTIL_H
#define PS_TESTUTIL_H

#include <stdint.h>

#include "core/config.h"
#include "core/generate.h"
#include "core/model.h"
#include "interventions/knockout.h"

/* A small config: 1 layer unless changed, vocab 23, d 16, 4 heads / 2 KV heads, hd 4, d_ff 24, T <= 64. */
ps_config tu_config(ps_attn_kind kind);
/* Create m for cfg and fill it: norms 1 + 0.2 N, everything else `scale` N. */
void tu_random_model(ps_model *m, const ps_config *cfg, uint64_t seed, float scale);
void tu_random_tokens(int32_t *tok, int64_t n, int64_t vocab, uint64_t seed);
/* A fresh directory under /tmp (or $TMPDIR); returns a static-lifetime string owned by the caller buffer. */
void tu_tempdir(char *out, size_t n, const char *tag);
/* max |a - b| / max |b| over one row of n floats (max |a - b| when b is all zero); tu_rows_rel: its maximum
 * over rows rows of n floats */
double tu_row_rel(const float *a, const float *b, int64_t n);
double tu_rows_rel(const float *a, const float *b, int64_t rows, int64_t n);
/* The shared conformance folder (tests/conformance in the repository; PS_CONFORMANCE_DIR overrides). */
const char *tu_conformance_dir(void);

/* The backend comparisons' generation (test_kvcache, test_v4_kvcache): ps_generate on kv for the 3 prompts
 * pr[3] of len[3] tokens, 6 tokens each sampled (temperature 1.1, top_p 0.95, seed 8), with the edits and
 * hooks given; the tokens [3, 6] (-1 past a sequence's end) and log-probabilities [3, 6] (0 there) written
 * out. 0, or -1 with err. */
int tu_generate_rows(ps_kvcache *kv, int32_t *const *pr, const int64_t *len, const ps_generate_edit *edits, int n_edits,
                     const ps_hooks *hooks, int32_t *out_tok, double *out_lp, ps_error *err);

/* The controlled model's knockout grid with options (ps_knockout_run with the model's runtime). */
int tu_knockout_opts(const ps_model *m, const ps_batch *base, const ps_task *task, const ps_filler_family *fam, int64_t P,
                     uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads, int n_heads,
                     ps_ko_target target, const ps_knockout_opts *o, ps_knockout_result *out, ps_progress_fn progress,
                     void *user, ps_error *err);

/* ---- gradients against a plain-loop reference, by central finite differences ---- */

/* The test's reference forward: double logits [T, V] of m on tok; user: what else it needs (a phase shift). */
typedef void (*tu_ref_forward_fn)(const ps_model *m, const int32_t *tok, int T, const void *user, double *logits);

/* Checks made and failed by a helper (added to the calling test's counters by CHECK_TALLY, check.h). */
typedef struct {
    int checks, failed;
} tu_tally;

/* Mean cross-entropy of the reference logits over the targets >= 0. */
double tu_ref_loss(const ps_model *m, const int32_t *tok, const int32_t *tgt, int T, tu_ref_forward_fn ref, const void *user);

/* A random model of c (tu_random_model, seed, scale 0.5), random tokens and targets (every third target ignored),
 * ps_forward (with the phase shift *shift when shift is not NULL) and ps_backward, against the reference: the
 * logits (1e-5 relative), the loss (1e-5 relative), the target count, and every parameter tensor's gradient at 6
 * sampled elements by central differences of the reference loss (step 1e-3; max error / tensor scale < 1e-3).
 * Each failed check prints a FAIL line naming label and tensor. */
tu_tally tu_fd_model(const char *label, ps_config c, uint64_t seed, int T, const int64_t *shift, tu_ref_forward_fn ref,
                     const void *user);

#endif
