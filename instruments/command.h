/* command.h — what every command and instrument is: a table (name, summary, its keys as flags with their help,
 * a run function) and a request (ps_args: the keys' values, read by name), filled either from a command line
 * (cli/cli.c, the program) or from a JSON request (api/instr_call.c, the library: no command line there) through
 * ps_args_set, checked and run by ps_command_run; integer values with one-line errors naming the bad key, and
 * model resolution (the shipped default when --model is absent). */
#ifndef PS_COMMAND_H
#define PS_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/ctx.h"
#include "core/error.h"

struct ps_runtime; /* core/runtime.h: an open checkpoint and a model family's table */
struct ps_family;

/* ---- the command scaffold ----
 *
 * A command is a table (ps_command): its name, a one-line summary, its usage text, its flags with their
 * help and whether each takes a value or is required, its positional arguments, and a run function. The flag
 * table is the one list of a command's keys: the CLI's flags and --help, the API's request keys
 * (ps_api_instruments_json) and Python's keywords. The program (cli/cli.h, ps_command_main) does the rest for
 * every command alike: --help / -h (anywhere on the line; the help is
 * generated from the table), parsing ("--flag value" and "--flag=value"), the usage errors (unknown flag,
 * flag given twice, missing value, value given to a switch, unexpected positional argument, missing
 * required flag, unknown --backend), the error line "phasescope CMD: message" on stderr and the exit
 * status (0; 2 for a usage error; 1 for any other error, see ps_cli_status). The run function reads its
 * flags by name (ps_args_get, ps_args_int, ...) and returns 0, or nonzero with err set. docs/design.md,
 * "Commands", shows how to add one. */

typedef struct {
    const char *name;  /* "--layer" */
    const char *value; /* the value's placeholder in the help ("L", "pad|move"); NULL for a switch */
    const char *help;  /* one line per '\n', aligned under each other in --help */
    int required;      /* 1: "--layer is required" (exit 2) when absent */
} ps_flag_spec;

/* The flags every command that runs a model takes (three table entries): --backend NAME (default "cpu"),
 * its alias --device NAME (the same flag under the name a GPU user looks for; give one of the two), and
 * --precision fp32|tf32|bf16 (the matrix products of a device backend; docs/cuda.md). PS_BACKENDS_TEXT:
 * the backends this build has (comma-separated); anything else is a usage error, and so is a precision
 * other than fp32 on the cpu backend. The scaffold checks them and sets the precision contexts start
 * with (ps_ctx_default_precision). */
#define PS_BACKEND_DEFAULT "cpu"
#define PS_BACKEND_FLAG                                                                                           \
    {"--backend", "NAME", "compute backend (default " PS_BACKEND_DEFAULT "; this build has: " PS_BACKENDS_TEXT ")", 0}, \
    {"--device", "NAME", "the same as --backend (cpu" PS_DEVICE_CUDA_TEXT ")", 0},                                  \
    {"--precision", "P", "matrix products on a device: fp32 (default), tf32 or bf16 (the cpu computes in fp32)", 0}
#ifdef PS_HAVE_CUDA
#define PS_DEVICE_CUDA_TEXT "|cuda"
#else
#define PS_DEVICE_CUDA_TEXT ""
#endif

typedef struct ps_args ps_args;

typedef struct {
    const char *name;        /* "gatecycle" */
    const char *summary;     /* one line for `phasescope --help` */
    const char *synopsis;    /* NULL: the usage line is generated from the flags; else the forms after
                              * "usage: " (several lines for commands with alternative forms) */
    const char *description; /* what the command does: the help between the usage line and the flags */
    const char *positional;  /* placeholder of the positional arguments ("RESULT.json [MORE.json ...]"), or NULL */
    int max_positional;      /* how many positional arguments are accepted (0: none) */
    const ps_flag_spec *flags; /* the flags, in help order, ending with {0} */
    int (*run)(const ps_args *a, ps_error *err);
} ps_command;

/* A caller's progress callback (a command run through the public API, ps_api_set_progress): done of total
 * units of the command's work (batches, shifts, candidates, steps), called at each unit's end; 0 goes on,
 * non-zero stops the command there (it fails with "cancelled after ..."). The same type as the engines'
 * ps_progress_fn (interventions/sweep.h). */
typedef int (*ps_cli_progress_fn)(int64_t done, int64_t total, void *user);

/* What the scaffold parsed, handed to the run function. Flags are read by name only. */
#define PS_MAX_FLAGS 48
struct ps_args {
    const ps_command *cmd;
    int argc;
    char **argv;      /* the command line's words (argv[0] is the command), for provenance only: the CLI's argv, or
                       * the words a request stands for (the API) */
    const char **pos; /* positional arguments in order */
    int n_pos;
    int n_flags;
    const char *value[PS_MAX_FLAGS]; /* parallel to cmd->flags */
    unsigned char present[PS_MAX_FLAGS];
    ps_cli_progress_fn progress;     /* the caller's (ps_command_call), or NULL (the CLI) */
    void *progress_user;
    /* the checkpoint --model names, already open (the API's model handle: ps_command_call's ps_call.rt), or
     * NULL: the command opens --model itself. A command that runs on it copies the runtime and never frees it. */
    const struct ps_runtime *rt;
    const struct ps_family *const *families; /* the families --model is tried with (NULL: core's ps_families) */
    /* the caller's prompt set (the API's request key "prompts", interventions/promptset.h), or NULL: a
     * command whose table has --prompts reads the file it names, if any */
    const struct ps_promptset_s *prompts;
    /* the caller's corrupt tokens (the API's request key "corrupt" given inline, interventions/promptset.h), or
     * NULL: a command whose table has --corrupt reads the file it names */
    const struct ps_token_set_s *corrupt;
    /* a library call's sink (instruments/result_out.h): the results kept in memory, nothing written or printed;
     * NULL: the CLI */
    struct ps_result_sink *sink;
};

/* What a caller of a command hands it besides argv (every field may be 0): its progress callback, the
 * checkpoint already open (ps_args.rt) and the family list (ps_args.families). */
typedef struct {
    ps_cli_progress_fn progress;
    void *progress_user;
    const struct ps_runtime *rt;
    const struct ps_family *const *families;
    const struct ps_promptset_s *prompts;
    const struct ps_token_set_s *corrupt;
    struct ps_result_sink *sink;
} ps_call;

/* A request of cmd with nothing set yet and the caller's call (NULL: none); ps_args_free frees it. */
int ps_args_init(ps_args *a, const ps_command *cmd, const ps_call *call, ps_error *err);
void ps_args_free(ps_args *a);
/* Set key `flag` ("--layers") to value (NULL for a switch): usage errors for an unknown key ("unknown flag
 * --x (see --help)"), one given twice, a missing value, a value given to a switch. */
int ps_args_set(ps_args *a, const char *flag, const char *value, ps_error *err);
/* A positional argument (beyond the command's max_positional: "unexpected argument"). */
int ps_args_add_positional(ps_args *a, const char *value, ps_error *err);
/* Check the request (a missing required key; --backend / --device / --precision against this build) and run the
 * command: 0, or -1 with err set (err->usage for a usage error). */
int ps_command_run(ps_args *a, ps_error *err);
/* The flags of a command's table, in order (n of them). */
int ps_command_n_flags(const ps_command *cmd);

/* The flag's value, or NULL when absent (or a switch). Naming a flag the command's table lacks is a
 * programming error: the program says so and aborts. */
const char *ps_args_get(const ps_args *a, const char *name);
/* Whether the flag was given (a switch, or a flag with its value). */
bool ps_args_has(const ps_args *a, const char *name);
/* An integer flag in [lo, hi] (ps_cli_int's errors); *out is left alone when the flag is absent. */
int ps_args_int(const ps_args *a, const char *name, int64_t lo, int64_t hi, int64_t *out, ps_error *err);
/* A positive number no larger than max: "--lr x: expected a positive number"; *out left alone when absent. */
int ps_args_positive(const ps_args *a, const char *name, double max, double *out, ps_error *err);
/* One of the names in choices (ending with NULL): *idx gets its index; "--mode x: expected pad or move"
 * otherwise. *idx is left alone when the flag is absent. */
int ps_args_choice(const ps_args *a, const char *name, const char *const *choices, int *idx, ps_error *err);
/* The --backend (or --device) value ("cpu" when absent; the scaffold has checked it). */
const char *ps_args_backend(const ps_args *a);
/* The command line as one string (for provenance). Caller frees. */
char *ps_args_command_line(const ps_args *a);

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

/* When --model was not given: a description of the default model for error messages, e.g.
 * "the default model /src/data/models/default (w8s8)". Empty when a --model was given. */
void ps_cli_default_model_note(const char *flag_value, char *out, size_t n);

/* The commands (instruments/cmd_*.c). */
extern const ps_command ps_cmd_init;
extern const ps_command ps_cmd_train;
extern const ps_command ps_cmd_info;
extern const ps_command ps_cmd_forward;
extern const ps_command ps_cmd_grad;
extern const ps_command ps_cmd_sweep;
extern const ps_command ps_cmd_knockout;
extern const ps_command ps_cmd_recall;
extern const ps_command ps_cmd_patch;
extern const ps_command ps_cmd_gatecycle;
extern const ps_command ps_cmd_gates;
extern const ps_command ps_cmd_merge;
extern const ps_command ps_cmd_atp_compare;
extern const ps_command ps_cmd_render;
extern const ps_command ps_cmd_table;
extern const ps_command ps_cmd_theory;
extern const ps_command ps_cmd_tokenize;
extern const ps_command ps_cmd_fillers;
extern const ps_command ps_cmd_probe;
extern const ps_command ps_cmd_serve;
extern const ps_command ps_cmd_generate;

#endif
