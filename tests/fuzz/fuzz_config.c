/* fuzz_config.c — the model-config parser on arbitrary bytes, and the round trip of what it accepts. */
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ps_config c, c2;
    ps_error err;
    if (ps_config_parse((const char *)data, size, "fuzz.json", &c, &err) == 0) {
        char *s = ps_config_to_json(&c);
        if (ps_config_parse(s, strlen(s), "roundtrip", &c2, &err) != 0 || memcmp(&c, &c2, sizeof c) != 0) abort();
        free(s);
    }
    return 0;
}
