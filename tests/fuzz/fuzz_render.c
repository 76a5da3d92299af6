/* fuzz_render.c — the result-JSON reader behind `render` on arbitrary bytes (as .json, and as a .jsonl
 * training log). */
#include "figures.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_error err;
    const char *p = fuzz_temp_file("in.json", data, size);
    const char *paths[1] = {p};
    ps_render(paths, 1, fuzz_temp_dir(), NULL, 0, &err);
    p = fuzz_temp_file("in.jsonl", data, size);
    paths[0] = p;
    ps_render(paths, 1, fuzz_temp_dir(), NULL, 0, &err);
    return 0;
}
