/* fuzz_index.c — the shard index (model.safetensors.index.json) on arbitrary bytes: parsed on its own
 * (every entry looked up, every shard name resolved inside a directory), then used to load a small
 * sharded checkpoint whose shards are valid, so the whole sharded loading path runs on hostile indexes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "core/model.h"
#include "core/safetensors.h"

static char CK[600];

static void make_checkpoint(void) { /* once per process: a 2-layer model in one shard per tensor */
    ps_config c;
    ps_config_defaults(&c);
    c.vocab_size = 11, c.d_model = 8, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 4, c.d_ff = 8;
    c.max_seq_len = 16, c.stride = c.window, c.local_window = c.window;
    ps_model m;
    ps_error err;
    snprintf(CK, sizeof CK, "%s/ck", fuzz_temp_dir());
    ps_save_opts o = {.layout = PS_LAYOUT_HF, .dtype_set = 1, .dtype = PS_DT_BF16, .max_shard_bytes = 1};
    if (ps_model_create(&m, &c, &err)) abort();
    ps_model_init(&m, 1);
    if (ps_model_save_as(&m, CK, &o, &err)) abort();
    ps_model_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!CK[0]) make_checkpoint();
    ps_st_index ix;
    ps_error err;
    if (ps_st_index_parse((const char *)data, size, "index.json", &ix, &err) == 0) {
        char path[4096];
        for (int i = 0; i < ix.n; i++)
            if (ps_st_index_find(&ix, ix.names[i]) != i) abort(); /* names are unique: each finds itself */
        for (int s = 0; s < ix.n_shards && s < 64; s++) ps_st_shard_path(CK, ix.path, ix.shards[s], path, sizeof path, &err);
        ps_st_index_free(&ix);
    } else if (strchr(err.msg, '\n'))
        abort(); /* errors are one line */
    char ipath[700];
    snprintf(ipath, sizeof ipath, "%s/%s", CK, PS_ST_INDEX_NAME);
    FILE *f = fopen(ipath, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    ps_model m;
    if (ps_model_load(&m, CK, &err) == 0) ps_model_free(&m);
    else if (strchr(err.msg, '\n'))
        abort();
    return 0;
}
