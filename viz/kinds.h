/* kinds.h — the registry of result kinds: one table (viz/kinds.c), one line per kind, naming the kind's
 * validator and its figure, which other kinds may share its figure, and whether several results of it
 * are drawn at once. ps_results_check and ps_render_docs look a kind up here, so no reader of results
 * branches on kind names. Each kind lives in its own module, viz/kind_NAME.c (its check and its
 * figures, nothing else); the pieces they share are viz/check_common.h and viz/fig_common.h.
 *
 * Adding a kind: docs/design.md, "Adding a result kind". */
#ifndef PS_KINDS_H
#define PS_KINDS_H

#include <jansson.h>
#include <stddef.h>

#include "core/error.h"
#include "viz/check_common.h"
#include "viz/figures.h"

/* A kind's validator: the document against its schema (docs/results-schema.md); 0, or -1 with the
 * checker's error naming the field at fault. "kind" itself has been checked. */
typedef int (*ps_kind_check_fn)(ps_ck *c, json_t *doc);
/* A kind's figures from n validated documents of it (n > 1 only where the kind's `multi` says so, or a
 * kind it lets share its figure); paths[i] names docs[i] in titles and errors. */
typedef int (*ps_kind_render_fn)(json_t *const *docs, const char *const *paths, int n, const char *out,
                                 const ps_render_opts *o, int verbose, ps_error *err);

typedef struct {
    const char *name;                /* the result's "kind" */
    ps_kind_check_fn check;
    ps_kind_render_fn render;
    const char *shares;              /* other kinds that may follow a first file of this kind into its figure,
                                      * space-separated ("" for none) */
    int multi;                       /* 1: several results of this kind are drawn in one figure */
    const char *several;             /* multi = 0: what several of them are called when refused
                                      * ("render: theory results are drawn one at a time") */
    /* The finish of partial results (--shard / MPI, `phasescope merge`) is the instrument's, in the command
     * registry (instruments/registry.c: command, finish, result kind, result file, splits), which names
     * this table's kinds (tests/check_api_symbols.sh checks every one is here). */
} ps_kind;

/* The kind called name, or NULL when none is. */
const ps_kind *ps_kind_find(const char *name);
/* Whether a file of kind `other` may join a figure of kind k's first file (other != k->name). */
int ps_kind_shares(const ps_kind *k, const char *other);
/* The table's names, "sweep, knockout, ...", into buf (for errors naming the known kinds). */
void ps_kind_names(char *buf, size_t n);

/* ---- the modules' entry points (viz/kind_*.c), named by the table ---- */
int ps_check_sweep(ps_ck *c, json_t *doc);
int ps_check_gatecycle(ps_ck *c, json_t *doc);
int ps_render_curves(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                     int verbose, ps_error *err); /* kind_sweep.c: sweep and gatecycle */
/* kind "patch" (phasescope patch): the knockout's grid with method "patch" and the corrupt run's curve beside the
 * clean one; drawn by the knockout's heatmap renderer (titles of activation patching) */
int ps_check_patch(ps_ck *c, json_t *doc);
int ps_check_knockout(ps_ck *c, json_t *doc);
int ps_render_knockout(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                       int verbose, ps_error *err);
int ps_check_recall(ps_ck *c, json_t *doc);
int ps_render_recall(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                     int verbose, ps_error *err); /* kind_recall.c: selection recall per layer x KV head and residue */
int ps_check_atp_compare(ps_ck *c, json_t *doc);
int ps_render_atp_compare(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                          int verbose, ps_error *err); /* kind_knockout.c: an attribution estimate against the exact grid */
int ps_check_gates(ps_ck *c, json_t *doc);
int ps_render_gates(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                    int verbose, ps_error *err);
int ps_check_theory(ps_ck *c, json_t *doc);
int ps_render_theory(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                     int verbose, ps_error *err);
int ps_check_fillers(ps_ck *c, json_t *doc);
int ps_render_fillers(json_t *const *docs, const char *const *paths, int n, const char *out, const ps_render_opts *o,
                      int verbose, ps_error *err);

/* Not a result kind: a training log (RUN/train.jsonl) has no "kind" and no validator; ps_render draws a
 * .jsonl file with this (viz/kind_training.c). */
int ps_render_training(const char *path, const char *out, const ps_render_opts *o, int verbose, ps_error *err);

#endif
