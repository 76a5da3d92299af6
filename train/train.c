#define _POSIX_C_SOURCE 200809L
#include "train/train.h"

#include "core/cpu_env.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backward.h"
#include "scaleout/dist.h"
#include "core/fileio.h"
#include "core/forward.h"
#include "gates/chgates.h"
#include "gates/gates.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "tasks/tasks.h"
#include "tasks/textkv_task.h"

/* ---- config ---- */

/* The "train" keys: one table drives parsing, range checks, the list in error messages and the
 * canonical JSON stored in checkpoints (in this order). */
typedef enum { TK_INT, TK_REAL, TK_SEED, TK_LOGITS } tk_kind;
typedef struct {
    const char *name;
    tk_kind kind;
    size_t off;     /* offset of the field in ps_train_cfg */
    double lo, hi;  /* allowed range (TK_INT, TK_REAL) */
    int omit_default; /* left out of the canonical JSON when 0, so checkpoints from before the key keep their form */
} train_key;

#define TKI(n, field, lo) {n, TK_INT, offsetof(ps_train_cfg, field), lo, (double)((int64_t)1 << 40), 0}
#define TKR(n, field, lo, hi) {n, TK_REAL, offsetof(ps_train_cfg, field), lo, hi, 0}
static const train_key TRAIN_KEYS[] = {
    TKI("steps", steps, 1),
    TKI("batch_size", batch_size, 1),
    {"seed", TK_SEED, offsetof(ps_train_cfg, seed), 0, 0, 0},
    TKR("lr", opt.lr, 0, 10),
    TKR("min_lr_frac", opt.min_lr_frac, 0, 1),
    TKI("warmup_steps", opt.warmup_steps, 0),
    TKR("beta1", opt.beta1, 0, 0.999999),
    TKR("beta2", opt.beta2, 0, 0.999999999),
    TKR("eps", opt.eps, 0, 1),
    TKR("weight_decay", opt.weight_decay, 0, 10),
    TKR("grad_clip", opt.grad_clip, 0, 1e9),
    TKR("gate_lr_mult", opt.gate_lr_mult, 0, 1e6),
    TKR("gate_weight_decay", opt.gate_weight_decay, 0, 10),
    TKI("log_every", log_every, 1),
    TKI("eval_every", eval_every, 1),
    TKI("eval_size", eval_size, 1),
    TKI("gates_every", gates_every, 1),
    TKI("checkpoint_every", checkpoint_every, 1),
    TKR("init_std", init_std, 1e-6, 10),
    {"logits", TK_LOGITS, offsetof(ps_train_cfg, logits_answers), 0, 0, 0},
    /* mitigations of the weak phase (docs/mitigations.md) */
    {"gate_reg", TK_REAL, offsetof(ps_train_cfg, gate_reg), 0, 1e6, 1},
    {"phase_augment", TK_INT, offsetof(ps_train_cfg, phase_augment), 0, 1, 1},
};
#undef TKI
#undef TKR
#define N_TRAIN_KEYS (int)(sizeof TRAIN_KEYS / sizeof TRAIN_KEYS[0])

void ps_train_cfg_free(ps_train_cfg *c) {
    free(c->canonical);
    c->canonical = NULL;
    if (c->text) ps_textkv_task_free(c->text);
    free(c->text);
    c->text = NULL;
}

/* the task as JSON (config canonical form, checkpoint metadata) */
static json_t *task_json(const ps_train_cfg *c) { return c->text ? ps_textkv_task_to_json(c->text) : ps_task_to_json(&c->task); }

/* a batch (allocated for b->B sequences) from seed */
static int generate(const ps_train_cfg *c, uint64_t seed, ps_batch *b, ps_error *err) {
    if (c->text) return ps_textkv_task_generate(c->text, seed, b->B, b, err);
    return ps_task_generate(&c->task, seed, b, err);
}


static int parse_train(json_t *o, const char *src, ps_train_cfg *c, ps_error *err) {
    if (!json_is_object(o)) return ps_fail(err, "%s: key \"train\" must be an object", src);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int i = 0;
        while (i < N_TRAIN_KEYS && strcmp(TRAIN_KEYS[i].name, k)) i++;
        if (i == N_TRAIN_KEYS) {
            char list[512] = "";
            for (int j = 0; j < N_TRAIN_KEYS; j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "", TRAIN_KEYS[j].name);
            return ps_fail(err, "%s: unknown key \"train.%s\" (valid: %s)", src, k, list);
        }
        const train_key *tk = &TRAIN_KEYS[i];
        char *field = (char *)c + tk->off;
        switch (tk->kind) {
        case TK_SEED:
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                return ps_fail(err, "%s: key \"train.seed\" must be a non-negative integer", src);
            *(uint64_t *)field = (uint64_t)json_integer_value(v);
            break;
        case TK_INT:
            if (!json_is_integer(v)) return ps_fail(err, "%s: key \"train.%s\" must be a JSON integer", src, k);
            *(int64_t *)field = (int64_t)json_integer_value(v);
            break;
        case TK_REAL:
            if (!json_is_number(v)) return ps_fail(err, "%s: key \"train.%s\" must be a number", src, k);
            *(double *)field = json_number_value(v);
            break;
        case TK_LOGITS:
            if (!json_is_string(v) || (strcmp(json_string_value(v), "all") && strcmp(json_string_value(v), "answers")))
                return ps_fail(err, "%s: key \"train.logits\" must be \"all\" or \"answers\"", src);
            *(int *)field = !strcmp(json_string_value(v), "answers");
            break;
        }
    }
    for (int i = 0; i < N_TRAIN_KEYS; i++) {
        const train_key *tk = &TRAIN_KEYS[i];
        const char *field = (const char *)c + tk->off;
        if (tk->kind == TK_INT) {
            int64_t x = *(const int64_t *)field;
            if ((double)x < tk->lo || (double)x > tk->hi)
                return ps_fail(err, "%s: key \"train.%s\" must be in [%lld, %lld], got %lld", src, tk->name, (long long)tk->lo,
                               (long long)tk->hi, (long long)x);
        } else if (tk->kind == TK_REAL) {
            double x = *(const double *)field;
            if (!(x >= tk->lo && x <= tk->hi) || (!strcmp(tk->name, "lr") && x == 0))
                return ps_fail(err, "%s: key \"train.%s\" is %g, outside [%g, %g]", src, tk->name, x, tk->lo, tk->hi);
        }
    }
    return 0;
}

/* The "train" object of the canonical config (the defaults made explicit; "logits" only when not "all",
 * so checkpoints written before the key existed keep their canonical form). */
static json_t *train_to_json(const ps_train_cfg *c) {
    json_t *tr = json_object();
    for (int i = 0; i < N_TRAIN_KEYS; i++) {
        const train_key *tk = &TRAIN_KEYS[i];
        const char *field = (const char *)c + tk->off;
        switch (tk->kind) {
        case TK_SEED: json_object_set_new(tr, tk->name, json_integer((json_int_t)*(const uint64_t *)field)); break;
        case TK_INT:
            if (!tk->omit_default || *(const int64_t *)field) json_object_set_new(tr, tk->name, json_integer(*(const int64_t *)field));
            break;
        case TK_REAL:
            if (!tk->omit_default || *(const double *)field) json_object_set_new(tr, tk->name, json_real(*(const double *)field));
            break;
        case TK_LOGITS:
            if (*(const int *)field) json_object_set_new(tr, tk->name, json_string("answers"));
            break;
        }
    }
    return tr;
}

int ps_train_cfg_parse(const char *text, size_t len, const char *src, ps_train_cfg *c, ps_error *err) {
    memset(c, 0, sizeof *c);
    ps_optim_defaults(&c->opt);
    c->steps = 1000;
    c->batch_size = 16;
    c->log_every = 10;
    c->eval_every = 100;
    c->eval_size = 256;
    c->gates_every = 100;
    c->checkpoint_every = 200;
    c->init_std = 0.02;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", src, je.line, je.text);
    int rc = -1;
    char *model_text = NULL;
    json_t *model = NULL, *task = NULL, *train = NULL;
    if (!json_is_object(root)) {
        ps_fail(err, "%s: training config must be a JSON object with \"model\", \"task\" and \"train\"", src);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "model")) model = v;
        else if (!strcmp(k, "task")) task = v;
        else if (!strcmp(k, "train")) train = v;
        else {
            ps_fail(err, "%s: unknown key \"%s\" (valid: model, task, train)", src, k);
            goto done;
        }
    }
    if (!model || !task) {
        ps_fail(err, "%s: missing key \"%s\"", src, model ? "task" : "model");
        goto done;
    }
    if (!json_is_object(model)) {
        ps_fail(err, "%s: key \"model\" must be an object", src);
        goto done;
    }
    model_text = json_dumps(model, JSON_COMPACT);
    char msrc[1100];
    snprintf(msrc, sizeof msrc, "%s (model)", src);
    if (ps_config_parse(model_text, strlen(model_text), msrc, &c->model, err)) goto done;
    if (ps_textkv_task_is(task)) { /* text key-value prompts of a real tokenizer (text/textkv_task.h) */
        char base[4096];
        ps_text_dirname(src, base, sizeof base);
        c->text = calloc(1, sizeof *c->text);
        if (!c->text) {
            ps_fail(err, "out of memory");
            goto done;
        }
        if (ps_textkv_task_from_json(task, src, base, c->text, err) ||
            ps_textkv_task_open(c->text, c->model.vocab_size, c->model.max_seq_len, src, err))
            goto done;
        c->task = ps_textkv_task_core(c->text);
    } else {
        if (ps_task_from_json(task, src, &c->task, err)) goto done;
        if (ps_task_validate(&c->task, c->model.vocab_size, c->model.max_seq_len, src, err)) goto done;
    }
    if (train && parse_train(train, src, c, err)) goto done;
    c->opt.total_steps = c->steps;
    /* canonical form: every key with its value, fixed order */
    json_t *canon = json_object(), *tr = train_to_json(c);
    char *mj = ps_config_to_json(&c->model);
    json_object_set_new(canon, "model", json_loads(mj, 0, NULL));
    free(mj);
    json_object_set_new(canon, "task", task_json(c));
    json_object_set_new(canon, "train", tr);
    c->canonical = json_dumps(canon, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(canon);
    rc = 0;
done:
    free(model_text);
    json_decref(root);
    if (rc) ps_train_cfg_free(c); /* a config that failed holds nothing (its text-kv task included) */
    return rc;
}

int ps_train_cfg_load(const char *path, ps_train_cfg *c, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)16 << 20, &text, &len, err)) return -1;
    int rc = ps_train_cfg_parse(text, len, path, c, err);
    free(text);
    return rc;
}

/* ---- run state ---- */

typedef struct {
    const ps_train_cfg *c;
    const char *dir;
    ps_model m;
    float *grads, *m1, *m2;
    ps_acts acts, gacts;
    int64_t *rows; /* logit rows of the step (train.logits "answers") */
    int64_t *shift; /* train.phase_augment: this rank's grid phase per sequence of the step */
    ps_batch batch, eval_batch;
    FILE *log;
    int has_gates;
    ps_gate_acc gacc;
    ps_hooks ghooks;
    int has_chgates;      /* attention kind v4: per-channel gate statistics (gates/chgates.h) */
    ps_chgate_acc chacc;
    float *stage; /* a device backend (not host-visible): 2 · n_params host floats that parameters and moments
                     pass through on their way to and from the checkpoint files; NULL until needed */
    int R, root;                /* ranks; this one is rank 0 */
    int64_t Bg, b0, B, T;       /* the global batch; this rank's rows of it, [b0, b0 + B); sequence length */
    int64_t max_rows;           /* train.logits "answers": the most logit rows of this rank's part (0: all rows) */
    double gate_reg_w;          /* train.gate_reg: the weight of each (layer, KV head, branch) term */
    char logpath[4200];         /* rank 0: the run's train.jsonl */
} run_state;

/* The host staging buffer of a run on a device backend (allocated once, on first use). */
static float *host_stage(run_state *s, ps_error *err) {
    if (!s->stage && !(s->stage = malloc((size_t)(2 * s->m.n_params) * sizeof(float))))
        ps_fail(err, "out of memory for the %.1f MB host copy of the parameters and AdamW moments",
                2.0 * (double)s->m.n_params * 4e-6);
    return s->stage;
}

static uint64_t step_seed(uint64_t seed, int64_t step) {
    uint64_t x = seed * 0xd1b54a32d192ed03ULL ^ ((uint64_t)step + 0x632be59bd9b4e019ULL);
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ULL;
    return x ^ (x >> 29);
}

/* The checkpoint of step: optimizer-STEP.safetensors, then model.safetensors (+ config.json). On a device
 * backend the moments, then the parameters, are copied to the host staging buffer and written from there. */
static int save_checkpoint(run_state *s, int64_t step, ps_error *err) {
    char name[64], path[4200], buf[32];
    snprintf(name, sizeof name, "optimizer-%lld.safetensors", (long long)step);
    if (ps_path_join(path, sizeof path, s->dir, name, err)) return -1;
    int dev = !ps_ctx_host_visible(s->m.ctx);
    int64_t n = s->m.n_params, bytes = n * (int64_t)sizeof(float);
    const float *mom[2] = {s->m1, s->m2};
    if (dev) {
        float *st = host_stage(s, err);
        if (!st || ps_buf_to_host(s->m.ctx, st, s->m1, bytes, err) || ps_buf_to_host(s->m.ctx, st + n, s->m2, bytes, err))
            return ps_fail_prefix(err, "checkpoint of step %lld: ", (long long)step);
        mom[0] = st, mom[1] = st + n;
    }
    ps_st_tensor *t = calloc((size_t)(2 * s->m.n_tensors), sizeof *t);
    char (*names)[140] = calloc((size_t)(2 * s->m.n_tensors), sizeof *names);
    if (!t || !names) {
        free(t);
        free(names);
        return ps_fail(err, "out of memory");
    }
    for (int i = 0; i < s->m.n_tensors; i++)
        for (int k = 0; k < 2; k++) {
            const ps_param_info *p = &s->m.table[i];
            ps_st_tensor *x = &t[2 * i + k];
            snprintf(names[2 * i + k], 140, "%s.%s", k ? "v" : "m", p->name);
            x->name = names[2 * i + k];
            x->ndim = p->ndim;
            for (int d = 0; d < 3; d++) x->shape[d] = p->shape[d];
            x->data = mom[k] + p->offset;
        }
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    const char *mk[] = {"phasescope.step"}, *mv[] = {buf};
    int rc = ps_st_save(path, t, 2 * s->m.n_tensors, mk, mv, 1, err);
    free(t);
    free(names);
    if (rc) return -1;
    /* the model names its optimizer file; written second, so a kill between the two leaves the older
     * (model, optimizer) pair intact */
    json_t *tj = task_json(s->c);
    char *task = json_dumps(tj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(tj);
    int bad = ps_model_set_meta(&s->m, "phasescope.step", buf, err) ||
              ps_model_set_meta(&s->m, "phasescope.optimizer", name, err) ||
              ps_model_set_meta(&s->m, "phasescope.task", task, err) ||
              ps_model_set_meta(&s->m, "phasescope.train", s->c->canonical, err) ||
              ps_model_set_meta(&s->m, "phasescope.version", PS_VERSION, err);
    char compute[640];
    ps_cpu_env_describe(compute, sizeof compute);
    if (strcmp(ps_ctx_backend_name(s->m.ctx), "cpu")) { /* the run computes on another backend (train --device) */
        size_t l = strlen(compute);
        snprintf(compute + l, sizeof compute - l, "; backend %s, precision %s", ps_ctx_backend_name(s->m.ctx),
                 ps_precision_name(s->m.ctx->precision));
    }
    if (ps_dist_size() > 1) { /* data parallel: how the global batch was split */
        size_t l = strlen(compute);
        snprintf(compute + l, sizeof compute - l, "; %d MPI ranks, global batch %lld", ps_dist_size(), (long long)s->c->batch_size);
    }
    bad = bad || ps_model_set_meta(&s->m, "phasescope.compute", compute, err);
    free(task);
    if (bad) return -1;
    ps_model snap = s->m; /* the parameters as the file gets them: in place, or their host copy */
    if (dev) {
        if (ps_buf_to_host(s->m.ctx, s->stage, s->m.params, bytes, err))
            return ps_fail_prefix(err, "checkpoint of step %lld: ", (long long)step);
        snap.params = s->stage;
    }
    if (ps_model_save(&snap, s->dir, err)) return -1;
    DIR *d = opendir(s->dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));)
            if (!strncmp(e->d_name, "optimizer-", 10) && strcmp(e->d_name, name) &&
                ps_path_join(path, sizeof path, s->dir, e->d_name, NULL) == 0)
                unlink(path);
        closedir(d);
    }
    return 0;
}

static void log_json(run_state *s, json_t *o) {
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    fprintf(s->log, "%s\n", line);
    fflush(s->log);
    free(line);
    json_decref(o);
}

/* Held-out accuracy and mean loss over the eval set; gate statistics pooled over it when asked. */
typedef struct {
    int *ok;
    double *lp;
    int64_t correct, nq, nt;
    double lsum;
} eval_acc;

static int eval_batch(const ps_batch *view, int64_t i0, ps_acts *a, void *user, ps_error *err) {
    (void)i0;
    eval_acc *e = user;
    if (ps_acts_score(a, view, e->ok, e->lp, err)) return -1;
    for (int64_t r = 0; r < view->B; r++)
        for (int64_t q = 0; q < view->n_q[r]; q++) {
            e->correct += e->ok[r * view->max_q + q];
            e->lsum -= e->lp[r * view->max_q + q];
            e->nt += view->queries[r * view->max_q + q].answer_len;
            e->nq++;
        }
    return 0;
}

static int evaluate(run_state *s, int with_gates, double *acc, double *loss, ps_error *err) {
    const ps_batch *eb = &s->eval_batch;
    int64_t B = s->c->batch_size;
    eval_acc e = {.ok = malloc((size_t)(B * eb->max_q) * sizeof(int)), .lp = malloc((size_t)(B * eb->max_q) * sizeof(double))};
    int rc = e.ok && e.lp ? 0
                          : ps_fail(err, "%s: out of memory for the evaluation of %lld queries", s->dir,
                                    (long long)(B * eb->max_q));
    if (with_gates && s->has_chgates) ps_chgate_acc_reset(&s->chacc);
    else if (with_gates) ps_gate_acc_reset(&s->gacc);
    if (!rc) rc = ps_forward_batches(&s->m, eb, B, false, with_gates ? &s->ghooks : NULL, eval_batch, &e, err);
    free(e.ok);
    free(e.lp);
    *acc = e.nq ? (double)e.correct / (double)e.nq : 0;
    *loss = e.nt ? e.lsum / (double)e.nt : 0;
    return rc;
}

static int log_gates(run_state *s, int64_t step) {
    if (s->has_chgates) { /* v4: {"type": "gates", "step", "gate": "per_channel", "layers": [...]} (gates/chgates.h) */
        json_t *g = ps_chgate_acc_to_json(&s->chacc), *o = json_object();
        json_object_set_new(o, "type", json_string("gates"));
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "gate", json_string("per_channel"));
        json_object_set(o, "layers", json_object_get(g, "layers"));
        json_decref(g);
        log_json(s, o);
        return 0;
    }
    json_t *g = ps_gate_acc_to_json(&s->gacc, &s->m.cfg), *o = json_object();
    json_object_set_new(o, "type", json_string("gates"));
    json_object_set_new(o, "step", json_integer(step));
    json_object_set(o, "layers", json_object_get(g, "layers"));
    json_decref(g);
    log_json(s, o);
    return 0;
}

/* Keep only the records of steps <= step (a resumed run rewrites what follows). */
static int truncate_log(const char *path, int64_t step, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 32, &text, &len, err)) return -1;
    char *out = malloc(len + 1);
    if (!out) {
        free(text);
        return ps_fail(err, "%s: out of memory rewriting the log", path);
    }
    size_t w = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        json_t *o = json_loadb(line, ll, 0, NULL);
        if (o && json_integer_value(json_object_get(o, "step")) <= step && nl) {
            memcpy(out + w, line, ll + 1);
            w += ll + 1;
        }
        json_decref(o);
        if (!nl) break;
        line = nl + 1;
    }
    int rc = ps_write_file_atomic(path, out, w, err);
    free(out);
    free(text);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The model (on the host) onto the run's backend (train --device), with the run's precision. */
static int to_backend(run_state *s, ps_error *err) {
    const char *be = s->c->backend;
    if (!be || !*be || !strcmp(be, ps_ctx_backend_name(s->m.ctx))) return 0;
    if (ps_model_to_backend(&s->m, be, err)) return ps_fail_prefix(err, "--device %s: ", be);
    s->m.ctx->precision = s->c->precision;
    return 0;
}

/* AdamW moments on the model's context, zeroed. */
static int alloc_optimizer(run_state *s, ps_error *err) {
    int64_t bytes = s->m.n_params * (int64_t)sizeof(float);
    s->m1 = ps_buf_alloc(s->m.ctx, bytes, "AdamW first moments", err);
    s->m2 = s->m1 ? ps_buf_alloc(s->m.ctx, bytes, "AdamW second moments", err) : NULL;
    return s->m2 ? 0 : -1;
}

/* train --init-from: the weights of checkpoint dir (every tensor of m, by name, with the same number of
 * elements; its config may differ in what changes no shape, e.g. attention.head_offsets). */
static int init_from_checkpoint(ps_model *m, const char *dir, ps_error *err) {
    ps_model src;
    if (ps_model_load(&src, dir, err)) return ps_fail_prefix(err, "--init-from: ");
    int rc = 0;
    if (src.n_tensors != m->n_tensors)
        rc = ps_fail(err, "--init-from %s: %d tensors, the training config's model has %d", dir, src.n_tensors, m->n_tensors);
    for (int i = 0; !rc && i < m->n_tensors; i++) {
        const ps_param_info *p = &m->table[i], *q = NULL;
        for (int k = 0; k < src.n_tensors && !q; k++)
            if (!strcmp(src.table[k].name, p->name)) q = &src.table[k];
        if (!q || q->numel != p->numel)
            rc = ps_fail(err, "--init-from %s: tensor \"%s\" %s", dir, p->name, q ? "has another shape" : "is missing");
        else
            memcpy(m->params + p->offset, src.params + q->offset, (size_t)p->numel * sizeof(float));
    }
    ps_model_free(&src);
    return rc;
}

/* --resume, first half: the checkpoint's model (on the host) and its step. */
static int load_resume(run_state *s, int64_t *step, ps_error *err) {
    if (ps_model_load(&s->m, s->dir, err)) return -1;
    const char *st = ps_model_get_meta(&s->m, "phasescope.step"), *opt = ps_model_get_meta(&s->m, "phasescope.optimizer"),
               *tr = ps_model_get_meta(&s->m, "phasescope.train");
    if (!st || !opt || !tr) return ps_fail(err, "%s/model.safetensors: not a training checkpoint (no phasescope.step)", s->dir);
    if (strcmp(tr, s->c->canonical))
        return ps_fail(err, "%s: the training config differs from the one this run was started with", s->dir);
    *step = strtoll(st, NULL, 10);
    return 0;
}

/* --resume, second half (the model on its backend, the moments allocated there): the AdamW moments of
 * the checkpoint's optimizer file, read in place on the host, or through the staging buffer to a device. */
static int load_moments(run_state *s, int64_t step, ps_error *err) {
    const char *opt = ps_model_get_meta(&s->m, "phasescope.optimizer");
    int dev = !ps_ctx_host_visible(s->m.ctx);
    int64_t n = s->m.n_params;
    float *dst[2] = {s->m1, s->m2};
    if (dev) {
        if (!host_stage(s, err)) return -1;
        dst[0] = s->stage, dst[1] = s->stage + n;
    }
    char path[4200];
    if (ps_path_join(path, sizeof path, s->dir, opt, err)) return -1;
    ps_st_file f;
    if (ps_st_open(path, &f, err)) return -1;
    const char *ost = ps_st_meta(&f, "phasescope.step");
    int rc = 0;
    if (!ost || strtoll(ost, NULL, 10) != step)
        rc = ps_fail(err, "%s: optimizer state is for another step than the model (%lld)", path, (long long)step);
    for (int i = 0; !rc && i < s->m.n_tensors; i++)
        for (int k = 0; k < 2 && !rc; k++) {
            char nm[140];
            snprintf(nm, sizeof nm, "%s.%s", k ? "v" : "m", s->m.table[i].name);
            const ps_st_entry *e = ps_st_find(&f, nm);
            if (!e || ps_st_numel(e) != s->m.table[i].numel)
                rc = ps_fail(err, "%s: tensor \"%s\" missing or of the wrong size", path, nm);
            else rc = ps_st_read_f32(&f, e, dst[k] + s->m.table[i].offset, err);
        }
    ps_st_close(&f);
    if (!rc && dev)
        for (int k = 0; k < 2 && !rc; k++)
            rc = ps_buf_from_host(s->m.ctx, k ? s->m2 : s->m1, dst[k], n * (int64_t)sizeof(float), err);
    return rc;
}

/* ---- data parallelism (docs/scale-out.md) ----
 * Every rank holds the whole model and optimizer; the global batch of a step (generated alike on every rank
 * from the step's seed) is split into contiguous row ranges, one per rank; the gradients (already scaled
 * by 1 / the global batch's target count) and the loss sums are summed over the ranks, so every rank takes
 * the same AdamW step on the same bits. Rank 0 alone reads and writes the run directory (checkpoints, log,
 * evaluation) and sends the starting state to the others. */

/* FNV-1a over the parameters' bytes (read in place, or from their host copy on a device backend): the
 * ranks compare it at every checkpoint. */
static int params_hash(run_state *s, uint64_t *out, ps_error *err) {
    const ps_model *m = &s->m;
    int64_t bytes = m->n_params * (int64_t)sizeof(float);
    const unsigned char *b = (const unsigned char *)m->params;
    if (!ps_ctx_host_visible(m->ctx)) {
        if (!host_stage(s, err) || ps_buf_to_host(m->ctx, s->stage, m->params, bytes, err)) return -1;
        b = (const unsigned char *)s->stage;
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    *out = h;
    return 0;
}

/* After a checkpoint (rank 0's status rc): the ranks agree, check they hold the same weights, and learn
 * what to say if the launcher stops them. */
static int dist_checkpoint(run_state *s, int64_t step, int rc, ps_error *err) {
    if (ps_dist_size() == 1) return rc;
    uint64_t h = 0, h0;
    if (!rc && params_hash(s, &h, err)) rc = -1;
    h0 = h;
    if (!rc && ps_dist_bcast(&h0, sizeof h0, 0, err)) rc = -1;
    if (!rc && h0 != h)
        rc = ps_fail(err, "after step %lld the weights of rank %d differ from rank 0's (the gradient all-reduce must give "
                          "every rank the same bits)",
                     (long long)step, ps_dist_rank());
    if (ps_dist_agree(rc, err)) return -1;
    char note[4400];
    snprintf(note, sizeof note,
             "the last checkpoint (step %lld) is in %s: continue with `phasescope train --config CFG --out %s --resume`, "
             "under mpirun with any number of ranks (the same global batch)",
             (long long)step, s->dir, s->dir);
    ps_dist_set_note(note);
    return 0;
}

/* ---- the run, in parts ---- */

/* The run directory (rank 0's) and the model in it: created and initialised (or --init-from), or a
 * checkpoint's (--resume, *start its step); then on the run's backend with its moments (a resumed run's
 * read back, its log cut at *start); with several ranks every one starts from rank 0's weights, moments and
 * step. -1 with err set when the run cannot start. */
static int open_run(run_state *s, int resume, int64_t *start, ps_error *err) {
    const ps_train_cfg *c = s->c;
    const char *dir = s->dir;
    char mpath[4200];
    int bad = 0;
    if (s->root) { /* the run directory is rank 0's */
        bad = ps_mkdir(dir, err) || ps_path_join(s->logpath, sizeof s->logpath, dir, "train.jsonl", err) ||
              ps_path_join(mpath, sizeof mpath, dir, "model.safetensors", err);
        if (!bad) ps_clean_temp_files(dir); /* what a killed checkpoint write left behind */
        if (!bad && resume && access(mpath, F_OK) != 0) bad = ps_fail(err, "--resume: %s holds no checkpoint to resume", dir);
        else if (!bad && !resume && access(mpath, F_OK) == 0)
            bad = ps_fail(err, "%s already holds a run; use --resume to continue it or choose another --out", dir);
        if (!bad && resume) bad = load_resume(s, start, err);
        else if (!bad) {
            bad = ps_model_create(&s->m, &c->model, err);
            if (!bad) ps_model_init_std(&s->m, c->seed, c->init_std);
            if (!bad && c->init_from) bad = init_from_checkpoint(&s->m, c->init_from, err);
        }
    } else
        bad = ps_model_create(&s->m, &c->model, err);
    /* created, initialised or loaded on the host; then onto the run's backend, where the moments (and below,
     * the gradients and activations) are allocated; a resumed run's moments follow them there */
    bad = bad || to_backend(s, err) || alloc_optimizer(s, err) ||
          (s->root && resume && (load_moments(s, *start, err) || truncate_log(s->logpath, *start, err)));
    if (s->R > 1) {
        /* every rank starts from rank 0's weights, moments and step */
        int64_t nb = s->m.n_params * (int64_t)sizeof(float);
        if (ps_dist_agree(bad, err)) return -1;
        if (!ps_ctx_host_visible(s->m.ctx))
            return ps_fail(err, "data-parallel training on a device backend needs its broadcast (not written yet)");
        if (ps_dist_bcast(start, sizeof *start, 0, err) || ps_dist_bcast(s->m.params, nb, 0, err) ||
            ps_dist_bcast(s->m1, nb, 0, err) || ps_dist_bcast(s->m2, nb, 0, err))
            return -1;
    } else if (bad)
        return -1;
    return 0;
}

/* train.logits "answers": s->max_rows, the most target rows this rank's part of a batch can have (each
 * query's answer tokens), and s->rows to hold them; 0 rows when the logits are taken everywhere. */
static int plan_logit_rows(run_state *s, ps_error *err) {
    const ps_train_cfg *c = s->c;
    s->max_rows = 0;
    if (c->logits_answers) {
        if (c->task.loss_all) {
            ps_fail(err, "%s: train.logits \"answers\" needs task.loss \"answers\" (the loss is taken on every position)", s->dir);
            ps_dist_mark_shared();
            return -1;
        }
        s->max_rows = s->B * c->task.n_queries *
                      (c->task.kind == PS_TASK_KV || c->task.kind == PS_TASK_TEXT ? c->task.value_len : 1);
        if (s->max_rows > s->B * s->T) s->max_rows = s->B * s->T;
    }
    s->rows = s->max_rows ? malloc((size_t)s->max_rows * sizeof *s->rows) : NULL;
    if (s->max_rows && !s->rows) return ps_fail(err, "out of memory for %lld logit rows", (long long)s->max_rows);
    return 0;
}

/* Mitigations (docs/mitigations.md): the checks on train.gate_reg and train.phase_augment, s->gate_reg_w (the
 * gate regulariser's weight per (layer, KV head, branch) term, so the loss term is gate_reg · the mean over
 * them of (log W - H(pooled gate)) / log W) and the phase shifts' buffer. */
static int plan_mitigations(run_state *s, ps_error *err) {
    const ps_train_cfg *c = s->c;
    const char *dir = s->dir;
    s->gate_reg_w = 0;
    if ((c->gate_reg > 0 || c->phase_augment) && c->model.kind != PS_ATTN_COMPRESSED) {
        ps_fail(err, "%s: train.%s needs a compressed-attention model", dir, c->gate_reg > 0 ? "gate_reg" : "phase_augment");
        ps_dist_mark_shared();
        return -1;
    }
    if (c->phase_augment && c->model.boundaries == PS_BOUNDARIES_CONTENT) {
        ps_fail(err, "%s: train.phase_augment shifts a window grid; content chunk boundaries (attention.boundaries \"content\") have none", dir);
        ps_dist_mark_shared();
        return -1;
    }
    if (c->gate_reg > 0 && s->R > 1) {
        ps_fail(err, "%s: train.gate_reg is single-process only (each rank would add the whole term)", dir);
        ps_dist_mark_shared();
        return -1;
    }
    if (c->gate_reg > 0) {
        if (c->model.gate != PS_GATE_LEARNED) {
            ps_fail(err, "%s: train.gate_reg needs learned gates (attention.gate \"learned\")", dir);
            ps_dist_mark_shared();
            return -1;
        }
        s->gate_reg_w = c->gate_reg / (log((double)c->model.window) * (double)c->model.n_layers * (double)c->model.n_kv_heads * 2.0);
    }
    if (c->phase_augment && !(s->shift = calloc((size_t)s->B, sizeof *s->shift)))
        return ps_fail(err, "out of memory for %lld phase shifts", (long long)s->B);
    return 0;
}

/* What the steps work in: gradients, logit rows, mitigations, activations, the batches (rank 0's held-out
 * evaluation batch generated), the gate statistics (rank 0's) and the log (rank 0's; appended to when
 * resuming). */
static int alloc_run(run_state *s, int resume, ps_error *err) {
    const ps_train_cfg *c = s->c;
    int64_t pbytes = s->m.n_params * (int64_t)sizeof(float);
    s->grads = ps_buf_alloc(s->m.ctx, pbytes, "gradients", err);
    if (plan_logit_rows(s, err) || plan_mitigations(s, err)) return -1;
    if (!s->grads || ps_acts_create_rows(&s->acts, s->m.ctx, &c->model, s->B, s->T, true, s->max_rows, err) ||
        ps_acts_create_rows(&s->gacts, s->m.ctx, &c->model, s->B, s->T, false, s->max_rows, err) ||
        ps_batch_alloc(&s->batch, s->Bg, s->T, c->task.n_queries, err) ||
        (s->root && ps_batch_alloc(&s->eval_batch, c->eval_size, s->T, c->task.n_queries, err)))
        return -1;
    if (s->root && generate(c, step_seed(c->seed ^ 0x5eed0e7a1ULL, -1), &s->eval_batch, err)) return -1; /* held out: never a train seed */
    s->has_gates = c->model.kind == PS_ATTN_COMPRESSED;
    if (s->root && s->has_gates &&
        (ps_gate_acc_init(&s->gacc, &c->model, err) || ps_gate_acc_watch(&s->gacc, &s->ghooks, &c->model, err)))
        return -1;
    if (s->root && c->model.kind == PS_ATTN_CHANNEL) { /* gate statistics are rank 0's, like the evaluation they come from */
        if (ps_chgate_init_model(&s->chacc, &c->model, err)) return -1;
        s->has_gates = s->has_chgates = 1;
        if (ps_chgate_watch_model(&s->chacc, &s->ghooks, &c->model, err)) return -1;
    }
    if (s->root) s->log = fopen(s->logpath, resume ? "a" : "w");
    if (s->root && !s->log) return ps_fail(err, "%s: cannot open for writing", s->logpath);
    return 0;
}

/* {"type": "eval", "step", "accuracy", "loss"} */
static void log_eval(run_state *s, int64_t step, double acc, double loss) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("eval"));
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "accuracy", json_real(acc));
    json_object_set_new(o, "loss", json_real(loss));
    log_json(s, o);
}

/* A new run's step 0 (rank 0): the --init-from record, the evaluation and gate statistics where the gates
 * start (uniform, or the --init-from checkpoint's) and the step-0 checkpoint. */
static int log_start(run_state *s, ps_error *err) {
    const ps_train_cfg *c = s->c;
    if (c->init_from) {
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string("init"));
        json_object_set_new(o, "step", json_integer(0));
        json_object_set_new(o, "from", json_string(c->init_from));
        log_json(s, o);
    }
    double acc, el;
    if (evaluate(s, s->has_gates, &acc, &el, err)) return -1;
    log_eval(s, 0, acc, el);
    if (s->has_gates) log_gates(s, 0);
    return save_checkpoint(s, 0, err);
}

/* The logit rows of this rank's part of the batch: its target positions (train.logits "answers"). */
static int set_logit_rows(run_state *s, int64_t step, const int32_t *my_targets, ps_error *err) {
    int64_t nr = 0;
    for (int64_t i = 0; i < s->B * s->T; i++)
        if (my_targets[i] >= 0) {
            if (nr == s->max_rows)
                return ps_fail(err, "step %lld: more targets than the %lld logit rows the task allows", (long long)step + 1,
                               (long long)s->max_rows);
            s->rows[nr++] = i;
        }
    return ps_acts_set_rows(&s->acts, s->rows, nr, err);
}

/* train.phase_augment: a random grid phase per sequence of the global batch, from the step's seed
 * (docs/mitigations.md); this rank keeps its rows' */
static int set_phase_shifts(run_state *s, int64_t step, ps_error *err) {
    const ps_train_cfg *c = s->c;
    ps_rng pr;
    ps_rng_seed(&pr, step_seed(c->seed ^ 0x9a5e0ffULL, step));
    for (int64_t b = 0; b < s->Bg; b++) {
        int64_t sh = ps_rng_below(&pr, c->model.stride);
        if (b >= s->b0 && b < s->b0 + s->B) s->shift[b - s->b0] = sh;
    }
    return ps_acts_set_phase(&s->acts, s->shift, err);
}

/* One optimizer step (step counts from 0): the step's batch, this rank's forward and backward, the sums over
 * the ranks, the gradient norm and the AdamW update; *loss, *lr and *gn are the step's. -1 with err set
 * (a loss or norm that is not finite stops the run). */
static int train_step(run_state *s, int64_t step, double *loss_out, double *lr_out, double *gn_out, ps_error *err) {
    const ps_train_cfg *c = s->c;
    int64_t T = s->T;
    if (generate(c, step_seed(c->seed, step), &s->batch, err)) return -1;
    /* this rank's rows of the batch (after generate: the text-kv task reallocates the batch) */
    const int32_t *my_tokens = s->batch.tokens + s->b0 * T, *my_targets = s->batch.targets + s->b0 * T;
    if (ps_fill(s->m.ctx, s->grads, 0.0f, s->m.n_params)) {
        ps_ctx_check(s->m.ctx, err);
        return -1;
    }
    int64_t n_t = 0; /* targets of the global batch: every rank scales its gradients by the same 1 / n_t */
    for (int64_t i = 0; i < s->Bg * T; i++) n_t += s->batch.targets[i] >= 0;
    double lsum = 0;
    int64_t cnt = 0;
    if (s->max_rows && set_logit_rows(s, step, my_targets, err)) return -1; /* logits at this batch's target rows only */
    if (c->phase_augment && set_phase_shifts(s, step, err)) return -1;
    s->gacts.gate_reg_weight = s->gate_reg_w;
    s->gacts.gate_reg_value = 0;
    if (ps_forward(&s->m, &s->acts, my_tokens, NULL, err) ||
        ps_backward(&s->m, &s->acts, &s->gacts, my_tokens, my_targets, 1.0f / (float)n_t, s->grads, &lsum, &cnt, err))
        return -1;
    if (s->R > 1) { /* the gradient seam (NCCL on a device backend) and the loss over the global batch */
        double sums[2] = {lsum, (double)cnt};
        if (ps_dist_allreduce_buf(s->m.ctx, s->grads, s->m.n_params, err) || ps_dist_allreduce_f64(sums, 2, err)) return -1;
        lsum = sums[0];
        cnt = (int64_t)sums[1];
    }
    double loss = lsum / (double)cnt, gn = 0;
    if (ps_grad_norm(s->m.ctx, s->grads, s->m.n_params, &gn, err)) return -1;
    if (!isfinite(loss) || !isfinite(gn)) {
        ps_dist_mark_shared(); /* every rank sees the same loss and norm */
        ps_fail(err, "step %lld: %s is %s; stopping (the last good checkpoint is kept in %s)", (long long)step + 1,
                isfinite(loss) ? "gradient norm" : "loss", isnan(isfinite(loss) ? gn : loss) ? "NaN" : "infinite", s->dir);
        return -1;
    }
    double clip = c->opt.grad_clip > 0 && gn > c->opt.grad_clip ? c->opt.grad_clip / gn : 1.0, lr = ps_lr_at(&c->opt, step);
    if (ps_adamw_update(&s->m, s->grads, s->m1, s->m2, step + 1, lr, clip, &c->opt, err)) return -1;
    *loss_out = loss, *lr_out = lr, *gn_out = gn;
    return 0;
}

/* {"type": "train", "step", "loss", "lr", "grad_norm", "tokens_per_s"[, "gate_reg"]} */
static void log_train(run_state *s, const ps_train_progress *pr) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("train"));
    json_object_set_new(o, "step", json_integer(pr->step));
    json_object_set_new(o, "loss", json_real(pr->loss));
    json_object_set_new(o, "lr", json_real(pr->lr));
    json_object_set_new(o, "grad_norm", json_real(pr->grad_norm));
    json_object_set_new(o, "tokens_per_s", json_real(round(pr->tokens_per_s)));
    if (s->c->gate_reg > 0) json_object_set_new(o, "gate_reg", json_real(s->gacts.gate_reg_value)); /* rank 0's batch */
    log_json(s, o);
}

/* After step pr->step (rank 0): the evaluation and gate statistics due at it (pr->eval_accuracy set when an
 * evaluation is logged). */
static int log_eval_due(run_state *s, ps_train_progress *pr, int last, ps_error *err) {
    const ps_train_cfg *c = s->c;
    int64_t done_steps = pr->step;
    int do_gates = s->has_gates && (done_steps % c->gates_every == 0 || last);
    if (!(done_steps % c->eval_every == 0 || last || do_gates)) return 0;
    double acc, el;
    if (evaluate(s, do_gates, &acc, &el, err)) return -1;
    if (done_steps % c->eval_every == 0 || last) {
        log_eval(s, done_steps, acc, el);
        pr->eval_accuracy = acc;
    }
    if (do_gates) log_gates(s, done_steps);
    return 0;
}

/* The steps [start, end): each one's step, its records (their schedule is the full run's, so an interrupted
 * and resumed run logs exactly what an uninterrupted one does), its checkpoint when due, and fn's say. */
static int run_steps(run_state *s, int64_t start, int64_t end, ps_train_progress_fn fn, void *user, ps_error *err) {
    const ps_train_cfg *c = s->c;
    double t_last = now_s();
    int64_t tok_since = 0;
    for (int64_t step = start; step < end; step++) {
        double loss, lr, gn;
        if (train_step(s, step, &loss, &lr, &gn, err)) return -1;
        tok_since += s->Bg * s->T;
        int64_t done_steps = step + 1;
        int last = done_steps == c->steps;
        ps_train_progress pr = {.step = done_steps, .total = c->steps, .loss = loss, .lr = lr, .grad_norm = gn,
                                .tokens_per_s = 0, .eval_accuracy = -1};
        if (s->root && (done_steps % c->log_every == 0 || last)) {
            double t = now_s();
            pr.tokens_per_s = (double)tok_since / (t - t_last > 1e-9 ? t - t_last : 1e-9);
            t_last = t;
            tok_since = 0;
            log_train(s, &pr);
        }
        if (s->root && log_eval_due(s, &pr, last, err)) return -1;
        int saved = done_steps % c->checkpoint_every == 0 || done_steps == end;
        if (saved) {
            int sv = s->root ? save_checkpoint(s, done_steps, err) : 0;
            if (s->R > 1 ? dist_checkpoint(s, done_steps, sv, err) : sv) return -1;
        }
        if (fn && s->root && fn(&pr, user) && s->R == 1) { /* the caller stopped the run: resumable from this step */
            if (!saved && save_checkpoint(s, done_steps, err)) return -1;
            return ps_fail(err, "cancelled after step %lld of %lld (checkpoint at step %lld in %s: --resume continues)",
                           (long long)done_steps, (long long)c->steps, (long long)done_steps, s->dir);
        }
    }
    return 0;
}

static void free_run(run_state *s) {
    if (s->log) fclose(s->log);
    ps_hooks_free(&s->ghooks);
    if (s->has_chgates) ps_chgate_acc_free(&s->chacc);
    else if (s->has_gates) ps_gate_acc_free(&s->gacc);
    ps_batch_free(&s->batch);
    ps_batch_free(&s->eval_batch);
    ps_acts_free(&s->acts);
    ps_acts_free(&s->gacts);
    free(s->rows);
    free(s->shift);
    free(s->stage);
    if (s->m.ctx) {
        ps_buf_free(s->m.ctx, s->grads, s->m.n_params * (int64_t)sizeof(float));
        ps_buf_free(s->m.ctx, s->m1, s->m.n_params * (int64_t)sizeof(float));
        ps_buf_free(s->m.ctx, s->m2, s->m.n_params * (int64_t)sizeof(float));
    }
    ps_model_free(&s->m);
}

int ps_train(const ps_train_cfg *c, const char *dir, int resume, int64_t stop_after, ps_train_progress_fn fn,
             void *user, ps_error *err) {
    run_state s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.dir = dir;
    ps_hooks_init(&s.ghooks);
    int me = ps_dist_rank();
    s.R = ps_dist_size(), s.root = me == 0;
    /* this rank's rows of the global batch: [b0, b0 + B) */
    s.Bg = c->batch_size, s.b0 = s.Bg * me / s.R, s.B = s.Bg * (me + 1) / s.R - s.b0, s.T = c->task.seq_len;
    if (s.R > s.Bg) {
        ps_fail(err, "a global batch of %lld sequences (train.batch_size) cannot be split over %d ranks: use at most %lld ranks",
                (long long)s.Bg, s.R, (long long)s.Bg);
        ps_dist_mark_shared();
        return -1;
    }
    /* a run directory this call creates is removed again if the run fails before writing anything into it
     * (e.g. --device cuda without a device): rmdir removes only an empty directory */
    int made_dir = s.root && access(dir, F_OK) != 0;
    int64_t start = 0;
    int rc = open_run(&s, resume, &start, err) || alloc_run(&s, resume, err) ||
             (!resume && s.root && log_start(&s, err)) || (s.R > 1 && dist_checkpoint(&s, start, 0, err));
    if (!rc) {
        if (s.R > 1) ps_dist_set_stall_limit(300); /* a rank gone or stuck ends the job (PS_DIST_TIMEOUT overrides) */
        int64_t end = stop_after >= 0 && stop_after < c->steps ? stop_after : c->steps;
        rc = run_steps(&s, start, end, fn, user, err);
        if (!rc) ps_dist_set_stall_limit(0);
    }
    rc = rc ? -1 : 0;
    free_run(&s);
    if (rc && made_dir) rmdir(dir);
    return rc;
}
