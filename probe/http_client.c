/* http_client.c — HTTP requests over libcurl with retries and N in flight (http_client.h). */
#define _POSIX_C_SOURCE 200809L
#include "probe/http_client.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void ps_http_reply_free(ps_http_reply *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

int ps_http_retryable(long status) { return status == 429 || status == 500 || status == 502 || status == 503 || status == 504; }

int ps_http_url(const ps_http_opts *o, const char *path, char *out, size_t n, ps_error *err) {
    size_t bl = strlen(o->base);
    while (bl > 0 && o->base[bl - 1] == '/') bl--;
    /* "http://host/v1" + "/v1/models": the prefix is not doubled */
    if (bl >= 3 && !strncmp(o->base + bl - 3, "/v1", 3) && !strncmp(path, "/v1/", 4)) bl -= 3;
    if (strncmp(o->base, "http://", 7) && strncmp(o->base, "https://", 8))
        return ps_fail(err, "--endpoint %s: expected an http:// or https:// URL", o->base);
    if ((size_t)snprintf(out, n, "%.*s%s", (int)bl, o->base, path) >= n) return ps_fail(err, "--endpoint: the URL is too long");
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* one request's state: its easy handle, what came back, its retry clock */
typedef struct {
    CURL *h;
    struct curl_slist *hdr;
    char *body, *resp;
    size_t n, cap;
    double retry_after; /* seconds the server asked to wait (Retry-After), or -1 */
    int64_t idx;
    int attempt, busy, waiting;
    double wake;
    int oom;
} slot;

static size_t on_data(char *p, size_t sz, size_t nm, void *user) {
    slot *s = user;
    size_t n = sz * nm;
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n + 1) cap *= 2;
        char *r = realloc(s->resp, cap);
        if (!r) {
            s->oom = 1;
            return 0;
        }
        s->resp = r;
        s->cap = cap;
    }
    memcpy(s->resp + s->n, p, n);
    s->n += n;
    s->resp[s->n] = '\0';
    return n;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *user) {
    slot *s = user;
    size_t n = sz * nm;
    if (n > 12 && !strncasecmp(p, "Retry-After:", 12)) {
        char buf[64];
        size_t k = n - 12 < sizeof buf - 1 ? n - 12 : sizeof buf - 1;
        memcpy(buf, p + 12, k);
        buf[k] = '\0';
        char *end;
        double v = strtod(buf, &end);
        if (end != buf && v >= 0) s->retry_after = v;
    }
    return n;
}

static int slot_setup(slot *s, const ps_http_opts *o, const char *url, const char *method, ps_error *err) {
    if (!s->h && !(s->h = curl_easy_init())) return ps_fail(err, "libcurl: cannot create a handle");
    curl_easy_reset(s->h);
    s->n = 0;
    if (s->resp) s->resp[0] = '\0';
    s->retry_after = -1;
    s->oom = 0;
    if (!s->hdr) {
        /* no "Expect: 100-continue" (curl adds it to large POSTs and then waits a second for servers that
         * never answer it) */
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json"), *h0 = h ? curl_slist_append(h, "Expect:") : NULL;
        h = h0;
        if (h && o->api_key && o->api_key[0]) {
            size_t n = strlen(o->api_key) + 32;
            char *line = malloc(n);
            if (!line) {
                curl_slist_free_all(h);
                return ps_fail(err, "out of memory");
            }
            snprintf(line, n, "Authorization: Bearer %s", o->api_key);
            struct curl_slist *h2 = curl_slist_append(h, line);
            memset(line, 0, n); /* the key lives in the list only */
            free(line);
            h = h2 ? h2 : NULL;
        }
        if (!h) return ps_fail(err, "out of memory for the request headers");
        s->hdr = h;
    }
    curl_easy_setopt(s->h, CURLOPT_URL, url);
    curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdr);
    curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(s->h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->h, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s > 0 ? o->timeout_s * 1000 : 600000));
    curl_easy_setopt(s->h, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->timeout_s > 0 && o->timeout_s < 30 ? o->timeout_s * 1000 : 30000));
    curl_easy_setopt(s->h, CURLOPT_ACCEPT_ENCODING, "");
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(s->h, CURLOPT_POST, 1L);
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, s->body ? s->body : "");
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(s->body ? strlen(s->body) : 0));
    } else
        curl_easy_setopt(s->h, CURLOPT_HTTPGET, 1L);
    return 0;
}

static void slot_free(slot *s) {
    if (s->h) curl_easy_cleanup(s->h);
    curl_slist_free_all(s->hdr);
    free(s->body);
    free(s->resp);
    memset(s, 0, sizeof *s);
}

static double backoff(const ps_http_opts *o, const slot *s) {
    double cap = o->backoff_max_s > 0 ? o->backoff_max_s : 60;
    double w = s->retry_after >= 0 ? s->retry_after : (o->backoff_s > 0 ? o->backoff_s : 0.5) * pow(2.0, s->attempt - 1);
    return w < cap ? w : cap;
}

/* take the response out of the slot into r */
static void slot_reply(slot *s, long status, ps_http_reply *r) {
    r->status = status;
    r->body = s->resp ? s->resp : calloc(1, 1);
    r->n = s->n;
    r->attempts = s->attempt;
    s->resp = NULL;
    s->n = s->cap = 0;
}

int ps_http_request(const ps_http_opts *o, const char *method, const char *path, const char *body, ps_http_reply *r,
                    ps_error *err) {
    memset(r, 0, sizeof *r);
    char url[4096];
    if (ps_http_url(o, path, url, sizeof url, err)) return -1;
    slot s;
    memset(&s, 0, sizeof s);
    int rc = 0;
    if (body) {
        s.body = malloc(strlen(body) + 1);
        if (!s.body) return ps_fail(err, "out of memory");
        strcpy(s.body, body);
    }
    for (;;) {
        s.attempt++;
        if (slot_setup(&s, o, url, method, err)) {
            rc = -1;
            break;
        }
        CURLcode c = curl_easy_perform(s.h);
        long status = 0;
        if (c == CURLE_OK) curl_easy_getinfo(s.h, CURLINFO_RESPONSE_CODE, &status);
        if (s.oom) {
            rc = ps_fail(err, "%s %s: out of memory for the response", method, url);
            break;
        }
        int again = (c != CURLE_OK || ps_http_retryable(status)) && s.attempt <= o->retries;
        if (!again) {
            if (c != CURLE_OK)
                rc = ps_fail(err, "%s %s: %s (after %d attempts)", method, url, curl_easy_strerror(c), s.attempt);
            else
                slot_reply(&s, status, r);
            break;
        }
        sleep_s(backoff(o, &s));
    }
    slot_free(&s);
    return rc;
}

int ps_http_post_many(const ps_http_opts *o, const char *path, const int64_t *todo, int64_t n, ps_http_make_fn make,
                      ps_http_done_fn done, ps_http_what_fn what, void *user, ps_error *err) {
    if (n <= 0) return 0;
    char url[4096];
    if (ps_http_url(o, path, url, sizeof url, err)) return -1;
    int C = o->concurrency > 0 ? o->concurrency : 1;
    if (C > n) C = (int)n;
    slot *sl = calloc((size_t)C, sizeof *sl);
    CURLM *mh = curl_multi_init();
    if (!sl || !mh) {
        free(sl);
        if (mh) curl_multi_cleanup(mh);
        return ps_fail(err, "out of memory for %d concurrent requests", C);
    }
    int64_t next = 0, finished = 0;
    int rc = 0;
    while (finished < n && !rc) {
        double t = now_s();
        /* start: new requests into idle slots, waiting retries whose time has come */
        for (int k = 0; k < C && !rc; k++) {
            slot *s = &sl[k];
            if (s->busy && !s->waiting) continue;
            if (s->busy && s->waiting && t < s->wake) continue;
            if (!s->busy) {
                if (next >= n) continue;
                s->idx = todo[next++];
                free(s->body);
                s->body = make(s->idx, user, err);
                if (!s->body) {
                    rc = -1;
                    break;
                }
                s->attempt = 0;
                s->busy = 1;
            }
            s->waiting = 0;
            s->attempt++;
            if (slot_setup(s, o, url, "POST", err) || curl_multi_add_handle(mh, s->h) != CURLM_OK) {
                rc = rc ? rc : ps_fail(err, "libcurl: cannot start a request");
                break;
            }
        }
        if (rc) break;
        int running = 0;
        curl_multi_perform(mh, &running);
        CURLMsg *msg;
        int left;
        while (!rc && (msg = curl_multi_info_read(mh, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            slot *s = NULL;
            for (int k = 0; k < C; k++)
                if (sl[k].busy && sl[k].h == msg->easy_handle) s = &sl[k];
            if (!s) continue;
            CURLcode c = msg->data.result;
            long status = 0;
            if (c == CURLE_OK) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
            curl_multi_remove_handle(mh, s->h);
            char desc[256] = "";
            if (what) what(s->idx, user, desc, sizeof desc);
            else snprintf(desc, sizeof desc, "request %lld", (long long)s->idx);
            if (s->oom) {
                rc = ps_fail(err, "%s: out of memory for the response", desc);
                break;
            }
            if ((c != CURLE_OK || ps_http_retryable(status)) && s->attempt <= o->retries) {
                s->waiting = 1;
                s->wake = now_s() + backoff(o, s);
                continue;
            }
            if (c != CURLE_OK) {
                rc = ps_fail(err, "%s: POST %s: %s (after %d attempts)", desc, url, curl_easy_strerror(c), s->attempt);
                break;
            }
            ps_http_reply r;
            slot_reply(s, status, &r);
            s->busy = 0;
            finished++;
            rc = done(s->idx, &r, user, err);
            ps_http_reply_free(&r);
        }
        if (rc || finished >= n) break;
        /* wait for traffic, or for the next retry's time */
        double wait = 0.2;
        t = now_s();
        for (int k = 0; k < C; k++)
            if (sl[k].busy && sl[k].waiting) wait = fmin(wait, fmax(0.0, sl[k].wake - t));
        curl_multi_poll(mh, NULL, 0, (int)(wait * 1000) + 1, NULL);
    }
    for (int k = 0; k < C; k++) {
        if (sl[k].busy && !sl[k].waiting && sl[k].h) curl_multi_remove_handle(mh, sl[k].h);
        slot_free(&sl[k]);
    }
    curl_multi_cleanup(mh);
    free(sl);
    return rc;
}
