/* http_client.h — the HTTP side of `phasescope probe` (probe/probe.h), over libcurl: one request
 * with retries, and many POSTs to one path with N in flight at once (curl's multi interface, one thread).
 *
 * Retries: a transport failure (connection refused or reset, a timeout) and the statuses 429, 500, 502,
 * 503 and 504 are retried up to `retries` times, waiting backoff_s · 2^attempt seconds (at most
 * backoff_max_s), or the server's Retry-After when it gives one (capped the same way). Any other status
 * is handed to the caller, which decides. The API key (when set) travels as "Authorization: Bearer KEY"
 * and appears in no message. */
#ifndef PS_HTTP_CLIENT_H
#define PS_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct {
    const char *base;    /* "http://host:port" or with a path prefix ("http://host/v1" is the same as "http://host") */
    const char *api_key; /* NULL: no Authorization header */
    double timeout_s;    /* per request, connection included */
    int concurrency;     /* requests in flight at once (ps_http_post_many) */
    int retries;         /* of one request */
    double backoff_s, backoff_max_s;
} ps_http_opts;

typedef struct {
    long status;   /* HTTP status (0 when none came) */
    char *body;    /* NUL-terminated, malloc'd (may be empty) */
    size_t n;
    int attempts;  /* 1 + the retries it took */
} ps_http_reply;

void ps_http_reply_free(ps_http_reply *r);

/* The URL of path ("/v1/models") under o->base into out. */
int ps_http_url(const ps_http_opts *o, const char *path, char *out, size_t n, ps_error *err);

/* One request (method "GET" or "POST"; body NULL for GET) with the retries above. Returns 0 with r filled
 * whatever the final status, -1 (err: the URL and curl's message) when the transport failed every time. */
int ps_http_request(const ps_http_opts *o, const char *method, const char *path, const char *body, ps_http_reply *r,
                    ps_error *err);

/* POST requests todo[0..n) to path, o->concurrency in flight: make(i) gives request i's body (malloc'd; NULL
 * with err set: stop), done(i, reply) takes its final reply (nonzero with err set: stop). Completion order
 * is not request order. A request whose transport failed on every attempt stops the run with an error
 * naming it (what(i) describes request i in messages, may be NULL). */
typedef char *(*ps_http_make_fn)(int64_t i, void *user, ps_error *err);
typedef int (*ps_http_done_fn)(int64_t i, const ps_http_reply *r, void *user, ps_error *err);
typedef void (*ps_http_what_fn)(int64_t i, void *user, char *out, size_t n);
int ps_http_post_many(const ps_http_opts *o, const char *path, const int64_t *todo, int64_t n, ps_http_make_fn make,
                      ps_http_done_fn done, ps_http_what_fn what, void *user, ps_error *err);

/* Whether a status is retried (429 and 5xx gateway / overload statuses). */
int ps_http_retryable(long status);

#endif
