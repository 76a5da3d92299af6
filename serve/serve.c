/* serve.c — the OpenAI-compatible server (serve.h). */
#define _POSIX_C_SOURCE 200809L
#include "serve/serve.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/generate.h"
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
    int all_rows;    /* the first step computes every row (echo with logprobs, prompt_logprobs) */
    int K;           /* top entries per position */
    double temp, top_p;
    ps_rng rng;
    pinfo *pi;       /* [n_prompt + gen_max]: pi[t] for token t (t >= 1) */
    int32_t *tid_pool;
    double *tlp_pool;
    int64_t row0;    /* the current step's first row */
    int started;     /* its first step ran */
    /* published by the worker under the server's lock after each step (what a streaming connection reads):
     * tok[0, pub) and pi[0, pub) are final; fin: nothing more comes */
    int64_t pub;
    int fin;
} seqst;

/* A request. It is held by its connection and, while queued or running, by the worker (refs); whoever lets
 * go last frees it (under the server's lock). */
typedef struct job {
    seqst *seqs;
    int64_t n;
    int refs;
    int done, failed;  /* failed: an HTTP status */
    int stepped;       /* a step has run (a streaming answer starts) */
    int cancelled;     /* the client went away: the worker drops its sequences at the next step */
    char msg[1024];
    struct job *next;  /* the queue, then the running list */
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
    job *head, *tail;       /* waiting to join */
    job *run;               /* running (continuous batching): in order of arrival */
    int64_t run_seqs;       /* their sequences */
    int64_t live_seqs, kv_bytes, steps; /* the cache's sequences and bytes after the last step (GET /health) */
    int64_t dropped[2];     /* jobs whose client went away: while queued, while running */
    int inflight;           /* requests begun and not yet completed (ps_serve_stop lets them end) */
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

/* (the server's lock held) let go of j */
static void job_release(job *j) {
    if (j && --j->refs == 0) job_free(j);
}

/* the row statistics of one logits row for token y (two passes: the maximum, then the sum of exponentials,
 * the rank of y and the K best); choose: pick the next token (greedy: the first maximum, as the local
 * scoring does; temperature > 0: sampled within the nucleus top_p, generate's sampler: ps_generate_pick) */
static int32_t row_stats(seqst *s, const float *x, int64_t V, int32_t y, int choose, pinfo *pi) {
    float mx = x[0];
    int64_t arg = 0;
    for (int64_t i = 1; i < V; i++)
        if (x[i] > mx) {
            mx = x[i];
            arg = i;
        }
    if (choose) {
        if (s->temp > 0) { /* sample from softmax(x / temp) within the nucleus top_p */
            y = ps_generate_pick(x, V, s->temp, s->top_p, &s->rng, NULL);
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

/* a sequence that still needs logits: tokens to generate, or its prompt's rows not yet computed */
static int seq_needs(const seqst *s) { return s->n - s->n_prompt < s->gen_max || (!s->started && s->all_rows && s->n > 1); }

/* One step of the running sequences act[0, B): a sequence that joins now gets its prompt's rows (its last,
 * or every row with all_rows), the others one new token each; all in one call of the decoder (one batched
 * append through the KV cache) or of the family's rows (the whole-sequence path: a forward of each
 * sequence, padded at the end to the longest). */
static int run_step(ps_server *sv, seqst **act, int64_t B, ps_error *err) {
    int64_t T = 0;
    for (int64_t i = 0; i < B; i++) T = act[i]->n > T ? act[i]->n : T;
    ps_batch b;
    int rc = ps_batch_alloc(&b, B, T, 1, err);
    if (rc) return rc;
    for (int64_t i = 0; i < B; i++) {
        seqst *s = act[i];
        int gen = s->n - s->n_prompt < s->gen_max;
        memcpy(b.tokens + i * T, s->tok, (size_t)s->n * sizeof(int32_t));
        for (int64_t t = s->n; t < T; t++) b.tokens[i * T + t] = s->tok[s->n - 1]; /* tail padding: never read */
        for (int64_t t = 0; t < T; t++) b.targets[i * T + t] = -1;
        int64_t r0 = !s->started && s->all_rows ? 0 : s->n - 1, r1 = gen ? s->n : s->n - 1; /* rows [r0, r1) */
        s->row0 = r0;
        b.n_q[i] = 1;
        b.queries[i] = (ps_query){.key_pos = 0, .answer_pos = r0, .answer_len = r1 - r0, .answer_src = r0 + 1};
    }
    fwd_ctx c = {act, sv->vocab};
    rc = sv->dec ? ps_serve_decode_rows(sv->dec, (const void *const *)act, &b, on_rows, &c, err)
                 : sv->rt.family->rows(&sv->rt, &b, sv->o.max_batch, 0, on_rows, &c, err);
    ps_batch_free(&b);
    return rc;
}

/* (lock held) j leaves the running batch: its cache sequences are dropped, its connection woken */
static void finish_job(ps_server *sv, job *j) {
    if (sv->dec)
        for (int64_t i = 0; i < j->n; i++) ps_serve_decoder_drop(sv->dec, &j->seqs[i]);
    sv->run_seqs -= j->n;
    j->done = 1;
    job_release(j);
}

/* Continuous batching: between two steps, the jobs whose clients went away leave, the queued jobs join
 * (while the running sequences stay within max_batch; a job larger than that runs alone), the finished
 * ones leave; each step runs every running sequence that needs logits. */
static void *worker_main(void *arg) {
    ps_server *sv = arg;
    seqst **act = NULL;
    int64_t cap = 0;
    pthread_mutex_lock(&sv->mu);
    for (;;) {
        while (!sv->stopping && !sv->run && !sv->head) pthread_cond_wait(&sv->cv_work, &sv->mu);
        if (sv->stopping) break;
        job **tailp = &sv->run;
        for (job *j; (j = *tailp);) {
            if (j->cancelled) {
                *tailp = j->next;
                sv->dropped[1]++;
                finish_job(sv, j);
            } else
                tailp = &j->next;
        }
        while (sv->head) {
            job *j = sv->head;
            if (!j->cancelled && sv->run_seqs > 0 && sv->run_seqs + j->n > sv->o.max_batch) break;
            sv->head = j->next;
            if (!sv->head) sv->tail = NULL;
            j->next = NULL;
            if (j->cancelled) {
                sv->dropped[0]++;
                j->done = 1;
                job_release(j);
                continue;
            }
            *tailp = j;
            tailp = &j->next;
            sv->run_seqs += j->n;
        }
        if (sv->run_seqs > cap) {
            seqst **na = realloc(act, (size_t)sv->run_seqs * sizeof *na);
            if (na) act = na, cap = sv->run_seqs;
        }
        int64_t B = 0;
        int rc = 0;
        ps_error e = {0};
        if (sv->run_seqs > cap) rc = ps_fail(&e, "out of memory for a step of %lld sequences", (long long)sv->run_seqs);
        for (job *j = sv->run; j && !rc; j = j->next)
            for (int64_t i = 0; i < j->n; i++)
                if (seq_needs(&j->seqs[i])) act[B++] = &j->seqs[i];
        pthread_mutex_unlock(&sv->mu);
        if (B && !rc) rc = run_step(sv, act, B, &e);
        pthread_mutex_lock(&sv->mu);
        sv->steps++;
        for (int64_t i = 0; i < B; i++) act[i]->started = 1;
        for (job **p = &sv->run; *p;) {
            job *j = *p;
            int more = 0;
            for (int64_t i = 0; i < j->n; i++) {
                seqst *s = &j->seqs[i];
                s->pub = s->n;
                s->fin = !seq_needs(s);
                more |= !s->fin;
            }
            j->stepped = 1;
            if (rc) {
                j->failed = 500;
                snprintf(j->msg, sizeof j->msg, "the model failed: %.900s", e.msg);
            }
            if (rc || !more) {
                *p = j->next;
                finish_job(sv, j);
            } else
                p = &j->next;
        }
        sv->live_seqs = sv->dec ? ps_serve_decoder_live(sv->dec) : 0;
        sv->kv_bytes = sv->dec ? ps_kvcache_bytes(&sv->dec->kv) : 0;
        pthread_cond_broadcast(&sv->cv_done);
    }
    /* shutting down: fail what runs and what waits */
    for (int k = 0; k < 2; k++) {
        job *j = k ? sv->head : sv->run;
        while (j) {
            job *nx = j->next;
            j->failed = 503;
            snprintf(j->msg, sizeof j->msg, "the server is shutting down");
            if (k) {
                j->done = 1;
                job_release(j);
            } else
                finish_job(sv, j);
            j = nx;
        }
    }
    sv->head = sv->tail = sv->run = NULL;
    pthread_cond_broadcast(&sv->cv_done);
    pthread_mutex_unlock(&sv->mu);
    free(act);
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
    double temperature, top_p;
    uint64_t seed;
    int stream, usage; /* "stream": server-sent events; stream_options.include_usage */
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

/* the OpenAI completions "logprobs" of tokens [t0, t1) of s: tokens, token_logprobs, top_logprobs and
 * text_offset (*at: the running length of the token texts, carried from chunk to chunk when streaming) */
static json_t *logprobs_json(const ps_server *sv, const creq *q, const seqst *s, int64_t t0, int64_t t1, int64_t *at) {
    json_t *lo = json_object(), *tk = json_array(), *tl = json_array(), *tp = json_array(), *off = json_array();
    for (int64_t t = t0; t < t1; t++) {
        char *ts = token_text(sv, s->tok[t], q->as_ids);
        json_array_append_new(tk, json_string(ts ? ts : ""));
        json_array_append_new(off, json_integer(*at));
        *at += ts ? utf8_chars(ts) : 0;
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
    return lo;
}

/* vLLM's prompt_logprobs of s: [null, {id: {logprob, rank, decoded_token}}, ...] */
static json_t *prompt_logprobs_json(const ps_server *sv, const creq *q, const seqst *s) {
    json_t *pl = json_array();
    for (int64_t t = 0; t < s->n_prompt; t++)
        json_array_append_new(pl, t == 0 ? json_null() : top_dict(sv, &s->pi[t], (int)q->prompt_logprobs, s->tok[t], q->as_ids, 1));
    return pl;
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
    int64_t at = 0;
    json_object_set_new(c, "logprobs", q->logprobs >= 0 ? logprobs_json(sv, q, s, t0, s->n, &at) : json_null());
    json_object_set_new(c, "finish_reason", json_string("length"));
    if (q->prompt_logprobs >= 0) json_object_set_new(c, "prompt_logprobs", prompt_logprobs_json(sv, q, s));
    return c;
}

/* ==== waiting for the worker, and the client going away ==== */

/* The client closed its end (or the connection broke): a poll that sees the end of the stream or an error,
 * without reading what it may have sent next (a peek). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return 1;
    char ch;
    return recv(ci->connect_fd, &ch, 1, MSG_PEEK) <= 0;
}

/* (lock held) one wait for the worker's next step (at most 100 ms); -1 when the client went away meanwhile:
 * then j is cancelled (the worker drops its sequences at the next step) */
static int wait_once(ps_server *sv, job *j, struct MHD_Connection *c) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&sv->cv_done, &sv->mu, &ts);
    if (!j->done && client_gone(c)) {
        j->cancelled = 1;
        pthread_cond_signal(&sv->cv_work);
        return -1;
    }
    return 0;
}

/* (lock held) wait until j is done (first: or has run its first step); -1 as wait_once */
static int wait_job(ps_server *sv, job *j, struct MHD_Connection *c, int first) {
    while (!j->done && !(first && j->stepped))
        if (wait_once(sv, j, c)) return -1;
    return 0;
}

/* ==== streaming: server-sent events as the OpenAI API sends them ====
 * One event per choice and step that brought tokens: data: {"id", "object": "text_completion", "created",
 * "model", "choices": [{"index", "text", "logprobs", "finish_reason"}]} (the last of a choice with
 * finish_reason "length"; with echo the first carries the prompt, with prompt_logprobs those too), then
 * with stream_options.include_usage one with "choices": [] and "usage", then data: [DONE]. The events
 * leave as the worker publishes the tokens (the connection's thread blocks in the reader until then). */
typedef struct {
    ps_server *sv;
    job *j;                 /* a reference held until the response is freed */
    creq q;
    struct MHD_Connection *conn;
    char rid[64];
    json_int_t created;
    int64_t *sent;          /* [n] tokens sent per choice */
    size_t *tbytes;         /* [n] bytes of text sent */
    int64_t *at;            /* [n] the text_offset so far */
    int *closed;            /* [n] the choice's last event sent */
    int end;                /* [DONE] queued */
    char *out;
    size_t on, opos, ocap;
} stream_ctx;

static int out_add(stream_ctx *x, const char *a, size_t n) {
    if (x->on + n > x->ocap) {
        size_t cap = x->ocap ? x->ocap : 4096;
        while (cap < x->on + n) cap *= 2;
        char *b = realloc(x->out, cap);
        if (!b) return -1;
        x->out = b;
        x->ocap = cap;
    }
    memcpy(x->out + x->on, a, n);
    x->on += n;
    return 0;
}

/* one event: data: JSON\n\n (o is consumed) */
static int out_event(stream_ctx *x, json_t *o) {
    char *t = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    int rc = !t || out_add(x, "data: ", 6) || out_add(x, t, strlen(t)) || out_add(x, "\n\n", 2) ? -1 : 0;
    free(t);
    return rc;
}

static json_t *chunk_head(const stream_ctx *x) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", x->rid, "object", "text_completion", "created", x->created, "model", x->sv->name);
}

/* the bytes of t that are whole characters: a trailing incomplete UTF-8 sequence or U+FFFD (a token that
 * ends inside a character) waits for the next tokens */
static size_t text_settled(const char *t, size_t n) {
    if (n >= 3 && !memcmp(t + n - 3, "\xEF\xBF\xBD", 3)) return n - 3;
    size_t k = n, back = 0;
    while (k > 0 && back < 4 && ((unsigned char)t[k - 1] & 0xC0) == 0x80) k--, back++;
    if (k == 0) return n;
    unsigned char lead = (unsigned char)t[k - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > back + 1 ? k - 1 : n;
}

/* the event of choice i: tokens [sent, pub) (last: the choice's final event) */
static int chunk_event(stream_ctx *x, int64_t i, int64_t pub, int last) {
    const ps_server *sv = x->sv;
    const seqst *s = &x->j->seqs[i];
    int64_t t0 = x->q.echo ? 0 : s->n_prompt, a = x->sent[i];
    char *text = NULL;
    size_t tn = 0;
    ps_error e = {0};
    if (sv->tok && ps_detokenize(sv->tok, s->tok + t0, (size_t)(pub - t0), false, &text, &tn, &e)) text = NULL, tn = 0;
    size_t upto = text ? (last ? tn : text_settled(text, tn)) : 0;
    if (upto < x->tbytes[i]) upto = x->tbytes[i]; /* the text so far never shrinks */
    json_t *o = chunk_head(x), *c = json_object(), *ch = json_array();
    json_object_set_new(c, "index", json_integer(i));
    json_object_set_new(c, "text", json_stringn(text && upto <= tn ? text + x->tbytes[i] : "", text && upto <= tn ? upto - x->tbytes[i] : 0));
    if (upto <= tn) x->tbytes[i] = upto;
    free(text);
    json_object_set_new(c, "logprobs", x->q.logprobs >= 0 ? logprobs_json(sv, &x->q, s, a, pub, &x->at[i]) : json_null());
    json_object_set_new(c, "finish_reason", last ? json_string("length") : json_null());
    if (a == t0 && x->q.prompt_logprobs >= 0) json_object_set_new(c, "prompt_logprobs", prompt_logprobs_json(sv, &x->q, s));
    json_array_append_new(ch, c);
    json_object_set_new(o, "choices", ch);
    x->sent[i] = pub;
    if (last) x->closed[i] = 1;
    return out_event(x, o);
}

/* Wait for what the worker publishes next and queue its events; -1: the client went away. */
static int stream_fill(stream_ctx *x) {
    ps_server *sv = x->sv;
    job *j = x->j;
    int64_t n = j->n;
    int64_t *pub = malloc((size_t)n * sizeof *pub);
    int *fin = malloc((size_t)n * sizeof *fin);
    if (!pub || !fin) {
        free(pub), free(fin);
        return -1;
    }
    int done, failed;
    char msg[1024];
    pthread_mutex_lock(&sv->mu);
    for (;;) {
        int news = 0;
        for (int64_t i = 0; i < n; i++) {
            pub[i] = j->seqs[i].pub;
            fin[i] = j->seqs[i].fin;
            news |= pub[i] > x->sent[i] || (fin[i] && !x->closed[i]);
        }
        done = j->done, failed = j->failed;
        if (news || done) break;
        if (wait_once(sv, j, x->conn)) {
            pthread_mutex_unlock(&sv->mu);
            free(pub), free(fin);
            return -1;
        }
    }
    snprintf(msg, sizeof msg, "%s", j->msg);
    pthread_mutex_unlock(&sv->mu);
    int rc = 0, open = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        if (pub[i] > x->sent[i] || (fin[i] && !x->closed[i])) rc = chunk_event(x, i, pub[i], fin[i]);
        open |= !x->closed[i];
    }
    if (!rc && done && (failed || !open)) {
        if (failed) { /* after the first event: the error as an event of its own */
            json_t *o = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", "server_error", "param", "code", failed);
            rc = out_event(x, o);
        } else if (x->q.usage) {
            int64_t ptok = 0, ctok = 0;
            for (int64_t i = 0; i < n; i++) ptok += j->seqs[i].n_prompt, ctok += j->seqs[i].n - j->seqs[i].n_prompt;
            json_t *o = chunk_head(x);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)ptok, "completion_tokens", (json_int_t)ctok,
                                                      "total_tokens", (json_int_t)(ptok + ctok)));
            rc = out_event(x, o);
        }
        if (!rc) rc = out_add(x, "data: [DONE]\n\n", 14);
        x->end = 1;
    }
    free(pub), free(fin);
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *x = cls;
    while (x->opos == x->on) {
        if (x->end) return MHD_CONTENT_READER_END_OF_STREAM;
        x->on = x->opos = 0;
        if (stream_fill(x)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t k = x->on - x->opos < max ? x->on - x->opos : max;
    memcpy(buf, x->out + x->opos, k);
    x->opos += k;
    return (ssize_t)k;
}

/* the response is done with (sent, or the client went away): a job still running is cancelled */
static void stream_free(void *cls) {
    stream_ctx *x = cls;
    pthread_mutex_lock(&x->sv->mu);
    if (!x->j->done) {
        x->j->cancelled = 1;
        pthread_cond_signal(&x->sv->cv_work);
    }
    job_release(x->j);
    pthread_mutex_unlock(&x->sv->mu);
    free(x->sent), free(x->tbytes), free(x->at), free(x->closed), free(x->out);
    free(x);
}

/* the SSE response of j (the connection's reference passes to it) */
static enum MHD_Result respond_stream(ps_server *sv, struct MHD_Connection *conn, job *j, const creq *q, int64_t id) {
    stream_ctx *x = calloc(1, sizeof *x);
    size_t n = (size_t)j->n;
    if (x) {
        x->sv = sv, x->j = j, x->q = *q, x->conn = conn, x->created = (json_int_t)time(NULL);
        snprintf(x->rid, sizeof x->rid, "cmpl-%lld", (long long)id);
        x->sent = malloc(n * sizeof *x->sent), x->tbytes = calloc(n, sizeof *x->tbytes), x->at = calloc(n, sizeof *x->at);
        x->closed = calloc(n, sizeof *x->closed);
    }
    struct MHD_Response *r = NULL;
    if (x && x->sent && x->tbytes && x->at && x->closed) {
        for (size_t i = 0; i < n; i++) x->sent[i] = q->echo ? 0 : j->seqs[i].n_prompt;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, x, stream_free);
    }
    if (!r) {
        if (x) free(x->sent), free(x->tbytes), free(x->at), free(x->closed), free(x);
        pthread_mutex_lock(&sv->mu);
        if (!j->done) {
            j->cancelled = 1;
            pthread_cond_signal(&sv->cv_work);
        }
        job_release(j);
        pthread_mutex_unlock(&sv->mu);
        return respond_error(conn, 500, NULL, "out of memory");
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result res = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return res;
}

/* A request's boolean option key (absent or null: *out kept); 0, or 400 with msg. */
static int get_flag(json_t *root, const char *key, int *out, char *msg, size_t mn) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        snprintf(msg, mn, "%s: expected true or false", key);
        return 400;
    }
    *out = json_is_true(v);
    return 0;
}

/* What an OpenAI or vLLM client may ask for and this server does not do: refused when it would change the
 * completion (absent, null or the neutral value is fine), never ignored. 0, or 400 with msg. */
static int refuse_unserved(json_t *root, char *msg, size_t mn) {
    static const struct {
        const char *key;
        double neutral; /* a number equal to this, an empty string, list or object, or false: nothing asked */
    } unserved[] = {{"top_k", -1},           {"min_p", 0},          {"stop", 0},
                    {"stop_token_ids", 0}, {"presence_penalty", 0}, {"frequency_penalty", 0}, {"repetition_penalty", 1},
                    {"logit_bias", 0},   {"suffix", 0},           {"min_tokens", 0},     {"ignore_eos", 0}};
    for (size_t k = 0; k < sizeof unserved / sizeof *unserved; k++) {
        json_t *v = json_object_get(root, unserved[k].key);
        int neutral = !v || json_is_null(v) || json_is_false(v) || (json_is_number(v) && json_number_value(v) == unserved[k].neutral) ||
                      (json_is_string(v) && !*json_string_value(v)) || (json_is_array(v) && !json_array_size(v)) ||
                      (json_is_object(v) && !json_object_size(v));
        if (!neutral) {
            snprintf(msg, mn, "%s: not served here (a completion is greedy, or sampled from softmax(logits / temperature) "
                              "within top_p, and ends after max_tokens tokens)", unserved[k].key);
            return 400;
        }
    }
    return 0;
}

/* The request's options (all but "model" and "prompt") into q, in the order they are checked; 0, or the HTTP
 * status with msg. */
static int parse_options(const ps_server *sv, json_t *root, creq *q, char *msg, size_t mn) {
    int st = 0;
    json_t *v;
    if (!st) st = get_count(root, "max_tokens", 0, sv->o.max_tokens, "--max-tokens", &q->max_tokens, msg, mn);
    if (!st) st = get_count(root, "logprobs", 0, sv->o.max_logprobs, "--max-logprobs", &q->logprobs, msg, mn);
    if (!st) st = get_count(root, "prompt_logprobs", 0, sv->o.max_logprobs, "--max-logprobs", &q->prompt_logprobs, msg, mn);
    if (!st) st = get_flag(root, "echo", &q->echo, msg, mn);
    if (!st) st = get_flag(root, "return_tokens_as_token_ids", &q->as_ids, msg, mn);
    if (!st && (v = json_object_get(root, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100)
            st = 400, snprintf(msg, mn, "temperature: expected a number in [0, 100]");
        else q->temperature = json_number_value(v);
    }
    if (!st && (v = json_object_get(root, "top_p")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1))
            st = 400, snprintf(msg, mn, "top_p: expected a number in (0, 1]");
        else q->top_p = json_number_value(v);
    }
    if (!st && (v = json_object_get(root, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v)) st = 400, snprintf(msg, mn, "seed: expected an integer");
        else q->seed = (uint64_t)json_integer_value(v);
    }
    if (!st && (v = json_object_get(root, "n")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        st = 400, snprintf(msg, mn, "n: only 1 completion per prompt is served");
    if (!st && (v = json_object_get(root, "best_of")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        st = 400, snprintf(msg, mn, "best_of: only 1 is served");
    if (!st) st = refuse_unserved(root, msg, mn);
    if (!st) st = get_flag(root, "stream", &q->stream, msg, mn);
    if (!st && (v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        json_t *u = json_object_get(v, "include_usage");
        if (!json_is_object(v) || (u && !json_is_null(u) && !json_is_boolean(u)))
            st = 400, snprintf(msg, mn, "stream_options: expected {\"include_usage\": true or false}");
        else q->usage = json_is_true(u);
    }
    return st;
}

/* Prompt i of the request (pv, named param in messages) into s: its ids within the limits, its sampling state
 * and the buffers of its generation (K log-probabilities a position); 0, or the HTTP status with msg. */
static int seq_init(const ps_server *sv, const creq *q, json_t *pv, const char *param, int64_t i, int K, seqst *s,
                    char *msg, size_t mn) {
    if (!json_is_string(pv) && !json_is_array(pv)) {
        snprintf(msg, mn, "%s: expected a string or a list of token ids", param);
        return 400;
    }
    int32_t *ids;
    int64_t L;
    int st = prompt_ids(sv, pv, param, &ids, &L, msg, mn);
    if (st) return st;
    if (L < 1) {
        free(ids);
        snprintf(msg, mn, "%s: the prompt is empty", param);
        return 400;
    }
    if (L > sv->o.max_prompt_tokens) {
        free(ids);
        snprintf(msg, mn, "%s: %lld prompt tokens exceed the limit %lld (--max-prompt-tokens)", param, (long long)L,
                 (long long)sv->o.max_prompt_tokens);
        return 400;
    }
    if (L + q->max_tokens > sv->rt.max_pos) {
        free(ids);
        snprintf(msg, mn, "%s: %lld prompt tokens + max_tokens %lld exceed the model's context of %lld tokens", param,
                 (long long)L, (long long)q->max_tokens, (long long)sv->rt.max_pos);
        return 400;
    }
    s->all_rows = (q->echo && q->logprobs >= 0) || q->prompt_logprobs >= 0;
    double need = (double)(s->all_rows ? L + 1 : 1) * (double)sv->vocab * 4.0;
    if (need > sv->o.max_logit_bytes) {
        free(ids);
        snprintf(msg, mn, "%s: log-probabilities at %lld positions need %.2f GiB of logits, more than the limit %.2f GiB (--max-logit-bytes)",
                 param, (long long)L, need / 1073741824.0, sv->o.max_logit_bytes / 1073741824.0);
        return 400;
    }
    int64_t cap = L + q->max_tokens;
    s->tok = realloc(ids, (size_t)cap * sizeof(int32_t));
    if (!s->tok) {
        free(ids);
        snprintf(msg, mn, "out of memory");
        return 500;
    }
    s->n_prompt = s->n = L;
    s->gen_max = q->max_tokens;
    s->K = K;
    s->temp = q->temperature;
    s->top_p = q->top_p;
    ps_rng_seed(&s->rng, q->seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i);
    s->pi = calloc((size_t)cap, sizeof *s->pi);
    s->tid_pool = malloc((size_t)(cap * K) * sizeof(int32_t));
    s->tlp_pool = malloc((size_t)(cap * K) * sizeof(double));
    if (!s->pi || !s->tid_pool || !s->tlp_pool) {
        snprintf(msg, mn, "out of memory");
        return 500;
    }
    for (int64_t t = 0; t < cap; t++) {
        s->pi[t].tid = s->tid_pool + t * K;
        s->pi[t].tlp = s->tlp_pool + t * K;
    }
    return 0;
}

/* The sequences of j (j->n of them) from the request's prompts (list: the prompts; pr: "prompt" as sent, which
 * names them in messages); 0, or the HTTP status with msg. */
static int job_init(const ps_server *sv, const creq *q, json_t *pr, json_t *list, job *j, char *msg, size_t mn) {
    int K = (int)(q->logprobs > q->prompt_logprobs ? q->logprobs : q->prompt_logprobs);
    if (K < 1) K = 1;
    int st = 0;
    for (int64_t i = 0; i < j->n && !st; i++) {
        char param[64];
        if (json_is_string(pr) || json_is_integer(json_array_get(pr, 0))) snprintf(param, sizeof param, "prompt");
        else snprintf(param, sizeof param, "prompt[%lld]", (long long)i);
        st = seq_init(sv, q, json_array_get(list, (size_t)i), param, i, K, &j->seqs[i], msg, mn);
    }
    return st;
}

/* The non-streaming answer of a finished job j (the connection's reference is released). */
static enum MHD_Result respond_completion(ps_server *sv, struct MHD_Connection *conn, job *j, const creq *q, int64_t id) {
    json_t *res = json_object(), *ch = json_array();
    char rid[64];
    snprintf(rid, sizeof rid, "cmpl-%lld", (long long)id);
    int64_t ptok = 0, ctok = 0;
    json_object_set_new(res, "id", json_string(rid));
    json_object_set_new(res, "object", json_string("text_completion"));
    json_object_set_new(res, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(res, "model", json_string(sv->name));
    for (int64_t i = 0; i < j->n; i++) {
        json_array_append_new(ch, choice_json(sv, q, &j->seqs[i], i));
        ptok += j->seqs[i].n_prompt;
        ctok += j->seqs[i].n - j->seqs[i].n_prompt;
    }
    json_object_set_new(res, "choices", ch);
    json_object_set_new(res, "usage", json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)ptok, "completion_tokens", (json_int_t)ctok,
                                                "total_tokens", (json_int_t)(ptok + ctok)));
    char *text = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(res);
    pthread_mutex_lock(&sv->mu);
    job_release(j);
    pthread_mutex_unlock(&sv->mu);
    return respond(conn, 200, text);
}

/* Queue j (it joins the running batch at the worker's next step), wait for it (a streaming answer: for its
 * first step; an error before it is a JSON error with its status) and answer. */
static enum MHD_Result run_job(ps_server *sv, struct MHD_Connection *conn, job *j, const creq *q) {
    pthread_mutex_lock(&sv->mu);
    if (sv->stopping) {
        pthread_mutex_unlock(&sv->mu);
        job_free(j);
        return respond_error(conn, 503, NULL, "the server is shutting down");
    }
    j->refs = 2; /* this connection's, the worker's */
    if (sv->tail) sv->tail->next = j;
    else sv->head = j;
    sv->tail = j;
    pthread_cond_signal(&sv->cv_work);
    if (wait_job(sv, j, conn, q->stream)) {
        job_release(j);
        pthread_mutex_unlock(&sv->mu);
        return MHD_NO; /* the client went away: its sequences are dropped at the next step */
    }
    int64_t id = ++sv->counter;
    if (j->failed) {
        unsigned failed = (unsigned)j->failed;
        char m[1024];
        snprintf(m, sizeof m, "%s", j->msg);
        job_release(j);
        pthread_mutex_unlock(&sv->mu);
        return respond_error(conn, failed, NULL, "%s", m);
    }
    pthread_mutex_unlock(&sv->mu);
    if (q->stream) return respond_stream(sv, conn, j, q, id);
    return respond_completion(sv, conn, j, q, id);
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
    creq q = {.max_tokens = 16, .logprobs = -1, .prompt_logprobs = -1, .temperature = 1.0, .top_p = 1.0};
    const char *mname = json_string_value(json_object_get(root, "model"));
    if (json_object_get(root, "model") && !json_is_null(json_object_get(root, "model")) && (!mname || strcmp(mname, sv->name))) {
        char got[300];
        snprintf(got, sizeof got, "%s", mname ? mname : "(not a string)");
        json_decref(root);
        return respond_error(conn, 404, "model", "model %s is not served here (this server serves \"%s\")", got, sv->name);
    }
    int st = parse_options(sv, root, &q, msg, sizeof msg);
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
    st = job_init(sv, &q, pr, list, j, msg, sizeof msg);
    json_decref(list);
    json_decref(root);
    if (st) {
        job_free(j);
        return respond_error(conn, (unsigned)st, "prompt", "%s", msg);
    }
    return run_job(sv, conn, j, &q);
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
        sv->inflight++; /* until on_completed */
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
        /* and the running batch: its sequences, the KV cache's sequences and bytes after the last step */
        pthread_mutex_lock(&sv->mu);
        json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:[I, I]}", "status", "ok", "running", (json_int_t)sv->run_seqs, "cache_sequences",
                              (json_int_t)sv->live_seqs, "cache_bytes", (json_int_t)sv->kv_bytes, "steps", (json_int_t)sv->steps,
                              "dropped", (json_int_t)sv->dropped[0], (json_int_t)sv->dropped[1]);
        pthread_mutex_unlock(&sv->mu);
        char *t = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
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
    (void)c;
    (void)toe;
    ps_server *sv = cls;
    conn_req *r = *con_cls;
    if (r) {
        free(r->body);
        free(r);
        pthread_mutex_lock(&sv->mu);
        sv->inflight--;
        pthread_cond_broadcast(&sv->cv_done);
        pthread_mutex_unlock(&sv->mu);
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
    o->port = 8000;
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
        free(sv->dec); /* a model the cache does not run (a family without one): the whole-sequence path */
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
    /* no new connections; the listening socket is ours to close once the daemon has stopped (until then a
     * client that connects waits in its backlog, then is refused) */
    MHD_socket lfd = sv->d ? MHD_quiesce_daemon(sv->d) : MHD_INVALID_SOCKET;
    pthread_mutex_lock(&sv->mu);
    sv->stopping = 1;
    pthread_cond_broadcast(&sv->cv_work);
    pthread_mutex_unlock(&sv->mu);
    if (sv->worker_up) pthread_join(sv->worker, NULL);
    /* the requests in flight send their answers (a 503, a stream's end or its 503 event and data: [DONE])
     * before the daemon closes their connections; a client that does not read gets 5 s */
    pthread_mutex_lock(&sv->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    while (sv->inflight > 0 && pthread_cond_timedwait(&sv->cv_done, &sv->mu, &until) == 0) {}
    pthread_mutex_unlock(&sv->mu);
    if (sv->d) MHD_stop_daemon(sv->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
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
