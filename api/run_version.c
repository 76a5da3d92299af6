/* run_version.c — the library's version and build facts (include/phasescope.h). */
#include "phasescope.h"

#include <stdlib.h>

#include "core/ctx.h"

PS_API int ps_api_version(void) { return PS_API_VERSION; }

PS_API const char *ps_api_release(void) { return PS_VERSION; }

PS_API const char *ps_api_devices(void) { return ps_ctx_backends(); }

PS_API void ps_api_free(void *p) { free(p); }
