/* cmd_knockout.c — `phasescope knockout`: the mean-replacement KV-head knockout grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instrument.h"
#include "knockout.h"

static const char HELP[] =
    "usage: phasescope knockout [--model DIR] [--layers LIST] [--heads LIST] [--target raw|compressed|both]\n"
    "                           [--period P] [--family NAME] [--n N] [--seed S] [--batch B] [--out DIR]\n"
    "\n"
    "Mean-replacement KV-head knockout (SPEC §6): for every chosen layer l and KV head g, that head's entries\n"
    "are replaced by their mean over the evaluation prompts of the same shift, position by position, and the\n"
    "prefix-padding sweep is run. Reports per (layer, head, residue) the change in accuracy (pp) and in mean\n"
    "target NLL against the clean run. Writes OUT/knockout.json.\n"
    "\n" PS_INSTR_HELP
    "  --layers LIST   layers, e.g. 0,2-3 (default: all)\n"
    "  --heads LIST    KV heads (default: all)\n"
    "  --target T      compressed (default for compressed models): hook_ck and hook_cv; raw (default for\n"
    "                  full attention): hook_k and hook_v; both\n";

int ps_cmd_knockout(int argc, char **argv) {
    if (ps_cli_wants_help(argc, argv)) {
        fputs(HELP, stdout);
        return 0;
    }
    ps_flag flags[] = {PS_INSTR_FLAGS, PS_FLAG("--layers", true), PS_FLAG("--heads", true), PS_FLAG("--target", true)};
    int npos;
    const char *pos[1];
    ps_error err = {{0}};
    ps_instr in = {0};
    ps_knockout_result r = {0};
    json_t *res = NULL;
    int rc = 1, layers[4096], heads[4096], nl = 0, nh = 0;
    if (ps_cli_parse(argc, argv, flags, PS_INSTR_N_FLAGS + 3, pos, 0, &npos, &err)) goto done;
    if (ps_instr_setup(&in, "knockout", argc, argv, flags, 1, &err)) goto done;
    const ps_config *c = &in.m.cfg;
    ps_ko_target target = c->kind == PS_ATTN_COMPRESSED ? PS_KO_COMPRESSED : PS_KO_RAW;
    if (flags[9].value) {
        if (!strcmp(flags[9].value, "raw")) target = PS_KO_RAW;
        else if (!strcmp(flags[9].value, "compressed")) target = PS_KO_COMPRESSED;
        else if (!strcmp(flags[9].value, "both")) target = PS_KO_BOTH;
        else {
            ps_fail(&err, "--target %s: expected raw, compressed or both", flags[9].value);
            goto done;
        }
    }
    if (flags[7].value) {
        if (ps_cli_int_list("--layers", flags[7].value, 0, c->n_layers - 1, layers, 4096, &nl, &err)) {
            char m[PS_ERROR_MAX];
            snprintf(m, sizeof m, "%s", err.msg);
            ps_fail(&err, "%.900s (the model has %lld layers)", m, (long long)c->n_layers);
            goto done;
        }
    } else
        for (nl = 0; nl < c->n_layers; nl++) layers[nl] = nl;
    if (flags[8].value) {
        if (ps_cli_int_list("--heads", flags[8].value, 0, c->n_kv_heads - 1, heads, 4096, &nh, &err)) {
            char m[PS_ERROR_MAX];
            snprintf(m, sizeof m, "%s", err.msg);
            ps_fail(&err, "%.900s (the model has %lld KV heads)", m, (long long)c->n_kv_heads);
            goto done;
        }
    } else
        for (nh = 0; nh < c->n_kv_heads; nh++) heads[nh] = nh;
    if (ps_knockout_grid(&in.m, &in.base, &in.task, in.fam, in.P, in.seed, in.batch, layers, nl, heads, nh, target, 0, &r,
                         ps_instr_progress, &in, &err)) {
        ps_progress_end(&in.bar);
        goto done;
    }
    ps_progress_end(&in.bar);
    res = json_object();
    json_object_set_new(res, "kind", json_string("knockout"));
    json_object_set_new(res, "provenance", ps_instr_provenance(&in, "pad"));
    json_t *grid = ps_knockout_json(&r, target);
    json_object_set_new(res, "grid", grid);
    if (ps_instr_write(&in, "knockout.json", res, &err)) goto done;
    /* the cells that hurt most */
    json_t *cells = json_object_get(grid, "cells");
    printf("clean mean accuracy %.3f; largest mean NLL increases:\n",
           json_number_value(json_object_get(json_object_get(grid, "clean"), "mean_accuracy")));
    size_t ncell = json_array_size(cells);
    int *order = malloc(ncell * sizeof(int));
    for (size_t i = 0; i < ncell; i++) order[i] = (int)i;
    for (size_t i = 0; i < ncell; i++)
        for (size_t j = i + 1; j < ncell; j++)
            if (json_number_value(json_object_get(json_array_get(cells, (size_t)order[j]), "mean_delta_nll")) >
                json_number_value(json_object_get(json_array_get(cells, (size_t)order[i]), "mean_delta_nll"))) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    for (size_t i = 0; i < ncell && i < 5; i++) {
        json_t *cell = json_array_get(cells, (size_t)order[i]);
        printf("  layer %lld head %lld: mean dNLL %+.3f, mean dacc %+.1f pp\n",
               (long long)json_integer_value(json_object_get(cell, "layer")),
               (long long)json_integer_value(json_object_get(cell, "head")),
               json_number_value(json_object_get(cell, "mean_delta_nll")),
               json_number_value(json_object_get(cell, "mean_delta_accuracy_pp")));
    }
    free(order);
    rc = 0;
done:
    if (rc) fprintf(stderr, "phasescope knockout: %s\n", err.msg);
    json_decref(res);
    ps_knockout_result_free(&r);
    ps_instr_free(&in);
    return rc;
}
