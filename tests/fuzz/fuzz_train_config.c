/* fuzz_train_config.c — the training-config parser (model, task, train) on arbitrary bytes. */
#include "fuzz.h"
#include "train/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_train_cfg c;
    ps_error err;
    if (ps_train_cfg_parse((const char *)data, size, "fuzz.json", &c, &err) == 0) ps_train_cfg_free(&c);
    return 0;
}
