/* cmd_theory.c — `phasescope theory`: the idealised bigram-induction model of SPEC §1, trained by gradient
 * descent from a small random init, to watch each head's key gate converge to one offset r_h and its
 * value gate to r_h + 1.
 *
 * The model (docs/theory.md): one-hot token embeddings; a context of C·S distinct tokens in chunks of
 * W = S; H heads, each with static gate logits a_h (key) and b_h (value) over the S offsets (no input
 * dependence, identity payloads). Chunk j's compressed key and value for head h are
 *     K_hj = sum_i softmax(a_h)_i e(x_{jS+i}),   V_hj = sum_i softmax(b_h)_i e(x_{jS+i}).
 * A query token x (one earlier occurrence, not the last) scores chunk j by lambda <e(x), K_hj>, attends
 * with a softmax over chunks per head, and the output o = sum_h sum_j pi_hj V_hj gives logits mu·o over
 * the vocabulary; the loss is the cross-entropy of x's successor. Gradients are exact (derived below). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "figures.h"
#include "fileio.h"
#include "gates.h"
#include "progress.h"
#include "rng.h"

static const char HELP[] =
    "usage: phasescope theory [--heads H] [--window S] [--chunks C] [--vocab N] [--steps K] [--lr X]\n"
    "                         [--temperature L] [--batch B] [--seed S] [--out DIR]\n"
    "\n"
    "Trains the idealised bigram-induction model (docs/theory.md: one-hot embeddings, one compressed key and\n"
    "value per chunk and head, static gates) by gradient descent from a small random init, and records each\n"
    "head's key and value gates, the loss and the accuracy over training. Writes OUT/theory.json and\n"
    "OUT/theory.png.\n"
    "\n"
    "  --heads H        heads (default 4)          --window S     chunk length W = S (default 8)\n"
    "  --chunks C       chunks of context (8)      --vocab N      tokens (default 128, >= C·S)\n"
    "  --steps K        gradient steps (3000)      --lr X         learning rate (default 1)\n"
    "  --temperature L  score and logit scale lambda = mu (default 8)\n"
    "  --batch B        queries per step (256)     --seed S       seed (default 0)\n"
    "  --out DIR        default out/theory\n"
    "  --check-grad     compare the exact gradient with central finite differences on one batch and exit\n";

typedef struct {
    int64_t H, S, C, N;
    double lam;
} theory;

static void softmax(const double *z, double *p, int64_t n) {
    double mx = z[0], s = 0;
    for (int64_t i = 1; i < n; i++) mx = fmax(mx, z[i]);
    for (int64_t i = 0; i < n; i++) s += (p[i] = exp(z[i] - mx));
    for (int64_t i = 0; i < n; i++) p[i] /= s;
}

/* Loss and gradient (da, db: [H, S], accumulated) of one query; returns the loss, sets *correct. */
static double query_grad(const theory *t, const double *al, const double *be, const int32_t *ctx, int64_t p, double *da,
                         double *db, double *scratch, int *correct) {
    int64_t H = t->H, S = t->S, C = t->C, N = t->N, c = p / S, off = p % S;
    double lam = t->lam, mu = t->lam;
    double *pi = scratch, *o = pi + H * C, *g = o + N, *G = g + N;
    /* forward: only chunk c matches the query token, with score lam * alpha_{h,off} */
    memset(o, 0, (size_t)N * sizeof(double));
    for (int64_t h = 0; h < H; h++) {
        double s[4096];
        for (int64_t j = 0; j < C; j++) s[j] = j == c ? lam * al[h * S + off] : 0.0;
        softmax(s, pi + h * C, C);
        for (int64_t j = 0; j < C; j++)
            for (int64_t i = 0; i < S; i++) o[ctx[j * S + i]] += pi[h * C + j] * be[h * S + i];
    }
    int32_t y = ctx[p + 1];
    double z[65536];
    for (int64_t v = 0; v < N; v++) z[v] = mu * o[v];
    softmax(z, g, N);
    double loss = -log(fmax(g[y], 1e-300));
    int64_t arg = 0;
    for (int64_t v = 1; v < N; v++)
        if (z[v] > z[arg]) arg = v;
    *correct = arg == y;
    g[y] -= 1.0; /* dL/dz */
    /* backward */
    for (int64_t h = 0; h < H; h++) {
        double dot = 0, dal[4096] = {0}, dbe[4096] = {0};
        for (int64_t j = 0; j < C; j++) {
            double Gj = 0;
            for (int64_t i = 0; i < S; i++) {
                double gv = mu * g[ctx[j * S + i]];
                Gj += be[h * S + i] * gv;
                dbe[i] += pi[h * C + j] * gv;
            }
            G[j] = Gj;
            dot += pi[h * C + j] * Gj;
        }
        dal[off] = lam * pi[h * C + c] * (G[c] - dot);
        /* through the gate softmaxes */
        double sa = 0, sb = 0;
        for (int64_t i = 0; i < S; i++) {
            sa += al[h * S + i] * dal[i];
            sb += be[h * S + i] * dbe[i];
        }
        for (int64_t i = 0; i < S; i++) {
            da[h * S + i] += al[h * S + i] * (dal[i] - sa);
            db[h * S + i] += be[h * S + i] * (dbe[i] - sb);
        }
    }
    return loss;
}

int ps_cmd_theory(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--heads", true), PS_FLAG("--window", true), PS_FLAG("--chunks", true),
                       PS_FLAG("--vocab", true), PS_FLAG("--steps", true), PS_FLAG("--lr", true),
                       PS_FLAG("--temperature", true), PS_FLAG("--batch", true), PS_FLAG("--seed", true),
                       PS_FLAG("--out", true), PS_FLAG("--check-grad", false)};
    int npos;
    const char *pos[1];
    ps_error err = {0};
    int rc = 1;
    int64_t H = 4, S = 8, C = 8, N = 128, steps = 3000, B = 256, seed = 0;
    double lr = 1.0, lam = 8.0;
    json_t *res = NULL;
    double *a = NULL, *b = NULL, *al = NULL, *be = NULL, *da = NULL, *db = NULL, *scratch = NULL;
    int32_t *ctx = NULL;
    int64_t *perm = NULL;
    if (ps_cli_parse(argc, argv, flags, 11, pos, 0, &npos, &err)) goto done;
    if ((flags[0].value && ps_cli_int("--heads", flags[0].value, 1, 64, &H, &err)) ||
        (flags[1].value && ps_cli_int("--window", flags[1].value, 2, 64, &S, &err)) ||
        (flags[2].value && ps_cli_int("--chunks", flags[2].value, 1, 256, &C, &err)) ||
        (flags[3].value && ps_cli_int("--vocab", flags[3].value, 2, 65536, &N, &err)) ||
        (flags[4].value && ps_cli_int("--steps", flags[4].value, 1, 1000000, &steps, &err)) ||
        (flags[7].value && ps_cli_int("--batch", flags[7].value, 1, 1 << 16, &B, &err)) ||
        (flags[8].value && ps_cli_int("--seed", flags[8].value, 0, INT64_MAX, &seed, &err)))
        goto done;
    if (flags[5].value && (sscanf(flags[5].value, "%lf", &lr) != 1 || !(lr > 0) || lr > 1e4)) {
        ps_cli_usage(&err, "--lr %s: expected a positive number", flags[5].value);
        goto done;
    }
    if (flags[6].value && (sscanf(flags[6].value, "%lf", &lam) != 1 || !(lam > 0) || lam > 1e4)) {
        ps_cli_usage(&err, "--temperature %s: expected a positive number", flags[6].value);
        goto done;
    }
    if (N < C * S) {
        ps_cli_usage(&err, "--vocab %lld: must hold the %lld distinct context tokens (chunks x window)", (long long)N, (long long)(C * S));
        goto done;
    }
    theory t = {H, S, C, N, lam};
    a = malloc((size_t)(H * S) * sizeof(double));
    b = malloc((size_t)(H * S) * sizeof(double));
    al = malloc((size_t)(H * S) * sizeof(double));
    be = malloc((size_t)(H * S) * sizeof(double));
    da = malloc((size_t)(H * S) * sizeof(double));
    db = malloc((size_t)(H * S) * sizeof(double));
    scratch = malloc((size_t)(H * C + 2 * N + C + 8) * sizeof(double));
    ctx = malloc((size_t)(C * S) * sizeof(int32_t));
    perm = malloc((size_t)N * sizeof(int64_t));
    ps_rng r;
    ps_rng_seed(&r, (uint64_t)seed);
    for (int64_t i = 0; i < H * S; i++) {
        a[i] = 0.01 * ps_rng_normal(&r);
        b[i] = 0.01 * ps_rng_normal(&r);
    }
    if (flags[10].present) {
        /* gradient check on a fixed batch of 16 queries, random (not small) gate logits */
        enum { NQ = 16 };
        int32_t *ctxs = malloc((size_t)(NQ * C * S) * sizeof(int32_t));
        int64_t qp[NQ];
        for (int64_t i = 0; i < H * S; i++) {
            a[i] = ps_rng_normal(&r);
            b[i] = ps_rng_normal(&r);
        }
        for (int q = 0; q < NQ; q++) {
            for (int64_t i = 0; i < N; i++) perm[i] = i;
            for (int64_t i = 0; i < C * S; i++) {
                int64_t j = i + ps_rng_below(&r, N - i), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
                ctxs[q * C * S + i] = (int32_t)perm[i];
            }
            qp[q] = ps_rng_below(&r, C * S - 1);
        }
        double *ga = calloc((size_t)(H * S), sizeof(double)), *gb = calloc((size_t)(H * S), sizeof(double)), worst = 0, scale = 0;
        for (int pass = 0; pass <= 2 * H * S; pass++) {
            double *vec = pass == 0 ? NULL : pass <= H * S ? a : b;
            int64_t idx = pass == 0 ? 0 : (pass - 1) % (H * S);
            double loss[2];
            for (int sgn = 0; sgn < (pass ? 2 : 1); sgn++) {
                if (vec) vec[idx] += sgn ? -2e-6 : 1e-6;
                for (int64_t h = 0; h < H; h++) {
                    softmax(a + h * S, al + h * S, S);
                    softmax(b + h * S, be + h * S, S);
                }
                double L = 0;
                int ok;
                for (int q = 0; q < NQ; q++) L += query_grad(&t, al, be, ctxs + q * C * S, qp[q], pass ? da : ga, pass ? db : gb, scratch, &ok);
                loss[sgn] = L;
                if (vec && sgn) vec[idx] += 1e-6;
            }
            if (pass) {
                double fd = (loss[0] - loss[1]) / 2e-6, an = pass <= H * S ? ga[idx] : gb[idx];
                worst = fmax(worst, fabs(fd - an));
                scale = fmax(scale, fabs(an));
            }
        }
        double rel = worst / fmax(scale, 1e-12);
        printf("gradient check: %lld parameters, max |exact - finite difference| / max |gradient| = %.2e\n",
               (long long)(2 * H * S), rel);
        free(ga);
        free(gb);
        free(ctxs);
        if (rel > 1e-5) {
            ps_fail(&err, "gradient check failed (relative error %.2e)", rel);
            goto done;
        }
        rc = 0;
        goto done;
    }
    json_t *steps_j = json_array(), *loss_j = json_array(), *acc_j = json_array(), *heads_j = json_array();
    json_t **kg = calloc((size_t)H, sizeof(json_t *)), **vg = calloc((size_t)H, sizeof(json_t *));
    for (int64_t h = 0; h < H; h++) {
        kg[h] = json_array();
        vg[h] = json_array();
    }
    int64_t log_every = steps / 50 > 0 ? steps / 50 : 1;
    ps_progress bar;
    ps_progress_init(&bar, (int64_t)1 << 40);
    for (int64_t step = 0; step <= steps; step++) {
        for (int64_t h = 0; h < H; h++) {
            softmax(a + h * S, al + h * S, S);
            softmax(b + h * S, be + h * S, S);
        }
        memset(da, 0, (size_t)(H * S) * sizeof(double));
        memset(db, 0, (size_t)(H * S) * sizeof(double));
        double loss = 0;
        int64_t correct = 0;
        for (int64_t q = 0; q < B; q++) {
            for (int64_t i = 0; i < N; i++) perm[i] = i; /* distinct context tokens */
            for (int64_t i = 0; i < C * S; i++) {
                int64_t j = i + ps_rng_below(&r, N - i), x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
                ctx[i] = (int32_t)perm[i];
            }
            int ok;
            loss += query_grad(&t, al, be, ctx, ps_rng_below(&r, C * S - 1), da, db, scratch, &ok);
            correct += ok;
        }
        loss /= (double)B;
        if (step % log_every == 0 || step == steps) {
            json_array_append_new(steps_j, json_integer(step));
            json_array_append_new(loss_j, json_real(loss));
            json_array_append_new(acc_j, json_real((double)correct / (double)B));
            for (int64_t h = 0; h < H; h++) {
                json_t *k = json_array(), *v = json_array();
                for (int64_t i = 0; i < S; i++) {
                    json_array_append_new(k, json_real(al[h * S + i]));
                    json_array_append_new(v, json_real(be[h * S + i]));
                }
                json_array_append_new(kg[h], k);
                json_array_append_new(vg[h], v);
            }
            char note[64];
            snprintf(note, sizeof note, "loss %.4f", loss);
            ps_progress_update(&bar, step, steps, note);
        }
        if (step == steps) break;
        for (int64_t i = 0; i < H * S; i++) {
            a[i] -= lr * da[i] / (double)B;
            b[i] -= lr * db[i] / (double)B;
        }
    }
    ps_progress_end(&bar);
    int aligned = 0;
    printf("%-5s %-9s %-9s %-10s %-10s\n", "head", "key peak", "val peak", "N_key", "N_value");
    for (int64_t h = 0; h < H; h++) {
        int64_t pk = 0, pv = 0;
        for (int64_t i = 1; i < S; i++) {
            if (al[h * S + i] > al[h * S + pk]) pk = i;
            if (be[h * S + i] > be[h * S + pv]) pv = i;
        }
        double nk = ps_effective_offsets(al + h * S, S), nv = ps_effective_offsets(be + h * S, S);
        aligned += pv == pk + 1;
        printf("%-5lld %-9lld %-9lld %-10.3f %-10.3f\n", (long long)h, (long long)pk, (long long)pv, nk, nv);
        json_t *ho = json_object();
        json_object_set_new(ho, "head", json_integer(h));
        json_object_set_new(ho, "key_gate", kg[h]);
        json_object_set_new(ho, "value_gate", vg[h]);
        json_object_set_new(ho, "key_peak", json_integer(pk));
        json_object_set_new(ho, "value_peak", json_integer(pv));
        json_object_set_new(ho, "N_key", json_real(nk));
        json_object_set_new(ho, "N_value", json_real(nv));
        json_array_append_new(heads_j, ho);
    }
    free(kg);
    free(vg);
    res = json_object();
    json_t *prov = json_object();
    char *cmd = ps_cli_command_line(argc, argv);
    json_object_set_new(prov, "command", json_string(cmd));
    free(cmd);
    json_object_set_new(prov, "model", json_string("idealised bigram induction (docs/theory.md)"));
    json_object_set_new(prov, "seed", json_integer(seed));
    json_object_set_new(prov, "version", json_string(PS_VERSION));
    json_object_set_new(res, "kind", json_string("theory"));
    json_object_set_new(res, "provenance", prov);
    json_object_set_new(res, "params", json_pack("{s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:I}", "heads", (json_int_t)H, "window", (json_int_t)S,
                                                 "chunks", (json_int_t)C, "vocab", (json_int_t)N, "steps", (json_int_t)steps, "lr", lr,
                                                 "temperature", lam, "batch", (json_int_t)B));
    json_object_set_new(res, "steps", steps_j);
    json_object_set_new(res, "loss", loss_j);
    json_object_set_new(res, "accuracy", acc_j);
    json_object_set_new(res, "heads", heads_j);
    json_object_set_new(res, "heads_with_value_peak_after_key_peak", json_integer(aligned));
    const char *out = flags[9].value ? flags[9].value : "out/theory";
    char path[4200];
    if (ps_mkdir("out", &err) || ps_mkdir(out, &err) || ps_path_join(path, sizeof path, out, "theory.json", &err)) goto done;
    char *text = json_dumps(res, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    int bad = ps_write_file_atomic(path, text, strlen(text), &err);
    free(text);
    if (bad) goto done;
    printf("%d of %lld heads have their value peak one offset after their key peak\nwrote %s\n", aligned, (long long)H, path);
    const char *paths[1] = {path};
    if (ps_render(paths, 1, out, NULL, 1, &err)) goto done;
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope theory: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    json_decref(res);
    free(a); free(b); free(al); free(be); free(da); free(db); free(scratch); free(ctx); free(perm);
    return rc;
}
