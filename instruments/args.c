/* args.c — the CLI module's flag readers (instruments/command.h): what a command's run function calls to read
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

#include "core/names.h"
#include "instruments/command.h"

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
    return v ? ps_choice(name, v, choices, idx, err) : 0;
}

const char *ps_args_backend(const ps_args *a) {
    const char *v = ps_args_get(a, "--backend");
    if (!v) v = ps_args_get(a, "--device");
    return v ? v : PS_BACKEND_DEFAULT;
}

char *ps_args_command_line(const ps_args *a) { return command_line(a->argc, a->argv); }

/* ---- a request: its keys set one by one (from a command line or a JSON request), checked and run ---- */

/* The k-th entry of a command's flag table (the scaffold is the only code that walks it by position). */
static const ps_flag_spec *spec(const ps_command *cmd, int k) { return cmd->flags + k; }

int ps_command_n_flags(const ps_command *cmd) {
    int n = 0;
    while (cmd->flags && spec(cmd, n)->name) n++;
    return n;
}


int ps_args_init(ps_args *a, const ps_command *cmd, const ps_call *call, ps_error *err) {
    ps_call none = {0};
    if (!call) call = &none;
    memset(a, 0, sizeof *a);
    *a = (ps_args){.cmd = cmd, .n_flags = ps_command_n_flags(cmd), .progress = call->progress, .progress_user = call->progress_user,
                   .rt = call->rt, .families = call->families, .prompts = call->prompts, .corrupt = call->corrupt, .sink = call->sink};
    if (a->n_flags > PS_MAX_FLAGS) return ps_fail(err, "internal error: %d flags, more than %d", a->n_flags, PS_MAX_FLAGS);
    a->pos = calloc((size_t)(cmd->max_positional > 0 ? cmd->max_positional : 1), sizeof *a->pos);
    return a->pos ? 0 : ps_fail(err, "out of memory");
}

void ps_args_free(ps_args *a) {
    free(a->pos);
    a->pos = NULL;
}

int ps_args_set(ps_args *a, const char *flag, const char *value, ps_error *err) {
    const ps_command *cmd = a->cmd;
    int k = -1;
    for (int j = 0; j < a->n_flags; j++)
        if (!strcmp(spec(cmd, j)->name, flag)) k = j;
    if (k < 0) return ps_cli_usage(err, "unknown flag %s (see --help)", flag);
    const ps_flag_spec *f = spec(cmd, k);
    if (a->present[k]) return ps_cli_usage(err, "flag %s given twice", f->name);
    if (f->value && !value) return ps_cli_usage(err, "flag %s needs a value", f->name);
    if (!f->value && value) return ps_cli_usage(err, "flag %s takes no value", f->name);
    a->present[k] = 1;
    a->value[k] = value;
    return 0;
}

int ps_args_add_positional(ps_args *a, const char *value, ps_error *err) {
    if (a->n_pos >= a->cmd->max_positional) return ps_cli_usage(err, "unexpected argument \"%s\"", value);
    a->pos[a->n_pos++] = value;
    return 0;
}

/* --backend (or its alias --device) must name a backend of this build (PS_BACKENDS_TEXT, comma-separated);
 * --precision must be fp32, tf32 or bf16, and fp32 on the cpu. Sets the precision new contexts get. */
static int check_backend(const ps_args *a, ps_error *err) {
    const char *v = NULL, *flag = "--backend", *prec = NULL;
    int n_given = 0;
    for (int k = 0; k < a->n_flags; k++) {
        const char *name = spec(a->cmd, k)->name;
        if ((!strcmp(name, "--backend") || !strcmp(name, "--device")) && a->value[k]) {
            v = a->value[k], flag = name;
            n_given++;
        }
        if (!strcmp(name, "--precision")) prec = a->value[k];
    }
    if (n_given > 1) return ps_cli_usage(err, "--device and --backend name the same thing: give one");
    int p = PS_PREC_FP32;
    if (prec && ps_precision_parse(prec, &p)) return ps_cli_usage(err, "--precision %s: expected fp32, tf32 or bf16", prec);
    if (v) {
        size_t n = strlen(v);
        int found = 0;
        for (const char *q = ps_ctx_backends(); *q && !found;) {
            size_t l = strcspn(q, ",");
            found = l == n && !strncmp(q, v, n);
            q += l;
            while (*q == ',' || *q == ' ') q++;
        }
        if (!found) return ps_cli_usage(err, "%s %s: this build has no such backend (it has: %s)", flag, v, ps_ctx_backends());
    }
    if (p != PS_PREC_FP32 && (!v || !strcmp(v, "cpu")))
        return ps_cli_usage(err, "--precision %s: the cpu backend computes in fp32 only", prec);
    ps_ctx_default_precision(p);
    return 0;
}

int ps_command_run(ps_args *a, ps_error *err) {
    for (int k = 0; k < a->n_flags; k++)
        if (spec(a->cmd, k)->required && !a->present[k]) return ps_cli_usage(err, "%s is required", spec(a->cmd, k)->name);
    return check_backend(a, err) || a->cmd->run(a, err) ? -1 : 0;
}
int ps_cli_status(const ps_error *err) { return err && err->usage ? 2 : 1; }
