/* args.c — the CLI module's flag readers (experiments/cli.h): what a command's run function calls to read
 * its parsed flags (ps_args_*) and to check a value (ps_cli_int, ps_cli_int_list, ps_cli_model_dir),
 * with the usage errors they fail with. cli.c holds the scaffold that parses argv and calls run. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experiments/cli.h"

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

static char *command_line(int argc, char **argv) {
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

static int flag_index(const ps_args *a, const char *name) {
    for (int k = 0; k < a->n_flags; k++)
        if (!strcmp(a->cmd->flags[k].name, name)) return k;
    fprintf(stderr, "phasescope %s: internal error: the command has no flag %s\n", a->cmd->name, name);
    abort();
}

const char *ps_args_get(const ps_args *a, const char *name) { return a->value[flag_index(a, name)]; }

bool ps_args_has(const ps_args *a, const char *name) { return a->present[flag_index(a, name)]; }

int ps_args_int(const ps_args *a, const char *name, int64_t lo, int64_t hi, int64_t *out, ps_error *err) {
    const char *v = ps_args_get(a, name);
    return v ? ps_cli_int(name, v, lo, hi, out, err) : 0;
}

int ps_args_positive(const ps_args *a, const char *name, double max, double *out, ps_error *err) {
    const char *v = ps_args_get(a, name);
    double x;
    if (!v) return 0;
    if (sscanf(v, "%lf", &x) != 1 || !(x > 0) || x > max) return ps_cli_usage(err, "%s %s: expected a positive number", name, v);
    *out = x;
    return 0;
}

int ps_args_choice(const ps_args *a, const char *name, const char *const *choices, int *idx, ps_error *err) {
    const char *v = ps_args_get(a, name);
    if (!v) return 0;
    int n = 0;
    for (; choices[n]; n++)
        if (!strcmp(choices[n], v)) {
            *idx = n;
            return 0;
        }
    char list[512];
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    return ps_cli_usage(err, "%s %s: expected %s", name, v, list);
}

const char *ps_args_backend(const ps_args *a) {
    const char *v = ps_args_get(a, "--backend");
    if (!v) v = ps_args_get(a, "--device");
    return v ? v : PS_BACKEND_DEFAULT;
}

char *ps_args_command_line(const ps_args *a) { return command_line(a->argc, a->argv); }
