/* results_check.h — the validator for result JSON (docs/results-schema.md, "Validation"): every reader of
 * a result file (render, table, anything that reads a previous result) checks it here first, so that no
 * figure or table ever shows a number that was never measured. A refusal is one line naming the file and
 * the first field at fault, e.g. `r.json: curve.residues[3].correct: 7 > n = 5`.
 *
 * Strict on the fields the figures and tables read (present, typed, in range, consistent with each other
 * and within the limits the writers can produce); lenient on additions (unknown keys are ignored). What
 * one figure can show (how many residues, cells, panels) is the figures' own check (each kind's module,
 * viz/kind_*.c), made when `render` draws a valid result. */
#ifndef PS_RESULTS_CHECK_H
#define PS_RESULTS_CHECK_H

#include <jansson.h>

#include "core/error.h"

/* The writers' limits that the validator enforces, one definition for both: --period and --n of the
 * instruments (instruments/instrument.c), gatecycle's --layer, --shift and --head (|value| at most
 * PS_RESULT_MAX_SHIFT). The idealised model's limits are gates/theory.h's PS_THEORY_ constants. */
#define PS_RESULT_MAX_PERIOD 4096
#define PS_RESULT_MAX_PROMPTS ((int64_t)1 << 22)
#define PS_RESULT_MAX_SHIFT 1000000

/* The largest result file read (the same limit the figures use). */
#define PS_RESULT_MAX_BYTES ((size_t)1 << 30)

/* Check a parsed document against the schema of its "kind" (the registry, viz/kinds.h: sweep, knockout,
 * gatecycle, gates, theory, fillers).
 * path names the file in the message. Returns 0 when valid, -1 with err set otherwise. */
int ps_results_check(json_t *doc, const char *path, ps_error *err);

/* Read, parse and check PATH. want_kind: NULL for any kind, or the one kind the caller reads (another
 * kind is refused). On success *doc holds the document (json_decref it). */
int ps_results_load(const char *path, const char *want_kind, json_t **doc, ps_error *err);

#endif
