/* commands.h — the non-instrument commands' modules (generate, tokenize, forward, init, info, grad): each a
 * request struct of its flags' values and the one call its command file makes (instruments/exec_NAME.c: the
 * loading, the work and the writing of outputs). The cmd_NAME.c files parse and check their flags, fill the
 * request and make that call; the call's messages, errors and outputs are the command's. */
#ifndef PS_COMMANDS_H
#define PS_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/model.h"
#include "instruments/command.h"

/* ---- generate (exec_generate.c) ---- */
typedef struct {
    const char *model;     /* --model DIR, or NULL: the shipped default */
    const char *prompt;    /* --prompt TEXT (with tokenizer), or NULL: tokens */
    const char *tokenizer; /* --tokenizer FILE, or NULL */
    const char *tokens;    /* --tokens T.json, or NULL: prompt */
    const char *hooks;     /* --hooks NAMES (comma-separated), or NULL */
    const char *edits;     /* --edit SPECS (comma-separated), or NULL */
    const char *out_dir;   /* --out DIR, or NULL: the text on stdout only */
    int64_t max_tokens;    /* --max-tokens (default 32) */
    int64_t seed;          /* --seed (default 0) */
    double temperature;    /* --temperature (default 0: greedy) */
    double top_p;          /* --top-p (default 1) */
    const char *backend;   /* --device / --backend NAME (checked by the scaffold), or NULL: the cpu */
    int stop[64];          /* --stop IDS: a sequence stops after generating one of them */
    int n_stop;
} ps_generate_req;

/* Opens the model, tokenizes or loads the prompts, records the hooks asked for, generates through the KV
 * cache (core/generate.h) and prints the text; with out_dir writes generate.json (provenance from args'
 * command line) and, with hooks, hooks.safetensors. 0, or -1 with err set (a usage error for a bad --prompt,
 * --edit or --hooks). */
int ps_generate_command(const ps_args *args, const ps_generate_req *r, ps_error *err);

/* ---- tokenize (exec_tokenize.c) ---- */
typedef struct {
    const char *tokenizer; /* --tokenizer FILE: the model's tokenizer.json */
    const char *in;        /* --in FILE: a JSON list of strings (of id lists when decode) */
    const char *out;       /* --out FILE, written atomically */
    bool decode;           /* --decode: ids to strings */
    bool add_special;      /* --add-special (encoding only) */
    bool skip_special;     /* --skip-special (decode only) */
} ps_tokenize_req;

/* Reads the input list, loads the tokenizer, encodes (or decodes) every item, writes the output and prints
 * "encoded|decoded N strings|id lists, T tokens (R tokens/s) -> OUT". 0, or nonzero with err set naming the
 * file and the item. */
int ps_tokenize_command(const ps_tokenize_req *r, ps_error *err);

/* ---- forward (exec_forward.c) ---- */
typedef struct {
    const char *model;   /* --model DIR, or NULL: the shipped default */
    const char *tokens;  /* --tokens T.json */
    const char *hooks;   /* --hooks NAMES (comma-separated), or NULL */
    const char *out;     /* --out OUT.safetensors */
    const char *layers;  /* --layers "0..L" as given (DeepSeek-V4), or NULL */
    int lazy;            /* --lazy (DeepSeek-V4) */
    const char *backend; /* --backend / --device */
} ps_forward_req;

/* Opens the checkpoint through the public API, checks the hook names against its table, runs every
 * sequence on its own and writes logits.{i} and {hook}.{i} to out. 0, or -1 with err set (a usage error
 * for a bad --layers, --lazy or --hooks). */
int ps_forward_command(const ps_forward_req *r, ps_error *err);

/* ---- init (exec_init.c) ---- */
typedef struct {
    const char *config; /* --config FILE (a model or a training config), or NULL: from */
    const char *from;   /* --from DIR (copy that checkpoint), or NULL: config */
    const char *out;    /* --out DIR */
    int64_t seed;       /* --seed (config only; default 0) */
    ps_save_opts save;  /* --format, --dtype, --shard-mb */
} ps_init_req;

/* Writes out: the checkpoint from (loaded, saved with save), or a model created from config and initialised
 * with seed (its training config's task stored as metadata phasescope.task); prints "wrote OUT (...)". 0, or
 * nonzero with err set. */
int ps_init_command(const ps_init_req *r, ps_error *err);

/* ---- info (exec_info.c) ---- */
typedef struct {
    const char *model;   /* --model DIR, or NULL: the shipped default */
    int64_t batch;       /* --batch B of the memory estimates (default 1) */
    const char *backend; /* --backend / --device */
} ps_info_req;

/* Prints the family's description of the checkpoint (with the content chunks measured on its task), its
 * hook-point table and the compute environment. 0, or -1 with err set. */
int ps_info_command(const ps_info_req *r, ps_error *err);

/* ---- grad (exec_grad.c) ---- */
typedef struct {
    const char *model;   /* --model DIR, or NULL: the shipped default */
    const char *tokens;  /* --tokens T.json */
    const char *targets; /* --targets Y.json (same shape; -1 or null: no target) */
    const char *out;     /* --out GRADS.safetensors */
    const char *backend; /* --backend / --device */
} ps_grad_req;

/* Runs every sequence on its own, accumulates the gradient of the mean cross-entropy over all target
 * positions for every checkpoint tensor and writes `loss` and the gradients to out. 0, or nonzero with err
 * set (the file and the sequence named). */
int ps_grad_command(const ps_grad_req *r, ps_error *err);

/* ---- serve (exec_serve.c; the server itself is serve/serve.h) ----
 * A server's options by name: the one table that `phasescope serve`'s flags (--max-batch N) and the public
 * API's options JSON (ps_api_serve_start: {"max_batch": N}) are read through, so the two are the same set
 * with the same ranges and messages. The defaults are ps_serve_defaults'. Built without libmicrohttpd
 * (PS_HAVE_SERVE unset) the table is empty (the command and ps_api_serve_start say the build has no server). */
struct ps_serve_opts;
enum { PS_SERVE_OPT_TEXT = 1, PS_SERVE_OPT_I64, PS_SERVE_OPT_INT };
typedef struct {
    const char *key;  /* "max_batch": the options key */
    const char *flag; /* "--max-batch": the flag */
    int kind;         /* PS_SERVE_OPT_TEXT: a string (host, tokenizer, name); else an integer in [lo, hi], an int64_t
                       * (_I64) or an int (_INT) field */
    int64_t lo, hi;
    size_t offset;    /* of its field in ps_serve_opts */
} ps_serve_option;
extern const ps_serve_option ps_serve_options[]; /* host, port, tokenizer, name, max_body, ... ending with {0} */

/* The option named key ("max_batch" or "max-batch"), or NULL. */
const ps_serve_option *ps_serve_option_find(const char *key);
/* Sets option p of o from its text value (a string option keeps the pointer: value must outlive o). A usage
 * error naming the flag for a value that is not an integer in [lo, hi] or (host) not an IPv4 address. */
int ps_serve_option_set(struct ps_serve_opts *o, const ps_serve_option *p, const char *value, ps_error *err);

#endif
