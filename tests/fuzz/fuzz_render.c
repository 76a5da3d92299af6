/* fuzz_render.c — `phasescope render` on arbitrary bytes: as a .json result, the result validator
 * (viz/results_check.c) and, for what passes, the figure itself; as a .jsonl
 * training log, the renderer's own reader. The seeds (corpus/render/) are valid results of every kind
 * written by the real commands plus near-valid mutations (mut_*.json), and render.dict lists the schema's
 * keys and values, so that mutations reach past the first check. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "viz/figures.h"
#include "fuzz.h"
#include "viz/results_check.h"

/* libFuzzer calls this before it parses its flags: add the schema dictionary unless -dict= was given. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static char dict[] = "-dict=" PS_SOURCE_DIR "/tests/fuzz/render.dict";
    static char **args;
    for (int i = 1; i < *argc; i++)
        if (!strncmp((*argv)[i], "-dict=", 6)) return 0;
    args = malloc((size_t)(*argc + 2) * sizeof *args);
    if (!args) return 0;
    memcpy(args, *argv, (size_t)*argc * sizeof *args);
    args[*argc] = dict;
    args[*argc + 1] = NULL;
    *argv = args;
    (*argc)++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_error err;
    const char *p = fuzz_temp_file("in.json", data, size);
    const char *paths[1] = {p};
    json_t *doc;
    if (ps_results_load(p, NULL, &doc, &err) == 0) {
        ps_render(paths, 1, fuzz_temp_dir(), NULL, 0, &err);
        json_decref(doc);
    }
    p = fuzz_temp_file("in.jsonl", data, size);
    paths[0] = p;
    ps_render(paths, 1, fuzz_temp_dir(), NULL, 0, &err);
    return 0;
}
