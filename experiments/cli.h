/* cli.h — command-line plumbing shared by the subcommands: flag parsing with one-line errors naming
 * the bad flag, integer flag values, and model resolution (the shipped default when --model is absent). */
#ifndef PS_CLI_H
#define PS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct {
    const char *name;  /* "--model" */
    bool takes_value;
    const char *value; /* set by the parser */
    bool present;
} ps_flag;
#define PS_FLAG(n, v) {.name = (n), .takes_value = (v)}

/* Parses argv[1..] (argv[0] is the subcommand). Accepts "--flag value" and "--flag=value".
 * Positional arguments go to pos (at most max_pos). Unknown flags and missing values are errors. */
int ps_cli_parse(int argc, char **argv, ps_flag *flags, int n_flags, const char **pos, int max_pos, int *n_pos,
                 ps_error *err);
ps_flag *ps_cli_get(ps_flag *flags, int n_flags, const char *name);

/* Fail with "--NAME is required" unless every listed flag was given (names end with NULL). */
int ps_cli_require(const ps_flag *flags, int n_flags, ps_error *err, ...);

/* Parse an integer flag value within [lo, hi]; the error names the flag and the allowed range. */
int ps_cli_int(const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out, ps_error *err);

/* A list of integers in [lo, hi]: "0,2,5-7". *n gets the count (at most max). */
int ps_cli_int_list(const char *flag, const char *value, int64_t lo, int64_t hi, int *out, int max, int *n, ps_error *err);

/* The model directory: --model if given, else the shipped default under data/models/. A directory without
 * config.json is refused ("DIR is not a model directory (no config.json)") before anything is loaded. */
int ps_cli_model_dir(const char *flag_value, char *out, size_t n, ps_error *err);

/* Exit status of a failed command: 2 for a usage error (unknown flag, missing required flag or value, a
 * flag value the flag does not accept: every failure of the ps_cli_* parsers, and those the command marks
 * with ps_cli_usage), 1 for a runtime error (a file, a model, a computation). */
int ps_cli_status(const ps_error *err);
/* Fail with a usage error (exit status 2): the message names the flag. */
int ps_cli_usage(ps_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Mark the error already in err as a usage error. Returns -1. */
int ps_cli_mark_usage(ps_error *err);

/* True when help was asked for (--help or -h anywhere). */
bool ps_cli_wants_help(int argc, char **argv);

/* The command line as one string (for provenance). Caller frees. */
char *ps_cli_command_line(int argc, char **argv);

/* When --model was not given: a description of the default model for error messages, e.g.
 * "the default model /src/data/models/default (w8s8)". Empty when a --model was given. */
void ps_cli_default_model_note(const char *flag_value, char *out, size_t n);

int ps_cmd_init(int argc, char **argv);
int ps_cmd_train(int argc, char **argv);
int ps_cmd_info(int argc, char **argv);
int ps_cmd_forward(int argc, char **argv);
int ps_cmd_grad(int argc, char **argv);
int ps_cmd_sweep(int argc, char **argv);
int ps_cmd_knockout(int argc, char **argv);
int ps_cmd_gatecycle(int argc, char **argv);
int ps_cmd_gates(int argc, char **argv);
int ps_cmd_render(int argc, char **argv);
int ps_cmd_table(int argc, char **argv);
int ps_cmd_theory(int argc, char **argv);
int ps_cmd_tokenize(int argc, char **argv);

#endif
