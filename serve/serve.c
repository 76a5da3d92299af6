/* serve.c — the OpenAI-compatible server (serve.h). */
#define _POSIX_C_SOURCE 200809L
#include "serve/serve.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "interventions/textkv.h"
#include "serve/decode.h"

/* ==== requests ==== */

typedef struct {
    double lp;
    int64_t rank;
    int nk;          /* top entries stored */
    int32_t *tid;    /* [K] best first */
    double *tlp;
} pinfo;

typedef struct {
    int32_t *tok;    /* prompt, then the generated tokens */
    int64_t n_prompt, n, gen_max;
    int all_rows;    /* the first forward computes every row (echo with logprobs, prompt_logprobs) */
    int K;           /* top entries per position */
    double temp;
    ps_rng rng;
    pinfo *pi;       /* [n_prompt + gen_max]: pi[t] for token t (t >= 1) */
    int32_t *tid_pool;
    double *tlp_pool;
    int64_t row0;    /* the current forward's first row */
} seqst;

typedef struct job {
    seqst *seqs;
    int64_t n;
    int done, failed;
    char msg[1024];
    struct job *next;
} job;

struct ps_server {
    ps_serve_opts o;
    ps_runtime rt;          /* the model, opened through core's family table */
    int64_t vocab;          /* its vocabulary */
    ps_serve_decoder *dec;  /* generation through the KV cache (serve/decode.h); NULL: the whole-sequence path */
    ps_tokenizer *tok;
    char name[512];
    struct MHD_Daemon *d;
    int port;
    pthread_t worker;
    int worker_up;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    job *head, *tail;
    int stopping;
    int open_conns;
    int64_t counter;
};

static void seq_free(seqst *s) {
    free(s->tok);
    free(s->pi);
    free(s->tid_pool);
    free(s->tlp_pool);
}

static void job_free(job *j) {
    if (!j) return;
    for (int64_t i = 0; i < j->n; i++) seq_free(&j->seqs[i]);
    free(j->seqs);
    free(j);
}

/* the row statistics of one logits row for token y (two passes: the maximum, then the sum of exponentials,
 * the rank of y and the K best); choose: pick the next token (greedy: the first maximum, as the local
 * scoring does; temperature > 0: sampled) */
static int32_t row_stats(seqst *s, const float *x, int64_t V, int32_t y, int choose, pinfo *pi) {
    float mx = x[0];
    int64_t arg = 0;
    for (int64_t i = 1; i < V; i++)
        if (x[i] > mx) {
            mx = x[i];
            arg = i;
        }
    if (choose) {
        if (s->temp > 0) { /* sample from softmax(x / temp) */
            double z = 0;
            for (int64_t i = 0; i < V; i++) z += exp((double)(x[i] - mx) / s->temp);
            double u = ps_rng_uniform(&s->rng) * z, c = 0;
            y = (int32_t)(V - 1);
            for (int64_t i = 0; i < V; i++) {
                c += exp((double)(x[i] - mx) / s->temp);
                if (c > u) {
                    y = (int32_t)i;
                    break;
                }
            }
        } else
            y = (int32_t)arg;
    }
    double sum = 0;
    int64_t rank = 1;
    int nk = 0, K = s->K;
    float xy = x[y], kth = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        float v = x[i];
        sum += (double)expf(v - mx); /* float exponentials, summed in double: log-probabilities to ~1e-7 */
        rank += v > xy;
        if (nk == K && v <= kth) continue;
        /* the K best, best first (ties: the lower id first) */
        int at = nk < K ? nk : K - 1;
        while (at > 0 && x[pi->tid[at - 1]] < v) {
            pi->tid[at] = pi->tid[at - 1];
            at--;
        }
        pi->tid[at] = (int32_t)i;
        if (nk < K) nk++;
        kth = x[pi->tid[nk - 1]];
    }
    double lse = (double)mx + log(sum);
    pi->lp = (double)xy - lse;
    pi->rank = rank;
    pi->nk = nk;
    for (int k = 0; k < nk; k++) pi->tlp[k] = (double)x[pi->tid[k]] - lse;
    return y;
}

typedef struct {
    seqst **act; /* the sequences of this forward, in batch order */
    int64_t V;
} fwd_ctx;

static int on_rows(const ps_batch *b, int64_t si, const float *rows, int64_t n, void *user, ps_error *err) {
    (void)b;
    (void)err;
    fwd_ctx *c = user;
    seqst *s = c->act[si];
    /* the rows of known tokens are independent of each other: threads share them */
    int64_t known = s->n - 1 - s->row0 < n ? s->n - 1 - s->row0 : n;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t k = 0; k < known; k++) row_stats(s, rows + k * c->V, c->V, s->tok[s->row0 + k + 1], 0, &s->pi[s->row0 + k + 1]);
    for (int64_t k = known > 0 ? known : 0; k < n; k++) {
        int64_t pos = s->row0 + k;
        if (pos + 1 == s->n && s->n - s->n_prompt < s->gen_max) {
            int32_t y = row_stats(s, rows + k * c->V, c->V, 0, 1, &s->pi[s->n]);
            s->tok[s->n++] = y;
        }
    }
    return 0;
}

/* Run a group of jobs: the first forward over every sequence, then one per generated token. */
static int run_group(ps_server *sv, job **jobs, int nj, ps_error *err) {
    int64_t total = 0;
    for (int j = 0; j < nj; j++) total += jobs[j]->n;
    seqst **act = malloc((size_t)(total ? total : 1) * sizeof *act);
    if (!act) return ps_fail(err, "out of memory");
    int rc = 0;
    for (int step = 0; !rc; step++) {
        int64_t B = 0, T = 0;
        for (int j = 0; j < nj; j++)
            for (int64_t i = 0; i < jobs[j]->n; i++) {
                seqst *s = &jobs[j]->seqs[i];
                int gen = s->n - s->n_prompt < s->gen_max;
                int rows = step == 0 && s->all_rows && s->n > 1;
                if (!gen && !rows) continue;
                act[B++] = s;
                T = s->n > T ? s->n : T;
            }
        if (!B) break;
        ps_batch b;
        if ((rc = ps_batch_alloc(&b, B, T, 1, err))) break;
        for (int64_t i = 0; i < B; i++) {
            seqst *s = act[i];
            int gen = s->n - s->n_prompt < s->gen_max;
            memcpy(b.tokens + i * T, s->tok, (size_t)s->n * sizeof(int32_t));
            for (int64_t t = s->n; t < T; t++) b.tokens[i * T + t] = s->tok[s->n - 1]; /* tail padding: never read */
            for (int64_t t = 0; t < T; t++) b.targets[i * T + t] = -1;
            int64_t r0 = step == 0 && s->all_rows ? 0 : s->n - 1, r1 = gen ? s->n : s->n - 1; /* rows [r0, r1) */
            s->row0 = r0;
            b.n_q[i] = 1;
            b.queries[i] = (ps_query){.key_pos = 0, .answer_pos = r0, .answer_len = r1 - r0, .answer_src = r0 + 1};
        }
        fwd_ctx c = {act, sv->vocab};
        rc = sv->dec ? ps_serve_decode_rows(sv->dec, (const void *const *)act, &b, on_rows, &c, err)
                     : sv->rt.family->rows(&sv->rt, &b, sv->o.max_batch, 0, on_rows, &c, err);
        ps_batch_free(&b);
    }
    if (sv->dec) ps_serve_decoder_reset(sv->dec);
    free(act);
    return rc;
}

static void *worker_main(void *arg) {
    ps_server *sv = arg;
    job **grp = malloc((size_t)(sv->o.max_batch + 1) * sizeof *grp);
    pthread_mutex_lock(&sv->mu);
    for (;;) {
        while (!sv->head && !sv->stopping) pthread_cond_wait(&sv->cv_work, &sv->mu);
        if (sv->stopping || !grp) break;
        int ng = 0;
        int64_t seqs = 0;
        while (sv->head && ng < sv->o.max_batch && (ng == 0 || seqs + sv->head->n <= sv->o.max_batch)) {
            job *j = sv->head;
            sv->head = j->next;
            if (!sv->head) sv->tail = NULL;
            grp[ng++] = j;
            seqs += j->n;
        }
        pthread_mutex_unlock(&sv->mu);
        ps_error e = {0};
        int rc = run_group(sv, grp, ng, &e);
        pthread_mutex_lock(&sv->mu);
        for (int k = 0; k < ng; k++) {
            if (rc) {
                grp[k]->failed = 500;
                snprintf(grp[k]->msg, sizeof grp[k]->msg, "the model failed: %.900s", e.msg);
            }
            grp[k]->done = 1;
        }
        pthread_cond_broadcast(&sv->cv_done);
    }
    /* shutting down: fail what waits */
    for (job *j = sv->head; j; j = j->next) {
        j->failed = 503;
        snprintf(j->msg, sizeof j->msg, "the server is shutting down");
        j->done = 1;
    }
    sv->head = sv->tail = NULL;
    pthread_cond_broadcast(&sv->cv_done);
    pthread_mutex_unlock(&sv->mu);
    free(grp);
    return NULL;
}

/* ==== HTTP ==== */

typedef struct {
    char *body;
    size_t n, cap;
    int too_big, refused;
} conn_req;

static char *error_json(int status, const char *type, const char *param, const char *msg) {
    json_t *o = json_pack("{s:{s:s, s:s, s:s?, s:i}}", "error", "message", msg, "type", type, "param", param, "code", status);
    char *t = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return t;
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, char *text) {
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Type", "application/json");
        enum MHD_Result x = MHD_queue_response(c, 500, r);
        MHD_destroy_response(r);
        return x;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result x = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return x;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *param, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : status == 404 ? "not_found_error"
                                                                                                           : "invalid_request_error";
    return respond(c, status, error_json((int)status, type, param, msg));
}

/* the text of one id (its own decoding), or "token_id:N" */
static char *token_text(const ps_server *sv, int32_t id, int as_ids) {
    char *t = NULL;
    size_t n = 0;
    if (!as_ids && sv->tok && id < ps_tokenizer_vocab_size(sv->tok)) {
        ps_error e = {0};
        if (!ps_detokenize(sv->tok, &id, 1, false, &t, &n, &e)) return t;
    }
    t = malloc(32);
    if (t) snprintf(t, 32, "token_id:%d", (int)id);
    return t;
}

static int64_t utf8_chars(const char *s) {
    int64_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* A parsed completions request (what every prompt shares). */
typedef struct {
    int64_t max_tokens, logprobs, prompt_logprobs; /* -1: not asked */
    int echo, as_ids;
    double temperature;
    uint64_t seed;
} creq;

/* the prompt in v as ids (a string tokenized, or a list of ints); 0, or an HTTP status with msg */
static int prompt_ids(const ps_server *sv, json_t *v, const char *param, int32_t **ids, int64_t *n, char *msg, size_t mn) {
    *ids = NULL;
    *n = 0;
    if (json_is_string(v)) {
        if (!sv->tok) {
            snprintf(msg, mn, "%s: a text prompt needs a tokenizer (start serve with --tokenizer); send token ids instead", param);
            return 400;
        }
        size_t k = 0;
        ps_error e = {0};
        if (ps_tokenize(sv->tok, json_string_value(v), json_string_length(v), false, ids, &k, &e)) {
            snprintf(msg, mn, "%s: %.900s", param, e.msg);
            return 400;
        }
        *n = (int64_t)k;
        return 0;
    }
    size_t L = json_array_size(v);
    *ids = malloc((L ? L : 1) * sizeof(int32_t));
    if (!*ids) {
        snprintf(msg, mn, "out of memory");
        return 500;
    }
    for (size_t i = 0; i < L; i++) {
        json_t *x = json_array_get(v, i);
        json_int_t id = json_integer_value(x);
        if (!json_is_integer(x) || id < 0 || id >= sv->vocab) {
            snprintf(msg, mn, "%s[%zu]: expected a token id in [0, %lld)", param, i, (long long)sv->vocab);
            free(*ids);
            *ids = NULL;
            return 400;
        }
        (*ids)[i] = (int32_t)id;
    }
    *n = (int64_t)L;
    return 0;
}

static int get_count(json_t *root, const char *key, int64_t lo, int64_t hi, const char *limit, int64_t *out, char *msg, size_t mn) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_boolean(v) && !strcmp(key, "logprobs")) { /* chat-style "logprobs": true */
        *out = json_is_true(v) ? 1 : -1;
        return 0;
    }
    if (!json_is_integer(v)) {
        snprintf(msg, mn, "%s: expected an integer", key);
        return 400;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo) {
        snprintf(msg, mn, "%s: %lld is below %lld", key, (long long)x, (long long)lo);
        return 400;
    }
    if (x > hi) {
        snprintf(msg, mn, "%s: %lld exceeds the limit %lld (%s)", key, (long long)x, (long long)hi, limit);
        return 400;
    }
    *out = x;
    return 0;
}

static void top_add(const ps_server *sv, json_t *d, int32_t id, double lp, int64_t rank, int as_ids, int vllm) {
    char *t = token_text(sv, id, vllm ? 0 : as_ids); /* vLLM's decoded_token is the text (the key is the id) */
    if (vllm) {
        char key[24];
        snprintf(key, sizeof key, "%d", (int)id);
        json_object_set_new(d, key, json_pack("{s:f, s:I, s:s}", "logprob", lp, "rank", (json_int_t)rank, "decoded_token", t ? t : ""));
    } else
        json_object_set_new(d, t ? t : "", json_real(lp));
    free(t);
}

/* the n best of a position and the token itself when it is not among them (as vLLM lists them) */
static json_t *top_dict(const ps_server *sv, const pinfo *pi, int n, int32_t self, int as_ids, int vllm) {
    json_t *d = json_object();
    int m = n < pi->nk ? n : pi->nk, seen = 0;
    for (int k = 0; k < m; k++) {
        top_add(sv, d, pi->tid[k], pi->tlp[k], k + 1, as_ids, vllm);
        seen |= pi->tid[k] == self;
    }
    if (!seen) top_add(sv, d, self, pi->lp, pi->rank, as_ids, vllm);
    return d;
}

/* the choice of sequence s (index i) */
static json_t *choice_json(const ps_server *sv, const creq *q, const seqst *s, int64_t i) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(i));
    int64_t t0 = q->echo ? 0 : s->n_prompt;
    char *text = NULL;
    size_t tn = 0;
    ps_error e = {0};
    if (sv->tok && ps_detokenize(sv->tok, s->tok + t0, (size_t)(s->n - t0), false, &text, &tn, &e)) text = NULL;
    json_object_set_new(c, "text", json_string(text ? text : ""));
    free(text);
    if (q->logprobs >= 0) {
        json_t *lo = json_object(), *tk = json_array(), *tl = json_array(), *tp = json_array(), *off = json_array();
        int64_t at = 0;
        for (int64_t t = t0; t < s->n; t++) {
            char *ts = token_text(sv, s->tok[t], q->as_ids);
            json_array_append_new(tk, json_string(ts ? ts : ""));
            json_array_append_new(off, json_integer(at));
            at += ts ? utf8_chars(ts) : 0;
            free(ts);
            if (t == 0) {
                json_array_append_new(tl, json_null());
                json_array_append_new(tp, json_null());
            } else {
                json_array_append_new(tl, json_real(s->pi[t].lp));
                json_array_append_new(tp, top_dict(sv, &s->pi[t], (int)q->logprobs, s->tok[t], q->as_ids, 0));
            }
        }
        json_object_set_new(lo, "tokens", tk);
        json_object_set_new(lo, "token_logprobs", tl);
        json_object_set_new(lo, "top_logprobs", tp);
        json_object_set_new(lo, "text_offset", off);
        json_object_set_new(c, "logprobs", lo);
    } else
        json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", json_string("length"));
    if (q->prompt_logprobs >= 0) {
        json_t *pl = json_array();
        for (int64_t t = 0; t < s->n_prompt; t++)
            json_array_append_new(pl, t == 0 ? json_null() : top_dict(sv, &s->pi[t], (int)q->prompt_logprobs, s->tok[t], q->as_ids, 1));
        json_object_set_new(c, "prompt_logprobs", pl);
    }
    return c;
}

static enum MHD_Result completions(ps_server *sv, struct MHD_Connection *conn, const char *body, size_t n) {
    json_error_t je;
    json_t *root = json_loadb(body, n, 0, &je);
    char msg[1024];
    if (!json_is_object(root)) {
        json_decref(root);
        return root ? respond_error(conn, 400, NULL, "the body is not a JSON object")
                    : respond_error(conn, 400, NULL, "the body is not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    creq q = {16, -1, -1, 0, 0, 1.0, 0};
    int st = 0;
    json_t *v;
    const char *mname = json_string_value(json_object_get(root, "model"));
    if (json_object_get(root, "model") && !json_is_null(json_object_get(root, "model")) && (!mname || strcmp(mname, sv->name))) {
        char got[300];
        snprintf(got, sizeof got, "%s", mname ? mname : "(not a string)");
        json_decref(root);
        return respond_error(conn, 404, "model", "model %s is not served here (this server serves \"%s\")", got, sv->name);
    }
    if (!st) st = get_count(root, "max_tokens", 0, sv->o.max_tokens, "--max-tokens", &q.max_tokens, msg, sizeof msg);
    if (!st) st = get_count(root, "logprobs", 0, sv->o.max_logprobs, "--max-logprobs", &q.logprobs, msg, sizeof msg);
    if (!st) st = get_count(root, "prompt_logprobs", 0, sv->o.max_logprobs, "--max-logprobs", &q.prompt_logprobs, msg, sizeof msg);
    if (!st && (v = json_object_get(root, "echo")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) st = 400, snprintf(msg, sizeof msg, "echo: expected true or false");
        else q.echo = json_is_true(v);
    }
    if (!st && (v = json_object_get(root, "return_tokens_as_token_ids")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) st = 400, snprintf(msg, sizeof msg, "return_tokens_as_token_ids: expected true or false");
        else q.as_ids = json_is_true(v);
    }
    if (!st && (v = json_object_get(root, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100)
            st = 400, snprintf(msg, sizeof msg, "temperature: expected a number in [0, 100]");
        else q.temperature = json_number_value(v);
    }
    if (!st && (v = json_object_get(root, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v)) st = 400, snprintf(msg, sizeof msg, "seed: expected an integer");
        else q.seed = (uint64_t)json_integer_value(v);
    }
    if (!st && (v = json_object_get(root, "n")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        st = 400, snprintf(msg, sizeof msg, "n: only 1 completion per prompt is served");
    if (!st && (v = json_object_get(root, "best_of")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        st = 400, snprintf(msg, sizeof msg, "best_of: only 1 is served");
    if (!st && json_is_true(json_object_get(root, "stream"))) st = 400, snprintf(msg, sizeof msg, "stream: streaming is not served");
    if (st) {
        json_decref(root);
        return respond_error(conn, (unsigned)st, NULL, "%s", msg);
    }
    /* the prompts: a string, a list of ids, or a list of either */
    json_t *pr = json_object_get(root, "prompt");
    json_t *list = NULL;
    if (json_is_string(pr) || (json_is_array(pr) && json_array_size(pr) > 0 && json_is_integer(json_array_get(pr, 0))))
        list = json_pack("[O]", pr);
    else if (json_is_array(pr) && json_array_size(pr) > 0)
        list = json_incref(pr);
    if (!list) {
        json_decref(root);
        return respond_error(conn, 400, "prompt", "prompt: expected a string, a list of token ids, or a non-empty list of either");
    }
    int64_t np = (int64_t)json_array_size(list);
    if (np > sv->o.max_prompts) {
        json_decref(list);
        json_decref(root);
        return respond_error(conn, 400, "prompt", "prompt: %lld prompts in one request exceed the limit %lld (--max-prompts)", (long long)np,
                             (long long)sv->o.max_prompts);
    }
    job *j = calloc(1, sizeof *j);
    if (j) j->seqs = calloc((size_t)np, sizeof *j->seqs);
    if (!j || !j->seqs) {
        free(j);
        json_decref(list);
        json_decref(root);
        return respond_error(conn, 500, NULL, "out of memory");
    }
    j->n = np;
    int K = (int)(q.logprobs > q.prompt_logprobs ? q.logprobs : q.prompt_logprobs);
    if (K < 1) K = 1;
    for (int64_t i = 0; i < np && !st; i++) {
        char param[64];
        if (json_is_string(pr) || json_is_integer(json_array_get(pr, 0))) snprintf(param, sizeof param, "prompt");
        else snprintf(param, sizeof param, "prompt[%lld]", (long long)i);
        json_t *pv = json_array_get(list, (size_t)i);
        if (!json_is_string(pv) && !json_is_array(pv)) {
            st = 400, snprintf(msg, sizeof msg, "%s: expected a string or a list of token ids", param);
            break;
        }
        seqst *s = &j->seqs[i];
        int32_t *ids;
        int64_t L;
        if ((st = prompt_ids(sv, pv, param, &ids, &L, msg, sizeof msg))) break;
        if (L < 1) {
            free(ids);
            st = 400, snprintf(msg, sizeof msg, "%s: the prompt is empty", param);
            break;
        }
        if (L > sv->o.max_prompt_tokens) {
            free(ids);
            st = 400, snprintf(msg, sizeof msg, "%s: %lld prompt tokens exceed the limit %lld (--max-prompt-tokens)", param, (long long)L,
                               (long long)sv->o.max_prompt_tokens);
            break;
        }
        if (L + q.max_tokens > sv->rt.max_pos) {
            free(ids);
            st = 400, snprintf(msg, sizeof msg, "%s: %lld prompt tokens + max_tokens %lld exceed the model's context of %lld tokens", param,
                               (long long)L, (long long)q.max_tokens, (long long)sv->rt.max_pos);
            break;
        }
        s->all_rows = (q.echo && q.logprobs >= 0) || q.prompt_logprobs >= 0;
        double need = (double)(s->all_rows ? L + 1 : 1) * (double)sv->vocab * 4.0;
        if (need > sv->o.max_logit_bytes) {
            free(ids);
            st = 400, snprintf(msg, sizeof msg, "%s: log-probabilities at %lld positions need %.2f GiB of logits, more than the limit %.2f GiB (--max-logit-bytes)",
                               param, (long long)L, need / 1073741824.0, sv->o.max_logit_bytes / 1073741824.0);
            break;
        }
        int64_t cap = L + q.max_tokens;
        s->tok = realloc(ids, (size_t)cap * sizeof(int32_t));
        if (!s->tok) {
            free(ids);
            st = 500, snprintf(msg, sizeof msg, "out of memory");
            break;
        }
        s->n_prompt = s->n = L;
        s->gen_max = q.max_tokens;
        s->K = K;
        s->temp = q.temperature;
        ps_rng_seed(&s->rng, q.seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i);
        s->pi = calloc((size_t)cap, sizeof *s->pi);
        s->tid_pool = malloc((size_t)(cap * K) * sizeof(int32_t));
        s->tlp_pool = malloc((size_t)(cap * K) * sizeof(double));
        if (!s->pi || !s->tid_pool || !s->tlp_pool) {
            st = 500, snprintf(msg, sizeof msg, "out of memory");
            break;
        }
        for (int64_t t = 0; t < cap; t++) {
            s->pi[t].tid = s->tid_pool + t * K;
            s->pi[t].tlp = s->tlp_pool + t * K;
        }
    }
    json_decref(list);
    json_decref(root);
    if (st) {
        job_free(j);
        return respond_error(conn, (unsigned)st, "prompt", "%s", msg);
    }
    /* queue it and wait for the worker */
    pthread_mutex_lock(&sv->mu);
    if (sv->stopping) {
        pthread_mutex_unlock(&sv->mu);
        job_free(j);
        return respond_error(conn, 503, NULL, "the server is shutting down");
    }
    if (sv->tail) sv->tail->next = j;
    else sv->head = j;
    sv->tail = j;
    pthread_cond_signal(&sv->cv_work);
    while (!j->done) pthread_cond_wait(&sv->cv_done, &sv->mu);
    int64_t id = ++sv->counter;
    pthread_mutex_unlock(&sv->mu);
    if (j->failed) {
        enum MHD_Result x = respond_error(conn, (unsigned)j->failed, NULL, "%s", j->msg);
        job_free(j);
        return x;
    }
    json_t *res = json_object(), *ch = json_array();
    char rid[64];
    snprintf(rid, sizeof rid, "cmpl-%lld", (long long)id);
    int64_t ptok = 0, ctok = 0;
    json_object_set_new(res, "id", json_string(rid));
    json_object_set_new(res, "object", json_string("text_completion"));
    json_object_set_new(res, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(res, "model", json_string(sv->name));
    for (int64_t i = 0; i < j->n; i++) {
        json_array_append_new(ch, choice_json(sv, &q, &j->seqs[i], i));
        ptok += j->seqs[i].n_prompt;
        ctok += j->seqs[i].n - j->seqs[i].n_prompt;
    }
    json_object_set_new(res, "choices", ch);
    json_object_set_new(res, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)ptok, "completion_tokens", (json_int_t)ctok,
                                                "total_tokens", (json_int_t)(ptok + ctok)));
    char *text = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(res);
    job_free(j);
    return respond(conn, 200, text);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                               const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ps_server *sv = cls;
    conn_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        pthread_mutex_lock(&sv->mu);
        r->refused = sv->open_conns > sv->o.max_connections;
        pthread_mutex_unlock(&sv->mu);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoll(cl, NULL, 10) > sv->o.max_body) r->too_big = 1;
        if (r->refused)
            return respond_error(conn, 429, NULL, "connection limit: more than %d open connections (--max-connections)", sv->o.max_connections);
        if (r->too_big)
            return respond_error(conn, 413, NULL, "the body of %s bytes exceeds the limit of %lld bytes (--max-body)", cl, (long long)sv->o.max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t k = *upload_size;
        *upload_size = 0;
        if (r->too_big || r->n + k > (size_t)sv->o.max_body) {
            r->too_big = 1;
            return MHD_YES;
        }
        if (r->n + k + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 65536;
            while (cap < r->n + k + 1) cap *= 2;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->n, upload, k);
        r->n += k;
        r->body[r->n] = '\0';
        return MHD_YES;
    }
    if (r->too_big)
        return respond_error(conn, 413, NULL, "the body exceeds the limit of %lld bytes (--max-body)", (long long)sv->o.max_body);
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get) return respond_error(conn, 405, NULL, "%s /health: use GET", method);
        char *t = malloc(32);
        if (t) strcpy(t, "{\"status\":\"ok\"}");
        return respond(conn, 200, t);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return respond_error(conn, 405, NULL, "%s /v1/models: use GET", method);
        json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:I, s:s}]}", "object", "list", "data", "id", sv->name, "object", "model",
                              "created", 0, "owned_by", "phasescope", "max_model_len", (json_int_t)sv->rt.max_pos, "root", sv->o.model_dir);
        char *t = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        return respond(conn, 200, t);
    }
    if (!strcmp(url, "/v1/completions")) {
        if (!post) return respond_error(conn, 405, NULL, "%s /v1/completions: use POST", method);
        return completions(sv, conn, r->body ? r->body : "", r->n);
    }
    return respond_error(conn, 404, NULL, "%s %s: no such endpoint (this server has POST /v1/completions, GET /v1/models, GET /health)", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_req *r = *con_cls;
    if (r) {
        free(r->body);
        free(r);
    }
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    (void)c;
    (void)socket_context;
    ps_server *sv = cls;
    pthread_mutex_lock(&sv->mu);
    sv->open_conns += toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&sv->mu);
}

void ps_serve_defaults(ps_serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->max_body = 64 << 20;
    o->max_logprobs = 20;
    o->max_tokens = 1024;
    o->max_prompts = 256;
    o->max_connections = 64;
    o->max_batch = 32;
    o->max_logit_bytes = 2.0 * 1073741824.0;
}

int ps_serve_port(const ps_server *s) { return s->port; }
const char *ps_serve_name(const ps_server *s) { return s->name; }

static int open_tokenizer(ps_server *sv, ps_error *err) {
    const char *path = sv->o.tokenizer;
    ps_textkv_task t;
    memset(&t, 0, sizeof t);
    int has = 0;
    char local[4200];
    if (!path) { /* a checkpoint trained on text-kv names its tokenizer */
        has = ps_textkv_runtime_task(&sv->rt, sv->o.model_dir, &t, err);
        if (has < 0) return -1;
        if (has) path = t.tokenizer_path;
    }
    struct stat stt;
    if (!path && !ps_path_join(local, sizeof local, sv->o.model_dir, "tokenizer.json", NULL) && !stat(local, &stt)) path = local;
    int rc = 0;
    if (path) {
        rc = ps_tokenizer_load(path, &sv->tok, err);
        if (!rc && ps_tokenizer_vocab_size(sv->tok) > sv->vocab)
            rc = ps_fail(err, "%s: the tokenizer has %d ids but the model %s has vocab_size %lld: they do not belong together", path,
                         (int)ps_tokenizer_vocab_size(sv->tok), sv->o.model_dir, (long long)sv->vocab);
    }
    if (has) ps_textkv_task_free(&t);
    return rc;
}

int ps_serve_start(const ps_serve_opts *o, ps_server **out, ps_error *err) {
    *out = NULL;
    ps_server *sv = calloc(1, sizeof *sv);
    if (!sv) return ps_fail(err, "out of memory");
    sv->o = *o;
    if (!sv->o.host) sv->o.host = "127.0.0.1";
    pthread_mutex_init(&sv->mu, NULL);
    pthread_cond_init(&sv->cv_work, NULL);
    pthread_cond_init(&sv->cv_done, NULL);
    ps_runtime_opts ro = {.backend = o->backend, .weights = 1, .lazy = 0};
    int opened = !ps_runtime_open_in(&sv->rt, o->families, o->model_dir, &ro, err);
    if (opened) sv->vocab = sv->rt.family->vocab(&sv->rt);
    if (!opened || open_tokenizer(sv, err)) {
        ps_serve_stop(sv);
        return -1;
    }
    if ((sv->dec = malloc(sizeof *sv->dec)) && ps_serve_decoder_create(sv->dec, &sv->rt, NULL)) {
        free(sv->dec); /* a model the cache does not run (another family, a device backend): the whole-sequence path */
        sv->dec = NULL;
    }
    if (!sv->o.max_prompt_tokens || sv->o.max_prompt_tokens > sv->rt.max_pos) sv->o.max_prompt_tokens = sv->rt.max_pos;
    if (o->name) snprintf(sv->name, sizeof sv->name, "%s", o->name);
    else {
        size_t L = strlen(o->model_dir);
        while (L > 1 && o->model_dir[L - 1] == '/') L--;
        size_t b = L;
        while (b > 0 && o->model_dir[b - 1] != '/') b--;
        snprintf(sv->name, sizeof sv->name, "%.*s", (int)(L - b), o->model_dir + b);
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)o->port);
    const char *host = !strcmp(sv->o.host, "localhost") ? "127.0.0.1" : sv->o.host;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        ps_serve_stop(sv);
        return ps_fail(err, "--host %s: expected an IPv4 address (127.0.0.1, 0.0.0.0, ...)", sv->o.host);
    }
    if (pthread_create(&sv->worker, NULL, worker_main, sv)) {
        ps_serve_stop(sv);
        return ps_fail(err, "cannot start the model's worker thread");
    }
    sv->worker_up = 1;
    sv->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL, handler, sv,
                             MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned int)(sv->o.max_connections + 16), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)600,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, sv,
                             MHD_OPTION_END);
    if (!sv->d) {
        ps_serve_stop(sv);
        return ps_fail(err, "cannot listen on %s:%d (in use, or not an address of this machine)", sv->o.host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    sv->port = di ? (int)di->port : o->port;
    *out = sv;
    return 0;
}

void ps_serve_stop(ps_server *sv) {
    if (!sv) return;
    if (sv->d) MHD_quiesce_daemon(sv->d);
    pthread_mutex_lock(&sv->mu);
    sv->stopping = 1;
    pthread_cond_broadcast(&sv->cv_work);
    pthread_mutex_unlock(&sv->mu);
    if (sv->worker_up) pthread_join(sv->worker, NULL);
    if (sv->d) MHD_stop_daemon(sv->d);
    ps_tokenizer_free(sv->tok);
    if (sv->dec) ps_serve_decoder_free(sv->dec);
    free(sv->dec);
    ps_runtime_free(&sv->rt);
    pthread_mutex_destroy(&sv->mu);
    pthread_cond_destroy(&sv->cv_work);
    pthread_cond_destroy(&sv->cv_done);
    free(sv);
}

int ps_serve_run(const ps_serve_opts *o, const char *port_file, ps_error *err) {
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* the threads the server starts inherit the mask: the signals reach sigwait below only */
    pthread_sigmask(SIG_BLOCK, &set, &old);
    ps_server *sv;
    if (ps_serve_start(o, &sv, err)) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return -1;
    }
    printf("serving %s (%s) on http://%s:%d/v1 (POST /v1/completions, GET /v1/models, GET /health); Ctrl-C stops\n", sv->name,
           sv->o.model_dir, sv->o.host, sv->port);
    fflush(stdout);
    int rc = 0;
    if (port_file) {
        char num[32];
        int k = snprintf(num, sizeof num, "%d\n", sv->port);
        rc = ps_write_file_atomic(port_file, num, (size_t)k, err);
    }
    int sig = 0;
    if (!rc) sigwait(&set, &sig);
    ps_serve_stop(sv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!rc) printf("stopped (signal %d)\n", sig);
    return rc;
}
