/* serve_http.h — the tests' HTTP client (libcurl) for a `phasescope serve` on loopback: a handle set up for
 * one request to 127.0.0.1:PORT, the growing buffer a response body is read into, and one whole request with
 * its JSON answer. test_serve.c (in process) and serve/test_serve_drops.c (a server process) use it. Not
 * probe/http_client.h: that one retries 429 and 5xx answers, which these tests expect to see. */
#ifndef PS_TEST_SERVE_HTTP_H
#define PS_TEST_SERVE_HTTP_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>

/* A response body: b[n] and a terminating '\0' (b NULL until a byte arrives; the caller frees b). */
typedef struct {
    char *b;
    size_t n;
} tu_http_buf;

/* libcurl's write callback: appends to the tu_http_buf u. */
size_t tu_http_on_data(char *p, size_t sz, size_t nm, void *u);

/* A handle for http://127.0.0.1:PORT<path>: the body into *b, a JSON Content-Type header (*hd: free it with
 * curl_slist_free_all after the request), a 60 s timeout, no signals. The caller sets the rest, performs it
 * and cleans it up. */
CURL *tu_http_open(int port, const char *path, tu_http_buf *b, struct curl_slist **hd);

/* One request: method "POST" (body, "" when NULL), "GET", or another (curl's custom request, no body).
 * Returns the status (0 when no answer came); *out (when out is given) the parsed body, NULL when it is not
 * JSON. */
long tu_http(int port, const char *method, const char *path, const char *body, json_t **out);

#endif
