/* result_out.h — where an instrument's result goes (ps_out): the CLI's --out directory (the result JSON and its
 * figures written there, "wrote PATH" and the summary printed on stdout), or a library call's sink (the result
 * documents kept in memory: nothing written, nothing printed; the caller draws the figures from them on request,
 * api/instr_call.c). */
#ifndef PS_RESULT_OUT_H
#define PS_RESULT_OUT_H

#include <jansson.h>

#include "core/error.h"

typedef struct ps_result_sink {
    json_t *docs; /* {"NAME.json": "the file's text", ...} in the order the run finished them (NULL until the first) */
} ps_result_sink;

typedef struct {
    const char *dir;      /* the CLI's --out (a library call: where a --shard part file goes) */
    ps_result_sink *sink; /* a library call's, or NULL (the CLI) */
} ps_out;

/* printf to stdout for the CLI; nothing for a library call */
void ps_say(const ps_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checks result against the reader's validator (named out/name in errors), then: the CLI writes it as
 * OUT/name (pretty JSON, atomically), prints "wrote PATH" and draws its figures from the file; a library call
 * keeps its text (the file's bytes) in the sink under name. */
int ps_result_write(const ps_out *out, const char *name, json_t *result, ps_error *err);

/* The text of a result document exactly as ps_result_write writes its file (caller frees). */
char *ps_result_text(json_t *result);

/* Keep result's text (pretty JSON with precision_flag, e.g. JSON_REAL_PRECISION(10): the text its file would hold)
 * in s under name. */
int ps_result_keep(ps_result_sink *s, const char *name, json_t *result, size_t precision_flag, ps_error *err);
void ps_result_sink_free(ps_result_sink *s);

#endif
