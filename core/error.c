#include "core/error.h"

#include <stdio.h>
#include <string.h>

/* the message, and whether it is a usage error */
static int fail_v(ps_error *err, int usage, const char *fmt, va_list ap) {
    if (!err) return -1;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    err->usage = usage;
    return -1;
}

int ps_fail(ps_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(err, 0, fmt, ap);
    va_end(ap);
    return -1;
}

int ps_fail_usage(ps_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(err, 1, fmt, ap);
    va_end(ap);
    return -1;
}

int ps_fail_prefix(ps_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[PS_ERROR_MAX], old[PS_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t pl = strnlen(prefix, sizeof prefix - 1);
    memcpy(err->msg, prefix, pl);
    size_t room = sizeof err->msg - 1 - pl, ol = strnlen(old, room);
    memcpy(err->msg + pl, old, ol);
    err->msg[pl + ol] = '\0';
    return -1;
}
