/* main.c — the `phasescope` program: dispatches to a subcommand, either as `phasescope CMD ...` or
 * when installed under the subcommand's own name (`forward ...`). */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "experiments/cli.h"
#include "core/cpu_env.h"
#include "dist/dist.h"

/* in the order `phasescope --help` lists them; each command's table holds its name and summary */
static const ps_command *const CMDS[] = {
    &ps_cmd_train,
    &ps_cmd_sweep,
    &ps_cmd_knockout,
    &ps_cmd_gatecycle,
    &ps_cmd_gates,
    &ps_cmd_fillers,
    &ps_cmd_merge,
    &ps_cmd_atp_compare,
    &ps_cmd_render,
    &ps_cmd_theory,
    &ps_cmd_table,
    &ps_cmd_init,
    &ps_cmd_info,
    &ps_cmd_forward,
    &ps_cmd_grad,
    &ps_cmd_tokenize,
    &ps_cmd_probe,
    &ps_cmd_serve,
    &ps_cmd_generate,
};
#define N_CMDS (int)(sizeof CMDS / sizeof CMDS[0])

static void usage(FILE *f) {
    fprintf(f, "phasescope %s — phase sensitivity of compressed-KV-cache transformers\n\nusage: phasescope COMMAND [FLAGS]\n\ncommands:\n", PS_VERSION);
    for (int i = 0; i < N_CMDS; i++) fprintf(f, "  %-10s %s\n", CMDS[i]->name, CMDS[i]->summary);
    fprintf(f, "\n`phasescope COMMAND --help` describes each command.\n");
}

/* Under an MPI launcher with several ranks, only these commands split their work (docs/scale-out.md). */
static const char *const DISTRIBUTED[] = {"train", "sweep", "knockout", "gatecycle", "gates", NULL};

static int run_command(const ps_command *cmd, int argc, char **argv) {
    char label[64];
    snprintf(label, sizeof label, "phasescope %s", cmd->name);
    ps_dist_set_label(label);
    if (ps_dist_size() > 1) {
        int ok = 0;
        for (int i = 0; DISTRIBUTED[i]; i++) ok |= !strcmp(DISTRIBUTED[i], cmd->name);
        for (int i = 1; i < argc; i++) ok |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
        if (!ok) {
            if (ps_dist_rank() == 0)
                fprintf(stderr, "phasescope %s: runs as one process: under an MPI launcher (here %d ranks) only train, sweep, "
                                "knockout, gatecycle and gates split their work; run it without mpirun\n",
                        cmd->name, ps_dist_size());
            return ps_dist_exit(2, 1);
        }
    }
    int st = ps_command_main(cmd, argc, argv);
    return ps_dist_exit(st, st == 2);
}

int main(int argc, char **argv) {
    /* a file-size limit (ulimit -f) makes writes fail with EFBIG, reported as an error, instead of a kill */
    signal(SIGXFSZ, SIG_IGN);
    /* BLAS kernels that match the CPU and a passive OpenMP wait policy; may re-execute the program once */
    char warning[PS_ERROR_MAX + 64];
    ps_cpu_env_prepare(argv, warning, sizeof warning);
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    /* one rank of an MPI job when a launcher started us (a no-op otherwise) */
    ps_error derr = {0};
    if (ps_dist_init(&argc, &argv, &derr)) {
        fprintf(stderr, "phasescope: %s\n", derr.msg);
        return derr.usage ? 2 : 1;
    }
    char self[4096];
    snprintf(self, sizeof self, "%s", argv[0]);
    const char *base = basename(self);
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(base, CMDS[i]->name)) return run_command(CMDS[i], argc, argv);
    int quiet = ps_dist_rank() != 0; /* the top-level usage and errors: rank 0 says them */
    if (argc < 2) {
        if (!quiet) usage(stderr);
        return ps_dist_exit(2, 1);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (!quiet) usage(stdout);
        return ps_dist_exit(0, 0);
    }
    if (!strcmp(argv[1], "--version")) {
        if (!quiet) printf("phasescope %s\n", PS_VERSION);
        return ps_dist_exit(0, 0);
    }
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(argv[1], CMDS[i]->name)) return run_command(CMDS[i], argc - 1, argv + 1);
    if (!quiet) fprintf(stderr, "phasescope: unknown command \"%s\" (see phasescope --help)\n", argv[1]);
    return ps_dist_exit(2, 1);
}
