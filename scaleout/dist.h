/* dist.h — scale-out across processes: ranks, collectives, and the split of a work list (docs/scale-out.md).
 *
 * Built on MPI (Open MPI from Debian; PS_MPI=AUTO|ON|OFF in CMake). A process started by an MPI launcher
 * (mpirun/mpiexec, or srun with PMI/PMIx) is one rank of a job; any other process is the only rank of its
 * own, and every call here is then a no-op that returns at once (a build without MPI has only that). The
 * layer sits above core/ and gates/ and below the commands: the training loop sums gradients with
 * ps_dist_allreduce_buf, the instruments gather their partial results (dist/partial.h) on rank 0.
 *
 * Every collective returns 0, or -1 with a one-line message; a rank that dies is caught by the launcher
 * (Open MPI's mpirun stops the others within about a second, and a stopped rank says so on stderr, see
 * ps_dist_set_note); a rank that hangs is caught by the stall limit (ps_dist_set_stall_limit). */
#ifndef PS_DIST_H
#define PS_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"
#include "core/error.h"

/* Start: MPI_Init when an MPI launcher started this process and the build has MPI. PS_MPI=0 in the
 * environment keeps a launched process out of MPI (it runs alone). Fails (usage: exit 2) when launched as
 * one of several ranks by a build without MPI, or by srun without an MPI plugin (the ranks could not talk).
 * `label` ("phasescope train") starts the messages of ps_dist_set_note and the stall limit. */
int ps_dist_init(int *argc, char ***argv, ps_error *err);
void ps_dist_set_label(const char *label);
/* The end of the program: MPI_Finalize after success or an error every rank shares (ps_dist_agree, or a
 * usage error); MPI_Abort after an error only this rank saw, which stops every rank (a rank that returned
 * early would otherwise leave the others waiting in a collective). Returns status (one rank: always). */
int ps_dist_exit(int status, int usage_error);

int ps_dist_rank(void);
int ps_dist_size(void);
/* Ranks of this job on this machine (1 without MPI). */
int ps_dist_local_size(void);
/* 1 when this build has MPI. */
int ps_dist_have_mpi(void);
/* "Open MPI v4.1.4, rank 0 of 2 (2 on this machine)"; "one process" when not under a launcher. */
void ps_dist_describe(char *out, size_t n);

int ps_dist_barrier(ps_error *err);
/* bytes from root to every rank. */
int ps_dist_bcast(void *buf, int64_t bytes, int root, ps_error *err);
/* Element-wise sums over ranks, in place; every rank gets the same bits. */
int ps_dist_allreduce_f64(double *x, int64_t n, ps_error *err);
int ps_dist_allreduce_i64(int64_t *x, int64_t n, ps_error *err);

/* The gradient seam: sums a float buffer of ctx (ps_buf_alloc) over ranks, in place, with the same bits on
 * every rank (each element is reduced once, by one rank, then copied: MPI_Reduce_scatter + MPI_Allgatherv),
 * so data-parallel replicas never drift apart. A device backend routes it to its own collective (NCCL)
 * with ps_dist_set_device_allreduce; without one, a buffer the host cannot read is staged through host
 * memory. Counts the calls, bytes and seconds (ps_dist_allreduce_stats). */
int ps_dist_allreduce_buf(ps_ctx *ctx, float *buf, int64_t n, ps_error *err);
typedef int (*ps_dist_device_allreduce_fn)(ps_ctx *ctx, float *buf, int64_t n, void *user, ps_error *err);
/* Route ps_dist_allreduce_buf on contexts of backend `backend` ("cuda") to fn (NULL: back to MPI). The
 * backend bootstraps its communicator over MPI first (NCCL: ncclGetUniqueId on rank 0, ps_dist_bcast of
 * the id, ncclCommInitRank(size, id, rank) on the GPU of the local rank): docs/scale-out.md. */
void ps_dist_set_device_allreduce(const char *backend, ps_dist_device_allreduce_fn fn, void *user);
/* Calls and bytes so far; seconds in the reduction itself and seconds waiting (in a barrier just before
 * it) for the slowest rank to arrive. */
void ps_dist_allreduce_stats(int64_t *calls, int64_t *bytes, double *seconds, double *wait_seconds);

/* Gather of partial results: every rank holds elements [off[r], off[r] + n[r]) of an array of elem_bytes
 * bytes per element (off, n: one entry per rank, the same on every rank); afterwards rank 0's buf holds
 * every rank's range at its own place. Ranges must not overlap. */
int ps_dist_gather_ranges(void *buf, int64_t elem_bytes, const int64_t *off, const int64_t *n, ps_error *err);

/* Agreement on failure (collective: every rank calls it at the same point with its own status). 0 when
 * every rank succeeded; else -1 on every rank, err holding the lowest failing rank's message ("rank 2 of 4:
 * ..." when that is not rank 0) and its usage flag, and the error counts as shared (ps_dist_exit ends
 * normally, only rank 0 prints it: ps_dist_error_shared). */
int ps_dist_agree(int rc, ps_error *err);
int ps_dist_error_shared(void);
/* Mark the error about to be returned as one every rank reaches at the same point by itself (e.g. a
 * non-finite loss after the all-reduce). */
void ps_dist_mark_shared(void);

/* The split of a work list of n units (in the one-process order) into n_parts contiguous ranges of about
 * equal weight (w[u] >= 0, integers so that every process computes the same split). A boundary moves to
 * the nearest unit with snap[u] set (a group start: a shift whose set-up a range pays again when it begins
 * inside it) when that unbalances the two sides by no more than `penalty` weight. Part `part` is
 * [*u0, *u1); parts may be empty. snap may be NULL. */
void ps_dist_split(const int64_t *w, const unsigned char *snap, int64_t n, int64_t penalty, int part, int n_parts,
                   int64_t *u0, int64_t *u1);

/* What a rank stopped by the launcher says after its "stopped" line (e.g. "the last checkpoint (step 40)
 * is in RUN/; continue with --resume, with any number of ranks"). Copied; NULL clears. */
void ps_dist_set_note(const char *note);
/* Collectives that wait longer than `seconds` (0: no limit) end the job: the rank prints which collective
 * stalled and the note, and exits with status 1, which makes the launcher stop the other ranks. The
 * environment's PS_DIST_TIMEOUT (seconds) overrides. Training sets it; the instruments do not (their
 * ranks may legitimately wait for a slower rank). */
void ps_dist_set_stall_limit(double seconds);

#endif
