/* main.c — the `phasescope` program: dispatches to a subcommand, either as `phasescope CMD ...` or
 * when installed under the subcommand's own name (`forward ...`). */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cpu_env.h"

/* in the order `phasescope --help` lists them; each command's table holds its name and summary */
static const ps_command *const CMDS[] = {
    &ps_cmd_train,
    &ps_cmd_sweep,
    &ps_cmd_knockout,
    &ps_cmd_gatecycle,
    &ps_cmd_gates,
    &ps_cmd_fillers,
    &ps_cmd_render,
    &ps_cmd_theory,
    &ps_cmd_table,
    &ps_cmd_init,
    &ps_cmd_info,
    &ps_cmd_forward,
    &ps_cmd_grad,
    &ps_cmd_tokenize,
};
#define N_CMDS (int)(sizeof CMDS / sizeof CMDS[0])

static void usage(FILE *f) {
    fprintf(f, "phasescope %s — phase sensitivity of compressed-KV-cache transformers\n\nusage: phasescope COMMAND [FLAGS]\n\ncommands:\n", PS_VERSION);
    for (int i = 0; i < N_CMDS; i++) fprintf(f, "  %-10s %s\n", CMDS[i]->name, CMDS[i]->summary);
    fprintf(f, "\n`phasescope COMMAND --help` describes each command.\n");
}

int main(int argc, char **argv) {
    /* a file-size limit (ulimit -f) makes writes fail with EFBIG, reported as an error, instead of a kill */
    signal(SIGXFSZ, SIG_IGN);
    /* BLAS kernels that match the CPU and a passive OpenMP wait policy; may re-execute the program once */
    char warning[PS_ERROR_MAX + 64];
    ps_cpu_env_prepare(argv, warning, sizeof warning);
    if (warning[0]) fprintf(stderr, "%s\n", warning);
    char self[4096];
    snprintf(self, sizeof self, "%s", argv[0]);
    const char *base = basename(self);
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(base, CMDS[i]->name)) return ps_command_main(CMDS[i], argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("phasescope %s\n", PS_VERSION);
        return 0;
    }
    for (int i = 0; i < N_CMDS; i++)
        if (!strcmp(argv[1], CMDS[i]->name)) return ps_command_main(CMDS[i], argc - 1, argv + 1);
    fprintf(stderr, "phasescope: unknown command \"%s\" (see phasescope --help)\n", argv[1]);
    return 2;
}
