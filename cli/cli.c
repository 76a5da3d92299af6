/* cli.c — the program's command line (cli/cli.h): argv parsed into a command's request (the library's
 * ps_args_set: the same keys, checks and messages as the API's JSON requests), --help generated from the
 * table, the error line and the exit status. */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaleout/dist.h"

static bool wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

/* The k-th entry of a command's flag table. */
static const ps_flag_spec *spec(const ps_command *cmd, int k) { return cmd->flags + k; }

/* Parses argv[1..] into a: "--flag value", "--flag=value", switches, positional arguments. */
static int parse(ps_args *a, ps_error *err) {
    const ps_command *cmd = a->cmd;
    for (int i = 1; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (strncmp(s, "--", 2) != 0 || s[2] == '\0') {
            if (ps_args_add_positional(a, s, err)) return -1;
            continue;
        }
        const char *eq = strchr(s, '=');
        char name[128];
        size_t nlen = eq ? (size_t)(eq - s) : strlen(s);
        snprintf(name, sizeof name, "%.*s", (int)(nlen < sizeof name ? nlen : sizeof name - 1), s);
        const ps_flag_spec *f = NULL;
        for (int j = 0; j < a->n_flags; j++)
            if (!strcmp(spec(cmd, j)->name, name)) f = spec(cmd, j);
        const char *value = NULL;
        if (f && f->value) {
            if (eq) value = eq + 1;
            else if (i + 1 < a->argc) value = a->argv[++i];
        } else if (eq)
            value = eq + 1;
        if (ps_args_set(a, name, value, err)) return -1;
    }
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
    int nf = ps_command_n_flags(cmd);
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
    ps_args a;
    if (ps_args_init(&a, cmd, call, err)) return -1;
    a.argc = argc;
    a.argv = argv;
    int rc = parse(&a, err) || ps_command_run(&a, err) ? -1 : 0;
    ps_args_free(&a);
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

