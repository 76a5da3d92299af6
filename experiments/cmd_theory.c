/* cmd_theory.c — `phasescope theory`: trains the idealised bigram-induction model of SPEC §1
 * (gates/theory.h, docs/theory.md) by gradient descent from a small random init, records its gates at
 * log-spaced steps and writes OUT/theory.json and OUT/theory.png. This file parses flags, runs the loop
 * and writes the result; the model, its exact loss and gradients live in gates/theory.c. */
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
#include "theory.h"

static const char HELP[] =
    "usage: phasescope theory [--heads H] [--window S] [--chunks C] [--vocab N] [--steps K] [--lr X]\n"
    "                         [--temperature L] [--learn-temperature] [--boundary] [--batch B]\n"
    "                         [--records R] [--seed S] [--out DIR] [--check-grad]\n"
    "\n"
    "Trains the idealised bigram-induction model (docs/theory.md: one-hot embeddings, one compressed key and\n"
    "value per chunk and head, static gates) by gradient descent from gate logits N(0, 0.01²), and records\n"
    "each head's key and value gates, their effective offsets, the loss, the accuracy and the temperatures at\n"
    "log-spaced steps. Writes OUT/theory.json and OUT/theory.png.\n"
    "\n"
    "  --heads H            heads (default 7 = S - 1: one per phase a head can answer)\n"
    "  --window S           chunk length W = S (default 8)     --chunks C   chunks of context (default 8)\n"
    "  --vocab N            tokens (default 128, >= C·S)\n"
    "  --steps K            gradient steps (default 1e5)       --lr X       learning rate (default 1)\n"
    "  --temperature L      score scale lambda = logit scale mu (default 8): fixed, or the starting value\n"
    "  --learn-temperature  learn log lambda and log mu by gradient descent too (no ceiling)\n"
    "  --batch B            0 (default): the exact population gradient (gradient descent on the expected\n"
    "                       loss); B > 0: B query positions sampled per step (stochastic gradient)\n"
    "  --boundary           also ask the queries at phase S - 1, whose successor lies in the next chunk (no\n"
    "                       head can answer them with key r, value r + 1); default: phases 0 .. S - 2 only,\n"
    "                       the theorem's setting, every successor in its query's chunk\n"
    "  --records R          log-spaced records of the gates (default 80)\n"
    "  --seed S             seed of the init (and of the sampled positions), default 0\n"
    "  --out DIR            default out/theory\n"
    "  --check-grad         compare the exact gradient (gates and both log-temperatures) with central finite\n"
    "                       differences at random gate logits, and the phase sum with the sum over every\n"
    "                       position, then exit\n";

/* Step numbers of the records: 0 and round(K^(k/R)), k = 0 .. R, without repeats. */
static int64_t record_steps(int64_t K, int64_t R, int64_t *out) {
    int64_t n = 0;
    out[n++] = 0;
    for (int64_t k = 0; k <= R; k++) {
        int64_t s = (int64_t)llround(exp((double)k / (double)R * log((double)K)));
        if (s > K) s = K;
        if (s > out[n - 1]) out[n++] = s;
    }
    if (out[n - 1] != K) out[n++] = K;
    return n;
}

static int check_grad(int64_t H, int64_t S, int64_t C, int64_t N, double lam, int within, uint64_t seed, ps_error *err) {
    ps_theory t;
    ps_theory_grad g = {0}, g2 = {0};
    if (ps_theory_init(&t, H, S, C, N, lam, 1.0, seed, err)) return -1; /* random, not small, gate logits */
    t.within_chunk = within;
    int rc = -1;
    if (ps_theory_grad_init(&g, &t, err) || ps_theory_grad_init(&g2, &t, err)) goto out;
    ps_rng r;
    ps_rng_seed(&r, seed + 1);
    t.log_lam += 0.5 * ps_rng_normal(&r); /* lambda != mu, so a swapped gradient shows */
    t.log_mu += 0.5 * ps_rng_normal(&r);
    ps_theory_gates(&t);
    double acc, L0 = ps_theory_population(&t, &g, &acc);
    /* the phase sum against every position */
    double Lall = 0, n = (double)ps_theory_positions(&t);
    int ok;
    for (int64_t p = 0; p < C * S - 1; p++)
        if (ps_theory_asked(&t, p)) Lall += ps_theory_query(&t, p, 1.0 / n, &g2, &ok) / n;
    double dsum = fabs(Lall - L0) / fmax(fabs(L0), 1e-300), gsum = 0, gscale = 0;
    for (int64_t i = 0; i < H * S; i++) {
        gsum = fmax(gsum, fmax(fabs(g.a[i] - g2.a[i]), fabs(g.b[i] - g2.b[i])));
        gscale = fmax(gscale, fmax(fabs(g.a[i]), fabs(g.b[i])));
    }
    gsum = fmax(gsum, fmax(fabs(g.log_lam - g2.log_lam), fabs(g.log_mu - g2.log_mu))) / fmax(gscale, 1e-300);
    /* central differences on every parameter */
    int64_t np = 2 * H * S + 2;
    double worst = 0, scale = 0, wt = 0, st = 0, eps = 1e-5;
    for (int64_t k = 0; k < np; k++) {
        double *v = k < H * S ? t.a + k : k < 2 * H * S ? t.b + (k - H * S) : k == 2 * H * S ? &t.log_lam : &t.log_mu;
        double an = k < H * S ? g.a[k] : k < 2 * H * S ? g.b[k - H * S] : k == 2 * H * S ? g.log_lam : g.log_mu, x = *v, Lp, Lm;
        *v = x + eps;
        ps_theory_gates(&t);
        Lp = ps_theory_population(&t, NULL, &acc);
        *v = x - eps;
        ps_theory_gates(&t);
        Lm = ps_theory_population(&t, NULL, &acc);
        *v = x;
        double fd = (Lp - Lm) / (2 * eps);
        if (k < 2 * H * S) {
            worst = fmax(worst, fabs(fd - an));
            scale = fmax(scale, fabs(an));
        } else {
            wt = fmax(wt, fabs(fd - an));
            st = fmax(st, fabs(an));
        }
    }
    ps_theory_gates(&t);
    double rel = worst / fmax(scale, 1e-12), relt = wt / fmax(st, 1e-12);
    printf("gradient check: %lld parameters, max |exact - finite difference| / max |gradient| = %.2e (gate logits), "
           "%.2e (log lambda, log mu)\n",
           (long long)np, rel, relt);
    printf("phase sum vs every position: loss %.2e, gradient %.2e (relative)\n", dsum, gsum);
    if (rel > 1e-5 || relt > 1e-5 || dsum > 1e-12 || gsum > 1e-12) {
        ps_fail(err, "gradient check failed (%.2e, %.2e, %.2e, %.2e)", rel, relt, dsum, gsum);
        goto out;
    }
    rc = 0;
out:
    ps_theory_grad_free(&g);
    ps_theory_grad_free(&g2);
    ps_theory_free(&t);
    return rc;
}

static int64_t argmax(const double *v, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[k]) k = i;
    return k;
}

int ps_cmd_theory(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_FLAG("--heads", true),       PS_FLAG("--window", true),  PS_FLAG("--chunks", true),
                       PS_FLAG("--vocab", true),       PS_FLAG("--steps", true),   PS_FLAG("--lr", true),
                       PS_FLAG("--temperature", true), PS_FLAG("--batch", true),   PS_FLAG("--seed", true),
                       PS_FLAG("--out", true),         PS_FLAG("--check-grad", false), PS_FLAG("--learn-temperature", false),
                       PS_FLAG("--records", true),     PS_FLAG("--boundary", false)};
    int npos;
    const char *pos[1];
    ps_error err = {0};
    int rc = 1;
    int64_t H = 7, S = 8, C = 8, N = 128, steps = 100000, B = 0, seed = 0, R = 80;
    double lr = 1.0, lam = 8.0;
    json_t *res = NULL, *steps_j = NULL, *loss_j = NULL, *acc_j = NULL, *lam_j = NULL, *mu_j = NULL, **kg = NULL, **vg = NULL,
           **nk_j = NULL, **nv_j = NULL;
    int64_t *rec = NULL;
    ps_theory t = {0};
    ps_theory_grad g = {0};
    if (ps_cli_parse(argc, argv, flags, 14, pos, 0, &npos, &err)) goto done;
    if ((flags[0].value && ps_cli_int("--heads", flags[0].value, 1, 64, &H, &err)) ||
        (flags[1].value && ps_cli_int("--window", flags[1].value, 2, 64, &S, &err)) ||
        (flags[2].value && ps_cli_int("--chunks", flags[2].value, 1, 256, &C, &err)) ||
        (flags[3].value && ps_cli_int("--vocab", flags[3].value, 2, 65536, &N, &err)) ||
        (flags[4].value && ps_cli_int("--steps", flags[4].value, 1, 10000000, &steps, &err)) ||
        (flags[7].value && ps_cli_int("--batch", flags[7].value, 0, 1 << 16, &B, &err)) ||
        (flags[8].value && ps_cli_int("--seed", flags[8].value, 0, INT64_MAX, &seed, &err)) ||
        (flags[12].value && ps_cli_int("--records", flags[12].value, 2, 2000, &R, &err)))
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
    int learn = flags[11].present, within = !flags[13].present;
    if (flags[10].present) {
        rc = check_grad(H, S, C, N, lam, within, (uint64_t)seed, &err) ? 1 : 0;
        goto done;
    }
    if (ps_theory_init(&t, H, S, C, N, lam, 0.01, (uint64_t)seed, &err) || ps_theory_grad_init(&g, &t, &err)) goto done;
    t.within_chunk = within;
    rec = malloc((size_t)(R + 3) * sizeof(int64_t));
    kg = calloc((size_t)H, sizeof(json_t *));
    vg = calloc((size_t)H, sizeof(json_t *));
    nk_j = calloc((size_t)H, sizeof(json_t *));
    nv_j = calloc((size_t)H, sizeof(json_t *));
    if (!rec || !kg || !vg || !nk_j || !nv_j) {
        ps_fail(&err, "out of memory");
        goto done;
    }
    int64_t nrec = record_steps(steps, R, rec), next = 0;
    steps_j = json_array();
    loss_j = json_array();
    acc_j = json_array();
    lam_j = json_array();
    mu_j = json_array();
    for (int64_t h = 0; h < H; h++) {
        kg[h] = json_array();
        vg[h] = json_array();
        nk_j[h] = json_array();
        nv_j[h] = json_array();
    }
    ps_rng r;
    ps_rng_seed(&r, (uint64_t)seed ^ 0x9e3779b97f4a7c15ull); /* sampled positions (--batch B > 0) */
    ps_progress bar;
    ps_progress_init(&bar, (int64_t)1 << 40);
    double loss = 0, acc = 0;
    for (int64_t step = 0; step <= steps; step++) {
        ps_theory_grad_zero(&g, &t);
        if (B == 0) loss = ps_theory_population(&t, &g, &acc);
        else {
            loss = acc = 0;
            for (int64_t q = 0; q < B; q++) {
                int ok;
                int64_t p;
                do p = ps_rng_below(&r, C * S - 1);
                while (!ps_theory_asked(&t, p));
                loss += ps_theory_query(&t, p, 1.0 / (double)B, &g, &ok) / (double)B;
                acc += ok / (double)B;
            }
        }
        if (!isfinite(loss)) {
            ps_fail(&err, "the loss is not finite at step %lld (learning rate %g too large?)", (long long)step, lr);
            goto done;
        }
        if (next < nrec && step == rec[next]) {
            next++;
            json_array_append_new(steps_j, json_integer(step));
            json_array_append_new(loss_j, json_real(loss));
            json_array_append_new(acc_j, json_real(acc));
            json_array_append_new(lam_j, json_real(exp(t.log_lam)));
            json_array_append_new(mu_j, json_real(exp(t.log_mu)));
            for (int64_t h = 0; h < H; h++) {
                json_t *k = json_array(), *v = json_array();
                for (int64_t i = 0; i < S; i++) {
                    json_array_append_new(k, json_real(t.alpha[h * S + i]));
                    json_array_append_new(v, json_real(t.beta[h * S + i]));
                }
                json_array_append_new(kg[h], k);
                json_array_append_new(vg[h], v);
                json_array_append_new(nk_j[h], json_real(ps_effective_offsets(t.alpha + h * S, S)));
                json_array_append_new(nv_j[h], json_real(ps_effective_offsets(t.beta + h * S, S)));
            }
            char note[64];
            snprintf(note, sizeof note, "loss %.4f", loss);
            ps_progress_update(&bar, step, steps, note);
        }
        if (step == steps) break;
        for (int64_t i = 0; i < H * S; i++) {
            t.a[i] -= lr * g.a[i];
            t.b[i] -= lr * g.b[i];
        }
        if (learn) {
            t.log_lam -= lr * g.log_lam;
            t.log_mu -= lr * g.log_mu;
        }
        ps_theory_gates(&t);
    }
    ps_progress_end(&bar);
    /* per head: final peaks and effective offsets; which phases are answered (key r, value r + 1) */
    int aligned = 0, onehot = 0;
    int64_t cover[64] = {0};
    double maxn = 0;
    json_t *heads_j = json_array();
    printf("%-5s %-9s %-9s %-10s %-10s %s\n", "head", "key peak", "val peak", "N_key", "N_value", "value = key + 1");
    for (int64_t h = 0; h < H; h++) {
        int64_t pk = argmax(t.alpha + h * S, S), pv = argmax(t.beta + h * S, S);
        double nk = ps_effective_offsets(t.alpha + h * S, S), nv = ps_effective_offsets(t.beta + h * S, S);
        int al = pv == pk + 1;
        aligned += al;
        if (al) cover[pk]++;
        onehot += nk <= 1.05 && nv <= 1.05;
        maxn = fmax(maxn, fmax(nk, nv));
        printf("%-5lld %-9lld %-9lld %-10.4f %-10.4f %s\n", (long long)h, (long long)pk, (long long)pv, nk, nv, al ? "yes" : "no");
        json_t *ho = json_object();
        json_object_set_new(ho, "head", json_integer(h));
        json_object_set_new(ho, "key_gate", kg[h]);
        json_object_set_new(ho, "value_gate", vg[h]);
        json_object_set_new(ho, "N_key_over_time", nk_j[h]);
        json_object_set_new(ho, "N_value_over_time", nv_j[h]);
        kg[h] = vg[h] = nk_j[h] = nv_j[h] = NULL;
        json_object_set_new(ho, "key_peak", json_integer(pk));
        json_object_set_new(ho, "value_peak", json_integer(pv));
        json_object_set_new(ho, "value_peak_is_key_peak_plus_1", json_boolean(al));
        json_object_set_new(ho, "N_key", json_real(nk));
        json_object_set_new(ho, "N_value", json_real(nv));
        json_array_append_new(heads_j, ho);
    }
    json_t *cov_j = json_array(), *shared_j = json_array();
    int64_t ncov = 0;
    for (int64_t i = 0; i < S - 1; i++)
        if (cover[i]) {
            ncov++;
            json_array_append_new(cov_j, json_integer(i));
            if (cover[i] > 1) json_array_append_new(shared_j, json_integer(i));
        }
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
    json_object_set_new(res, "params",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:b,s:b,s:I,s:I,s:f}", "heads", (json_int_t)H, "window", (json_int_t)S,
                                  "chunks", (json_int_t)C, "vocab", (json_int_t)N, "steps", (json_int_t)steps, "lr", lr,
                                  "temperature", lam, "learn_temperature", learn, "within_chunk", within, "batch", (json_int_t)B, "records", (json_int_t)R,
                                  "init_std", 0.01));
    json_object_set_new(res, "steps", steps_j);
    json_object_set_new(res, "loss", loss_j);
    json_object_set_new(res, "accuracy", acc_j);
    json_object_set_new(res, "score_scale", lam_j);
    json_object_set_new(res, "logit_scale", mu_j);
    steps_j = loss_j = acc_j = lam_j = mu_j = NULL;
    json_object_set_new(res, "heads", heads_j);
    json_object_set_new(res, "heads_with_value_peak_after_key_peak", json_integer(aligned));
    json_object_set_new(res, "heads_one_hot", json_integer(onehot));
    json_object_set_new(res, "max_final_N", json_real(maxn));
    json_object_set_new(res, "coverable_phases", json_integer(S - 1));
    json_object_set_new(res, "covered_phases", cov_j);
    json_object_set_new(res, "phases_covered_twice_or_more", shared_j);
    printf("%d of %lld heads have their value peak one offset after their key peak; %d of %lld one-hot (N_key, N_value <= 1.05)\n"
           "phases answered (key r, value r + 1): %lld of the %lld a head can answer (0 .. %lld); final loss %.4f, accuracy %.3f, "
           "lambda %.3f, mu %.3f\n",
           aligned, (long long)H, onehot, (long long)H, (long long)ncov, (long long)(S - 1), (long long)(S - 2), loss, acc,
           exp(t.log_lam), exp(t.log_mu));
    const char *out = flags[9].value ? flags[9].value : "out/theory";
    char path[4200];
    if (ps_mkdir("out", &err) || ps_mkdir(out, &err) || ps_path_join(path, sizeof path, out, "theory.json", &err)) goto done;
    char *text = json_dumps(res, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    int bad = !text || ps_write_file_atomic(path, text, strlen(text), &err);
    if (!text) ps_fail(&err, "out of memory");
    free(text);
    if (bad) goto done;
    printf("wrote %s\n", path);
    const char *paths[1] = {path};
    if (ps_render(paths, 1, out, NULL, 1, &err)) goto done;
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "phasescope theory: %s\n", err.msg);
        rc = ps_cli_status(&err);
    }
    for (int64_t h = 0; kg && h < H; h++) {
        json_decref(kg[h]);
        json_decref(vg[h]);
        json_decref(nk_j[h]);
        json_decref(nv_j[h]);
    }
    free(kg);
    free(vg);
    free(nk_j);
    free(nv_j);
    json_decref(steps_j);
    json_decref(loss_j);
    json_decref(acc_j);
    json_decref(lam_j);
    json_decref(mu_j);
    json_decref(res);
    free(rec);
    ps_theory_grad_free(&g);
    ps_theory_free(&t);
    return rc;
}
