/* test_serve.c — `phasescope serve` (serve/serve.h) in process, over loopback: the prompt log-probabilities of
 * echo + logprobs and of prompt_logprobs against a plain log-softmax of ps_forward's logits (and their ranks
 * and top lists), greedy continuations against the argmax of a forward of the extended sequence, string
 * prompts through the tokenizer, malformed and oversized requests (4xx JSON naming the limit, and the server
 * keeps serving), the connection limit (429), 32 concurrent clients that all get their own right answers
 * (the worker batches them), streamed answers ("stream": true, server-sent events) against the same answers
 * in one piece (tokens, log-probabilities, text, echo and prompt_logprobs, usage; for the other families
 * too: Qwen3, DeepSeek-V4, MiniCPM4), and continuous batching: a request joining a batch of running streams, and a stream that others
 * joined and left, against the same request alone; a family defined in tests/ (the bigram toy, toy_family.h),
 * passed in the server's family list, answers a greedy completion with the table's argmax and log-softmax.
 * Every server is shut down by the test itself. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#define OK(c) CHECK(c, "%s", "")
#include "core/config.h"
#include "core/forward.h"
#include "core/model.h"
#include "serve_http.h"
#include "serve/serve.h"
#include "testutil.h"
#include "toy_family.h"
#include "text/tokenizer.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_model.h"
#include "core/minicpm/minicpm.h"

/* log-softmax of the forward's logits for ids (double, plain loops): lsm[t * V + v] for the row at t */
static double *reference_lsm(const ps_model *m, const int32_t *ids, int64_t T) {
    ps_acts a;
    ps_error err = {0};
    int64_t V = m->cfg.vocab_size;
    OK(!ps_acts_create(&a, m->ctx, &m->cfg, 1, T, false, &err));
    OK(!ps_forward(m, &a, ids, NULL, &err));
    const float *lg = ps_acts_logits_host(&a, &err);
    double *out = malloc((size_t)(T * V) * sizeof *out);
    for (int64_t t = 0; t < T; t++) {
        double mx = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, lg[t * V + v]);
        for (int64_t v = 0; v < V; v++) s += exp(lg[t * V + v] - mx);
        for (int64_t v = 0; v < V; v++) out[t * V + v] = lg[t * V + v] - mx - log(s);
    }
    ps_acts_free(&a);
    return out;
}

static char *ids_json(const int32_t *ids, int64_t n) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

static int is_error(json_t *o, const char *needle) {
    const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    if (!m) return 0;
    if (needle && !strstr(m, needle)) {
        fprintf(stderr, "error message \"%s\" lacks \"%s\"\n", m, needle);
        return 0;
    }
    return 1;
}

typedef struct {
    int port;
    const int32_t *ids;
    int64_t T;
    int32_t want; /* the greedy next token */
    int ok;
} client;

static void *client_main(void *u) {
    client *c = u;
    char *ij = ids_json(c->ids, c->T), body[4096];
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 1, \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}", ij);
    free(ij);
    json_t *o;
    long st = tu_http(c->port, "POST", "/v1/completions", body, &o);
    const char *tk = json_string_value(json_array_get(
        json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"), "tokens"), 0));
    char want[32];
    snprintf(want, sizeof want, "token_id:%d", (int)c->want);
    c->ok = st == 200 && tk && !strcmp(tk, want);
    json_decref(o);
    return NULL;
}


/* ---- streaming (server-sent events) ---- */
typedef struct {
    tu_http_buf body;
    char ctype[128];
} sse_reply;

static size_t on_header(char *p, size_t sz, size_t nm, void *u) {
    sse_reply *r = u;
    size_t n = sz * nm;
    if (n > 13 && !strncasecmp(p, "Content-Type:", 13)) {
        size_t k = n - 13 < sizeof r->ctype - 1 ? n - 13 : sizeof r->ctype - 1;
        memcpy(r->ctype, p + 13, k);
        r->ctype[k] = '\0';
    }
    return n;
}

/* POST a streaming request: the status (minus curl's error code when none came); *events: the JSON of every
 * "data:" event before "data: [DONE]" (NULL when the stream does not end with it, or a line is not an event) */
static long sse_post(int port, const char *body, json_t **events, char *ctype, size_t ctn) {
    sse_reply r = {0};
    struct curl_slist *hd;
    CURL *h = tu_http_open(port, "/v1/completions", &r.body, &hd);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    long st = 0;
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    else st = -(long)cc; /* no answer: minus curl's error code */
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    if (ctype) snprintf(ctype, ctn, "%s", r.ctype);
    *events = NULL;
    json_t *ev = json_array();
    int done = 0, bad = 0;
    char *p = r.body.b;
    while (p && *p && !bad) {
        char *e = strstr(p, "\n\n");
        if (!e || strncmp(p, "data: ", 6) || done) {
            bad = 1;
            break;
        }
        *e = '\0';
        if (!strcmp(p + 6, "[DONE]")) done = 1;
        else {
            json_t *o = json_loads(p + 6, JSON_ALLOW_NUL, NULL); /* a token may decode to U+0000 */
            if (!o) bad = 1;
            else json_array_append_new(ev, o);
        }
        p = e + 2;
    }
    if (done && !bad) *events = ev;
    else {
        if (st == 200) fprintf(stderr, "stream not well formed: %s\n", r.body.b ? r.body.b : "(empty)");
        json_decref(ev);
        if (st != 200 && r.body.b) *events = json_loads(r.body.b, 0, NULL); /* a JSON error */
    }
    free(r.body.b);
    return st;
}

/* the tokens ("token_id:N" ids) and token log-probabilities of a non-streaming choice's logprobs, or of every
 * event of a stream for choice `index`, concatenated; text too */
typedef struct {
    int32_t id[512];
    double lp[512];
    int n, finished;
    char text[4096];
} answer;

static void answer_add(answer *a, json_t *choice) {
    json_t *lo = json_object_get(choice, "logprobs"), *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs");
    for (size_t k = 0; k < json_array_size(tk) && a->n < 512; k++) {
        const char *t = json_string_value(json_array_get(tk, k));
        a->id[a->n] = t && !strncmp(t, "token_id:", 9) ? atoi(t + 9) : -1;
        a->lp[a->n++] = json_is_null(json_array_get(tl, k)) ? NAN : json_number_value(json_array_get(tl, k));
    }
    const char *x = json_string_value(json_object_get(choice, "text"));
    size_t L = strlen(a->text);
    snprintf(a->text + L, sizeof a->text - L, "%s", x ? x : "");
    a->finished |= json_is_string(json_object_get(choice, "finish_reason"));
}

static void answer_of_stream(json_t *events, int index, answer *a) {
    memset(a, 0, sizeof *a);
    for (size_t e = 0; e < json_array_size(events); e++) {
        json_t *ch = json_object_get(json_array_get(events, e), "choices");
        for (size_t k = 0; k < json_array_size(ch); k++)
            if (json_integer_value(json_object_get(json_array_get(ch, k), "index")) == index) {
                OK(!a->finished); /* nothing after a choice's last event */
                answer_add(a, json_array_get(ch, k));
            }
    }
}

/* |a - b| over the tokens (tokens must be equal); -1 when they differ */
static double answer_diff(const answer *a, const answer *b) {
    if (a->n != b->n) return -1;
    double w = 0;
    for (int k = 0; k < a->n; k++) {
        if (a->id[k] != b->id[k]) return -1;
        if (isnan(a->lp[k]) != isnan(b->lp[k])) return -1;
        if (!isnan(a->lp[k])) w = fmax(w, fabs(a->lp[k] - b->lp[k]));
    }
    return w;
}

typedef struct {
    int port;
    char body[4096];
    json_t *events;
    long st;
    double t_end;
} stream_client;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *stream_main(void *u) {
    stream_client *c = u;
    c->st = sse_post(c->port, c->body, &c->events, NULL, 0);
    c->t_end = now_s();
    return NULL;
}

/* Another family behind the same adapter: serve dir and compare prompt_logprobs with the log-softmax of
 * that family's own forward (ps_forward, the DeepSeek-V4 forward (v4 1) or the MiniCPM4 forward (v4 2)), computed here. */
static void check_family(const char *dir, int v4) {
    ps_error err = {0};
    ps_serve_opts o;
    ps_serve_defaults(&o);
    o.model_dir = dir;
    o.port = 0;
    ps_server *sv;
    if (ps_serve_start(&o, &sv, &err)) {
        OK(0);
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        return;
    }
    int64_t V, T = 24;
    int32_t ids[24];
    float *lg = NULL;
    if (v4 == 2) { /* MiniCPM4 */
        ps_minicpm_model m;
        memset(&m, 0, sizeof m);
        OK(!ps_minicpm_model_load(&m, dir, &err));
        V = m.cfg.vocab_size;
        tu_random_tokens(ids, T, V, 5);
        ps_minicpm_acts a;
        OK(!ps_minicpm_acts_create(&a, &m, 1, T, &err) && !ps_minicpm_forward(&m, &a, ids, NULL, -1, &err));
        lg = malloc((size_t)(T * V) * sizeof *lg);
        memcpy(lg, a.logits, (size_t)(T * V) * sizeof *lg);
        ps_minicpm_acts_free(&a);
        ps_minicpm_model_free(&m);
    } else if (v4) {
        ps_v4_model m;
        memset(&m, 0, sizeof m);
        OK(!ps_v4_model_load(&m, dir, 0, &err));
        V = m.cfg.vocab_size;
        tu_random_tokens(ids, T, V, 5);
        ps_v4_acts a;
        OK(!ps_v4_acts_create(&a, &m, 1, T, &err) && !ps_v4_forward(&m, &a, ids, NULL, -1, &err));
        const float *h = ps_v4_logits_host(&a, &err);
        lg = malloc((size_t)(T * V) * sizeof *lg);
        memcpy(lg, h, (size_t)(T * V) * sizeof *lg);
        ps_v4_acts_free(&a);
        ps_v4_model_free(&m);
    } else {
        ps_model m;
        memset(&m, 0, sizeof m);
        OK(!ps_model_load(&m, dir, &err));
        V = m.cfg.vocab_size;
        tu_random_tokens(ids, T, V, 5);
        ps_acts a;
        OK(!ps_acts_create(&a, m.ctx, &m.cfg, 1, T, false, &err) && !ps_forward(&m, &a, ids, NULL, &err));
        const float *h = ps_acts_logits_host(&a, &err);
        lg = malloc((size_t)(T * V) * sizeof *lg);
        memcpy(lg, h, (size_t)(T * V) * sizeof *lg);
        ps_acts_free(&a);
        ps_model_free(&m);
    }
    char *ij = ids_json(ids, T), body[4096];
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 1, \"temperature\": 0, \"prompt_logprobs\": 1}", ij);
    free(ij);
    json_t *r;
    OK(tu_http(ps_serve_port(sv), "POST", "/v1/completions", body, &r) == 200);
    json_t *pl = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "prompt_logprobs");
    OK(json_array_size(pl) == (size_t)T);
    double worst = 0;
    for (int64_t t = 1; t < T; t++) {
        const float *x = lg + (t - 1) * V;
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, x[v]);
        for (int64_t v = 0; v < V; v++) sum += exp(x[v] - mx);
        char key[16];
        snprintf(key, sizeof key, "%d", (int)ids[t]);
        json_t *e = json_object_get(json_array_get(pl, (size_t)t), key);
        OK(e != NULL);
        worst = fmax(worst, fabs(json_number_value(json_object_get(e, "logprob")) - (x[ids[t]] - mx - log(sum))));
    }
    printf("%s (%s): prompt_logprobs vs its forward's log-softmax: max |diff| %.3g\n", dir, v4 == 2 ? "MiniCPM4" : v4 ? "DeepSeek-V4" : "Qwen3 layout", worst);
    OK(worst < 1e-4);
    json_decref(r);
    /* a streamed greedy answer adds up to the answer in one piece (this family's own decode path) */
    ij = ids_json(ids, 8);
    char one[4096], str[4200];
    snprintf(one, sizeof one, "{\"prompt\": %s, \"max_tokens\": 3, \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true", ij);
    free(ij);
    snprintf(str, sizeof str, "%s}", one);
    answer A, S;
    memset(&A, 0, sizeof A);
    OK(tu_http(ps_serve_port(sv), "POST", "/v1/completions", str, &r) == 200);
    answer_add(&A, json_array_get(json_object_get(r, "choices"), 0));
    json_decref(r);
    snprintf(str, sizeof str, "%s, \"stream\": true}", one);
    json_t *ev;
    OK(sse_post(ps_serve_port(sv), str, &ev, NULL, 0) == 200 && ev);
    answer_of_stream(ev, 0, &S);
    printf("%s: a streamed answer against the answer in one piece: %d tokens, max |logprob diff| %g\n", dir, S.n, answer_diff(&A, &S));
    OK(A.n == 3 && answer_diff(&A, &S) == 0 && S.finished);
    json_decref(ev);
    free(lg);
    ps_serve_stop(sv);
}

/* serve on a family the caller defines: the toy bigram table in the server's family list */
static void test_toy_family(void) {
    ps_error err = {0};
    char dir[512], path[600];
    tu_tempdir(dir, sizeof dir, "serve_toy");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    OK(f != NULL);
    if (!f) return;
    fputs("{\"model_type\": \"toy_bigram\"}\n", f);
    fclose(f);
    /* a prompt whose greedy continuation is unambiguous for two tokens */
    int last = -1, g1 = -1, g2 = -1;
    OK(!toy_greedy_pair(&last, &g1, &g2));
    ps_serve_opts o;
    ps_serve_defaults(&o);
    o.model_dir = dir;
    o.port = 0;
    o.families = toy_family_list(); /* the list test_toy_family opens it with through ps_api_open_in */
    ps_server *sv;
    if (ps_serve_start(&o, &sv, &err)) {
        CHECK(0, "serve on the toy family: %s", err.msg);
        return;
    }
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\": [3, 5, %d], \"max_tokens\": 2, \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}",
             last);
    json_t *r = NULL;
    long st = tu_http(ps_serve_port(sv), "POST", "/v1/completions", body, &r);
    json_t *lo = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs");
    json_t *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs");
    char w1[32], w2[32];
    snprintf(w1, sizeof w1, "token_id:%d", g1);
    snprintf(w2, sizeof w2, "token_id:%d", g2);
    const char *t1 = json_string_value(json_array_get(tk, 0)), *t2 = json_string_value(json_array_get(tk, 1));
    CHECK(st == 200 && t1 && t2 && !strcmp(t1, w1) && !strcmp(t2, w2), "toy family through serve: greedy tokens %s %s, want %s %s (status %ld)",
          t1 ? t1 : "?", t2 ? t2 : "?", w1, w2, st);
    /* the log-probability of the first: the log-softmax of the table's row `last` */
    double mx = -1e30, z = 0;
    for (int b = 0; b < TOY_V; b++) mx = fmax(mx, toy_weight(last, b));
    for (int b = 0; b < TOY_V; b++) z += exp(toy_weight(last, b) - mx);
    double want = toy_weight(last, g1) - mx - log(z), got = json_real_value(json_array_get(tl, 0));
    CHECK(fabs(got - want) < 1e-5, "toy family through serve: token log-prob %.7f, the table's log-softmax %.7f", got, want);
    json_decref(r);
    ps_serve_stop(sv);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    test_toy_family();
    ps_error err = {0};
    char dir[512];
    tu_tempdir(dir, sizeof dir, "serve");
    ps_config cfg;
    OK(!ps_config_load(PS_SOURCE_DIR "/tests/text/tiny_model.json", &cfg, &err));
    cfg.max_seq_len = 256;
    ps_model m;
    tu_random_model(&m, &cfg, 7, 0.5f);
    OK(!ps_model_save(&m, dir, &err));
    const int64_t V = cfg.vocab_size;

    ps_serve_opts o;
    ps_serve_defaults(&o);
    o.model_dir = dir;
    o.tokenizer = PS_SOURCE_DIR "/tests/text/tiny_tokenizer.json";
    o.port = 0;
    o.max_body = 4096;
    o.max_logprobs = 5;
    o.max_prompt_tokens = 100;
    o.max_connections = 40;
    ps_server *sv;
    if (ps_serve_start(&o, &sv, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int port = ps_serve_port(sv);
    OK(port > 0);
    json_t *r;
    OK(tu_http(port, "GET", "/health", NULL, &r) == 200 && !strcmp(json_string_value(json_object_get(r, "status")), "ok"));
    json_decref(r);
    OK(tu_http(port, "GET", "/v1/models", NULL, &r) == 200);
    const char *nm = json_string_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "id"));
    OK(nm && !strcmp(nm, ps_serve_name(sv)));
    char name[512];
    snprintf(name, sizeof name, "%s", nm ? nm : "");
    json_decref(r);

    /* ---- echo + logprobs and prompt_logprobs against the forward's log-softmax ---- */
    int64_t T = 40;
    int32_t ids[64];
    tu_random_tokens(ids, T, V, 11);
    double *lsm = reference_lsm(&m, ids, T);
    char *ij = ids_json(ids, T), body[8192];
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"prompt\": %s, \"max_tokens\": 2, \"temperature\": 0, \"echo\": true, \"logprobs\": 3, \"prompt_logprobs\": 2}", name, ij);
    long st0 = tu_http(port, "POST", "/v1/completions", body, &r);
    if (st0 != 200) {
        char *t = r ? json_dumps(r, 0) : NULL;
        fprintf(stderr, "status %ld: %s\n", st0, t ? t : "(no JSON)");
        free(t);
    }
    OK(st0 == 200);
    json_t *c0 = json_array_get(json_object_get(r, "choices"), 0), *lo = json_object_get(c0, "logprobs");
    json_t *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs"), *tp = json_object_get(lo, "top_logprobs"),
           *off = json_object_get(lo, "text_offset"), *pl = json_object_get(c0, "prompt_logprobs");
    OK(json_array_size(tk) == (size_t)T + 2 && json_array_size(tl) == (size_t)T + 2 && json_array_size(tp) == (size_t)T + 2);
    OK(json_array_size(off) == (size_t)T + 2 && json_array_size(pl) == (size_t)T);
    OK(json_is_null(json_array_get(tl, 0)) && json_is_null(json_array_get(pl, 0)));
    double worst = 0;
    for (int64_t t = 1; t < T; t++) {
        const double *row = lsm + (t - 1) * V;
        double lp = json_number_value(json_array_get(tl, (size_t)t));
        worst = fmax(worst, fabs(lp - row[ids[t]]));
        /* rank and top-2 (prompt_logprobs: keyed by id) */
        int64_t rank = 1;
        int best = 0;
        for (int64_t v = 0; v < V; v++) {
            rank += row[v] > row[ids[t]];
            if (row[v] > row[best]) best = (int)v;
        }
        json_t *d = json_array_get(pl, (size_t)t);
        char key[16];
        snprintf(key, sizeof key, "%d", (int)ids[t]);
        json_t *e = json_object_get(d, key);
        OK(e && json_integer_value(json_object_get(e, "rank")) == rank);
        OK(fabs(json_number_value(json_object_get(e, "logprob")) - row[ids[t]]) < 1e-4);
        snprintf(key, sizeof key, "%d", best);
        OK(json_object_get(d, key) && fabs(json_number_value(json_object_get(json_object_get(d, key), "logprob")) - row[best]) < 1e-4);
        OK(json_object_size(d) == (rank <= 2 ? 2u : 3u));
        /* top_logprobs: 3 best + the token itself when it is not among them */
        size_t want_n = rank <= 3 ? 3 : 4;
        OK(json_object_size(json_array_get(tp, (size_t)t)) <= want_n);
        /* text_offset: the running length of the token texts */
        int64_t o0 = json_integer_value(json_array_get(off, (size_t)t - 1)), o1 = json_integer_value(json_array_get(off, (size_t)t));
        const char *prev = json_string_value(json_array_get(tk, (size_t)t - 1));
        int64_t chars = 0;
        for (const char *s = prev; *s; s++) chars += ((unsigned char)*s & 0xC0) != 0x80;
        OK(o1 - o0 == chars);
    }
    printf("echo logprobs vs forward log-softmax: max |diff| %.3g over %lld positions\n", worst, (long long)T - 1);
    OK(worst < 1e-4);
    /* the two generated tokens: greedy = argmax of a forward of the extended sequence */
    json_t *text = json_object_get(c0, "text");
    OK(json_is_string(text));
    int32_t ext[66];
    memcpy(ext, ids, (size_t)T * sizeof *ext);
    for (int k = 0; k < 2; k++) {
        double *l2 = reference_lsm(&m, ext, T + k);
        int best = 0;
        for (int64_t v = 1; v < V; v++)
            if (l2[(T + k - 1) * V + v] > l2[(T + k - 1) * V + best]) best = (int)v;
        ext[T + k] = best;
        double lp = json_number_value(json_array_get(tl, (size_t)(T + k)));
        OK(fabs(lp - l2[(T + k - 1) * V + best]) < 1e-4);
        free(l2);
    }
    json_decref(r);
    /* the same prompt with return_tokens_as_token_ids: the generated ids */
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 2, \"temperature\": 0, \"logprobs\": 0, \"return_tokens_as_token_ids\": true}", ij);
    OK(tu_http(port, "POST", "/v1/completions", body, &r) == 200);
    tk = json_object_get(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs"), "tokens");
    char w0[32], w1[32];
    snprintf(w0, sizeof w0, "token_id:%d", (int)ext[T]);
    snprintf(w1, sizeof w1, "token_id:%d", (int)ext[T + 1]);
    OK(json_array_size(tk) == 2 && !strcmp(json_string_value(json_array_get(tk, 0)), w0) &&
          !strcmp(json_string_value(json_array_get(tk, 1)), w1));
    OK(json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens")) == 2);
    json_decref(r);
    free(ij);
    free(lsm);

    /* ---- a string prompt and a list of prompts: the tokenizer's ids, one choice each ---- */
    ps_tokenizer *tok;
    OK(!ps_tokenizer_load(PS_SOURCE_DIR "/tests/text/tiny_tokenizer.json", &tok, &err));
    int32_t *sid;
    size_t sn;
    OK(!ps_tokenize(tok, "def f(x):\n    return x", 22, false, &sid, &sn, &err));
    OK(tu_http(port, "POST", "/v1/completions", "{\"prompt\": [\"def f(x):\\n    return x\", [5, 6, 7]], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}", &r) == 200);
    json_t *ch = json_object_get(r, "choices");
    OK(json_array_size(ch) == 2);
    OK(!strcmp(json_string_value(json_object_get(json_array_get(ch, 0), "text")), "def f(x):\n    return x"));
    OK(json_array_size(json_object_get(json_object_get(json_array_get(ch, 0), "logprobs"), "tokens")) == sn);
    OK(json_integer_value(json_object_get(json_array_get(ch, 1), "index")) == 1);
    OK(json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")) == (json_int_t)sn + 3);
    json_decref(r);
    free(sid);
    ps_tokenizer_free(tok);

    /* ---- bad requests: 4xx JSON naming the field or limit, and the server keeps serving ---- */
    struct {
        const char *method, *path, *body, *needle;
        long status;
    } bad[] = {
        {"POST", "/v1/completions", "{\"prompt\": [1, 2", "not JSON", 400},
        {"POST", "/v1/completions", "[1, 2]", "not a JSON object", 400},
        {"POST", "/v1/completions", "{\"max_tokens\": 1}", "prompt", 400},
        {"POST", "/v1/completions", "{\"prompt\": []}", "prompt", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 99999]}", "prompt[1]", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, -1]}", "prompt[1]", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"logprobs\": 6}", "--max-logprobs", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"prompt_logprobs\": 99}", "--max-logprobs", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": -1}", "max_tokens", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 255}", "context", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"echo\": 3}", "echo", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"n\": 2}", "n:", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"stop\": [\"\\n\"]}", "stop: not served", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"top_p\": 0}", "top_p: expected a number in (0, 1]", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"top_k\": 5}", "top_k: not served", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"stop_token_ids\": [3]}", "stop_token_ids: not served", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"presence_penalty\": 0.5}", "presence_penalty: not served", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"stream\": 3}", "stream", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"stream\": true, \"stream_options\": 5}", "stream_options", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"stream\": true, \"logprobs\": 6}", "--max-logprobs", 400},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"model\": \"other\"}", "not served", 404},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"temperature\": \"hot\"}", "temperature", 400},
        {"GET", "/v1/completions", NULL, "use POST", 405},
        {"POST", "/v1/models", "{}", "use GET", 405},
        {"GET", "/v2/nothing", NULL, "no such endpoint", 404},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long st = tu_http(port, bad[i].method, bad[i].path, bad[i].body, &r);
        if (st != bad[i].status || !is_error(r, bad[i].needle)) fprintf(stderr, "bad request %zu: status %ld\n", i, st);
        OK(st == bad[i].status && is_error(r, bad[i].needle));
        json_decref(r);
    }
    /* too many prompt tokens (limit 100) and an oversized body (limit 4096 bytes) */
    int32_t many[120];
    for (int i = 0; i < 120; i++) many[i] = i % 300;
    ij = ids_json(many, 101);
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 0}", ij);
    free(ij);
    OK(tu_http(port, "POST", "/v1/completions", body, &r) == 400 && is_error(r, "--max-prompt-tokens"));
    json_decref(r);
    char *huge = malloc(10000);
    memset(huge, ' ', 9999);
    memcpy(huge, "{\"prompt\": [1]", 14);
    huge[9998] = '}';
    huge[9999] = '\0';
    OK(tu_http(port, "POST", "/v1/completions", huge, &r) == 413 && is_error(r, "--max-body"));
    json_decref(r);
    free(huge);
    OK(tu_http(port, "GET", "/health", NULL, &r) == 200);
    json_decref(r);
    OK(tu_http(port, "POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"max_tokens\": 1, \"temperature\": 0}", &r) == 200);
    /* the unserved keys at their neutral values (what a client library may send) change nothing */
    json_t *r2 = NULL;
    OK(tu_http(port, "POST", "/v1/completions",
               "{\"prompt\": [1, 2, 3], \"max_tokens\": 1, \"temperature\": 0, \"top_p\": 1, \"stop\": null, \"stop_token_ids\": [], "
               "\"presence_penalty\": 0, \"frequency_penalty\": 0.0, \"logit_bias\": {}, \"top_k\": -1, \"ignore_eos\": false}",
               &r2) == 200);
    OK(r && r2 && json_equal(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "text"),
                             json_object_get(json_array_get(json_object_get(r2, "choices"), 0), "text")));
    json_decref(r2);
    json_decref(r);
    /* sampling (generate's sampler): a seed repeats its tokens; a nucleus of one token is the greedy answer */
    const char *samp = "{\"prompt\": [1, 2, 3], \"max_tokens\": 5, \"temperature\": 1.5, \"top_p\": 0.9, \"seed\": 4, "
                       "\"return_tokens_as_token_ids\": true, \"logprobs\": 0}";
    json_t *sa = NULL, *sb = NULL, *g1 = NULL, *n1 = NULL;
    OK(tu_http(port, "POST", "/v1/completions", samp, &sa) == 200 && tu_http(port, "POST", "/v1/completions", samp, &sb) == 200);
    OK(sa && sb && json_equal(json_object_get(json_array_get(json_object_get(sa, "choices"), 0), "text"),
                              json_object_get(json_array_get(json_object_get(sb, "choices"), 0), "text")));
    OK(tu_http(port, "POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"max_tokens\": 5, \"temperature\": 0}", &g1) == 200);
    OK(tu_http(port, "POST", "/v1/completions",
               "{\"prompt\": [1, 2, 3], \"max_tokens\": 5, \"temperature\": 1.5, \"top_p\": 1e-9, \"seed\": 9}", &n1) == 200);
    OK(g1 && n1 && json_equal(json_object_get(json_array_get(json_object_get(g1, "choices"), 0), "text"),
                              json_object_get(json_array_get(json_object_get(n1, "choices"), 0), "text")));
    json_decref(sa), json_decref(sb), json_decref(g1), json_decref(n1);

    /* ---- 32 concurrent clients, each its own prompt: every answer is its own greedy token ---- */
    enum { NC = 32 };
    client cl[NC];
    int32_t pr[NC][24];
    pthread_t th[NC];
    for (int i = 0; i < NC; i++) {
        int64_t L = 8 + i % 16;
        tu_random_tokens(pr[i], L, V, 100 + (uint64_t)i);
        double *l = reference_lsm(&m, pr[i], L);
        int best = 0;
        for (int64_t v = 1; v < V; v++)
            if (l[(L - 1) * V + v] > l[(L - 1) * V + best]) best = (int)v;
        free(l);
        cl[i] = (client){port, pr[i], L, best, 0};
    }
    for (int i = 0; i < NC; i++) pthread_create(&th[i], NULL, client_main, &cl[i]);
    int good = 0;
    for (int i = 0; i < NC; i++) {
        pthread_join(th[i], NULL);
        good += cl[i].ok;
    }
    printf("32 concurrent clients: %d right answers\n", good);
    OK(good == NC);

    /* ---- streaming: the same tokens, log-probabilities and text as the answer in one piece ---- */
    {
        int32_t sp[2][12];
        tu_random_tokens(sp[0], 12, V, 300);
        tu_random_tokens(sp[1], 12, V, 301);
        char *s0 = ids_json(sp[0], 12), *s1 = ids_json(sp[1], 12), one[4096], str[4200];
        snprintf(one, sizeof one, "{\"prompt\": %s, \"max_tokens\": 6, \"temperature\": 0, \"logprobs\": 2, \"return_tokens_as_token_ids\": true", s0);
        snprintf(str, sizeof str, "%s}", one);
        OK(tu_http(port, "POST", "/v1/completions", str, &r) == 200);
        answer A, S;
        memset(&A, 0, sizeof A);
        answer_add(&A, json_array_get(json_object_get(r, "choices"), 0));
        json_decref(r);
        snprintf(str, sizeof str, "%s, \"stream\": true, \"stream_options\": {\"include_usage\": true}}", one);
        json_t *ev;
        char ct[128];
        OK(sse_post(port, str, &ev, ct, sizeof ct) == 200 && ev);
        OK(strstr(ct, "text/event-stream") != NULL);
        answer_of_stream(ev, 0, &S);
        double d = answer_diff(&A, &S);
        size_t ne = json_array_size(ev);
        printf("stream: %zu events, %d tokens; against the answer in one piece: max |logprob diff| %g, text \"%s\" vs \"%s\"\n", ne, S.n, d,
               S.text, A.text);
        OK(A.n == 6 && d == 0 && S.finished && !strcmp(A.text, S.text));
        /* 1 to 6 token events (a slow reader gets several steps in one), then the usage; one id, the chunk object */
        OK(ne >= 2 && ne <= 7);
        json_t *last = json_array_get(ev, ne - 1);
        OK(json_array_size(json_object_get(last, "choices")) == 0);
        OK(json_integer_value(json_object_get(json_object_get(last, "usage"), "completion_tokens")) == 6);
        OK(json_integer_value(json_object_get(json_object_get(last, "usage"), "prompt_tokens")) == 12);
        for (size_t e = 0; e < ne; e++) {
            json_t *o = json_array_get(ev, e);
            OK(!strcmp(json_string_value(json_object_get(o, "object")), "text_completion"));
            OK(!strcmp(json_string_value(json_object_get(o, "id")), json_string_value(json_object_get(json_array_get(ev, 0), "id"))));
        }
        json_decref(ev);
        /* two prompts, echo and prompt_logprobs: each choice's events add up to its choice in one piece, the
         * first carries the echoed prompt and its prompt_logprobs */
        snprintf(one, sizeof one, "{\"prompt\": [%s, %s], \"max_tokens\": 3, \"echo\": true, \"logprobs\": 1, \"prompt_logprobs\": 1, \"return_tokens_as_token_ids\": true", s0, s1);
        snprintf(str, sizeof str, "%s}", one);
        OK(tu_http(port, "POST", "/v1/completions", str, &r) == 200);
        snprintf(str, sizeof str, "%s, \"stream\": true}", one);
        OK(sse_post(port, str, &ev, NULL, 0) == 200 && ev);
        for (int c = 0; c < 2; c++) {
            json_t *ch = json_array_get(json_object_get(r, "choices"), (size_t)c);
            memset(&A, 0, sizeof A);
            answer_add(&A, ch);
            answer_of_stream(ev, c, &S);
            OK(A.n == 15 && answer_diff(&A, &S) == 0 && S.finished && !strcmp(A.text, S.text));
            json_t *first = NULL;
            for (size_t e = 0; e < json_array_size(ev) && !first; e++) {
                json_t *x = json_array_get(json_object_get(json_array_get(ev, e), "choices"), 0);
                if (json_integer_value(json_object_get(x, "index")) == c) first = x;
            }
            json_t *pa = json_object_get(first, "prompt_logprobs"), *pb = json_object_get(ch, "prompt_logprobs");
            OK(json_array_size(pa) == 12 && json_equal(pa, pb));
        }
        json_decref(r);
        json_decref(ev);
        free(s0);
        free(s1);
    }

    /* ---- continuous batching: a request that joins a running batch between two steps (and leaves it before
     * the others end) gets the answer it gets alone: the same tokens, log-probabilities within float rounding
     * (the batched append's matrix products have another row count) ---- */
    {
        enum { NL = 8 };
        int32_t lp[NL][8], rp[10];
        stream_client lc[NL];
        pthread_t lt[NL];
        char one[4096];
        for (int i = 0; i < NL; i++) {
            tu_random_tokens(lp[i], 8, V, 400 + (uint64_t)i);
            char *j = ids_json(lp[i], 8);
            lc[i] = (stream_client){.port = port};
            snprintf(lc[i].body, sizeof lc[i].body,
                     "{\"prompt\": %s, \"max_tokens\": 240, \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true, \"stream\": true}", j);
            free(j);
        }
        tu_random_tokens(rp, 10, V, 500);
        char *j = ids_json(rp, 10);
        snprintf(one, sizeof one, "{\"prompt\": %s, \"max_tokens\": 6, \"temperature\": 0, \"logprobs\": 3, \"return_tokens_as_token_ids\": true}", j);
        free(j);
        answer alone, beside, la, lb;
        memset(&alone, 0, sizeof alone);
        memset(&beside, 0, sizeof beside);
        OK(tu_http(port, "POST", "/v1/completions", one, &r) == 200);
        answer_add(&alone, json_array_get(json_object_get(r, "choices"), 0));
        json_decref(r);
        for (int i = 0; i < NL; i++) pthread_create(&lt[i], NULL, stream_main, &lc[i]);
        /* the long answers run (GET /health counts the running sequences), then the short request comes
         * (whether it overlaps them is up to the scheduler, so it is printed, not checked: on an idle machine
         * the long ones have 200-odd steps to go when it joins) */
        int64_t running = 0;
        for (int tries = 0; tries < 2000 && running < NL; tries++) {
            OK(tu_http(port, "GET", "/health", NULL, &r) == 200);
            running = json_integer_value(json_object_get(r, "running"));
            json_decref(r);
        }
        OK(tu_http(port, "POST", "/v1/completions", one, &r) == 200);
        double t_r = now_s();
        answer_add(&beside, json_array_get(json_object_get(r, "choices"), 0));
        json_decref(r);
        int later = 0;
        for (int i = 0; i < NL; i++) {
            pthread_join(lt[i], NULL);
            OK(lc[i].st == 200 && lc[i].events);
            later += lc[i].t_end > t_r;
        }
        double d = answer_diff(&alone, &beside);
        printf("continuous batching: a 6-token request sent while %lld sequences ran, beside %d 240-token streams (%d of them ended "
               "after it): same tokens %s, max |logprob diff| %g (%s)\n", (long long)running, NL, later, d >= 0 ? "yes" : "NO", d,
               d == 0 ? "bit for bit" : "float rounding");
        OK(alone.n == 6 && d >= 0 && d < 1e-5);
        /* a long answer beside the others (and the short one joining and leaving) equals it alone */
        char body0[4096];
        snprintf(body0, sizeof body0, "%s", lc[0].body);
        char *sfx = strstr(body0, ", \"stream\": true}");
        strcpy(sfx, "}");
        OK(tu_http(port, "POST", "/v1/completions", body0, &r) == 200);
        memset(&la, 0, sizeof la);
        answer_add(&la, json_array_get(json_object_get(r, "choices"), 0));
        json_decref(r);
        answer_of_stream(lc[0].events, 0, &lb);
        d = answer_diff(&la, &lb);
        printf("continuous batching: a 240-token stream beside 7 others and a joining request vs alone: same tokens %s, max |logprob diff| %g\n",
               d >= 0 ? "yes" : "NO", d);
        OK(la.n == 240 && d >= 0 && d < 1e-5);
        for (int i = 0; i < NL; i++) json_decref(lc[i].events);
    }

    /* ---- the connection limit: 40 idle connections open, the next request is refused with 429 ---- */
    int socks[41];
    for (int i = 0; i < 41; i++) {
        socks[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        OK(connect(socks[i], (struct sockaddr *)&sa, sizeof sa) == 0);
    }
    long st = 0;
    r = NULL;
    for (int tries = 0; tries < 50 && st != 429; tries++) { /* the server counts a connection once it accepted it */
        usleep(100000);
        json_decref(r);
        st = tu_http(port, "GET", "/health", NULL, &r);
    }
    OK(st == 429 && is_error(r, "--max-connections"));
    json_decref(r);
    for (int i = 0; i < 41; i++) close(socks[i]);
    st = 0;
    for (int tries = 0; tries < 50 && st != 200; tries++) {
        usleep(100000);
        st = tu_http(port, "GET", "/health", NULL, NULL);
    }
    OK(st == 200);

    /* ---- stopping while streams run: each ends — whole, or with an error event (503) before data: [DONE]
     * (the JSON error, 503, when it had not started; cut off only when it had not reached the server) — and
     * none hangs ---- */
    {
        stream_client sc[2];
        pthread_t stt[2];
        for (int i = 0; i < 2; i++) {
            int32_t p8[8];
            tu_random_tokens(p8, 8, V, 600 + (uint64_t)i);
            char *j = ids_json(p8, 8);
            sc[i] = (stream_client){.port = port};
            snprintf(sc[i].body, sizeof sc[i].body, "{\"prompt\": %s, \"max_tokens\": 240, \"stream\": true}", j);
            free(j);
            pthread_create(&stt[i], NULL, stream_main, &sc[i]);
        }
        int64_t running = 0;
        for (int tries = 0; tries < 20000 && running < 2; tries++) {
            OK(tu_http(port, "GET", "/health", NULL, &r) == 200);
            running = json_integer_value(json_object_get(r, "running"));
            json_decref(r);
        }
        ps_serve_stop(sv);
        int whole = 0, stopped = 0, cut = 0;
        for (int i = 0; i < 2; i++) {
            pthread_join(stt[i], NULL);
            json_t *last = json_array_get(sc[i].events, json_array_size(sc[i].events) - 1);
            json_t *fr = json_object_get(json_array_get(json_object_get(last, "choices"), 0), "finish_reason");
            if (sc[i].st == 503) { /* stopped before its first step: the JSON error */
                OK(is_error(sc[i].events, "shutting down"));
                stopped++;
            } else if (!sc[i].events) { /* the connection closed by the daemon's stop, never a wait until curl's timeout */
                OK(sc[i].st != -(long)CURLE_OPERATION_TIMEDOUT);
                cut++;
            }
            else if (json_is_string(fr) && !strcmp(json_string_value(fr), "length")) whole++;
            else {
                OK(json_integer_value(json_object_get(json_object_get(last, "error"), "code")) == 503);
                stopped++;
            }
            json_decref(sc[i].events);
        }
        OK(running < 2 || cut == 0); /* both had begun: both end with their 503 event (or whole), none cut off */
        printf("stopping with %lld streams running: %d whole, %d ended by a 503 (an error event, or the JSON error before the first "
               "step), %d cut off\n", (long long)running, whole, stopped, cut);
    }
    ps_model_free(&m);

    /* the other families: a Hugging Face Qwen3 checkpoint and a DeepSeek-V4 checkpoint (conformance vectors) */
    char fd[4200];
    snprintf(fd, sizeof fd, "%s/qwen3_published", tu_conformance_dir());
    check_family(fd, 0);
    snprintf(fd, sizeof fd, "%s/v4/hub3", tu_conformance_dir());
    check_family(fd, 1);
    snprintf(fd, sizeof fd, "%s/infllm/tiny", tu_conformance_dir()); /* MiniCPM4: every prompt row through its cache */
    check_family(fd, 2);
    curl_global_cleanup();
    CHECK_DONE();
}
