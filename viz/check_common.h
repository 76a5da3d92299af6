/* check_common.h — internal to viz/: the pieces every result kind's validator (viz/kind_*.c) shares: the
 * writers' limits, the checker `ps_ck` that carries the path of the field being checked (so a refusal names
 * it: `r.json: curve.residues[3].correct: 7 > n = 5`), typed field getters that stop at the first fault,
 * and the checks of the parts several kinds hold: the provenance block and a phase curve. Not a public
 * header: the layers above read results through viz/results_check.h. */
#ifndef PS_CHECK_COMMON_H
#define PS_CHECK_COMMON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "viz/results_check.h"

/* writer limits (results_check.h; the interventions, core/config.c, gates/theory.h) */
#define MAX_PERIOD PS_RESULT_MAX_PERIOD   /* --period */
#define MAX_PROMPTS PS_RESULT_MAX_PROMPTS /* --n */
#define MAX_COUNT ((int64_t)1000000000000000) /* a count of scored queries: far above what a run scores */
#define MAX_INDEX ((int64_t)1 << 24)  /* layers, heads (PS_MAX_DIM) */
#define MAX_WINDOW 4096               /* attention.window */
#define MAX_SHIFT PS_RESULT_MAX_SHIFT /* gatecycle --shift, --layer, --head */
#define TOL 1e-6                      /* "within rounding": results are written with 10 significant digits */

typedef struct {
    const char *file;
    ps_error *err;
    char path[512];
    size_t len;
} ps_ck;

typedef struct {
    int64_t n_prompts, period; /* eval (0 when the kind has none) */
} ps_prov_info;

typedef struct {
    int64_t P;
    int64_t *n, *k;
    double *acc, *lp;
} ps_curve_info;

/* ---- the path of the field being checked: key/idx push a part (returning the old length), pop restores ---- */
size_t ps_ck_key(ps_ck *c, const char *k);
size_t ps_ck_idx(ps_ck *c, size_t i);
void ps_ck_pop(ps_ck *c, size_t old);
/* Fail with "FILE: PATH: message" (PATH "(top level)" when empty); returns -1. */
int ps_ck_bad(ps_ck *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "an object", "an integer", ... "nothing (the field is missing)" for NULL */
const char *ps_ck_type_name(const json_t *v);
/* |a - b| within TOL, relative to max(1, scale) */
int ps_ck_close_to(double a, double b, double scale);

/* ---- typed fields: each pushes the key, checks, and pops on success (on failure the path stays) ---- */
int ps_ck_field(ps_ck *c, json_t *o, const char *k, json_t **v);
int ps_ck_want_type(ps_ck *c, json_t *v, int ok, const char *what);
int ps_ck_get_obj(ps_ck *c, json_t *o, const char *k, json_t **v);
/* an array of lo..hi entries (lo == hi: exactly that many); its length in *n when n */
int ps_ck_get_arr(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, json_t **v, int64_t *n);
int ps_ck_int_value(ps_ck *c, json_t *v, int64_t lo, int64_t hi, int64_t *out);
int ps_ck_get_int(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out);
int ps_ck_num_value(ps_ck *c, json_t *v, double lo, double hi, double *out);
int ps_ck_get_num(ps_ck *c, json_t *o, const char *k, double lo, double hi, double *out);
/* a fraction in [0, 1] (rounding may overshoot by TOL; the value is clamped) */
int ps_ck_get_frac(ps_ck *c, json_t *o, const char *k, double *out);
int ps_ck_get_str(ps_ck *c, json_t *o, const char *k, const char **out);
/* a string that must be one of the NULL-terminated opts */
int ps_ck_get_enum(ps_ck *c, json_t *o, const char *k, const char *const *opts, const char **out);
/* optional: absent is fine; present must have the type */
int ps_ck_opt_str(ps_ck *c, json_t *o, const char *k);
int ps_ck_opt_int(ps_ck *c, json_t *o, const char *k, int64_t lo, int64_t hi);

/* ---- parts several kinds hold ---- */
/* The provenance block; instrument: an instrument's result (config and eval required); mode_kind: the kind
 * whose eval.mode is required (NULL: checked only when present). Fills *pi. */
int ps_ck_provenance(ps_ck *c, json_t *doc, int instrument, const char *mode_kind, ps_prov_info *pi);
/* The phase curve parent[name] (sweep.curve, gatecycle.before/after, knockout.grid.clean): every residue,
 * the summary recomputed from the counts. want_P: the period the provenance declares (eval.period). Fills
 * *ci (free it with ps_ck_curve_free, also after a failure). */
int ps_ck_curve(ps_ck *c, json_t *parent, const char *name, int64_t want_P, ps_curve_info *ci);
void ps_ck_curve_free(ps_curve_info *ci);

#endif
