/* api_internal.h — what the API's own files share (api/run_*.c, api/instr_*.c): the handles' layouts and
 * the error convention's helpers. Nothing here is public: include/phasescope.h is the interface. */
#ifndef PS_API_INTERNAL_H
#define PS_API_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "phasescope.h"
#include "core/error.h"
#include "core/runtime.h"

struct ps_api_model {
    ps_runtime rt;
    char *path, *device;
    char *config_json, *points_json, *names_json;
    char **names; /* every concrete hook name, in firing order (those that run: see n_run) */
    int n_names;
    int n_run;    /* the layers every run runs (ps_api_open_ex's "layers"); -1: all, and the logits */
    ps_api_progress_fn progress; /* ps_api_set_progress, or NULL */
    void *progress_user;
    const ps_family **families; /* the families it was opened with (ps_api_open_in: a NULL-terminated copy), or
                                 * NULL: core's ps_families; an instrument's request naming another model uses them */
};

/* A caller's progress callback as the engines see it (ps_progress_fn): `stopped` records that it asked to
 * stop, so that the call's failure is PS_API_ECANCELLED. */
typedef struct {
    ps_api_progress_fn fn;
    void *user;
    int stopped;
} ps_api_progress;
int ps_api_progress_call(int64_t done, int64_t total, void *user); /* user: a ps_api_progress */

/* Copy a phasescope error into the caller's buffer; returns PS_API_EINPUT for a usage error, else
 * PS_API_EFAIL. */
int ps_api_report(const ps_error *e, char *err, size_t errlen);
/* Copy a message (printf-style) into the caller's buffer; returns code. */
int ps_api_say(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Whether device names one of the build's backends (ps_ctx_backends: "cpu, cuda"). */
int ps_api_known_device(const char *device);

/* A call's options JSON (ps_api_open_ex's, ps_api_serve_start's; NULL or "": none): a JSON object, each of
 * whose keys `one` takes (0) or refuses (a PS_API_EINPUT message naming the key: unknown, wrong type, out of
 * range). Returns 0, "options: not a JSON object" or the first refusal. */
struct json_t;
typedef int (*ps_api_option_fn)(const char *key, struct json_t *value, void *user, char *err, size_t errlen);
int ps_api_options(const char *text, ps_api_option_fn one, void *user, char *err, size_t errlen);

/* The index in the family's point table of the point `name` parses to, and its layer (-1: a global
 * point); an invalid name is a usage error listing the valid ones (the family's parser). */
int ps_api_point_of(const ps_api_model *m, const char *name, int *index, int *layer, ps_error *e);

/* Whether point i (of the family's table) at `layer` (-1: a global point) fires when only layers
 * 0..n_run-1 run (a global point the table lists before every layer point does, as embed). */
int ps_api_point_runs(const ps_api_model *m, int i, int layer);

#endif
