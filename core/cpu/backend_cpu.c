/* backend_cpu.c — the CPU backend's table: host memory (calloc/free, copies are memcpy) and the ops. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cpu/cpu.h"

static void *cpu_alloc(ps_ctx *c, int64_t bytes) {
    (void)c;
    return calloc(1, (size_t)(bytes > 0 ? bytes : 1));
}

static void cpu_free(ps_ctx *c, void *p) {
    (void)c;
    free(p);
}

static int cpu_copy_bytes(ps_ctx *c, void *dst, const void *src, int64_t bytes) {
    (void)c;
    if (bytes > 0 && dst != src) memcpy(dst, src, (size_t)bytes);
    return 0;
}

/* The op tables, one entry per op of the enums (core/backend.h): op f is ps_cpu_<f>. */
#define PS_CPU_OP_(E, f) .f = ps_cpu_##f,
static const ps_backend_v4_ops cpu_v4_ops = {PS_V4_OPS(PS_CPU_OP_)};

const ps_backend ps_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 1,
    .init = NULL,
    .fini = NULL,
    .supports = NULL, /* the CPU runs every op with any parameters */
    .ops = {PS_CORE_OPS(PS_CPU_OP_)},
    .v4 = &cpu_v4_ops,
};

/* "cpu-staged": a TEST backend (docs/backends.md), not listed by ps_ctx_backends() nor offered by the CLI.
 * The same ops on the same CPU, but it declares its buffers not host-visible, so code that branches on
 * ps_ctx_host_visible takes the device path (ps_buf_to_host / ps_buf_from_host copies) while the numbers
 * stay the cpu's bit for bit: tests compare a run on it with the same run on "cpu".
 *
 * Its buffers live in one reserved address range that is PROT_NONE except while an op or copy of some
 * cpu-staged context runs (the guard, core/ops.h's ps_op_open / ps_op_close): host code that reads or
 * writes a buffer between ops — what would read a device pointer on CUDA — faults here at that line, on
 * any machine. The range is the process's one, as a device's memory is: a buffer of one context may be an
 * argument of another's op (hook sources uploaded once, models on their own contexts), as on CUDA. It is
 * the one piece of process-wide state in the library, opened by the first cpu-staged context and
 * released with the last. Blocks are page-rounded, first fit over a free list kept sorted and merged; a
 * freed block's pages are returned (MADV_DONTNEED), so a reused one reads zero as calloc's would. One mutex
 * orders the calls. */
#define STAGED_RESERVE ((size_t)1 << 36) /* 64 GiB of address space (MAP_NORESERVE: nothing committed) */

typedef struct {
    size_t off, len;
} staged_block;

typedef struct {
    char *base;
    int users;                  /* cpu-staged contexts alive */
    size_t top;                 /* bytes of the range ever handed out (high-water mark) */
    staged_block *live, *free_; /* blocks handed out (unordered) / free below top (sorted by off) */
    int n_live, cap_live, n_free, cap_free;
    int depth; /* ops running (nested calls count): the range is readable while depth > 0 */
} staged_arena;

static pthread_mutex_t staged_mu = PTHREAD_MUTEX_INITIALIZER;
static staged_arena staged; /* the device memory of cpu-staged (see above) */

static int staged_push(staged_block **a, int *n, int *cap, int at, staged_block b) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        staged_block *na = realloc(*a, (size_t)nc * sizeof *na);
        if (!na) return -1;
        *a = na;
        *cap = nc;
    }
    memmove(*a + at + 1, *a + at, (size_t)(*n - at) * sizeof **a);
    (*a)[at] = b;
    (*n)++;
    return 0;
}

static int staged_init(ps_ctx *c) {
    staged_arena *s = &staged;
    int rc = 0;
    pthread_mutex_lock(&staged_mu);
    if (!s->users) {
        void *base = mmap(NULL, STAGED_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED)
            rc = ps_ctx_fail(c, "could not reserve %zu GiB of address space for its buffers: %s", STAGED_RESERVE >> 30, strerror(errno));
        else
            *s = (staged_arena){.base = base};
    }
    if (!rc) s->users++;
    pthread_mutex_unlock(&staged_mu);
    return rc;
}

static void staged_fini(ps_ctx *c) {
    (void)c;
    staged_arena *s = &staged;
    pthread_mutex_lock(&staged_mu);
    if (--s->users == 0) { /* the last context: the range goes (a buffer still held is the holder's leak) */
        munmap(s->base, STAGED_RESERVE);
        free(s->live);
        free(s->free_);
        *s = (staged_arena){0};
    }
    pthread_mutex_unlock(&staged_mu);
}

static void staged_guard(ps_ctx *c, int open) {
    (void)c;
    staged_arena *s = &staged;
    pthread_mutex_lock(&staged_mu);
    if (open ? s->depth++ == 0 : --s->depth == 0)
        if (s->top) mprotect(s->base, s->top, open ? PROT_READ | PROT_WRITE : PROT_NONE);
    pthread_mutex_unlock(&staged_mu);
}

static void *staged_alloc(ps_ctx *c, int64_t bytes) {
    (void)c;
    staged_arena *s = &staged;
    long page = sysconf(_SC_PAGESIZE);
    size_t len = ((size_t)(bytes > 0 ? bytes : 1) + (size_t)page - 1) / (size_t)page * (size_t)page;
    void *p = NULL;
    pthread_mutex_lock(&staged_mu);
    int i = 0;
    while (i < s->n_free && s->free_[i].len < len) i++;
    staged_block b = {0, len};
    if (i < s->n_free) { /* first fit: take the front of free block i */
        b.off = s->free_[i].off;
        s->free_[i].off += len;
        s->free_[i].len -= len;
        if (!s->free_[i].len) memmove(s->free_ + i, s->free_ + i + 1, (size_t)(--s->n_free - i) * sizeof *s->free_);
    } else if (len <= STAGED_RESERVE - s->top) { /* or grow the range: the new pages get the range's state */
        b.off = s->top;
        s->top += len;
        mprotect(s->base + b.off, len, s->depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE);
    } else {
        pthread_mutex_unlock(&staged_mu);
        return NULL;
    }
    if (!staged_push(&s->live, &s->n_live, &s->cap_live, s->n_live, b)) p = s->base + b.off;
    pthread_mutex_unlock(&staged_mu);
    return p;
}

static void staged_free(ps_ctx *c, void *p) {
    (void)c;
    staged_arena *s = &staged;
    if (!p) return;
    pthread_mutex_lock(&staged_mu);
    size_t off = (size_t)((char *)p - s->base);
    int i = 0;
    while (i < s->n_live && s->live[i].off != off) i++;
    if (i < s->n_live) {
        staged_block b = s->live[i];
        s->live[i] = s->live[--s->n_live];
        madvise(s->base + b.off, b.len, MADV_DONTNEED); /* zero on the next touch */
        int at = 0;                                       /* sorted insert, merged with its neighbours */
        while (at < s->n_free && s->free_[at].off < b.off) at++;
        if (at > 0 && s->free_[at - 1].off + s->free_[at - 1].len == b.off) {
            b.off = s->free_[at - 1].off;
            b.len += s->free_[at - 1].len;
            memmove(s->free_ + at - 1, s->free_ + at, (size_t)(--s->n_free - (at - 1)) * sizeof *s->free_);
            at--;
        }
        if (at < s->n_free && b.off + b.len == s->free_[at].off) {
            b.len += s->free_[at].len;
            memmove(s->free_ + at, s->free_ + at + 1, (size_t)(--s->n_free - at) * sizeof *s->free_);
        }
        if (b.off + b.len == s->top) s->top = b.off; /* the range shrinks back */
        else if (staged_push(&s->free_, &s->n_free, &s->cap_free, at, b)) {
        } /* no memory for the free list: the block is lost to reuse, not to correctness */
    }
    pthread_mutex_unlock(&staged_mu);
}

static int staged_copy(ps_ctx *c, void *dst, const void *src, int64_t bytes) {
    return PS_BE_RUN(c, cpu_copy_bytes, dst, src, bytes);
}

const ps_backend ps_backend_cpu_staged = {
    .name = "cpu-staged",
    .alloc = staged_alloc,
    .free = staged_free,
    .to_host = staged_copy,
    .from_host = staged_copy,
    .host_visible = 0,
    .guard = staged_guard,
    .init = staged_init,
    .fini = staged_fini,
    .supports = NULL,
    .ops = {PS_CORE_OPS(PS_CPU_OP_)},
    .v4 = &cpu_v4_ops,
};
