#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ps_cli_status(const ps_error *err) { return err && err->usage ? 2 : 1; }

int ps_cli_mark_usage(ps_error *err) {
    if (err) err->usage = 1;
    return -1;
}

int ps_cli_usage(ps_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return ps_cli_mark_usage(err);
}

ps_flag *ps_cli_get(ps_flag *flags, int n_flags, const char *name) {
    for (int i = 0; i < n_flags; i++)
        if (!strcmp(flags[i].name, name)) return &flags[i];
    return NULL;
}

int ps_cli_parse(int argc, char **argv, ps_flag *flags, int n_flags, const char **pos, int max_pos, int *n_pos,
                 ps_error *err) {
    *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (*n_pos >= max_pos) return ps_cli_usage(err, "unexpected argument \"%s\"", a);
            pos[(*n_pos)++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        ps_flag *f = NULL;
        for (int k = 0; k < n_flags; k++)
            if (strlen(flags[k].name) == nlen && !strncmp(flags[k].name, a, nlen)) f = &flags[k];
        if (!f) return ps_cli_usage(err, "unknown flag %.*s (see --help)", (int)nlen, a);
        if (f->present) return ps_cli_usage(err, "flag %s given twice", f->name);
        f->present = true;
        if (f->takes_value) {
            if (eq) f->value = eq + 1;
            else if (i + 1 < argc) f->value = argv[++i];
            else return ps_cli_usage(err, "flag %s needs a value", f->name);
        } else if (eq)
            return ps_cli_usage(err, "flag %s takes no value", f->name);
    }
    return 0;
}

int ps_cli_require(const ps_flag *flags, int n_flags, ps_error *err, ...) {
    va_list ap;
    va_start(ap, err);
    for (const char *name; (name = va_arg(ap, const char *));)
        for (int i = 0; i < n_flags; i++)
            if (!strcmp(flags[i].name, name) && !flags[i].present) {
                va_end(ap);
                return ps_cli_usage(err, "%s is required", name);
            }
    va_end(ap);
    return 0;
}

int ps_cli_int(const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out, ps_error *err) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0') return ps_cli_usage(err, "%s %s: not an integer", flag, value);
    if (v < lo || v > hi) return ps_cli_usage(err, "%s %s: must be in [%lld, %lld]", flag, value, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

int ps_cli_int_list(const char *flag, const char *value, int64_t lo, int64_t hi, int *out, int max, int *n, ps_error *err) {
    *n = 0;
    const char *p = value;
    while (*p) {
        char *end;
        errno = 0;
        long long a = strtoll(p, &end, 10), b = a;
        if (end == p || errno) return ps_cli_usage(err, "%s %s: expected a list like 0,2,5-7", flag, value);
        if (*end == '-') {
            const char *q = end + 1;
            b = strtoll(q, &end, 10);
            if (end == q) return ps_cli_usage(err, "%s %s: expected a list like 0,2,5-7", flag, value);
        }
        if (a > b) return ps_cli_usage(err, "%s %s: range %lld-%lld is reversed", flag, value, a, b);
        for (long long x = a; x <= b; x++) {
            if (x < lo || x > hi)
                return ps_cli_usage(err, "%s %s: %lld is out of range [%lld, %lld]", flag, value, x, (long long)lo, (long long)hi);
            for (int i = 0; i < *n; i++)
                if (out[i] == x) return ps_cli_usage(err, "%s %s: %lld is listed twice", flag, value, x);
            if (*n >= max) return ps_cli_usage(err, "%s %s: too many entries", flag, value);
            out[(*n)++] = (int)x;
        }
        if (*end == ',') end++;
        else if (*end) return ps_cli_usage(err, "%s %s: expected a list like 0,2,5-7", flag, value);
        p = end;
    }
    if (*n == 0) return ps_cli_usage(err, "%s: empty list", flag);
    return 0;
}

int ps_cli_model_dir(const char *flag_value, char *out, size_t n, ps_error *err) {
    const char *dir = flag_value ? flag_value : PS_SOURCE_DIR "/data/models/default";
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (!flag_value)
            return ps_fail(err, "--model not given and no shipped default model at %s", dir);
        return ps_fail(err, "--model %s: no such directory", dir);
    }
    if (!S_ISDIR(st.st_mode)) return ps_fail(err, "--model %s: not a directory (a checkpoint is a directory holding config.json and model.safetensors)", dir);
    if ((size_t)snprintf(out, n, "%s", dir) >= n) return ps_fail(err, "--model: path too long");
    /* check before loading: a directory without config.json is not a checkpoint at all */
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (stat(cfg, &st) != 0) return ps_fail(err, "%s is not a model directory (no config.json)", dir);
    return 0;
}

void ps_cli_default_model_note(const char *flag_value, char *out, size_t n) {
    if (!n) return;
    out[0] = '\0';
    if (flag_value) return;
    const char *dir = PS_SOURCE_DIR "/data/models/default";
    char target[4096];
    ssize_t l = readlink(dir, target, sizeof target - 1);
    if (l > 0) {
        target[l] = '\0';
        snprintf(out, n, "the default model %s (-> %s)", dir, target);
    } else
        snprintf(out, n, "the default model %s", dir);
}

bool ps_cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

char *ps_cli_command_line(int argc, char **argv) {
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) + 3;
    char *s = malloc(n);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < argc; i++) {
        if (i) strcat(s, " ");
        strcat(s, argv[i]);
    }
    return s;
}
