/* fillers.c — text filler experiments: the experiment file, prompts, candidate scoring, the periodicity
 * test and the result JSON (fillers.h, docs/text-experiments.md). */
#include "interventions/fillers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "interventions/sweep.h"
#include "tasks/tasks.h"

/* ---- the experiment file ---- */

void ps_fillexp_free(ps_fillexp *e) {
    free(e->path);
    free(e->name);
    free(e->description);
    free(e->template_text);
    free(e->slot);
    free(e->chat_prefix);
    free(e->chat_suffix);
    ps_text_families_free(e->fams, e->n_fams);
    for (int i = 0; i < e->n_cands; i++) {
        free(e->cands[i].text);
        ps_ids_free(&e->cands[i].ids);
    }
    free(e->cands);
    ps_ids_free(&e->before);
    ps_ids_free(&e->after);
    if (e->fill)
        for (int i = 0; i < e->n_fams; i++) ps_ids_free(&e->fill[i]);
    free(e->fill);
    memset(e, 0, sizeof *e);
}

static int opt_string(json_t *root, const char *key, const char *src, char **out, ps_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v) return 0;
    if (!json_is_string(v)) return ps_fail(err, "%s: %s: expected a string, got %s", src, key, ps_json_type_name(v));
    if (!(*out = strdup(json_string_value(v)))) return ps_fail(err, "%s: out of memory", src);
    return 0;
}

static int get_int_in(json_t *v, const char *src, const char *key, int64_t lo, int64_t hi, int64_t *out, ps_error *err) {
    if (!json_is_integer(v))
        return ps_fail(err, "%s: %s: expected an integer, got %s", src, key, ps_json_type_name(v));
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return ps_fail(err, "%s: %s: %lld is out of range [%lld, %lld]", src, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static const char *const EXP_KEYS[] = {"name", "description", "template", "slot", "chat", "families", "lengths",
                                       "candidates", "period", "permutations", "detrend", "seed", NULL};

int ps_fillexp_parse(json_t *root, const char *src, const char *base_dir, ps_fillexp *e, ps_error *err) {
    memset(e, 0, sizeof *e);
    e->permutations = PS_FILLERS_DEFAULT_PERMUTATIONS;
    e->detrend = 1;
    if (!json_is_object(root)) return ps_fail(err, "%s: expected a JSON object (an experiment), got %s", src, ps_json_type_name(root));
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int known = 0;
        for (int j = 0; EXP_KEYS[j] && !known; j++) known = !strcmp(k, EXP_KEYS[j]);
        if (!known)
            return ps_fail(err, "%s: unknown key \"%s\" (an experiment has name, description, template, slot, chat, families, "
                                "lengths, candidates, period, permutations, detrend, seed)",
                           src, k);
    }
    if (!(e->path = strdup(src))) return ps_fail(err, "out of memory");
    if (opt_string(root, "name", src, &e->name, err) || opt_string(root, "description", src, &e->description, err) ||
        opt_string(root, "slot", src, &e->slot, err))
        return -1;
    if (!e->slot && !(e->slot = strdup("{filler}"))) return ps_fail(err, "out of memory");
    if (!e->slot[0]) return ps_fail(err, "%s: slot: must not be empty", src);
    json_t *t = json_object_get(root, "template");
    if (!json_is_string(t)) return ps_fail(err, "%s: template: expected a string with the filler slot, got %s", src, ps_json_type_name(t));
    if (!(e->template_text = strdup(json_string_value(t)))) return ps_fail(err, "out of memory");
    if (strlen(e->template_text) != json_string_length(t)) return ps_fail(err, "%s: template: holds a NUL character", src);
    const char *at = strstr(e->template_text, e->slot);
    if (!at) return ps_fail(err, "%s: template: no filler slot \"%s\" in it (the slot marks where the filler goes)", src, e->slot);
    if (strstr(at + strlen(e->slot), e->slot))
        return ps_fail(err, "%s: template: the filler slot \"%s\" appears more than once", src, e->slot);
    json_t *chat = json_object_get(root, "chat");
    if (chat && !json_is_null(chat)) {
        json_t *p = json_object_get(chat, "prefix"), *s = json_object_get(chat, "suffix");
        if (!json_is_object(chat) || !json_is_string(p) || !json_is_string(s) || json_object_size(chat) != 2)
            return ps_fail(err, "%s: chat: expected {\"prefix\": text, \"suffix\": text} (the text around the user content)", src);
        if (!(e->chat_prefix = strdup(json_string_value(p))) || !(e->chat_suffix = strdup(json_string_value(s))))
            return ps_fail(err, "out of memory");
    }
    json_t *ln = json_object_get(root, "lengths");
    if (!json_is_array(ln) || json_array_size(ln) != 2)
        return ps_fail(err, "%s: lengths: expected [min, max] (filler lengths in tokens, both included), got %s", src,
                       ps_json_type_name(ln));
    if (get_int_in(json_array_get(ln, 0), src, "lengths[0]", 0, PS_FILLERS_MAX_L, &e->L_min, err) ||
        get_int_in(json_array_get(ln, 1), src, "lengths[1]", 0, PS_FILLERS_MAX_L, &e->L_max, err))
        return -1;
    if (e->L_min > e->L_max) return ps_fail(err, "%s: lengths: min %lld > max %lld", src, (long long)e->L_min, (long long)e->L_max);
    char fsrc[4200];
    snprintf(fsrc, sizeof fsrc, "%s: families", src);
    if (ps_text_families_parse(json_object_get(root, "families"), base_dir, fsrc, &e->fams, &e->n_fams, err)) return -1;
    if ((double)e->n_fams * (double)(e->L_max - e->L_min + 1) > PS_FILLERS_MAX_POINTS)
        return ps_fail(err, "%s: %d families x %lld lengths: more than %d prompts", src, e->n_fams,
                       (long long)(e->L_max - e->L_min + 1), PS_FILLERS_MAX_POINTS);
    json_t *cs = json_object_get(root, "candidates");
    if (!json_is_array(cs) || json_array_size(cs) < 2 || json_array_size(cs) > PS_FILLERS_MAX_CANDIDATES)
        return ps_fail(err, "%s: candidates: expected a list of 2 to %d continuations (texts, or lists of ids), got %s", src,
                       PS_FILLERS_MAX_CANDIDATES, ps_json_type_name(cs));
    e->cands = calloc(json_array_size(cs), sizeof *e->cands);
    if (!e->cands) return ps_fail(err, "out of memory");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        ps_fillexp_cand *cd = &e->cands[i];
        e->n_cands++;
        if (json_is_string(c)) {
            if (!json_string_length(c) || strlen(json_string_value(c)) != json_string_length(c))
                return ps_fail(err, "%s: candidates[%zu]: an empty text (or one with a NUL)", src, i);
            if (!(cd->text = strdup(json_string_value(c)))) return ps_fail(err, "out of memory");
        } else if (json_is_array(c) && json_array_size(c) > 0 && json_array_size(c) <= 4096) {
            for (size_t j = 0; j < json_array_size(c); j++) {
                int64_t id;
                char key[64];
                snprintf(key, sizeof key, "candidates[%zu][%zu]", i, j);
                if (get_int_in(json_array_get(c, j), src, key, 0, INT32_MAX, &id, err)) return -1;
                int32_t id32 = (int32_t)id;
                if (ps_ids_push(&cd->ids, &id32, 1, err)) return -1;
            }
        } else
            return ps_fail(err, "%s: candidates[%zu]: expected a text or a non-empty list of token ids, got %s", src, i,
                           ps_json_type_name(c));
    }
    if ((v = json_object_get(root, "period")) && get_int_in(v, src, "period", 1, 4096, &e->period, err)) return -1;
    if ((v = json_object_get(root, "permutations")) &&
        get_int_in(v, src, "permutations", 99, PS_FILLERS_MAX_PERMUTATIONS, &e->permutations, err))
        return -1;
    int64_t seed = 0;
    if ((v = json_object_get(root, "seed")) && get_int_in(v, src, "seed", 0, INT64_MAX, &seed, err)) return -1;
    e->seed = (uint64_t)seed;
    if ((v = json_object_get(root, "detrend"))) {
        if (!json_is_boolean(v)) return ps_fail(err, "%s: detrend: expected true or false, got %s", src, ps_json_type_name(v));
        e->detrend = json_is_true(v);
    }
    if (!e->name) {
        const char *b = strrchr(src, '/');
        b = b ? b + 1 : src;
        size_t l = strlen(b);
        if (l > 5 && !strcmp(b + l - 5, ".json")) l -= 5;
        if (!(e->name = strndup(b, l))) return ps_fail(err, "out of memory");
    }
    return 0;
}

int ps_fillexp_load(const char *path, ps_fillexp *e, ps_error *err) {
    memset(e, 0, sizeof *e);
    char *text;
    size_t len;
    if (ps_read_file(path, 1 << 24, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    char dir[4096];
    ps_text_dirname(path, dir, sizeof dir);
    int rc = ps_fillexp_parse(root, path, dir, e, err);
    json_decref(root);
    if (rc) ps_fillexp_free(e);
    return rc;
}

int ps_fillexp_prepare(ps_fillexp *e, const ps_tokenizer *tok, ps_error *err) {
    const char *at = strstr(e->template_text, e->slot);
    size_t pl = e->chat_prefix ? strlen(e->chat_prefix) : 0, sl = e->chat_suffix ? strlen(e->chat_suffix) : 0;
    size_t bl = (size_t)(at - e->template_text), al = strlen(at + strlen(e->slot));
    char *b = malloc(pl + bl + 1), *a = malloc(al + sl + 1);
    int rc = b && a ? 0 : ps_fail(err, "out of memory");
    if (!rc) {
        if (pl) memcpy(b, e->chat_prefix, pl);
        memcpy(b + pl, e->template_text, bl);
        memcpy(a, at + strlen(e->slot), al);
        if (sl) memcpy(a + al, e->chat_suffix, sl);
        ps_ids_free(&e->before);
        ps_ids_free(&e->after);
        rc = ps_ids_text(&e->before, tok, b, pl + bl, err) || ps_ids_text(&e->after, tok, a, al + sl, err);
        if (rc) ps_fail_prefix(err, "%s: template: ", e->path);
    }
    free(b);
    free(a);
    if (rc) return -1;
    if (e->before.n + e->after.n == 0)
        return ps_fail(err, "%s: template: the prompt around the slot is empty (the model needs at least one token before the "
                            "candidates)",
                       e->path);
    int32_t V = ps_tokenizer_vocab_size(tok);
    for (int i = 0; i < e->n_cands; i++) {
        ps_fillexp_cand *c = &e->cands[i];
        if (c->text) {
            ps_ids_free(&c->ids);
            if (ps_ids_text(&c->ids, tok, c->text, strlen(c->text), err))
                return ps_fail_prefix(err, "%s: candidates[%d]: ", e->path, i);
            if (c->ids.n == 0) return ps_fail(err, "%s: candidates[%d]: \"%s\" gives no tokens", e->path, i, c->text);
        } else
            for (int64_t j = 0; j < c->ids.n; j++)
                if (c->ids.v[j] >= V)
                    return ps_fail(err, "%s: candidates[%d][%lld]: id %d is not in the tokenizer's vocabulary (%d ids)", e->path, i,
                                   (long long)j, (int)c->ids.v[j], (int)V);
        for (int j = 0; j < i; j++)
            if (e->cands[j].ids.n == c->ids.n && !memcmp(e->cands[j].ids.v, c->ids.v, (size_t)c->ids.n * sizeof(int32_t)))
                return ps_fail(err, "%s: candidates[%d] has the same token ids as candidates[%d]", e->path, i, j);
    }
    if (e->fill)
        for (int i = 0; i < e->n_fams; i++) ps_ids_free(&e->fill[i]);
    free(e->fill);
    e->fill = calloc((size_t)e->n_fams, sizeof *e->fill);
    if (!e->fill) return ps_fail(err, "out of memory");
    for (int i = 0; i < e->n_fams; i++)
        if (ps_text_family_ids(&e->fams[i], tok, e->L_max, &e->fill[i], err))
            return ps_fail_prefix(err, "%s: lengths up to %lld: ", e->path, (long long)e->L_max);
    return 0;
}

int ps_fillexp_prompt(const ps_fillexp *e, int f, int64_t L, ps_ids *out, ps_error *err) {
    if (f < 0 || f >= e->n_fams || !e->fill || L < 0 || L > e->fill[f].n)
        return ps_fail(err, "family %d, L = %lld: not prepared", f, (long long)L);
    out->n = 0;
    return ps_ids_push(out, e->before.v, e->before.n, err) || ps_ids_push(out, e->fill[f].v, L, err) ||
                   ps_ids_push(out, e->after.v, e->after.n, err)
               ? -1
               : 0;
}

/* ---- running ---- */

void ps_fillexp_result_free(ps_fillexp_result *r) {
    free(r->pts);
    memset(r, 0, sizeof *r);
}

typedef struct {
    ps_fillexp_result *r;
    int c;
    const int32_t *cand;
    int64_t m, V;
} run_ctx;

static int score_cand(const ps_batch *b, int64_t s, const float *rows, int64_t n, void *user, ps_error *err) {
    (void)b;
    run_ctx *x = user;
    if (n != x->m) return ps_fail(err, "internal error: %lld answer rows for a candidate of %lld tokens", (long long)n, (long long)x->m);
    ps_fillexp_point *pt = &x->r->pts[s];
    double lp = 0;
    int ok = 1;
    for (int64_t k = 0; k < x->m; k++) {
        const float *row = rows + k * x->V;
        float mx = row[0];
        int64_t arg = 0;
        for (int64_t i = 1; i < x->V; i++)
            if (row[i] > mx) {
                mx = row[i];
                arg = i;
            }
        double sum = 0;
        for (int64_t i = 0; i < x->V; i++) sum += exp((double)(row[i] - mx));
        lp += (double)(row[x->cand[k]] - mx) - log(sum);
        if (arg != x->cand[k]) ok = 0;
        if (k == 0 && x->c == 0) pt->top1 = (int32_t)arg;
    }
    pt->logprob[x->c] = lp;
    pt->all_top1[x->c] = ok;
    return 0;
}

int ps_fillexp_run(const ps_runtime *rt, const ps_fillexp *e, int64_t P, int64_t batch, double mem_bytes,
                   ps_fillexp_result *r, ps_fillexp_progress_fn progress, void *user, ps_error *err) {
    memset(r, 0, sizeof *r);
    if (!e->fill) return ps_fail(err, "internal error: the experiment is not prepared");
    if (P < 1) return ps_fail(err, "period %lld must be >= 1", (long long)P);
    int64_t nL = e->L_max - e->L_min + 1, N = (int64_t)e->n_fams * nL, V = rt->family->vocab(rt);
    r->n_fams = e->n_fams;
    r->n_cands = e->n_cands;
    r->n_L = nL;
    r->P = P;
    r->pts = calloc((size_t)N, sizeof *r->pts);
    if (!r->pts) return ps_fail(err, "out of memory for %lld prompts", (long long)N);
    for (int f = 0; f < e->n_fams; f++)
        for (int64_t i = 0; i < nL; i++) {
            ps_fillexp_point *pt = &r->pts[f * nL + i];
            pt->L = e->L_min + i;
            pt->phase = pt->L % P;
            pt->prompt_tokens = e->before.n + pt->L + e->after.n;
        }
    int rc = 0;
    ps_ids prompt = {0};
    for (int c = 0; c < e->n_cands && !rc; c++) {
        const ps_ids *cd = &e->cands[c].ids;
        for (int64_t k = 0; k < cd->n && !rc; k++)
            if (cd->v[k] >= V)
                rc = ps_fail(err, "%s: candidates[%d]: id %d is outside the model's vocabulary (%lld)", e->path, c, (int)cd->v[k],
                             (long long)V);
        int64_t T = e->before.n + e->L_max + e->after.n + cd->n;
        if (!rc && T > rt->max_pos)
            rc = ps_fail(err, "%s: the longest prompt with candidates[%d] has %lld tokens, more than the model's %s %lld",
                         e->path, c, (long long)T, rt->family->max_pos_name ? rt->family->max_pos_name : "context", (long long)rt->max_pos);
        ps_batch b = {0};
        if (!rc) rc = ps_batch_alloc(&b, N, T, 1, err);
        for (int64_t s = 0; s < N && !rc; s++) {
            int f = (int)(s / nL);
            int64_t L = e->L_min + s % nL;
            rc = ps_fillexp_prompt(e, f, L, &prompt, err) || ps_ids_push(&prompt, cd->v, cd->n, err);
            if (rc) break;
            int32_t *dst = b.tokens + s * T;
            memcpy(dst, prompt.v, (size_t)prompt.n * sizeof *dst);
            for (int64_t t = prompt.n; t < T; t++) dst[t] = prompt.v[prompt.n - 1]; /* tail padding: never read */
            for (int64_t t = 0; t < T; t++) b.targets[s * T + t] = -1;
            int64_t Tp = prompt.n - cd->n;
            b.n_q[s] = 1;
            b.queries[s] = (ps_query){.key_pos = e->before.n, .answer_pos = Tp - 1, .answer_len = cd->n, .answer_src = Tp};
            for (int64_t k = 0; k < cd->n; k++) b.targets[s * T + Tp - 1 + k] = cd->v[k];
        }
        run_ctx x = {r, c, cd->v, cd->n, V};
        if (!rc) rc = rt->family->rows(rt, &b, batch, mem_bytes, score_cand, &x, err);
        ps_batch_free(&b);
        if (!rc && progress && progress(c + 1, e->n_cands, user))
            rc = ps_fail(err, "cancelled after %lld of %lld candidates", (long long)(c + 1), (long long)e->n_cands);
    }
    ps_ids_free(&prompt);
    for (int64_t s = 0; s < N && !rc; s++) r->pts[s].delta = exp(r->pts[s].logprob[0]) - exp(r->pts[s].logprob[1]);
    if (rc) ps_fillexp_result_free(r);
    return rc;
}

/* ---- the periodicity test ---- */

void ps_phase_residuals(const double *y, const int64_t *x, const int *stratum, int64_t n, int detrend, double *e,
                        int *all_detrended) {
    int maxs = 0;
    for (int64_t i = 0; i < n; i++) maxs = stratum && stratum[i] > maxs ? stratum[i] : maxs;
    *all_detrended = n > 0 && detrend;
    for (int s = 0; s <= maxs; s++) {
        double sx = 0, sy = 0, cnt = 0;
        for (int64_t i = 0; i < n; i++)
            if (!stratum || stratum[i] == s) {
                sx += (double)x[i];
                sy += y[i];
                cnt++;
            }
        if (cnt == 0) continue;
        double mx = sx / cnt, my = sy / cnt, sxx = 0, sxy = 0;
        for (int64_t i = 0; i < n; i++)
            if (!stratum || stratum[i] == s) {
                sxx += ((double)x[i] - mx) * ((double)x[i] - mx);
                sxy += ((double)x[i] - mx) * (y[i] - my);
            }
        int fit = detrend && cnt >= 3 && sxx > 0;
        if (detrend && !fit) *all_detrended = 0;
        double slope = fit ? sxy / sxx : 0;
        for (int64_t i = 0; i < n; i++)
            if (!stratum || stratum[i] == s) e[i] = y[i] - my - slope * ((double)x[i] - mx);
    }
}

/* η² from residuals grouped by residue; sums in a fixed order, so the validator gets the same bits */
static void eta2_groups(const double *e, const int64_t *g, int64_t n, int64_t P, double *sum, int64_t *cnt, double *eta2,
                        double *F, int64_t *groups) {
    memset(sum, 0, (size_t)P * sizeof *sum);
    memset(cnt, 0, (size_t)P * sizeof *cnt);
    double tot = 0;
    for (int64_t i = 0; i < n; i++) {
        sum[g[i]] += e[i];
        cnt[g[i]]++;
        tot += e[i];
    }
    double mean = n ? tot / (double)n : 0, sst = 0, ssb = 0;
    for (int64_t i = 0; i < n; i++) sst += (e[i] - mean) * (e[i] - mean);
    int64_t k = 0;
    for (int64_t r = 0; r < P; r++)
        if (cnt[r]) {
            double d = sum[r] / (double)cnt[r] - mean;
            ssb += (double)cnt[r] * d * d;
            k++;
        }
    if (groups) *groups = k;
    /* residuals equal up to rounding (relative 1e-10): nothing to explain */
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(e[i]));
    if (!(sst > 1e-20 * scale * scale * (double)n)) {
        *eta2 = 0;
        if (F) *F = NAN;
        return;
    }
    *eta2 = fmin(1, fmax(0, ssb / sst));
    if (F) *F = k >= 2 && n > k && sst - ssb > 0 ? (ssb / (double)(k - 1)) / ((sst - ssb) / (double)(n - k)) : NAN;
}

void ps_phase_eta2(const double *e, const int64_t *x, int64_t n, int64_t P, double *eta2, double *F, int64_t *groups) {
    double *sum = malloc((size_t)P * sizeof *sum);
    int64_t *cnt = malloc((size_t)P * sizeof *cnt), *g = malloc((size_t)(n ? n : 1) * sizeof *g);
    if (!sum || !cnt || !g) {
        *eta2 = NAN;
        if (F) *F = NAN;
        if (groups) *groups = 0;
    } else {
        for (int64_t i = 0; i < n; i++) g[i] = ((x[i] % P) + P) % P;
        eta2_groups(e, g, n, P, sum, cnt, eta2, F, groups);
    }
    free(sum);
    free(cnt);
    free(g);
}

int ps_phase_test_run(const double *y, const int64_t *x, const int *stratum, int64_t n, int64_t P, int detrend,
                      int64_t perms, uint64_t seed, ps_phase_test *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    if (P < 1 || n < 0 || perms < 0) return ps_fail(err, "periodicity test: bad arguments (P %lld, n %lld)", (long long)P, (long long)n);
    double *e = malloc((size_t)(n ? n : 1) * sizeof *e), *w = malloc((size_t)(n ? n : 1) * sizeof *w),
           *sum = malloc((size_t)P * sizeof *sum);
    int64_t *g = calloc((size_t)(n ? n : 1), sizeof *g), *cnt = malloc((size_t)P * sizeof *cnt);
    if (!e || !w || !sum || !g || !cnt) {
        free(e), free(w), free(sum), free(g), free(cnt);
        return ps_fail(err, "out of memory for the periodicity test of %lld points", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) g[i] = ((x[i] % P) + P) % P;
    ps_phase_residuals(y, x, stratum, n, detrend, e, &out->detrended);
    double obs;
    eta2_groups(e, g, n, P, sum, cnt, &obs, &out->F, &out->groups);
    out->n = n;
    out->eta2 = obs;
    out->permutations = perms;
    int64_t ge = 0;
    if (obs > 0) {
        /* the indices of each stratum, stratum by stratum (in index order within one) */
        int maxs = 0;
        for (int64_t i = 0; i < n; i++) maxs = stratum && stratum[i] > maxs ? stratum[i] : maxs;
        int64_t *idx = malloc((size_t)n * sizeof *idx), *off = calloc((size_t)maxs + 2, sizeof *off);
        if (!idx || !off) {
            free(idx), free(off), free(e), free(w), free(sum), free(g), free(cnt);
            return ps_fail(err, "out of memory for the periodicity test of %lld points", (long long)n);
        }
        for (int64_t i = 0; i < n; i++) off[(stratum ? stratum[i] : 0) + 1]++;
        for (int s = 0; s <= maxs; s++) off[s + 1] += off[s];
        for (int64_t i = 0; i < n; i++) idx[off[stratum ? stratum[i] : 0]++] = i; /* off[s] moves to the end of s */
        for (int s = maxs; s >= 0; s--) off[s + 1] = off[s];                       /* and back */
        off[0] = 0;
        ps_rng r;
        ps_rng_seed(&r, seed ^ 0x7e57ULL);
        memcpy(w, e, (size_t)n * sizeof *w);
        double tol = 1e-12 * fmax(1, obs);
        for (int64_t k = 0; k < perms; k++) {
            for (int s = 0; s <= maxs; s++) /* Fisher-Yates within the stratum */
                for (int64_t i = off[s + 1] - off[s] - 1; i > 0; i--) {
                    int64_t j = ps_rng_below(&r, i + 1), a = idx[off[s] + i], b = idx[off[s] + j];
                    double t = w[a];
                    w[a] = w[b];
                    w[b] = t;
                }
            double v;
            eta2_groups(w, g, n, P, sum, cnt, &v, NULL, NULL);
            ge += v >= obs - tol;
        }
        free(idx);
        free(off);
    } else
        ge = perms;
    out->p_value = (1.0 + (double)ge) / (1.0 + (double)perms);
    free(e), free(w), free(sum), free(g), free(cnt);
    return 0;
}

/* ---- result JSON ---- */

#define SET(o, key, v) (bad |= json_object_set_new((o), (key), (v)) != 0)
#define APPEND(a, v) (bad |= json_array_append_new((a), (v)) != 0)

static json_t *ids_json(const ps_ids *ids) {
    json_t *a = json_array();
    for (int64_t i = 0; a && i < ids->n; i++)
        if (json_array_append_new(a, json_integer(ids->v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *test_json(const ps_phase_test *t) {
    json_t *o = json_object();
    int bad = !o;
    if (o) {
        SET(o, "n", json_integer(t->n));
        SET(o, "groups", json_integer(t->groups));
        SET(o, "eta2", json_real(t->eta2));
        SET(o, "F", isfinite(t->F) ? json_real(t->F) : json_null());
        SET(o, "permutations", json_integer(t->permutations));
        SET(o, "p_value", json_real(t->p_value));
        SET(o, "detrended", json_boolean(t->detrended));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *ps_fillexp_json(const ps_fillexp *e, const ps_tokenizer *tok, const ps_fillexp_result *r, ps_error *err) {
    int bad = 0, failed = 0; /* bad: out of memory; failed: a test failed (err set) */
    int64_t nL = r->n_L, N = (int64_t)r->n_fams * nL, P = r->P;
    json_t *o = json_object(), *ex = json_object(), *cands = json_array(), *st = json_object(), *fams = json_array();
    double *y = malloc((size_t)(N ? N : 1) * sizeof *y), *sum = calloc((size_t)P, sizeof *sum);
    int64_t *x = malloc((size_t)(N ? N : 1) * sizeof *x), *cnt = calloc((size_t)P, sizeof *cnt);
    int *strat = malloc((size_t)(N ? N : 1) * sizeof *strat);
    if (!o || !ex || !cands || !st || !fams || !y || !x || !sum || !cnt || !strat) {
        bad = 1;
        goto done;
    }
    SET(ex, "file", json_string(e->path));
    SET(ex, "name", json_string(e->name));
    if (e->description) SET(ex, "description", json_string(e->description));
    SET(ex, "template", json_string(e->template_text));
    SET(ex, "slot", json_string(e->slot));
    if (e->chat_prefix) {
        json_t *ch = json_object();
        if (ch) {
            SET(ch, "prefix", json_string(e->chat_prefix));
            SET(ch, "suffix", json_string(e->chat_suffix));
        }
        SET(ex, "chat", ch ? ch : json_null());
    } else
        SET(ex, "chat", json_null());
    json_t *ln = json_array();
    if (ln) {
        APPEND(ln, json_integer(e->L_min));
        APPEND(ln, json_integer(e->L_max));
    }
    SET(ex, "lengths", ln);
    for (int c = 0; c < e->n_cands; c++) {
        json_t *co = json_object();
        if (!co) {
            bad = 1;
            break;
        }
        SET(co, "text", e->cands[c].text ? json_string(e->cands[c].text) : json_null());
        SET(co, "ids", ids_json(&e->cands[c].ids));
        APPEND(cands, co);
    }
    SET(ex, "candidates", json_incref(cands));
    SET(ex, "prefix_tokens", json_integer(e->before.n));
    SET(ex, "suffix_tokens", json_integer(e->after.n));
    SET(o, "experiment", ex);
    ex = NULL;
    SET(o, "period", json_integer(P));
    SET(st, "test", json_string("permutation test of the between-residue variance of delta (eta squared)"));
    SET(st, "detrend", json_boolean(e->detrend));
    SET(st, "permutations", json_integer(e->permutations));
    SET(st, "seed", json_integer((json_int_t)e->seed));
    SET(o, "statistic", st);
    st = NULL;
    for (int f = 0; f < r->n_fams && !bad; f++) {
        json_t *fo = json_object(), *pts = json_array(), *res = json_array();
        if (!fo || !pts || !res) {
            json_decref(fo), json_decref(pts), json_decref(res);
            bad = 1;
            break;
        }
        SET(fo, "name", json_string(e->fams[f].name));
        SET(fo, "source", json_string(e->fams[f].source));
        memset(sum, 0, (size_t)P * sizeof *sum);
        memset(cnt, 0, (size_t)P * sizeof *cnt);
        for (int64_t i = 0; i < nL; i++) {
            const ps_fillexp_point *pt = &r->pts[f * nL + i];
            json_t *po = json_object(), *pc = json_array(), *t1 = json_object();
            if (!po || !pc || !t1) {
                json_decref(po), json_decref(pc), json_decref(t1);
                bad = 1;
                break;
            }
            SET(po, "L", json_integer(pt->L));
            SET(po, "phase", json_integer(pt->phase));
            SET(po, "prompt_tokens", json_integer(pt->prompt_tokens));
            for (int c = 0; c < r->n_cands; c++) {
                json_t *co = json_object();
                if (!co) {
                    bad = 1;
                    break;
                }
                SET(co, "logprob", json_real(pt->logprob[c]));
                SET(co, "p", json_real(exp(pt->logprob[c])));
                SET(co, "all_top1", json_boolean(pt->all_top1[c]));
                APPEND(pc, co);
            }
            SET(po, "candidates", pc);
            SET(po, "delta", json_real(pt->delta));
            char *txt = ps_text_id_string(tok, pt->top1);
            SET(t1, "id", json_integer(pt->top1));
            SET(t1, "text", txt ? json_string(txt) : json_null());
            free(txt);
            SET(po, "top1", t1);
            APPEND(pts, po);
            sum[pt->phase] += pt->delta;
            cnt[pt->phase]++;
            y[f * nL + i] = pt->delta;
            x[f * nL + i] = pt->L;
            strat[f * nL + i] = f;
        }
        for (int64_t rho = 0; rho < P; rho++) {
            json_t *ro = json_object();
            if (!ro) {
                bad = 1;
                break;
            }
            SET(ro, "rho", json_integer(rho));
            SET(ro, "n", json_integer(cnt[rho]));
            SET(ro, "mean_delta", cnt[rho] ? json_real(sum[rho] / (double)cnt[rho]) : json_null());
            APPEND(res, ro);
        }
        SET(fo, "points", pts);
        SET(fo, "residues", res);
        ps_phase_test t;
        if (bad || ps_phase_test_run(y + f * nL, x + f * nL, NULL, nL, P, e->detrend, e->permutations, e->seed + (uint64_t)f, &t, err)) {
            json_decref(fo);
            failed = !bad;
            goto done;
        }
        json_t *tj = test_json(&t);
        if (!tj) bad = 1;
        SET(fo, "test", tj ? tj : json_null());
        APPEND(fams, fo);
    }
    if (!bad) {
        SET(o, "families", json_incref(fams));
        ps_phase_test t;
        if (ps_phase_test_run(y, x, strat, N, P, e->detrend, e->permutations, e->seed ^ 0x9001ULL, &t, err)) {
            failed = 1;
            goto done;
        }
        json_t *tj = test_json(&t);
        if (!tj) bad = 1;
        SET(o, "pooled", tj ? tj : json_null());
    }
done:
    json_decref(ex);
    json_decref(st);
    json_decref(cands);
    json_decref(fams);
    free(y), free(x), free(sum), free(cnt), free(strat);
    if (bad) ps_fail(err, "out of memory while building the fillers result");
    if (bad || failed) {
        json_decref(o);
        return NULL;
    }
    return o;
}
