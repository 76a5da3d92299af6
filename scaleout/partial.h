/* partial.h — partial results of a split instrument run (docs/scale-out.md).
 *
 * An instrument's work is a list of units in the one-process order (a sweep: (shift, batch); a knockout
 * grid: (shift, batch, layer); ...). Each unit produces per-item values (a query's correct flag and target
 * log-probability, a window's gate distribution, ...) into arrays laid out unit after unit. A process runs
 * a contiguous range of units and fills their part of the arrays; the parts come together either by
 * ps_partial_gather (MPI ranks, onto rank 0) or as files (--shard I/N writes one, ps_partial_merge_files
 * reads them all). Either way the whole arrays are then reduced in the one-process order, so the result
 * does not depend on how the work was split: the sums of floating-point values see the same operands in
 * the same order.
 *
 * A part file is a safetensors file (the public layout: header JSON, raw little-endian data): per array
 * NAME (I32, F32 or F64: the part's elements) and NAME.offsets (I64 [n_units + 1]: where each unit
 * starts in the whole array), and __metadata__ "phasescope.partial": {"version", "command", "n_units",
 * "units": [u0, u1], "shard": [i, n], "arrays": [...], "meta": {...}}, meta being what the command needs
 * to finish its result (provenance, its parameters); every part of one run must have the same meta (its
 * provenance.compute and provenance.command aside: the merged result records part 0's command line, which
 * is the one-process command line but for the --shard flag). */
#ifndef PS_PARTIAL_H
#define PS_PARTIAL_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"

enum { PS_PART_I32 = 0, PS_PART_F32 = 1, PS_PART_F64 = 2 };
#define PS_PART_MAX_ARRAYS 8

typedef struct {
    char name[32];
    int type;
    int64_t *off; /* [n_units + 1]: unit u's elements are [off[u], off[u + 1]) */
    void *data;   /* [off[n_units]] elements (zero-filled) */
} ps_part_array;

typedef struct {
    char command[32];
    int64_t n_units;
    int64_t u0, u1;        /* the units whose elements this holds */
    int shard, n_shards;   /* --shard I/N (0/1: the whole run) */
    json_t *meta;          /* owned */
    int n_arr;
    ps_part_array arr[PS_PART_MAX_ARRAYS];
} ps_partial;

/* An empty partial of n_units units; takes the reference to meta. */
int ps_partial_init(ps_partial *p, const char *command, int64_t n_units, json_t *meta, ps_error *err);
/* Add an array with per_unit[u] elements for unit u; returns its index, or -1. */
int ps_partial_add(ps_partial *p, const char *name, int type, const int64_t *per_unit, ps_error *err);
/* Unit u's first element of array a, and its element count. */
void *ps_partial_at(const ps_partial *p, int a, int64_t u);
int64_t ps_partial_count(const ps_partial *p, int a, int64_t u);
/* The array called name, or -1. */
int ps_partial_find(const ps_partial *p, const char *name);
void ps_partial_free(ps_partial *p);
int ps_partial_type_size(int type);

/* MPI: rank r holds units [u0s[r], u1s[r]) (contiguous ranges, in rank order); afterwards rank 0 holds
 * them all (its u0, u1 span them). A no-op with one rank. */
int ps_partial_gather(ps_partial *p, const int64_t *u0s, const int64_t *u1s, ps_error *err);

/* Write the units [p->u0, p->u1) as a part file (atomically). */
int ps_partial_write(const ps_partial *p, const char *path, ps_error *err);
/* Read part files and merge them: one run (same command, units, arrays and meta), shards 0..N-1 each once,
 * their units tiling [0, n_units). out holds every unit afterwards; out->meta is part 0's, with
 * provenance.compute noting the merge. */
int ps_partial_merge_files(const char *const *paths, int n, ps_partial *out, ps_error *err);
/* The part files named by paths: a file stands for itself, a directory for the part files in it
 * (COMMAND.part-I-of-N.safetensors, by name; a directory without one is an error naming it). out is a new
 * list (free with ps_free_paths). So `merge a b` takes the --out directories of `--shard 0/2 --out a` and
 * `--shard 1/2 --out b`. */
int ps_partial_expand_paths(const char *const *paths, int n, char ***out, int *n_out, ps_error *err);
void ps_free_paths(char **paths, int n);

/* The part file name of shard i of n for a result NAME ("sweep"): "NAME.part-I-of-N.safetensors". */
void ps_partial_file_name(char *out, size_t n, const char *name, int i, int of);

#endif
