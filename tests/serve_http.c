/* serve_http.c — the tests' HTTP client for serve (serve_http.h). */
#define _POSIX_C_SOURCE 200809L
#include "serve_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t tu_http_on_data(char *p, size_t sz, size_t nm, void *u) {
    tu_http_buf *b = u;
    size_t n = sz * nm;
    char *r = realloc(b->b, b->n + n + 1);
    if (!r) return 0;
    b->b = r;
    memcpy(b->b + b->n, p, n);
    b->n += n;
    b->b[b->n] = '\0';
    return n;
}

CURL *tu_http_open(int port, const char *path, tu_http_buf *b, struct curl_slist **hd) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, tu_http_on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hd);
    return h;
}

long tu_http(int port, const char *method, const char *path, const char *body, json_t **out) {
    tu_http_buf b = {0};
    struct curl_slist *hd;
    CURL *h = tu_http_open(port, path, &b, &hd);
    if (!strcmp(method, "POST")) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
    else if (strcmp(method, "GET")) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    long st = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    if (out) *out = b.b ? json_loads(b.b, JSON_ALLOW_NUL, NULL) : NULL;
    free(b.b);
    return st;
}
