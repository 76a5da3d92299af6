/* backend_cpu.c — the CPU backend's table: host memory (calloc/free, copies are memcpy) and the ops. */
#include <stdlib.h>
#include <string.h>

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

/* Everything else but the name and host visibility of both tables below. The CPU runs every op with any
 * parameters (supports NULL). */
#define PS_CPU_TABLE                                                                                           \
    .init = NULL, .fini = NULL, .supports = NULL, .ops = {PS_CORE_OPS(PS_CPU_OP_)}, .v4 = &cpu_v4_ops

const ps_backend ps_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 1,
    PS_CPU_TABLE
};

/* "cpu-staged": a TEST backend (docs/backends.md), not listed by ps_ctx_backends() nor offered by the CLI.
 * The same host memory and ops, but it declares its buffers not host-visible, so code that branches on
 * ps_ctx_host_visible takes the device path (ps_buf_to_host / ps_buf_from_host copies) while the numbers
 * stay the cpu's bit for bit: tests compare a run on it with the same run on "cpu". */
const ps_backend ps_backend_cpu_staged = {
    .name = "cpu-staged",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
    .host_visible = 0,
    PS_CPU_TABLE
};
