/* fuzz.h — the entry point every fuzz target defines (libFuzzer's), also driven by replay_main.c so the
 * seed corpus and every kept crash input run as ordinary tests in every build. */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Write data to a per-process temporary file (or directory entry) and return its path. */
const char *fuzz_temp_file(const char *name, const uint8_t *data, size_t size);
const char *fuzz_temp_dir(void);

#endif
