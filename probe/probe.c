/* probe.c — phase sweeps of a served model over the OpenAI completions API (probe.h). */
#define _POSIX_C_SOURCE 200809L
#include "probe/probe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "interventions/units.h"

const char *ps_probe_scoring_name(ps_probe_scoring s) {
    static const char *const N[] = {"auto", "prompt-logprobs", "echo", "greedy"};
    return s >= 0 && s <= PS_PROBE_GREEDY ? N[s] : "?";
}

void ps_probe_clean_url(const char *url, char *out, size_t n) {
    const char *sch = strstr(url, "://"), *at = NULL;
    if (sch) {
        const char *host = sch + 3, *slash = strchr(host, '/');
        for (const char *c = host; *c && (!slash || c < slash); c++)
            if (*c == '@') at = c;
        if (at) {
            snprintf(out, n, "%.*s%s", (int)(host - url), url, at + 1);
            return;
        }
    }
    snprintf(out, n, "%s", url);
}

/* ---- JSON helpers ---- */

static const char *body_excerpt(const char *b, char *buf, size_t n) {
    size_t k = 0;
    for (const char *c = b ? b : ""; *c && k + 4 < n; c++) buf[k++] = (*c == '\n' || *c == '\r') ? ' ' : *c;
    if (b && strlen(b) > k) {
        buf[k++] = '.';
        buf[k++] = '.';
        buf[k++] = '.';
    }
    buf[k] = '\0';
    return buf;
}

int ps_probe_resolve_model(ps_probe *p, ps_error *err) {
    if (p->model[0]) return 0;
    ps_http_reply r;
    if (ps_http_request(&p->http, "GET", "/v1/models", NULL, &r, err)) return -1;
    char ex[200];
    int rc = 0;
    json_t *root = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    json_t *m0 = json_array_get(json_object_get(root, "data"), 0);
    const char *id = json_string_value(json_object_get(m0, "id"));
    if (r.status != 200)
        rc = ps_fail(err, "GET %s/v1/models: HTTP %ld: %s (give the model with --api-model)", p->endpoint, r.status,
                     body_excerpt(r.body, ex, sizeof ex));
    else if (!id)
        rc = ps_fail(err, "GET %s/v1/models: no model listed (expected {\"data\": [{\"id\": ...}]}; give one with --api-model): %s",
                     p->endpoint, body_excerpt(r.body, ex, sizeof ex));
    else
        snprintf(p->model, sizeof p->model, "%s", id);
    json_decref(root);
    ps_http_reply_free(&r);
    return rc;
}

/* ---- the generic engine: jobs (sequences with scored spans) -> requests -> outcomes ---- */

typedef int (*build_fn)(void *ctx, int64_t job, ps_ids *ids, ps_probe_span *spans, ps_error *err);
typedef void (*describe_fn)(void *ctx, int64_t job, char *out, size_t n);

typedef struct {
    ps_probe *p;
    int64_t n_jobs, n_spans, rs, n_req; /* rs: requests per job (n_spans when greedy, else 1) */
    build_fn build;
    describe_fn describe;
    void *ctx;
    ps_probe_out *outs;  /* [n_jobs × n_spans] */
    unsigned char *have; /* [n_req] */
    ps_probe_scoring scoring;
    FILE *journal;
    int64_t done;
    ps_ids ids;          /* the current request's ids (make and done run on one thread, one at a time each) */
    ps_probe_span *spans;
    /* optional, from the caller's own pass over the prompts: every job's length and spans ([n_jobs],
     * [n_jobs × n_spans]), so the cost needs no second build of every prompt */
    const int64_t *job_len;
    const ps_probe_span *job_spans;
} engine;

static void req_what(int64_t r, void *user, char *out, size_t n) {
    engine *e = user;
    char d[200];
    e->describe(e->ctx, r / e->rs, d, sizeof d);
    if (e->rs > 1)
        snprintf(out, n, "request %lld (%s, answer %lld)", (long long)r, d, (long long)(r % e->rs));
    else
        snprintf(out, n, "request %lld (%s)", (long long)r, d);
}

/* The ids a request sends, and its spans, into e->ids / e->spans: the job's sequence (greedy: cut before
 * the span's answer). *first, *count: the spans this request scores. */
static int req_build(engine *e, int64_t r, int64_t *first, int64_t *count, int64_t *n_send, ps_error *err) {
    int64_t job = r / e->rs;
    if (e->build(e->ctx, job, &e->ids, e->spans, err)) return -1;
    if (e->scoring == PS_PROBE_GREEDY) {
        *first = r % e->rs;
        *count = 1;
        *n_send = e->spans[*first].src;
    } else {
        *first = 0;
        *count = e->n_spans;
        *n_send = e->ids.n;
    }
    return 0;
}

static int append_ids(char **buf, size_t *len, size_t *cap, const int32_t *v, int64_t n) {
    size_t need = *len + (size_t)n * 12 + 64;
    if (need > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < need) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b;
        *cap = c;
    }
    char *o = *buf + *len;
    *o++ = '[';
    for (int64_t i = 0; i < n; i++) o += sprintf(o, i ? ",%d" : "%d", (int)v[i]);
    *o++ = ']';
    *o = '\0';
    *len = (size_t)(o - *buf);
    return 0;
}

/* The body of a completions request for ids[0..n) under scoring s (AUTO: ask for both log-probability forms). */
static char *make_body(const ps_probe *p, ps_probe_scoring s, const int32_t *ids, int64_t n, int64_t gen, ps_error *err) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(p->model));
    json_object_set_new(o, "prompt", json_string("@IDS@"));
    json_object_set_new(o, "max_tokens", json_integer(s == PS_PROBE_GREEDY ? gen : p->max_tokens));
    json_object_set_new(o, "temperature", json_integer(0));
    if (s == PS_PROBE_ECHO || s == PS_PROBE_AUTO) json_object_set_new(o, "echo", json_true());
    json_object_set_new(o, "logprobs", json_integer(1));
    if (s == PS_PROBE_PROMPT_LOGPROBS || s == PS_PROBE_AUTO) json_object_set_new(o, "prompt_logprobs", json_integer(1));
    json_object_set_new(o, "return_tokens_as_token_ids", json_true());
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    char *at = t ? strstr(t, "\"@IDS@\"") : NULL;
    if (!at) {
        free(t);
        ps_fail(err, "out of memory for a request body");
        return NULL;
    }
    size_t len = (size_t)(at - t), cap = 0;
    char *buf = NULL;
    if (!(buf = malloc(len + 1))) {
        free(t);
        ps_fail(err, "out of memory for a request body");
        return NULL;
    }
    memcpy(buf, t, len);
    buf[len] = '\0';
    cap = len + 1;
    int bad = append_ids(&buf, &len, &cap, ids, n);
    const char *rest = at + 7;
    size_t rl = strlen(rest);
    if (!bad && len + rl + 1 > cap) {
        char *b = realloc(buf, len + rl + 1);
        if (!b) bad = 1;
        else buf = b;
    }
    if (bad) {
        free(buf);
        free(t);
        ps_fail(err, "out of memory for a request body of %lld ids", (long long)n);
        return NULL;
    }
    memcpy(buf + len, rest, rl + 1);
    free(t);
    return buf;
}

static char *req_make(int64_t r, void *user, ps_error *err) {
    engine *e = user;
    int64_t first, count, n_send;
    if (req_build(e, r, &first, &count, &n_send, err)) return NULL;
    return make_body(e->p, e->scoring, e->ids.v, n_send, e->spans[first].len, err);
}

/* "token_id:123" -> 123 (1), else 0 */
static int token_id_form(const char *s, int32_t *id) {
    if (!s || strncmp(s, "token_id:", 9)) return 0;
    char *end;
    long v = strtol(s + 9, &end, 10);
    if (end == s + 9 || *end || v < 0 || v > INT32_MAX) return 0;
    *id = (int32_t)v;
    return 1;
}

/* the id a token string names: "token_id:N", else the one id it tokenizes to, else -1 */
static int32_t string_id(const ps_probe *p, const char *s) {
    int32_t id;
    if (token_id_form(s, &id)) return id;
    if (!p->tok || !s) return -1;
    if ((id = ps_tokenizer_token_to_id(p->tok, s, strlen(s))) >= 0) return id; /* the stored form ("Ġthe") */
    int32_t *ids = NULL;
    size_t n = 0;
    ps_error e = {0};
    if (ps_tokenize(p->tok, s, strlen(s), false, &ids, &n, &e)) return -1;
    id = n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}

/* Does the echoed token string stand for id? 1 yes, 0 no, -1 cannot tell (no ids, and the id's text is
 * not a whole character). Servers write a token as "token_id:N" (vLLM's return_tokens_as_token_ids), as
 * its decoded text, or as the string the tokenizer stores (older vLLM: "Ġthe"); each is accepted. */
static int token_matches(const ps_probe *p, const char *s, int32_t id) {
    int32_t got;
    if (token_id_form(s, &got)) return got == id;
    if (!p->tok) return -1;
    size_t sl = 0;
    const char *stored = ps_tokenizer_id_to_token(p->tok, id, &sl);
    if (stored && sl == strlen(s) && !memcmp(stored, s, sl)) return 1;
    char *txt = NULL;
    size_t n = 0;
    ps_error e = {0};
    if (ps_detokenize(p->tok, &id, 1, false, &txt, &n, &e)) return -1;
    int r = strstr(txt, "\xEF\xBF\xBD") ? -1 : !strcmp(txt, s);
    free(txt);
    return r;
}

#define BAD(...) (ps_fail(err, __VA_ARGS__), ps_fail_prefix(err, "%s: ", what))

/* the largest value of a top-logprobs object (numbers, or {"logprob": x} objects); its key into *key */
static int top_max(json_t *top, double *mx, const char **key, int64_t *count) {
    const char *k;
    json_t *v;
    *mx = -INFINITY;
    *key = NULL;
    *count = 0;
    json_object_foreach(top, k, v) {
        json_t *lv = json_is_object(v) ? json_object_get(v, "logprob") : v;
        if (!json_is_number(lv)) return -1;
        double x = json_number_value(lv);
        if (x > *mx || !*key) {
            *mx = x;
            *key = k;
        }
        (*count)++;
    }
    return 0;
}

/* Read the reply of a request scored by echo or prompt-logprobs into outs[first .. first + count). */
static int parse_scored(const ps_probe *p, ps_probe_scoring s, json_t *c0, const int32_t *ids, int64_t n, const ps_probe_span *sp,
                        int64_t count, ps_probe_out *out, const char *what, ps_error *err) {
    int64_t most = 2; /* "logprobs": 1 asks for the top one; servers add the sent token when it is not it */
    if (s == PS_PROBE_PROMPT_LOGPROBS) {
        json_t *pl = json_object_get(c0, "prompt_logprobs");
        if (!json_is_array(pl)) return BAD("the reply has no choices[0].prompt_logprobs list");
        if ((int64_t)json_array_size(pl) != n)
            return BAD("choices[0].prompt_logprobs has %lld entries for a prompt of %lld tokens", (long long)json_array_size(pl),
                       (long long)n);
        for (int64_t k = 0; k < count; k++) {
            out[k].ok = 1;
            out[k].lp = 0;
            out[k].top = -1;
            for (int64_t t = sp[k].src; t < sp[k].src + sp[k].len; t++) {
                json_t *d = json_array_get(pl, (size_t)t);
                char key[24];
                snprintf(key, sizeof key, "%d", (int)ids[t]);
                double mx;
                const char *mk;
                int64_t cnt;
                if (!json_is_object(d) || top_max(d, &mx, &mk, &cnt))
                    return BAD("choices[0].prompt_logprobs[%lld] is not an object of log-probabilities", (long long)t);
                if (cnt < 1 || cnt > most)
                    return BAD("choices[0].prompt_logprobs[%lld] has %lld log-probabilities (asked for 1, at most %lld with the sent token)",
                               (long long)t, (long long)cnt, (long long)most);
                json_t *e = json_object_get(d, key);
                if (!e) return BAD("choices[0].prompt_logprobs[%lld] lacks the sent token %d (a token the request did not send?)", (long long)t, (int)ids[t]);
                json_t *lv = json_is_object(e) ? json_object_get(e, "logprob") : e, *rk = json_object_get(e, "rank");
                double lp = json_number_value(lv);
                out[k].lp += lp;
                int top1 = json_is_integer(rk) ? json_integer_value(rk) == 1 : lp >= mx;
                if (!top1) out[k].ok = 0;
                if (t == sp[k].src) out[k].top = top1 ? ids[t] : (int32_t)strtol(mk, NULL, 10);
            }
        }
        return 0;
    }
    json_t *lo = json_object_get(c0, "logprobs"), *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs"),
           *tp = json_object_get(lo, "top_logprobs");
    if (!json_is_array(tk) || !json_is_array(tl) || !json_is_array(tp))
        return BAD("the reply has no choices[0].logprobs with tokens, token_logprobs and top_logprobs (echo with logprobs)");
    int64_t L = (int64_t)json_array_size(tk);
    if ((int64_t)json_array_size(tl) != L || (int64_t)json_array_size(tp) != L)
        return BAD("choices[0].logprobs: %lld tokens, %lld token_logprobs, %lld top_logprobs (a wrong number of log-probabilities)",
                   (long long)L, (long long)json_array_size(tl), (long long)json_array_size(tp));
    if (L < n || L > n + p->max_tokens)
        return BAD("choices[0].logprobs has %lld tokens for an echoed prompt of %lld and max_tokens %d", (long long)L, (long long)n,
                   p->max_tokens);
    for (int64_t t = 0; t < n; t++) {
        const char *ts = json_string_value(json_array_get(tk, (size_t)t));
        if (!ts) return BAD("choices[0].logprobs.tokens[%lld] is not a string", (long long)t);
        if (token_matches(p, ts, ids[t]) == 0)
            return BAD("choices[0].logprobs.tokens[%lld] is \"%.40s\", but the request sent token %d there", (long long)t, ts, (int)ids[t]);
    }
    for (int64_t k = 0; k < count; k++) {
        out[k].ok = 1;
        out[k].lp = 0;
        out[k].top = -1;
        for (int64_t t = sp[k].src; t < sp[k].src + sp[k].len; t++) {
            json_t *lv = json_array_get(tl, (size_t)t), *d = json_array_get(tp, (size_t)t);
            double mx;
            const char *mk;
            int64_t cnt;
            if (!json_is_number(lv)) return BAD("choices[0].logprobs.token_logprobs[%lld] is not a number", (long long)t);
            if (!json_is_object(d) || top_max(d, &mx, &mk, &cnt))
                return BAD("choices[0].logprobs.top_logprobs[%lld] is not an object of log-probabilities", (long long)t);
            if (cnt < 1 || cnt > most)
                return BAD("choices[0].logprobs.top_logprobs[%lld] has %lld log-probabilities (asked for 1, at most %lld with the sent token)",
                           (long long)t, (long long)cnt, (long long)most);
            double lp = json_number_value(lv);
            out[k].lp += lp;
            int top1 = lp >= mx;
            if (!top1) out[k].ok = 0;
            if (t == sp[k].src) out[k].top = top1 ? ids[t] : string_id(p, mk);
        }
    }
    return 0;
}

/* greedy: the continuation against the answer ids[src .. src + len) */
static int parse_greedy(const ps_probe *p, json_t *c0, const int32_t *ans, int64_t len, ps_probe_out *out, const char *what,
                        ps_error *err) {
    json_t *lo = json_object_get(c0, "logprobs"), *tk = json_object_get(lo, "tokens"), *tl = json_object_get(lo, "token_logprobs");
    const char *text = json_string_value(json_object_get(c0, "text"));
    if (!text) return BAD("the reply has no choices[0].text");
    out->top = -1;
    out->lp = NAN;
    int32_t id;
    if (json_is_array(tk) && json_array_size(tk) > 0 && token_id_form(json_string_value(json_array_get(tk, 0)), &id)) {
        int64_t L = (int64_t)json_array_size(tk);
        if (L > len) return BAD("%lld tokens generated with max_tokens %lld", (long long)L, (long long)len);
        int ok = L == len;
        double lp = 0;
        for (int64_t k = 0; k < L; k++) {
            if (!token_id_form(json_string_value(json_array_get(tk, (size_t)k)), &id))
                return BAD("choices[0].logprobs.tokens[%lld] is not of the form token_id:N", (long long)k);
            if (k == 0) out->top = id;
            if (id != ans[k]) ok = 0;
            json_t *lv = json_array_get(tl, (size_t)k);
            lp = json_is_number(lv) ? lp + json_number_value(lv) : NAN;
        }
        out->ok = ok;
        if (ok) out->lp = lp;
        return 0;
    }
    /* text only: compare with the answer's text */
    char *want = NULL;
    size_t wn = 0;
    if (!p->tok) return BAD("the reply gives the continuation as text and no tokenizer is loaded to compare it");
    if (ps_detokenize(p->tok, ans, (size_t)len, false, &want, &wn, err)) return -1;
    out->ok = !strcmp(text, want);
    free(want);
    if (out->ok && json_is_array(tl) && (int64_t)json_array_size(tl) == len) {
        double lp = 0;
        for (int64_t k = 0; k < len; k++) {
            json_t *lv = json_array_get(tl, (size_t)k);
            lp = json_is_number(lv) ? lp + json_number_value(lv) : NAN;
        }
        out->lp = lp;
    }
    return 0;
}

static void journal_line(engine *e, int64_t r, int64_t first, int64_t count) {
    if (!e->journal) return;
    char line[4096];
    size_t k = 0;
    const ps_probe_out *o = &e->outs[(r / e->rs) * e->n_spans + first];
    k += (size_t)snprintf(line + k, sizeof line - k, "{\"r\":%lld,\"ok\":[", (long long)r);
    for (int64_t s = 0; s < count && k < sizeof line; s++) k += (size_t)snprintf(line + k, sizeof line - k, s ? ",%d" : "%d", o[s].ok);
    k += (size_t)snprintf(line + k, k < sizeof line ? sizeof line - k : 0, "],\"lp\":[");
    for (int64_t s = 0; s < count && k < sizeof line; s++) {
        if (isnan(o[s].lp)) k += (size_t)snprintf(line + k, sizeof line - k, s ? ",null" : "null");
        else k += (size_t)snprintf(line + k, sizeof line - k, s ? ",%.17g" : "%.17g", o[s].lp);
    }
    k += (size_t)snprintf(line + k, k < sizeof line ? sizeof line - k : 0, "],\"top\":[");
    for (int64_t s = 0; s < count && k < sizeof line; s++) k += (size_t)snprintf(line + k, sizeof line - k, s ? ",%d" : "%d", (int)o[s].top);
    k += (size_t)snprintf(line + k, k < sizeof line ? sizeof line - k : 0, "]}\n");
    if (k < sizeof line) {
        fwrite(line, 1, k, e->journal);
        fflush(e->journal);
    }
}

/* parse a reply for request r (its ids rebuilt) into the outcomes */
static int req_parse(engine *e, int64_t r, const ps_http_reply *rep, ps_probe_scoring s, ps_error *err) {
    char what[300], ex[300];
    req_what(r, e, what, sizeof what);
    int64_t first, count, n_send;
    ps_probe_scoring keep = e->scoring;
    e->scoring = s;
    int rb = req_build(e, r, &first, &count, &n_send, err);
    e->scoring = keep;
    if (rb) return -1;
    if (rep->status != 200)
        return ps_fail(err, "%s: HTTP %ld%s: %s", what, rep->status, rep->attempts > 1 ? " (after retries)" : "",
                       body_excerpt(rep->body, ex, sizeof ex));
    json_error_t je;
    json_t *root = json_loads(rep->body, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return ps_fail(err, "%s: the reply is not a JSON object (%s): %s", what, je.text, body_excerpt(rep->body, ex, sizeof ex));
    }
    json_t *ch = json_object_get(root, "choices"), *c0 = json_array_get(ch, 0);
    int rc = 0;
    ps_probe_out *o = &e->outs[(r / e->rs) * e->n_spans + first];
    if (!json_is_object(c0))
        rc = ps_fail(err, "%s: the reply has no choices[0]: %s", what, body_excerpt(rep->body, ex, sizeof ex));
    else if (json_array_size(ch) != 1)
        rc = ps_fail(err, "%s: the reply has %zu choices for one prompt", what, json_array_size(ch));
    else if (s == PS_PROBE_GREEDY)
        rc = parse_greedy(e->p, c0, e->ids.v + e->spans[first].src, e->spans[first].len, o, what, err);
    else
        rc = parse_scored(e->p, s, c0, e->ids.v, n_send, e->spans + first, count, o, what, err);
    json_decref(root);
    return rc;
}

static int req_done(int64_t r, const ps_http_reply *rep, void *user, ps_error *err) {
    engine *e = user;
    if (req_parse(e, r, rep, e->scoring, err)) return -1;
    e->have[r] = 1;
    e->done++;
    journal_line(e, r, e->scoring == PS_PROBE_GREEDY ? r % e->rs : 0, e->scoring == PS_PROBE_GREEDY ? 1 : e->n_spans);
    if (e->p->progress && e->p->progress(e->done, e->n_req, e->p->user))
        return ps_fail(err, "cancelled after %lld of %lld requests (the journal keeps them: run again to resume)",
                       (long long)e->done, (long long)e->n_req);
    return 0;
}

/* The first request asks for both forms; the reply says which the server gives. */
static int detect_scoring(engine *e, int64_t r, ps_error *err) {
    int64_t first, count, n_send;
    e->scoring = PS_PROBE_AUTO;
    if (req_build(e, r, &first, &count, &n_send, err)) return -1;
    char *body = make_body(e->p, PS_PROBE_AUTO, e->ids.v, n_send, 0, err);
    if (!body) return -1;
    ps_http_reply rep;
    int rc = ps_http_request(&e->p->http, "POST", "/v1/completions", body, &rep, err);
    free(body);
    if (rc) return -1;
    ps_probe_scoring s = PS_PROBE_GREEDY;
    if (rep.status == 200) {
        json_t *root = json_loads(rep.body, 0, NULL), *c0 = json_array_get(json_object_get(root, "choices"), 0);
        json_t *tk = json_object_get(json_object_get(c0, "logprobs"), "tokens");
        if (json_is_array(json_object_get(c0, "prompt_logprobs"))) s = PS_PROBE_PROMPT_LOGPROBS;
        else if (json_is_array(tk) && (int64_t)json_array_size(tk) >= n_send) s = PS_PROBE_ECHO;
        json_decref(root);
    } else if (rep.status >= 400 && rep.status < 500) { /* both at once refused: echo alone? */
        ps_http_reply_free(&rep);
        e->scoring = PS_PROBE_ECHO;
        body = make_body(e->p, PS_PROBE_ECHO, e->ids.v, n_send, 0, err);
        e->scoring = PS_PROBE_AUTO;
        if (!body || ps_http_request(&e->p->http, "POST", "/v1/completions", body, &rep, err)) {
            free(body);
            return -1;
        }
        free(body);
        json_t *root = rep.status == 200 ? json_loads(rep.body, 0, NULL) : NULL;
        json_t *tk = json_object_get(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "logprobs"), "tokens");
        if (json_is_array(tk) && (int64_t)json_array_size(tk) >= n_send) s = PS_PROBE_ECHO;
        json_decref(root);
    } else {
        char what[300], ex[300];
        req_what(r, e, what, sizeof what);
        rc = ps_fail(err, "%s (finding what the server scores): HTTP %ld: %s", what, rep.status, body_excerpt(rep.body, ex, sizeof ex));
    }
    ps_http_reply_free(&rep);
    e->scoring = s;
    return rc;
}

/* ---- the journal ---- */

static int journal_open(engine *e, const char *path, json_t *plan, ps_error *err) {
    FILE *f = fopen(path, "r");
    if (!f && errno != ENOENT) return ps_fail(err, "%s: cannot read the journal: %s", path, strerror(errno));
    long good = 0;
    int fresh = 1;
    if (f) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        int64_t ln = 0;
        int rc = 0;
        while ((len = getline(&line, &cap, f)) > 0 && !rc) {
            ln++;
            int complete = line[len - 1] == '\n';
            json_t *o = complete ? json_loads(line, 0, NULL) : NULL;
            if (!o) {
                if (!complete) break; /* a line cut by a kill: dropped, and rewritten */
                rc = ps_fail(err, "%s: line %lld is not JSON (delete the journal to start over)", path, (long long)ln);
                break;
            }
            if (ln == 1) {
                json_t *pl = json_object_get(o, "plan");
                const char *sc = json_string_value(json_object_get(o, "scoring"));
                if (!json_is_integer(json_object_get(o, "probe_journal")) || !pl || !sc)
                    rc = ps_fail(err, "%s: not a probe journal (delete it or use another --out)", path);
                else if (!json_equal(pl, plan))
                    rc = ps_fail(err, "%s: the journal of another run (its plan differs: endpoint, model or prompts); use another --out or delete it", path);
                else {
                    ps_probe_scoring s = PS_PROBE_AUTO;
                    for (int k = 1; k <= PS_PROBE_GREEDY; k++)
                        if (!strcmp(sc, ps_probe_scoring_name((ps_probe_scoring)k))) s = (ps_probe_scoring)k;
                    if (s == PS_PROBE_AUTO) rc = ps_fail(err, "%s: scoring \"%s\" unknown", path, sc);
                    else if (e->p->scoring != PS_PROBE_AUTO && e->p->scoring != s)
                        rc = ps_fail(err, "%s: the journal was scored by %s, not --scoring %s; use another --out or delete it", path, sc,
                                     ps_probe_scoring_name(e->p->scoring));
                    else {
                        e->scoring = s;
                        e->rs = s == PS_PROBE_GREEDY ? e->n_spans : 1;
                        e->n_req = e->n_jobs * e->rs;
                        e->have = calloc((size_t)e->n_req, 1);
                        if (!e->have) rc = ps_fail(err, "out of memory");
                        fresh = 0;
                    }
                }
            } else {
                json_t *jr = json_object_get(o, "r"), *ok = json_object_get(o, "ok"), *lp = json_object_get(o, "lp"),
                       *tp = json_object_get(o, "top");
                int64_t r = json_integer_value(jr), cnt = e->scoring == PS_PROBE_GREEDY ? 1 : e->n_spans;
                if (!json_is_integer(jr) || r < 0 || r >= e->n_req || (int64_t)json_array_size(ok) != cnt ||
                    (int64_t)json_array_size(lp) != cnt || (int64_t)json_array_size(tp) != cnt)
                    rc = ps_fail(err, "%s: line %lld is not a request of this run (delete the journal to start over)", path, (long long)ln);
                else {
                    int64_t first = e->scoring == PS_PROBE_GREEDY ? r % e->rs : 0;
                    ps_probe_out *out = &e->outs[(r / e->rs) * e->n_spans + first];
                    for (int64_t s = 0; s < cnt; s++) {
                        json_t *l = json_array_get(lp, (size_t)s);
                        out[s].ok = (int)json_integer_value(json_array_get(ok, (size_t)s));
                        out[s].lp = json_is_number(l) ? json_number_value(l) : NAN;
                        out[s].top = (int32_t)json_integer_value(json_array_get(tp, (size_t)s));
                    }
                    if (!e->have[r]) e->done++;
                    e->have[r] = 1;
                }
            }
            json_decref(o);
            good = ftell(f);
        }
        free(line);
        fclose(f);
        if (rc) return -1;
        if (!fresh && truncate(path, good)) return ps_fail(err, "%s: cannot cut the journal's last line: %s", path, strerror(errno));
    }
    e->journal = fopen(path, fresh ? "w" : "a");
    if (!e->journal) return ps_fail(err, "%s: cannot write the journal: %s", path, strerror(errno));
    return fresh ? 1 : 0;
}

static int journal_header(engine *e, json_t *plan, const char *path, ps_error *err) {
    json_t *h = json_pack("{s:i, s:O, s:s}", "probe_journal", 1, "plan", plan, "scoring", ps_probe_scoring_name(e->scoring));
    char *t = h ? json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(h);
    if (!t) return ps_fail(err, "out of memory");
    int rc = fprintf(e->journal, "%s\n", t) < 0 || fflush(e->journal) ? ps_fail(err, "%s: cannot write the journal", path) : 0;
    free(t);
    return rc;
}

static int engine_run(engine *e, const char *journal, json_t *plan, ps_probe_cost *cost, ps_error *err) {
    ps_probe *p = e->p;
    int rc = 0, fresh = 1;
    memset(cost, 0, sizeof *cost);
    e->scoring = p->scoring;
    e->rs = e->scoring == PS_PROBE_GREEDY ? e->n_spans : 1; /* (the journal or the detection may change it) */
    e->n_req = e->n_jobs * e->rs;
    e->spans = malloc((size_t)e->n_spans * sizeof *e->spans);
    if (!e->spans) return ps_fail(err, "out of memory");
    for (int64_t k = 0; k < e->n_jobs * e->n_spans; k++) e->outs[k] = (ps_probe_out){0, NAN, -1};
    if (journal && !p->dry_run) {
        fresh = journal_open(e, journal, plan, err);
        if (fresh < 0) {
            rc = -1;
            goto done;
        }
    }
    if (fresh && e->scoring == PS_PROBE_AUTO && !p->dry_run && (rc = detect_scoring(e, 0, err))) goto done;
    if (fresh) {
        e->rs = e->scoring == PS_PROBE_GREEDY ? e->n_spans : 1;
        e->n_req = e->n_jobs * e->rs;
        free(e->have);
        if (!(e->have = calloc((size_t)(e->n_req ? e->n_req : 1), 1))) {
            rc = ps_fail(err, "out of memory");
            goto done;
        }
        if (e->journal && (rc = journal_header(e, plan, journal, err))) goto done;
    }
    cost->scoring = e->scoring;
    /* the plan's cost (the same for a resumed run: it is what the whole run sends) */
    for (int64_t r = 0; r < e->n_req && !rc; r++) {
        int64_t first, count, n_send;
        if (e->job_len) {
            int64_t j = r / e->rs;
            first = e->scoring == PS_PROBE_GREEDY ? r % e->rs : 0;
            n_send = e->scoring == PS_PROBE_GREEDY ? e->job_spans[j * e->n_spans + first].src : e->job_len[j];
            e->spans[first] = e->job_spans[j * e->n_spans + first];
        } else if ((rc = req_build(e, r, &first, &count, &n_send, err)))
            break;
        cost->requests++;
        cost->prompt_tokens += n_send;
        cost->max_prompt_tokens = n_send > cost->max_prompt_tokens ? n_send : cost->max_prompt_tokens;
        cost->generated_tokens += e->scoring == PS_PROBE_GREEDY ? e->spans[first].len : p->max_tokens;
    }
    cost->resumed = e->done;
    if (rc || p->dry_run) goto done;
    int64_t *todo = malloc((size_t)(e->n_req ? e->n_req : 1) * sizeof *todo), nt = 0;
    if (!todo) {
        rc = ps_fail(err, "out of memory");
        goto done;
    }
    for (int64_t r = 0; r < e->n_req; r++)
        if (!e->have[r]) todo[nt++] = r;
    if (p->progress && p->progress(e->done, e->n_req, p->user))
        rc = ps_fail(err, "cancelled after %lld of %lld requests", (long long)e->done, (long long)e->n_req);
    else rc = ps_http_post_many(&p->http, "/v1/completions", todo, nt, req_make, req_done, req_what, e, err);
    free(todo);
done:
    if (e->journal) fclose(e->journal);
    e->journal = NULL;
    free(e->have);
    e->have = NULL;
    free(e->spans);
    e->spans = NULL;
    ps_ids_free(&e->ids);
    return rc;
}

/* ---- the text-kv sweep ---- */

typedef struct {
    const ps_textkv_set *set;
    ps_sweep_mode mode;
    int64_t N;
    uint64_t seed;
    ps_query *q;
} kv_ctx;

static int kv_build(void *user, int64_t job, ps_ids *ids, ps_probe_span *sp, ps_error *err) {
    kv_ctx *c = user;
    int64_t rho[64], nq = c->set->kv.n_queries;
    int64_t *r = nq <= 64 ? rho : malloc((size_t)nq * sizeof *r);
    if (!r) return ps_fail(err, "out of memory");
    int rc = ps_textkv_set_prompt(c->set, c->mode, job / c->N, c->seed, job % c->N, ids, c->q, r, err);
    if (r != rho) free(r);
    if (rc) return -1;
    for (int64_t k = 0; k < nq; k++) sp[k] = (ps_probe_span){c->q[k].answer_src, c->q[k].answer_len};
    ids->n = ps_textkv_set_prompt_len(c->set, c->q) < ids->n ? ps_textkv_set_prompt_len(c->set, c->q) : ids->n;
    return 0;
}

static void kv_describe(void *user, int64_t job, char *out, size_t n) {
    kv_ctx *c = user;
    snprintf(out, n, "prompt %lld of shift %lld", (long long)(job % c->N), (long long)(job / c->N));
}

int ps_probe_textkv(ps_probe *p, const ps_textkv_set *set, ps_sweep_mode mode, int64_t N, uint64_t seed, const char *journal,
                    json_t *plan, ps_residue_stats *st, int64_t *tmin, int64_t *tmax, ps_probe_cost *cost, ps_error *err) {
    int64_t P = set->P, nq = set->kv.n_queries, nj = P * N;
    kv_ctx c = {set, mode, N, seed, malloc((size_t)nq * sizeof(ps_query))};
    engine e = {.p = p, .n_jobs = nj, .n_spans = nq, .build = kv_build, .describe = kv_describe, .ctx = &c};
    e.outs = malloc((size_t)(nj * nq) * sizeof *e.outs);
    int32_t *ok = malloc((size_t)(nj * nq) * sizeof *ok), *rho = malloc((size_t)(nj * nq) * sizeof *rho);
    double *lp = malloc((size_t)(nj * nq) * sizeof *lp);
    int64_t *r64 = malloc((size_t)nq * sizeof *r64), *jl = malloc((size_t)nj * sizeof *jl);
    ps_probe_span *js = malloc((size_t)(nj * nq) * sizeof *js);
    ps_ids ids = {0};
    int rc = c.q && e.outs && ok && rho && lp && r64 && jl && js ? 0 : ps_fail(err, "out of memory for %lld prompts", (long long)nj);
    e.job_len = jl;
    e.job_spans = js;
    memset(st, 0, sizeof *st);
    *tmin = INT64_MAX;
    *tmax = 0;
    /* the residues and lengths of every prompt (the prompts themselves are built again as they are sent) */
    for (int64_t j = 0; j < nj && !rc; j++) {
        rc = ps_textkv_set_prompt(set, mode, j / N, seed, j % N, &ids, c.q, r64, err);
        if (rc) break;
        int64_t T0 = ps_textkv_set_prompt_len(set, c.q);
        *tmin = T0 < *tmin ? T0 : *tmin;
        *tmax = T0 > *tmax ? T0 : *tmax;
        for (int64_t k = 0; k < nq; k++) {
            rho[j * nq + k] = (int32_t)r64[k];
            js[j * nq + k] = (ps_probe_span){c.q[k].answer_src, c.q[k].answer_len};
        }
        jl[j] = T0 < ids.n ? T0 : ids.n;
        if (p->progress && p->dry_run && p->progress(j + 1, nj, p->user))
            rc = ps_fail(err, "cancelled after %lld of %lld prompts", (long long)(j + 1), (long long)nj);
    }
    ps_ids_free(&ids);
    if (!rc) rc = engine_run(&e, journal, plan, cost, err);
    if (!rc && !p->dry_run) {
        for (int64_t k = 0; k < nj * nq; k++) {
            ok[k] = e.outs[k].ok;
            lp[k] = isnan(e.outs[k].lp) ? 0.0 : e.outs[k].lp; /* greedy: the curve's mean_logprob is then null (the caller) */
        }
        rc = ps_residue_stats_init(st, P, err);
        /* shift by shift, prompt by prompt, query by query: the local sweep's order of the sums */
        if (!rc) ps_residue_stats_add_items(st, ok, lp, rho, nj * nq);
    }
    free(c.q);
    free(e.outs);
    free(ok);
    free(rho);
    free(lp);
    free(r64);
    free(jl);
    free(js);
    return rc;
}

/* ---- the fillers experiment ---- */

typedef struct {
    const ps_fillexp *e;
    int64_t N; /* points: families × lengths */
} fill_ctx;

static int fill_build(void *user, int64_t job, ps_ids *ids, ps_probe_span *sp, ps_error *err) {
    fill_ctx *c = user;
    int cand = (int)(job / c->N);
    int64_t s = job % c->N, nL = c->e->L_max - c->e->L_min + 1;
    const ps_ids *cd = &c->e->cands[cand].ids;
    if (ps_fillexp_prompt(c->e, (int)(s / nL), c->e->L_min + s % nL, ids, err) || ps_ids_push(ids, cd->v, cd->n, err)) return -1;
    sp[0] = (ps_probe_span){ids->n - cd->n, cd->n};
    return 0;
}

static void fill_describe(void *user, int64_t job, char *out, size_t n) {
    fill_ctx *c = user;
    int64_t s = job % c->N, nL = c->e->L_max - c->e->L_min + 1;
    snprintf(out, n, "family %s, L = %lld, candidate %lld", c->e->fams[s / nL].name, (long long)(c->e->L_min + s % nL),
             (long long)(job / c->N));
}

int ps_probe_fillers(ps_probe *p, const ps_fillexp *ex, int64_t P, const char *journal, json_t *plan, ps_fillexp_result *r,
                     ps_probe_cost *cost, ps_error *err) {
    memset(r, 0, sizeof *r);
    if (p->scoring == PS_PROBE_GREEDY)
        return ps_fail(err, "--scoring greedy: the fillers experiment needs candidate probabilities (echo or prompt-logprobs)");
    int64_t nL = ex->L_max - ex->L_min + 1, N = (int64_t)ex->n_fams * nL, nj = N * ex->n_cands;
    fill_ctx c = {ex, N};
    engine e = {.p = p, .n_jobs = nj, .n_spans = 1, .build = fill_build, .describe = fill_describe, .ctx = &c};
    e.outs = malloc((size_t)nj * sizeof *e.outs);
    r->pts = calloc((size_t)N, sizeof *r->pts);
    if (!e.outs || !r->pts) {
        free(e.outs);
        ps_fillexp_result_free(r);
        return ps_fail(err, "out of memory for %lld prompts", (long long)nj);
    }
    r->n_fams = ex->n_fams;
    r->n_cands = ex->n_cands;
    r->n_L = nL;
    r->P = P;
    int rc = engine_run(&e, journal, plan, cost, err);
    if (!rc && !p->dry_run && e.scoring == PS_PROBE_GREEDY)
        rc = ps_fail(err, "%s gives no prompt log-probabilities (neither echo with logprobs nor prompt_logprobs): the fillers experiment "
                          "needs candidate probabilities",
                     p->endpoint);
    for (int64_t s = 0; s < N && !rc && !p->dry_run; s++) {
        ps_fillexp_point *pt = &r->pts[s];
        pt->L = ex->L_min + s % nL;
        pt->phase = pt->L % P;
        pt->prompt_tokens = ex->before.n + pt->L + ex->after.n;
        for (int cd = 0; cd < ex->n_cands; cd++) {
            const ps_probe_out *o = &e.outs[cd * N + s];
            pt->logprob[cd] = o->lp;
            pt->all_top1[cd] = o->ok;
            if (cd == 0) pt->top1 = o->top;
        }
        if (pt->top1 < 0)
            rc = ps_fail(err, "%s: the top-1 token after the prompt of point %lld is not an id the tokenizer knows (ask the server for "
                              "token ids: vLLM's return_tokens_as_token_ids)",
                         p->endpoint, (long long)s);
        pt->delta = exp(pt->logprob[0]) - exp(pt->logprob[1]);
    }
    free(e.outs);
    if (rc) ps_fillexp_result_free(r);
    return rc;
}

json_t *ps_probe_json(const ps_probe *p, const ps_probe_cost *c) {
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", json_string(p->endpoint));
    json_object_set_new(o, "api_model", json_string(p->model));
    json_object_set_new(o, "scoring", json_string(ps_probe_scoring_name(c->scoring)));
    json_object_set_new(o, "max_tokens", json_integer(c->scoring == PS_PROBE_GREEDY ? -1 : p->max_tokens)); /* greedy: each answer's length */
    json_object_set_new(o, "prompt_as", json_string("token ids"));
    json_object_set_new(o, "requests", json_integer(c->requests));
    json_object_set_new(o, "prompt_tokens", json_integer(c->prompt_tokens));
    json_object_set_new(o, "max_prompt_tokens", json_integer(c->max_prompt_tokens));
    json_object_set_new(o, "generated_tokens", json_integer(c->generated_tokens));
    return o;
}
