#include "interventions/v4_instr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/ops.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "tasks/tasks.h"

/* ---- the task ---- */

void ps_v4_task_free(ps_v4_task *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static int id_list(json_t *ids, const char *key, int64_t want, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *a = json_object_get(ids, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != want)
        return ps_fail(err, "%s: key \"ids.%s\" must be a list of %lld token ids (the task's n_%s)", src, key, (long long)want, key);
    for (int64_t i = 0; i < want; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
            return ps_fail(err, "%s: key \"ids.%s[%lld]\" must be a token id in [0, %lld)", src, key, (long long)i, (long long)vocab);
        out[i] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int one_id(json_t *ids, const char *key, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *x = json_object_get(ids, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
        return ps_fail(err, "%s: key \"ids.%s\" must be a token id in [0, %lld)", src, key, (long long)vocab);
    *out = (int32_t)json_integer_value(x);
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

int ps_v4_task_load(ps_v4_task *t, const char *task_path, const char *model_dir, int64_t vocab, int64_t max_pos, ps_error *err) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (task_path) snprintf(t->source, sizeof t->source, "%s", task_path);
    else {
        snprintf(t->source, sizeof t->source, "%s/phasescope_task.json", model_dir);
        if (stat(t->source, &st) != 0)
            return ps_fail(err, "%s is a DeepSeek-V4 checkpoint, which carries no phasescope task: give the prompts' task with "
                                "--task FILE.json ({\"task\": {...}, \"ids\": {...}}; docs/results-schema.md, \"DeepSeek-V4\"), "
                                "or put it in %s",
                           model_dir, t->source);
    }
    char *text;
    size_t len;
    if (ps_read_file(t->source, 1 << 20, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", t->source, je.line, je.text);
    int rc = -1;
    json_t *tj = json_object_get(root, "task"), *ids = json_object_get(root, "ids");
    if (!json_is_object(root)) {
        ps_fail(err, "%s: expected an object {\"task\": {...}, \"ids\": {...}}", t->source);
        goto done;
    }
    if (!tj) tj = root, ids = NULL; /* a bare task */
    else {
        const char *k;
        json_t *v;
        json_object_foreach(root, k, v) if (strcmp(k, "task") && strcmp(k, "ids")) {
            ps_fail(err, "%s: unknown key \"%s\" (valid: task, ids)", t->source, k);
            goto done;
        }
    }
    if (ps_task_from_json(tj, t->source, &t->task, err)) goto done;
    int64_t need = ps_task_vocab_needed(&t->task);
    if (ps_task_validate(&t->task, ids ? need : vocab, max_pos, t->source, err)) goto done;
    t->n_ids = need;
    t->ids = malloc((size_t)need * sizeof(int32_t));
    if (!t->ids) {
        ps_fail(err, "out of memory for %lld token ids", (long long)need);
        goto done;
    }
    if (!ids) {
        for (int64_t i = 0; i < need; i++) t->ids[i] = (int32_t)i;
        rc = 0;
        goto done;
    }
    t->mapped = 1;
    if (!json_is_object(ids)) {
        ps_fail(err, "%s: key \"ids\" must be an object {\"bos\", \"marker\", \"keys\", \"values\", \"fillers\"}", t->source);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(ids, k, v) if (strcmp(k, "bos") && strcmp(k, "marker") && strcmp(k, "keys") && strcmp(k, "values") &&
                                       strcmp(k, "fillers")) {
        ps_fail(err, "%s: unknown key \"ids.%s\" (valid: bos, marker, keys, values, fillers)", t->source, k);
        goto done;
    }
    const ps_task *tk = &t->task;
    if (one_id(ids, "bos", vocab, &t->ids[PS_BOS], t->source, err) || one_id(ids, "marker", vocab, &t->ids[PS_MARKER], t->source, err) ||
        id_list(ids, "keys", tk->n_keys, vocab, t->ids + ps_task_key0(tk), t->source, err) ||
        (tk->n_values > 0 && id_list(ids, "values", tk->n_values, vocab, t->ids + ps_task_val0(tk), t->source, err)) ||
        id_list(ids, "fillers", tk->n_fillers, vocab, t->ids + ps_task_fill0(tk), t->source, err))
        goto done;
    /* one role per token: a token both key and value (or filler) would make the answers ambiguous */
    int32_t *sorted = malloc((size_t)need * sizeof(int32_t));
    if (!sorted) {
        ps_fail(err, "out of memory");
        goto done;
    }
    memcpy(sorted, t->ids, (size_t)need * sizeof(int32_t));
    qsort(sorted, (size_t)need, sizeof(int32_t), cmp_i32);
    for (int64_t i = 1; i < need; i++)
        if (sorted[i] == sorted[i - 1]) {
            ps_fail(err, "%s: token id %d appears twice in \"ids\" (every task token needs its own id)", t->source, sorted[i]);
            free(sorted);
            goto done;
        }
    free(sorted);
    rc = 0;
done:
    json_decref(root);
    if (rc) ps_v4_task_free(t);
    return rc;
}

json_t *ps_v4_task_source_json(const ps_v4_task *t) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(t->source));
    if (!t->mapped) {
        json_object_set_new(o, "ids", json_string("identity"));
        return o;
    }
    json_t *ids = json_object(), *a;
    const ps_task *tk = &t->task;
    json_object_set_new(ids, "bos", json_integer(t->ids[PS_BOS]));
    json_object_set_new(ids, "marker", json_integer(t->ids[PS_MARKER]));
    struct { const char *k; int64_t off, n; } L[] = {{"keys", ps_task_key0(tk), tk->n_keys},
                                                   {"values", ps_task_val0(tk), tk->n_values},
                                                   {"fillers", ps_task_fill0(tk), tk->n_fillers}};
    for (int i = 0; i < 3; i++) {
        if (!L[i].n) continue;
        a = json_array();
        for (int64_t j = 0; j < L[i].n; j++) json_array_append_new(a, json_integer(t->ids[L[i].off + j]));
        json_object_set_new(ids, L[i].k, a);
    }
    json_object_set_new(o, "ids", ids);
    return o;
}

/* ---- evaluation ---- */

int ps_v4_eval(ps_v4_model *m, const ps_v4_task *t, const ps_batch *b, int64_t batch, const ps_hooks *hooks, int *correct,
               double *logprob, ps_error *err) {
    int64_t N = b->B, T = b->T, V = m->cfg.vocab_size, full = batch < N ? batch : N;
    if (batch < 1) return ps_fail(err, "batch %lld must be >= 1", (long long)batch);
    if (N == 0) return 0;
    /* the mapped copy: tokens (and the answer tokens scoring reads from them) in the model's ids */
    ps_batch mb;
    if (ps_batch_alloc(&mb, N, T, b->max_q, err)) return -1;
    for (int64_t i = 0; i < N * T; i++) {
        int32_t x = b->tokens[i], y = b->targets[i];
        if (x < 0 || x >= t->n_ids) {
            ps_batch_free(&mb);
            return ps_fail(err, "token %d outside the task's %lld ids", x, (long long)t->n_ids);
        }
        mb.tokens[i] = t->ids[x];
        mb.targets[i] = y >= 0 && y < t->n_ids ? t->ids[y] : -1;
    }
    memcpy(mb.n_q, b->n_q, (size_t)N * sizeof *b->n_q);
    memcpy(mb.queries, b->queries, (size_t)(N * b->max_q) * sizeof *b->queries);
    ps_v4_acts a, part;
    int have_a = 0, have_part = 0, rc = 0;
    int64_t last0 = (N - 1) / full * full;
    rc = ps_v4_acts_create(&a, m, full, T, err);
    have_a = !rc;
    if (!rc && N - last0 != full) {
        rc = ps_v4_acts_create(&part, m, N - last0, T, err);
        have_part = !rc;
    }
    for (int64_t i0 = 0; i0 < N && !rc; i0 += full) {
        ps_v4_acts *use = i0 == last0 && have_part ? &part : &a;
        ps_batch view = ps_batch_view(&mb, i0, use->B);
        rc = ps_v4_forward(m, use, view.tokens, hooks, -1, err);
        const float *lg = rc ? NULL : ps_v4_logits_host(use, err);
        if (!rc && !lg) rc = -1;
        if (!rc) ps_score_queries(&view, lg, V, correct + i0 * b->max_q, logprob + i0 * b->max_q);
    }
    if (have_part) ps_v4_acts_free(&part);
    if (have_a) ps_v4_acts_free(&a);
    ps_batch_free(&mb);
    return rc;
}

static int outcome_arrays(const ps_batch *b, int **ok, double **lp, ps_error *err) {
    *ok = malloc((size_t)(b->B * b->max_q > 0 ? b->B * b->max_q : 1) * sizeof(int));
    *lp = malloc((size_t)(b->B * b->max_q > 0 ? b->B * b->max_q : 1) * sizeof(double));
    if (*ok && *lp) return 0;
    free(*ok), free(*lp);
    *ok = NULL, *lp = NULL;
    return ps_fail(err, "out of memory for the outcomes of %lld prompts x %lld queries", (long long)b->B, (long long)b->max_q);
}

int ps_v4_sweep_run(ps_v4_model *m, const ps_v4_task *t, const ps_batch *base, const ps_filler_family *fam,
                    ps_sweep_mode mode, int64_t P, uint64_t seed, int64_t batch, ps_residue_stats *stats,
                    ps_progress_fn progress, void *user, ps_error *err) {
    if (ps_residue_stats_init(stats, P, err)) return -1;
    int *ok;
    double *lp;
    if (outcome_arrays(base, &ok, &lp, err)) return -1;
    int rc = 0;
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        rc = ps_make_shifted(base, &t->task, fam, mode, P, p, seed, m->cfg.max_position_embeddings, &s, err);
        if (rc) break;
        rc = ps_v4_eval(m, t, &s.b, batch, NULL, ok, lp, err);
        if (!rc) ps_residue_stats_add(stats, &s, ok, lp);
        ps_shifted_free(&s);
        if (progress) progress(p + 1, P, user);
    }
    free(ok);
    free(lp);
    return rc;
}

/* ---- gates ---- */

typedef struct {
    ps_chgate_acc *acc;
    int layer, branch;
} gate_tap;

static int gate_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    (void)err;
    const gate_tap *g = user;
    ps_chgate_acc_add(g->acc, g->layer, g->branch, ev->data, ev->shape[0], ev->shape[1]);
    return 0;
}

static const char *const BRANCHES[] = {"compressor", "indexer"};

int ps_v4_gates_run(ps_v4_model *m, const ps_v4_task *t, const ps_batch *base, const ps_filler_family *fam, uint64_t seed,
                    int64_t batch, ps_chgate_acc *acc, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    int L = (int)c->n_layers, rc = -1;
    if (ps_chgate_acc_init(acc, L, 2, BRANCHES, err)) return -1;
    gate_tap *taps = calloc((size_t)L * 2, sizeof *taps);
    ps_hooks h;
    ps_hooks_init(&h);
    ps_shifted s = {0};
    int *ok = NULL;
    double *lp = NULL;
    int any = 0;
    if (!taps) {
        ps_fail(err, "out of memory");
        goto done;
    }
    for (int l = 0; l < L; l++) {
        ps_v4_attn_type at = c->attn_type[l];
        if (at == PS_V4_SLIDING) continue;
        int csa = at == PS_V4_CSA;
        int64_t mr = c->compress_rate[l];
        const char *an = csa ? "csa" : "hca";
        char name[96];
        if (ps_chgate_acc_set(acc, l, 0, csa ? 2 * mr : mr, c->head_dim, csa, mr, an, err)) goto done;
        taps[2 * l] = (gate_tap){acc, l, 0};
        ps_v4_hook_name(name, sizeof name, l, PS_V4H_C_ALPHA);
        if (ps_v4_hooks_add(&h, c, name, gate_hook, &taps[2 * l], err)) goto done;
        if (csa) {
            if (ps_chgate_acc_set(acc, l, 1, 2 * mr, c->index_head_dim, 1, mr, an, err)) goto done;
            taps[2 * l + 1] = (gate_tap){acc, l, 1};
            ps_v4_hook_name(name, sizeof name, l, PS_V4H_I_C_ALPHA);
            if (ps_v4_hooks_add(&h, c, name, gate_hook, &taps[2 * l + 1], err)) goto done;
        }
        any = 1;
    }
    if (!any) {
        ps_fail(err, "%s: no CSA or HCA layer (every layer is sliding-window attention): there are no gates", m->dir);
        goto done;
    }
    if (ps_make_shifted(base, &t->task, fam, PS_SWEEP_PAD, 1, 0, seed, c->max_position_embeddings, &s, err) ||
        outcome_arrays(&s.b, &ok, &lp, err) || ps_v4_eval(m, t, &s.b, batch, &h, ok, lp, err))
        goto done;
    rc = 0;
done:
    free(ok);
    free(lp);
    ps_shifted_free(&s);
    ps_hooks_free(&h);
    free(taps);
    if (rc) ps_chgate_acc_free(acc);
    return rc;
}

/* ---- gate cycling ---- */

int ps_v4_gate_cycle(ps_v4_model *m, int layer, int branches, int64_t k, ps_error *err) {
    const ps_v4_config *c = &m->cfg;
    if (layer < 0 || layer >= c->n_layers)
        return ps_fail(err, "--layer %d: out of range (the model has %lld layers, 0..%lld)", layer, (long long)c->n_layers,
                       (long long)c->n_layers - 1);
    ps_v4_attn_type at = c->attn_type[layer];
    if (at == PS_V4_SLIDING) {
        char list[256] = "";
        size_t w = 0;
        for (int l = 0; l < c->n_layers && w + 12 < sizeof list; l++)
            if (c->attn_type[l] != PS_V4_SLIDING) w += (size_t)snprintf(list + w, sizeof list - w, " %d", l);
        return ps_fail(err, "--layer %d: a sliding-window layer has no compressor to cycle (compressed layers:%s)", layer,
                       w ? list : " none");
    }
    if ((branches & PS_V4_CYCLE_INDEXER) && !(branches & PS_V4_CYCLE_COMPRESSOR) && at != PS_V4_CSA)
        return ps_fail(err, "--branch indexer: layer %d is %s, which has no indexer (CSA layers only)", layer, ps_v4_attn_type_name(at));
    int64_t mr = c->compress_rate[layer], cw = (at == PS_V4_CSA ? 2 : 1) * c->head_dim, iw = 2 * c->index_head_dim;
    k = ((k % mr) + mr) % mr;
    ps_v4_layer w;
    if (ps_v4_layer_acquire(m, layer, &w, err)) return -1;
    int bad = 0;
    if (branches & PS_V4_CYCLE_COMPRESSOR) bad = ps_roll_blocks(m->ctx, w.c_ape, mr, cw, 0, cw, k);
    if (!bad && (branches & PS_V4_CYCLE_INDEXER) && at == PS_V4_CSA) bad = ps_roll_blocks(m->ctx, w.i_ape, mr, iw, 0, iw, k);
    /* a lazily loaded model keeps the cycled layer pinned (its reference is not released), so the roll is not
     * lost when the forward drops the layer; freed with the model */
    if (!m->lazy) ps_v4_layer_release(m, layer);
    if (bad) {
        ps_ctx_check(m->ctx, err);
        return ps_fail_prefix(err, "cycling layer %d's position bias (m = %lld): ", layer, (long long)mr);
    }
    return 0;
}

/* ---- knockout ---- */

const char *const ps_v4_ko_targets[] = {"heads", "compressed", "raw", "indexer", "sink", NULL};

int ps_v4_ko_layer_ok(const ps_v4_config *c, int l, ps_v4_ko_target target) {
    if (target == PS_V4KO_COMPRESSED) return c->attn_type[l] != PS_V4_SLIDING;
    if (target == PS_V4KO_INDEXER) return c->attn_type[l] == PS_V4_CSA;
    return 1;
}

static ps_v4_hook_point target_point(ps_v4_ko_target t, int sum_pass) {
    switch (t) {
    case PS_V4KO_HEADS: return PS_V4H_Q;
    case PS_V4KO_COMPRESSED: return PS_V4H_C_KV;
    case PS_V4KO_RAW: return PS_V4H_KV;
    case PS_V4KO_INDEXER: return sum_pass ? PS_V4H_I_SCORES : PS_V4H_I_TOPK;
    default: return PS_V4H_SINK;
    }
}

/* The summed / mean array of one layer: [n] values per sequence (positions × inner). */
typedef struct {
    double *sum;      /* [n] */
    float *mean;      /* [n] (indexer: the mean-pattern top-k [T, K]) */
    int64_t n;
    int64_t count;    /* sequences summed */
    /* replacement */
    int head;         /* heads: the query head replaced (layout [npos, H, Dh]); -1: the whole array */
    int64_t npos, H, Dh;
} layer_mean;

static int sum_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    layer_mean *lm = user;
    int64_t B = ev->shape[0], n = 1;
    for (int i = 1; i < ev->ndim; i++) n *= ev->shape[i];
    if (n != lm->n) return ps_fail(err, "hook \"%s\": %lld values per sequence, the knockout expected %lld", ev->name, (long long)n, (long long)lm->n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) lm->sum[i] += ev->data[b * n + i];
    lm->count += B;
    return 0;
}

static int replace_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    const layer_mean *lm = user;
    int64_t B = ev->shape[0], n = 1;
    for (int i = 1; i < ev->ndim; i++) n *= ev->shape[i];
    if (n != lm->n) return ps_fail(err, "hook \"%s\": %lld values per sequence, the knockout expected %lld", ev->name, (long long)n, (long long)lm->n);
    for (int64_t b = 0; b < B; b++) {
        float *x = ev->data + b * n;
        if (lm->head < 0) memcpy(x, lm->mean, (size_t)n * sizeof(float));
        else
            for (int64_t t = 0; t < lm->npos; t++)
                memcpy(x + (t * lm->H + lm->head) * lm->Dh, lm->mean + (t * lm->H + lm->head) * lm->Dh, (size_t)lm->Dh * sizeof(float));
    }
    return 0;
}

void ps_v4_mean_topk(const double *ms, int64_t T, int64_t nW, int64_t K, int64_t m, float *topk) {
    for (int64_t t = 0; t < T; t++) {
        int64_t nv = m > 0 ? (t + 1) / m : nW;
        if (nv > nW) nv = nW;
        const double *row = ms + t * nW;
        float *o = topk + t * K;
        for (int64_t i = 0; i < K; i++) {
            int64_t best = -1;
            for (int64_t w = 0; w < nv; w++) {
                int taken = 0;
                for (int64_t j = 0; j < i && !taken; j++) taken = o[j] == (float)w;
                if (taken) continue;
                if (best < 0 || row[w] > row[best]) best = w; /* strict: ties to the lower index */
            }
            o[i] = (float)best;
        }
    }
}

int ps_v4_knockout_grid(ps_v4_model *m, const ps_v4_task *t, const ps_batch *base, const ps_filler_family *fam, int64_t P,
                        uint64_t seed, int64_t batch, const int *layers, int n_layers, const int *heads, int n_heads,
                        ps_v4_ko_target target, ps_knockout_result *out, ps_progress_fn progress, void *user, ps_error *err) {
    memset(out, 0, sizeof *out);
    const ps_v4_config *c = &m->cfg;
    int per_head = target == PS_V4KO_HEADS;
    static const int ONE[1] = {0};
    if (!per_head) heads = ONE, n_heads = 1;
    if (n_layers < 1 || n_heads < 1) return ps_fail(err, "knockout grid: no layers or no heads selected");
    for (int i = 0; i < n_layers; i++) {
        if (layers[i] < 0 || layers[i] >= c->n_layers) return ps_fail(err, "knockout grid: layer %d out of range", layers[i]);
        if (!ps_v4_ko_layer_ok(c, layers[i], target))
            return ps_fail(err, "--target %s: layer %d is %s, which has no %s", ps_v4_ko_targets[target], layers[i],
                           ps_v4_attn_type_name(c->attn_type[layers[i]]),
                           target == PS_V4KO_INDEXER ? "indexer (CSA layers only)" : "compressed entries (CSA and HCA layers only)");
    }
    for (int i = 0; i < n_heads; i++)
        if (heads[i] < 0 || heads[i] >= c->n_heads) return ps_fail(err, "knockout grid: head %d out of range", heads[i]);
    out->P = P;
    out->n_layers = n_layers;
    out->n_heads = n_heads;
    out->layers = malloc((size_t)n_layers * sizeof(int));
    out->heads = malloc((size_t)n_heads * sizeof(int));
    out->cells = calloc((size_t)n_layers * (size_t)n_heads, sizeof *out->cells);
    if (!out->layers || !out->heads || !out->cells)
        return ps_fail(err, "out of memory for a knockout grid of %d layers x %d units", n_layers, n_heads);
    memcpy(out->layers, layers, (size_t)n_layers * sizeof(int));
    memcpy(out->heads, heads, (size_t)n_heads * sizeof(int));
    int rc = ps_residue_stats_init(&out->clean, P, err);
    for (int64_t i = 0; i < (int64_t)n_layers * n_heads && !rc; i++) rc = ps_residue_stats_init(&out->cells[i], P, err);
    if (rc) return -1;
    int *ok;
    double *lp;
    if (outcome_arrays(base, &ok, &lp, err)) return -1;
    layer_mean *lm = calloc((size_t)n_layers, sizeof *lm);
    if (!lm) rc = ps_fail(err, "out of memory");
    int64_t total = P * (1 + (int64_t)n_layers * n_heads), H = c->n_heads, Dh = c->head_dim;
    for (int64_t p = 0; p < P && !rc; p++) {
        ps_shifted s;
        if ((rc = ps_make_shifted(base, &t->task, fam, PS_SWEEP_PAD, P, p, seed, c->max_position_embeddings, &s, err))) break;
        int64_t T = s.b.T;
        /* pass 1: the sums over the prompts of this shift, and the clean outcomes */
        ps_hooks h;
        ps_hooks_init(&h);
        for (int li = 0; li < n_layers && !rc; li++) {
            int l = layers[li];
            int64_t nW = ps_v4_n_windows(c, l, T), K = c->index_topk < nW ? c->index_topk : nW;
            layer_mean *x = &lm[li];
            free(x->sum), free(x->mean);
            memset(x, 0, sizeof *x);
            x->head = -1;
            switch (target) {
            case PS_V4KO_HEADS: x->n = T * H * Dh, x->npos = T, x->H = H, x->Dh = Dh; break;
            case PS_V4KO_COMPRESSED: x->n = nW * Dh; break;
            case PS_V4KO_RAW: x->n = T * Dh; break;
            case PS_V4KO_INDEXER: x->n = T * nW; break;
            default: x->n = H * T; break;
            }
            int64_t nmean = target == PS_V4KO_INDEXER ? T * K : x->n;
            x->sum = calloc((size_t)(x->n ? x->n : 1), sizeof(double));
            x->mean = malloc((size_t)(nmean ? nmean : 1) * sizeof(float));
            if (!x->sum || !x->mean) {
                rc = ps_fail(err, "out of memory for the knockout means of layer %d", l);
                break;
            }
            char name[96];
            ps_v4_hook_name(name, sizeof name, l, target_point(target, 1));
            rc = ps_v4_hooks_add(&h, c, name, sum_hook, x, err);
        }
        if (!rc && !(rc = ps_v4_eval(m, t, &s.b, batch, &h, ok, lp, err))) ps_residue_stats_add(&out->clean, &s, ok, lp);
        ps_hooks_free(&h);
        for (int li = 0; li < n_layers && !rc; li++) {
            layer_mean *x = &lm[li];
            int l = layers[li];
            if (x->count != s.b.B) {
                rc = ps_fail(err, "layer %d: the knockout's sums saw %lld prompts of %lld", l, (long long)x->count, (long long)s.b.B);
                break;
            }
            if (target == PS_V4KO_INDEXER) {
                int64_t nW = ps_v4_n_windows(c, l, T), K = c->index_topk < nW ? c->index_topk : nW;
                for (int64_t i = 0; i < x->n; i++) x->sum[i] /= (double)x->count;
                ps_v4_mean_topk(x->sum, T, nW, K, c->compress_rate[l], x->mean);
                x->n = T * K; /* the replacement array */
            } else
                for (int64_t i = 0; i < x->n; i++) x->mean[i] = (float)(x->sum[i] / (double)x->count);
        }
        if (progress) progress(p * (1 + (int64_t)n_layers * n_heads) + 1, total, user);
        /* pass 2: one forward per cell with its replacement */
        for (int li = 0; li < n_layers && !rc; li++)
            for (int hi = 0; hi < n_heads && !rc; hi++) {
                layer_mean x = lm[li];
                x.head = per_head ? heads[hi] : -1;
                ps_hooks_init(&h);
                char name[96];
                ps_v4_hook_name(name, sizeof name, layers[li], target_point(target, 0));
                rc = ps_v4_hooks_add(&h, c, name, replace_hook, &x, err);
                if (!rc && !(rc = ps_v4_eval(m, t, &s.b, batch, &h, ok, lp, err)))
                    ps_residue_stats_add(&out->cells[li * n_heads + hi], &s, ok, lp);
                ps_hooks_free(&h);
                if (progress) progress(p * (1 + (int64_t)n_layers * n_heads) + 2 + li * n_heads + hi, total, user);
            }
        ps_shifted_free(&s);
    }
    if (lm)
        for (int li = 0; li < n_layers; li++) free(lm[li].sum), free(lm[li].mean);
    free(lm);
    free(ok);
    free(lp);
    return rc;
}
