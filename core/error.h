/* error.h — the error value every fallible phasescope function fills in.
 *
 * Convention: a function that can fail returns int (0 = success, -1 = failure) and takes a
 * `ps_error *err` as its last argument; on failure it writes one printable line naming the file,
 * tensor, key or flag at fault. Library code never prints and never exits. */
#ifndef PS_ERROR_H
#define PS_ERROR_H

#include <stdarg.h>

#define PS_ERROR_MAX 1024

typedef struct {
    char msg[PS_ERROR_MAX];
    int usage; /* 1 when the caller asked for something invalid (a bad flag or value): CLI exit status 2 */
} ps_error;

/* Write a message into err (NULL-safe; clears `usage`); always returns -1 so callers can `return ps_fail(...)`. */
int ps_fail(ps_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* As ps_fail, and marks the error a usage error (`usage` = 1: a flag or value the caller gave is invalid). */
int ps_fail_usage(ps_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix an existing message, e.g. with the file name: "FILE: <old message>". Returns -1. */
int ps_fail_prefix(ps_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
