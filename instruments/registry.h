/* registry.h — the one table of phasescope's commands (instruments/registry.c): for each, its command
 * table (name, summary, flags, run: instruments/command.h), how its partial results are finished (merge), the
 * kind and file of the result it writes, whether its work splits over shards and MPI ranks, and whether
 * the public API runs it as an instrument (include/phasescope.h, ps_api_instrument).
 *
 * Every reader takes what it needs from here: `phasescope --help` and the dispatch (main.c), the commands
 * that run under an MPI launcher (main.c), `phasescope merge` (cmd_merge.c), the per-subcommand links of
 * the build (`phasescope --commands`, scripts/command_links.cmake), the API's instrument calls and their
 * list (api/instr_call.c). A kind named here is a result kind of viz/kinds.c (tests/test_api.c checks
 * every one). Adding an instrument: docs/design.md, "Adding an instrument". */
#ifndef PS_REGISTRY_H
#define PS_REGISTRY_H

#include "core/error.h"
#include "scaleout/partial.h"
#include "instruments/command.h"
#include "instruments/result_out.h"

typedef struct {
    const ps_command *cmd; /* name, summary, flags, run */
    /* the result from complete partial results (rank 0 of a run, or `phasescope merge`); NULL: the
     * command writes no partial results */
    int (*finish)(const ps_partial *p, const ps_out *out, ps_error *err);
    const char *kind;      /* the "kind" of the result JSON it writes (viz/kinds.c), or NULL (none, or it varies) */
    const char *result;    /* the result's file name in --out DIR, or NULL (none, or it varies: the API
                            * takes the one JSON file the run wrote) */
    int splits;            /* 1: --shard I/N and MPI ranks split its work (docs/scale-out.md) */
    int instrument;        /* 1: ps_api_instrument runs it (a request of its flags) */
    int changes_model;     /* 1: its run changes the model's weights (gatecycle's cycle): ps_api_instrument opens a
                            * copy of the checkpoint for it instead of running it on the caller's model handle */
} ps_registry_entry;

/* The commands, in the order `phasescope --help` lists them. */
extern const ps_registry_entry ps_registry[];
extern const int ps_registry_n;

/* The entry of command `name`, or NULL. */
const ps_registry_entry *ps_registry_find(const char *name);

#endif
