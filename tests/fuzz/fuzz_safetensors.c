/* fuzz_safetensors.c — the safetensors reader on arbitrary bytes: open, then read every float tensor. */
#include <stdlib.h>

#include "fuzz.h"
#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = fuzz_temp_file("in.safetensors", data, size);
    ps_st_file f;
    ps_error err;
    if (ps_st_open(p, &f, &err) == 0) {
        for (int i = 0; i < f.n; i++) {
            int64_t n = ps_st_numel(&f.entries[i]);
            if (n > (1 << 24)) continue;
            float *buf = malloc((size_t)(n ? n : 1) * sizeof(float));
            ps_st_read_f32(&f, &f.entries[i], buf, &err);
            free(buf);
        }
        ps_st_meta(&f, "format");
        ps_st_close(&f);
    }
    return 0;
}
