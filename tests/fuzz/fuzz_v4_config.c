/* fuzz_v4_config.c — the DeepSeek-V4 config parser (both forms) on arbitrary bytes; what it accepts must
 * size its tensors and activations without overflow and give finite rotary frequencies, and the hook
 * names of its layers must parse back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "core/v4/v4_config.h"
#include "core/v4/v4_forward.h"
#include "core/v4/v4_hooks.h"
#include "core/v4/v4_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_v4_config c;
    ps_error err;
    (void)ps_v4_config_detect((const char *)data, size);
    if (ps_v4_config_parse((const char *)data, size, "fuzz.json", &c, &err) != 0) return 0;
    if (ps_v4_config_validate(&c, "again", &err) != 0) abort();
    int64_t n = ps_v4_global_params(&c);
    for (int l = 0; l < c.n_layers; l++) n += ps_v4_layer_params(&c, l);
    if (n <= 0) abort();
    int64_t T = c.max_position_embeddings < 64 ? c.max_position_embeddings : 64;
    if (ps_v4_acts_bytes(&c, 1, T, 1) <= 0) abort();
    double inv[PS_V4_MAX_HALF_ROPE];
    const ps_v4_rope_cfg *r[2] = {&c.rope_main, &c.rope_compress};
    for (int i = 0; i < 2; i++) {
        ps_v4_rope_inv_freq(r[i], c.rope_dim, inv);
        for (int64_t k = 0; k < c.rope_dim / 2; k++)
            if (!isfinite(inv[k])) abort();
    }
    char name[96];
    for (int p = 0; p < PS_V4H_NPOINTS; p++) {
        int slot;
        ps_v4_hook_point pt;
        ps_v4_hook_name(name, sizeof name, (int)c.n_layers - 1, p);
        if (ps_v4_hook_parse(&c, name, &slot, &pt, &err) == 0 && (int)pt != p) abort();
    }
    return 0;
}
