#define _POSIX_C_SOURCE 200809L
#include "core/ctx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/fileio.h"

/* The backends this build has (a CUDA build adds its table here: core/cuda/backend_cuda.c), and last the
 * test backend "cpu-staged", which PS_BACKENDS_TEXT does not list (docs/backends.md). */
#ifdef PS_HAVE_CUDA
extern const ps_backend ps_backend_cuda;
static const ps_backend *const backends[] = {&ps_backend_cpu, &ps_backend_cuda, &ps_backend_cpu_staged};
#else
static const ps_backend *const backends[] = {&ps_backend_cpu, &ps_backend_cpu_staged};
#endif
#define N_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

const char *ps_ctx_backends(void) { return PS_BACKENDS_TEXT; }

static int default_precision = PS_PREC_FP32;

int ps_precision_parse(const char *name, int *out) {
    static const char *const names[] = {"fp32", "tf32", "bf16"};
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, names[i])) {
            *out = i;
            return 0;
        }
    return -1;
}

const char *ps_precision_name(int precision) {
    return precision == PS_PREC_TF32 ? "tf32" : precision == PS_PREC_BF16 ? "bf16" : "fp32";
}

void ps_ctx_default_precision(int precision) { default_precision = precision; }

int ps_ctx_create(ps_ctx **out, const char *backend, ps_error *err) {
    *out = NULL;
    const char *want = backend && *backend ? backend : "cpu";
    const ps_backend *be = NULL;
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(backends[i]->name, want)) be = backends[i];
    if (!be) {
        ps_fail(err, "--backend %s: this build has no such backend (it has: %s)", want, ps_ctx_backends());
        if (err) err->usage = 1;
        return -1;
    }
    for (int op = 0; op < PS_OP_COUNT; op++) /* every entry of the op table is required (core/backend.h) */
        if (!ps_backend_has_op(be, (ps_op)op))
            return ps_fail(err, "%s backend: its op table has no entry for op \"%s\"", want, ps_op_name((ps_op)op));
    for (int op = 0; be->v4 && op < PS_V4_OP_COUNT; op++)
        if (!ps_backend_has_v4_op(be, (ps_v4_op)op))
            return ps_fail(err, "%s backend: its DeepSeek-V4 table has no entry for op \"%s\"", want, ps_v4_op_name((ps_v4_op)op));
    ps_ctx *c = calloc(1, sizeof *c);
    if (!c) return ps_fail(err, "out of memory for a %s context", want);
    c->be = be;
    c->precision = default_precision;
    if (be->init && be->init(c)) {
        ps_fail(err, "%s backend: %s", want, c->err.msg);
        free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void ps_ctx_free(ps_ctx *c) {
    if (!c) return;
    if (c->ws) c->be->free(c, c->ws);
    if (c->be->fini) c->be->fini(c);
    free(c);
}

const char *ps_ctx_backend_name(const ps_ctx *c) { return c->be->name; }

int ps_ctx_fail(ps_ctx *c, const char *fmt, ...) {
    if (c->failed) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
    va_end(ap);
    c->failed = 1;
    return -1;
}

int ps_ctx_check(ps_ctx *c, ps_error *err) {
    if (!c->failed) return 0;
    if (err) *err = c->err;
    c->failed = 0;
    c->err.msg[0] = '\0';
    return -1;
}

float *ps_ctx_workspace(ps_ctx *c, int64_t n_floats) {
    if (c->failed) return NULL;
    if (n_floats < 1) n_floats = 1;
    if (n_floats <= c->ws_floats) return c->ws;
    if (c->ws) c->be->free(c, c->ws);
    c->live_bytes -= c->ws_floats * (int64_t)sizeof(float);
    c->ws = NULL;
    c->ws_floats = 0;
    c->ws = c->be->alloc(c, n_floats * (int64_t)sizeof(float));
    if (!c->ws) {
        ps_ctx_fail(c, "out of memory: op workspace of %.1f MB", (double)n_floats * 4 / 1e6);
        return NULL;
    }
    c->ws_floats = n_floats;
    if (n_floats > c->ws_peak) c->ws_peak = n_floats;
    c->live_bytes += n_floats * (int64_t)sizeof(float);
    if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
    return c->ws;
}

void *ps_buf_alloc(ps_ctx *c, int64_t bytes, const char *name, ps_error *err) {
    if (bytes < 0) {
        ps_fail(err, "%s: negative size %lld bytes", name, (long long)bytes);
        return NULL;
    }
    void *p = c->be->alloc(c, bytes ? bytes : 1);
    if (!p) {
        ps_fail(err, "out of memory: %s need %.1f MB on the %s backend", name, (double)bytes / 1e6, c->be->name);
        return NULL;
    }
    c->live_bytes += bytes;
    if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
    return p;
}

void ps_buf_free(ps_ctx *c, void *buf, int64_t bytes) {
    if (!buf) return;
    c->be->free(c, buf);
    c->live_bytes -= bytes;
}

int ps_buf_to_host(ps_ctx *c, void *host, const void *buf, int64_t bytes, ps_error *err) {
    if (c->be->to_host(c, host, buf, bytes)) return ps_fail(err, "copy of %lld bytes to the host failed: %s", (long long)bytes, c->err.msg);
    return 0;
}

int ps_buf_from_host(ps_ctx *c, void *buf, const void *host, int64_t bytes, ps_error *err) {
    if (c->be->from_host(c, buf, host, bytes))
        return ps_fail(err, "copy of %lld bytes from the host failed: %s", (long long)bytes, c->err.msg);
    return 0;
}

int ps_ctx_host_visible(const ps_ctx *c) { return c->be->host_visible; }

int ps_ctx_mem_info(ps_ctx *c, int64_t *free_bytes, int64_t *total_bytes, ps_error *err) {
    if (c->failed) /* an earlier op's failure stays for ps_ctx_check; nothing is queried */
        return ps_fail(err, "memory of the %s context: an earlier op failed (%s)", c->be->name, c->err.msg);
    if (c->be->mem_info) /* a failed query clears its own failure: it is not a failed op */
        return c->be->mem_info(c, free_bytes, total_bytes) ? ps_ctx_check(c, err) : 0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *free_bytes = (int64_t)ps_mem_available();
    *total_bytes = pages > 0 && page > 0 ? (int64_t)pages * (int64_t)page : 0;
    return 0;
}

uint64_t ps_ctx_mem_free(ps_ctx *c) {
    if (!c) return ps_mem_available();
    int64_t fb = 0, tb = 0;
    ps_error e;
    return ps_ctx_mem_info(c, &fb, &tb, &e) || fb <= 0 ? 0 : (uint64_t)fb; /* 0: the size check is skipped */
}
