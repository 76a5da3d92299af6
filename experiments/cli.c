/* cli.c — the command scaffold (experiments/cli.h): parses argv against a command's flag table, prints
 * --help, checks --backend / --precision and calls the command's run; args.c holds the flag readers run uses. */
#define _POSIX_C_SOURCE 200809L
#include "experiments/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scaleout/dist.h"

int ps_cli_status(const ps_error *err) { return err && err->usage ? 2 : 1; }

/* ---- the command scaffold ---- */

static bool wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

/* The k-th entry of a command's flag table (the scaffold is the only code that walks it by position). */
static const ps_flag_spec *spec(const ps_command *cmd, int k) { return cmd->flags + k; }

static int n_specs(const ps_command *cmd) {
    int n = 0;
    while (cmd->flags && spec(cmd, n)->name) n++;
    return n;
}

/* Parses argv[1..] into a: "--flag value", "--flag=value", switches, positional arguments. */
static int parse(ps_args *a, ps_error *err) {
    const ps_command *cmd = a->cmd;
    for (int i = 1; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (strncmp(s, "--", 2) != 0 || s[2] == '\0') {
            if (a->n_pos >= cmd->max_positional) return ps_cli_usage(err, "unexpected argument \"%s\"", s);
            a->pos[a->n_pos++] = s;
            continue;
        }
        const char *eq = strchr(s, '=');
        size_t nlen = eq ? (size_t)(eq - s) : strlen(s);
        int k = -1;
        for (int j = 0; j < a->n_flags; j++)
            if (strlen(spec(cmd, j)->name) == nlen && !strncmp(spec(cmd, j)->name, s, nlen)) k = j;
        if (k < 0) return ps_cli_usage(err, "unknown flag %.*s (see --help)", (int)nlen, s);
        const ps_flag_spec *f = spec(cmd, k);
        if (a->present[k]) return ps_cli_usage(err, "flag %s given twice", f->name);
        a->present[k] = 1;
        if (f->value) {
            if (eq) a->value[k] = eq + 1;
            else if (i + 1 < a->argc) a->value[k] = a->argv[++i];
            else return ps_cli_usage(err, "flag %s needs a value", f->name);
        } else if (eq)
            return ps_cli_usage(err, "flag %s takes no value", f->name);
    }
    for (int k = 0; k < a->n_flags; k++)
        if (spec(cmd, k)->required && !a->present[k]) return ps_cli_usage(err, "%s is required", spec(cmd, k)->name);
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

/* A help text of several lines, each after the first indented by `indent` columns. */
static void put_lines(FILE *f, const char *text, int indent) {
    for (const char *p = text; *p;) {
        size_t l = strcspn(p, "\n");
        fprintf(f, "%.*s\n", (int)l, p);
        p += l;
        if (*p == '\n' && *++p) fprintf(f, "%*s", indent, "");
    }
}

void ps_command_help(const ps_command *cmd, FILE *f) {
    int nf = n_specs(cmd);
    if (cmd->synopsis) {
        fputs("usage: ", f);
        put_lines(f, cmd->synopsis, 7);
    } else {
        /* generated: positional arguments, then every flag in table order ([optional]), wrapped */
        enum { WIDTH = 110 };
        int col = fprintf(f, "usage: phasescope %s", cmd->name), indent = col + 1;
        for (int k = -1; k < nf; k++) {
            char tok[256];
            if (k < 0) {
                if (!cmd->positional) continue;
                snprintf(tok, sizeof tok, "%s", cmd->positional);
            } else {
                const ps_flag_spec *s = spec(cmd, k);
                snprintf(tok, sizeof tok, "%s%s%s%s%s", s->required ? "" : "[", s->name, s->value ? " " : "",
                         s->value ? s->value : "", s->required ? "" : "]");
            }
            int l = (int)strlen(tok);
            if (col + 1 + l > WIDTH && col > indent) col = fprintf(f, "\n%*s", indent - 1, "") - 1;
            col += fprintf(f, " %s", tok);
        }
        fputc('\n', f);
    }
    if (cmd->description) {
        fputc('\n', f);
        fputs(cmd->description, f);
    }
    if (nf) {
        /* flags: "  --name VALUE  help", the help aligned; a longer name and value get a line of their own */
        enum { MAXW = 22 };
        int w = 0;
        for (int k = 0; k < nf; k++) {
            const ps_flag_spec *s = spec(cmd, k);
            int l = (int)strlen(s->name) + (s->value ? 1 + (int)strlen(s->value) : 0);
            if (l <= MAXW && l > w) w = l;
        }
        fputc('\n', f);
        for (int k = 0; k < nf; k++) {
            const ps_flag_spec *s = spec(cmd, k);
            char text[256];
            snprintf(text, sizeof text, "%s%s%s", s->name, s->value ? " " : "", s->value ? s->value : "");
            if ((int)strlen(text) > w) fprintf(f, "  %s\n%*s", text, w + 4, "");
            else fprintf(f, "  %-*s  ", w, text);
            put_lines(f, s->help ? s->help : "", w + 4);
        }
    }
}

int ps_command_call(const ps_command *cmd, int argc, char **argv, const ps_call *call, ps_error *err) {
    ps_call none = {0};
    if (!call) call = &none;
    ps_args a = {.cmd = cmd, .argc = argc, .argv = argv, .n_flags = n_specs(cmd), .progress = call->progress,
                 .progress_user = call->progress_user, .rt = call->rt, .families = call->families, .prompts = call->prompts, .sink = call->sink};
    if (a.n_flags > PS_MAX_FLAGS) return ps_fail(err, "internal error: %d flags, more than %d", a.n_flags, PS_MAX_FLAGS);
    a.pos = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *a.pos);
    int rc;
    if (!a.pos) rc = ps_fail(err, "out of memory");
    else rc = parse(&a, err) || check_backend(&a, err) || cmd->run(&a, err) ? -1 : 0;
    free(a.pos);
    return rc;
}

int ps_command_main(const ps_command *cmd, int argc, char **argv) {
    if (wants_help(argc, argv)) {
        if (ps_dist_rank() == 0) ps_command_help(cmd, stdout); /* under MPI, once */
        return 0;
    }
    ps_error err = {0};
    int rc = ps_command_call(cmd, argc, argv, NULL, &err);
    if (!rc) return 0;
    /* under MPI: an error every rank has (a usage error, or one the ranks agreed on) is printed by rank 0;
     * one only this rank saw names the rank */
    if (ps_dist_rank() == 0) fprintf(stderr, "phasescope %s: %s\n", cmd->name, err.msg);
    else if (!err.usage && !ps_dist_error_shared())
        fprintf(stderr, "phasescope %s: rank %d of %d: %s\n", cmd->name, ps_dist_rank(), ps_dist_size(), err.msg);
    return ps_cli_status(&err);
}

