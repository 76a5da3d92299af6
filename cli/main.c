/* main.c — the `phasescope` program: dispatches to a subcommand, either as `phasescope CMD ...` or
 * when installed under the subcommand's own name (`forward ...`). */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "instruments/registry.h"
#include "core/cpu_env.h"
#include "scaleout/dist.h"

static void usage(FILE *f) {
    fprintf(f, "phasescope %s — phase sensitivity of compressed-KV-cache transformers\n\nusage: phasescope COMMAND [FLAGS]\n\ncommands:\n", PS_VERSION);
    for (int i = 0; i < ps_registry_n; i++) fprintf(f, "  %-10s %s\n", ps_registry[i].cmd->name, ps_registry[i].cmd->summary);
    fprintf(f, "\n`phasescope COMMAND --help` describes each command.\n");
}

/* The commands whose work splits (the registry's), "train, sweep, ... and gates". */
static void splitting_names(char *buf, size_t n) {
    int total = 0, k = 0;
    size_t o = 0;
    for (int i = 0; i < ps_registry_n; i++) total += ps_registry[i].splits;
    buf[0] = '\0';
    for (int i = 0; i < ps_registry_n && o < n; i++) {
        if (!ps_registry[i].splits) continue;
        int w = snprintf(buf + o, n - o, "%s%s", k == 0 ? "" : k == total - 1 ? " and " : ", ", ps_registry[i].cmd->name);
        if (w < 0) break;
        o += (size_t)w, k++;
    }
}

static int run_command(const ps_registry_entry *e, int argc, char **argv) {
    const ps_command *cmd = e->cmd;
    char label[64];
    snprintf(label, sizeof label, "phasescope %s", cmd->name);
    ps_dist_set_label(label);
    if (ps_dist_size() > 1) {
        int ok = e->splits;
        for (int i = 1; i < argc; i++) ok |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
        if (!ok) {
            char names[256];
            splitting_names(names, sizeof names);
            if (ps_dist_rank() == 0)
                fprintf(stderr, "phasescope %s: runs as one process: under an MPI launcher (here %d ranks) only %s split their "
                                "work; run it without mpirun\n",
                        cmd->name, ps_dist_size(), names);
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
    const ps_registry_entry *e = ps_registry_find(base);
    if (e) return run_command(e, argc, argv);
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
    if (!strcmp(argv[1], "--commands")) { /* the registry's names, one a line (the build's per-command links) */
        if (!quiet)
            for (int i = 0; i < ps_registry_n; i++) printf("%s\n", ps_registry[i].cmd->name);
        return ps_dist_exit(0, 0);
    }
    if ((e = ps_registry_find(argv[1]))) return run_command(e, argc - 1, argv + 1);
    if (!quiet) fprintf(stderr, "phasescope: unknown command \"%s\" (see phasescope --help)\n", argv[1]);
    return ps_dist_exit(2, 1);
}
