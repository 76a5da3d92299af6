/* dist.c — ranks and collectives over MPI, or a single rank without it (see dist.h). */
#define _GNU_SOURCE
#include "scaleout/dist.h"

#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef PS_HAVE_MPI
#include <mpi.h>
#include <pthread.h>
#endif

static int g_rank = 0, g_size = 1, g_local = 1, g_shared = 0;
#ifdef PS_HAVE_MPI
static int g_mpi = 0; /* MPI_Init was called */
#endif
static char g_label[128] = "phasescope", g_note[1024];
static char g_stop_msg[2048]; /* what SIGTERM prints: composed beforehand, the handler only writes it */
static size_t g_stop_len;
static int64_t g_ar_calls, g_ar_bytes;
static double g_ar_seconds, g_ar_wait;
static char g_dev_backend[32];
static ps_dist_device_allreduce_fn g_dev_fn;
static void *g_dev_user;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ps_dist_rank(void) { return g_rank; }
int ps_dist_size(void) { return g_size; }
int ps_dist_local_size(void) { return g_local; }
int ps_dist_error_shared(void) { return g_shared; }
void ps_dist_mark_shared(void) { g_shared = 1; }

int ps_dist_have_mpi(void) {
#ifdef PS_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

static void compose_stop(void) {
    int n = snprintf(g_stop_msg, sizeof g_stop_msg,
                     "%s: rank %d of %d: stopped by the MPI launcher (another rank failed or exited early, or the job "
                     "was cancelled)%s%s\n",
                     g_label, g_rank, g_size, g_note[0] ? "; " : "", g_note);
    g_stop_len = n < 0 ? 0 : (size_t)n < sizeof g_stop_msg ? (size_t)n : sizeof g_stop_msg - 1;
}

void ps_dist_set_label(const char *label) {
    snprintf(g_label, sizeof g_label, "%s", label ? label : "phasescope");
    compose_stop();
}

void ps_dist_set_note(const char *note) {
    snprintf(g_note, sizeof g_note, "%s", note ? note : "");
    compose_stop();
}

__attribute__((unused)) static void on_term(int sig) {
    (void)sig;
    if (g_stop_len) {
        ssize_t w = write(2, g_stop_msg, g_stop_len);
        (void)w;
    }
    _exit(143);
}

/* Which launcher started this process, and how many ranks it started (0: not known). */
static int launched(int *size) {
    const char *s;
    *size = 0;
    if ((s = getenv("OMPI_COMM_WORLD_SIZE")) && *s) {
        *size = atoi(s);
        return 1;
    }
    if ((s = getenv("PMI_SIZE")) && *s) {
        *size = atoi(s);
        return 1;
    }
    if (((s = getenv("PMIX_RANK")) && *s) || ((s = getenv("PMI_RANK")) && *s)) return 1;
    return 0;
}

/* ---- the stall limit ---- */

static double g_stall_limit;
static atomic_llong g_wait_since_us; /* 0: not waiting in a collective */
static const char *_Atomic g_wait_what;

__attribute__((unused)) static void wait_begin(const char *what) {
    if (g_stall_limit <= 0) return;
    atomic_store(&g_wait_what, what);
    atomic_store(&g_wait_since_us, (long long)(now_s() * 1e6) + 1);
}
__attribute__((unused)) static void wait_end(void) {
    if (g_stall_limit > 0) atomic_store(&g_wait_since_us, 0);
}

#ifdef PS_HAVE_MPI
static MPI_Comm g_comm = MPI_COMM_NULL;
static int g_watchdog;

static void *watchdog(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        long long since = atomic_load(&g_wait_since_us);
        double lim = g_stall_limit;
        if (since && lim > 0 && now_s() - (double)since * 1e-6 > lim) {
            char msg[2400];
            const char *what = atomic_load(&g_wait_what);
            int n = snprintf(msg, sizeof msg,
                             "%s: rank %d of %d: %s has waited %.0f s for the other ranks (stall limit %.0f s, "
                             "PS_DIST_TIMEOUT): a rank is gone or stuck; stopping the job%s%s\n",
                             g_label, g_rank, g_size, what ? what : "a collective", now_s() - (double)since * 1e-6, lim,
                             g_note[0] ? "; " : "", g_note);
            ssize_t w = write(2, msg, n > 0 ? (size_t)n : 0);
            (void)w;
            _exit(1); /* a rank that exits with an error makes the launcher stop the others */
        }
    }
    return NULL;
}

static int mpi_fail(int code, const char *what, ps_error *err) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", code);
    return ps_fail(err, "%s (rank %d of %d): %s", what, g_rank, g_size, s);
}
#define CHUNK ((int64_t)1 << 30) /* bytes or elements per MPI call: counts are int */

/* Waiting without burning a core. Open MPI's blocking calls poll at full speed, which on a machine shared
 * with other work (or with more ranks than cores) takes the time slices of the ranks that still compute.
 * Two ways to wait, chosen by what is waited for:
 *   PASSIVE for the other ranks to arrive (a barrier, an agreement: possibly long, while they compute):
 *     poll, then sleep between polls, up to 1 ms (like OMP_WAIT_POLICY=PASSIVE for the threads);
 *   TRANSFER for data once every rank is there (a large message moves in many fragments, each needing
 *     both sides to poll): poll, yielding the core between polls to whoever needs it.
 * Transfers therefore follow a barrier. PS_DIST_WAIT=active polls at full speed in both cases. */
enum { PASSIVE = 0, TRANSFER = 1 };
static int wait_req(MPI_Request *req, int how) {
    static int active = -1;
    if (active < 0) {
        const char *e = getenv("PS_DIST_WAIT");
        active = e && !strcmp(e, "active");
    }
    int done = 0, rc;
    long ns = 1000;
    for (int spins = 0;; spins++) {
        if ((rc = MPI_Test(req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || done) return rc;
        if (active || spins < 200) continue;
        if (how == TRANSFER) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 1000000) ns += ns / 4;
    }
}
/* a nonblocking call, then wait_req */
#define MPI_WAIT_CALL(what, how, icall)                             \
    do {                                                            \
        MPI_Request req_;                                           \
        wait_begin(what);                                           \
        int rc_ = (icall);                                          \
        if (rc_ == MPI_SUCCESS) rc_ = wait_req(&req_, how);         \
        wait_end();                                                 \
        if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, what, err);    \
    } while (0)
#endif

void ps_dist_set_stall_limit(double seconds) {
    const char *e = getenv("PS_DIST_TIMEOUT");
    if (e && *e) seconds = atof(e);
    g_stall_limit = seconds > 0 ? seconds : 0;
#ifdef PS_HAVE_MPI
    if (g_stall_limit > 0 && g_size > 1 && !g_watchdog) {
        pthread_t t;
        if (pthread_create(&t, NULL, watchdog, NULL) == 0) {
            pthread_detach(t);
            g_watchdog = 1;
        }
    }
#endif
}

int ps_dist_init(int *argc, char ***argv, ps_error *err) {
    int want = 0;
    int is_launched = launched(&want);
    const char *off = getenv("PS_MPI");
    if (off && !strcmp(off, "0")) is_launched = 0;
#ifdef PS_HAVE_MPI
    if (!is_launched) return 0;
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
        ps_fail(err, "MPI_Init failed (error %d)", rc);
        err->usage = 0;
        return -1;
    }
    g_mpi = 1;
    MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g_comm, &g_rank);
    MPI_Comm_size(g_comm, &g_size);
    MPI_Comm node;
    if (MPI_Comm_split_type(g_comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &g_local);
        MPI_Comm_free(&node);
    }
    compose_stop();
    if (g_size > 1) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        const char *e = getenv("PS_DIST_TIMEOUT");
        if (e && *e) ps_dist_set_stall_limit(0);
    }
    return 0;
#else
    (void)argc;
    (void)argv;
    if (is_launched && want > 1) {
        ps_fail(err, "started as one of %d ranks by an MPI launcher, but this build has no MPI (Open MPI was not found, or "
                     "PS_MPI=OFF): install libopenmpi-dev (scripts/setup.sh) and rebuild, or run the shards without MPI "
                     "(--shard I/N, then phasescope merge)",
                want);
        err->usage = 1;
        return -1;
    }
    return 0;
#endif
}

int ps_dist_exit(int status, int usage_error) {
#ifdef PS_HAVE_MPI
    if (!g_mpi) return status;
    fflush(NULL);
    if (g_size > 1 && status != 0 && !usage_error && !g_shared) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Comm_free(&g_comm);
    MPI_Finalize();
#else
    (void)usage_error;
#endif
    return status;
}

void ps_dist_describe(char *out, size_t n) {
#ifdef PS_HAVE_MPI
    if (g_mpi) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "MPI";
        int len = 0;
        if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) lib[strcspn(lib, ",\n")] = '\0';
        snprintf(out, n, "%s, rank %d of %d (%d on this machine)", lib, g_rank, g_size, g_local);
        return;
    }
    snprintf(out, n, "one process (not started by an MPI launcher)");
#else
    snprintf(out, n, "one process (this build has no MPI)");
#endif
}

int ps_dist_barrier(ps_error *err) {
#ifdef PS_HAVE_MPI
    if (g_mpi && g_size > 1) MPI_WAIT_CALL("MPI_Barrier", PASSIVE, MPI_Ibarrier(g_comm, &req_));
#else
    (void)err;
#endif
    return 0;
}

int ps_dist_bcast(void *buf, int64_t bytes, int root, ps_error *err) {
#ifdef PS_HAVE_MPI
    if (!g_mpi || g_size == 1) return 0;
    if (bytes > 4096 && ps_dist_barrier(err)) return -1; /* the root may still be loading: wait passively */
    for (int64_t o = 0; o < bytes; o += CHUNK) {
        int64_t c = bytes - o < CHUNK ? bytes - o : CHUNK;
        MPI_WAIT_CALL("MPI_Bcast", bytes > 4096 ? TRANSFER : PASSIVE, MPI_Ibcast((char *)buf + o, (int)c, MPI_BYTE, root, g_comm, &req_));
    }
#else
    (void)buf, (void)bytes, (void)root, (void)err;
#endif
    return 0;
}

/* Small host arrays: reduced on rank 0, then broadcast (the same bits everywhere). */
int ps_dist_allreduce_f64(double *x, int64_t n, ps_error *err) {
#ifdef PS_HAVE_MPI
    if (!g_mpi || g_size == 1 || n == 0) return 0;
    if (n > INT_MAX) return ps_fail(err, "all-reduce of %lld doubles: too many for one call", (long long)n);
    double *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return ps_fail(err, "out of memory for an all-reduce of %lld doubles", (long long)n);
    MPI_Request req;
    wait_begin("MPI_Reduce (doubles)");
    int rc = MPI_Ireduce(x, tmp, (int)n, MPI_DOUBLE, MPI_SUM, 0, g_comm, &req);
    if (rc == MPI_SUCCESS) rc = wait_req(&req, PASSIVE);
    wait_end();
    if (rc == MPI_SUCCESS && g_rank == 0) memcpy(x, tmp, (size_t)n * sizeof *tmp);
    free(tmp);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Reduce (doubles)", err);
    MPI_WAIT_CALL("MPI_Bcast (doubles)", PASSIVE, MPI_Ibcast(x, (int)n, MPI_DOUBLE, 0, g_comm, &req_));
#else
    (void)x, (void)n, (void)err;
#endif
    return 0;
}

int ps_dist_allreduce_i64(int64_t *x, int64_t n, ps_error *err) {
#ifdef PS_HAVE_MPI
    if (!g_mpi || g_size == 1 || n == 0) return 0;
    if (n > INT_MAX) return ps_fail(err, "all-reduce of %lld integers: too many for one call", (long long)n);
    MPI_WAIT_CALL("MPI_Allreduce (integers)", PASSIVE, MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_INT64_T, MPI_SUM, g_comm, &req_));
#else
    (void)x, (void)n, (void)err;
#endif
    return 0;
}

void ps_dist_set_device_allreduce(const char *backend, ps_dist_device_allreduce_fn fn, void *user) {
    snprintf(g_dev_backend, sizeof g_dev_backend, "%s", backend && fn ? backend : "");
    g_dev_fn = backend ? fn : NULL;
    g_dev_user = user;
}

void ps_dist_allreduce_stats(int64_t *calls, int64_t *bytes, double *seconds, double *wait_seconds) {
    if (calls) *calls = g_ar_calls;
    if (bytes) *bytes = g_ar_bytes;
    if (seconds) *seconds = g_ar_seconds;
    if (wait_seconds) *wait_seconds = g_ar_wait;
}

#ifdef PS_HAVE_MPI
/* x[0..n) summed over ranks: segment r is reduced by rank r (MPI_Reduce_scatter), then every segment is
 * copied to every rank (MPI_Allgatherv): one reduction per element, so the same bits on every rank. */
static int sum_host_floats(float *x, int64_t n, ps_error *err) {
    int P = g_size;
    int *counts = malloc((size_t)P * sizeof(int)), *displs = malloc((size_t)P * sizeof(int));
    float *mine = malloc((size_t)(CHUNK / P + 1) * sizeof(float));
    int rc = counts && displs && mine ? 0 : ps_fail(err, "out of memory for an all-reduce of %lld floats", (long long)n);
    for (int64_t o = 0; o < n && !rc; o += CHUNK) {
        int64_t c = n - o < CHUNK ? n - o : CHUNK;
        for (int r = 0, d = 0; r < P; r++) {
            counts[r] = (int)(c / P + (r < c % P));
            displs[r] = d;
            d += counts[r];
        }
        MPI_Request req;
        wait_begin("the gradient all-reduce (MPI_Reduce_scatter)");
        int m = MPI_Ireduce_scatter(x + o, mine, counts, MPI_FLOAT, MPI_SUM, g_comm, &req);
        if (m == MPI_SUCCESS) m = wait_req(&req, TRANSFER);
        wait_end();
        if (m != MPI_SUCCESS) {
            rc = mpi_fail(m, "the gradient all-reduce (MPI_Reduce_scatter)", err);
            break;
        }
        wait_begin("the gradient all-reduce (MPI_Allgatherv)");
        m = MPI_Iallgatherv(mine, counts[g_rank], MPI_FLOAT, x + o, counts, displs, MPI_FLOAT, g_comm, &req);
        if (m == MPI_SUCCESS) m = wait_req(&req, TRANSFER);
        wait_end();
        if (m != MPI_SUCCESS) rc = mpi_fail(m, "the gradient all-reduce (MPI_Allgatherv)", err);
    }
    free(counts);
    free(displs);
    free(mine);
    return rc;
}
#endif

int ps_dist_allreduce_buf(ps_ctx *ctx, float *buf, int64_t n, ps_error *err) {
    if (g_size == 1 || n <= 0) return 0;
    /* a barrier first: the time until the last rank arrives (load imbalance, a busy machine) is counted
     * apart from the reduction itself */
    double tw = now_s();
    if (ps_dist_barrier(err)) return -1;
    double t0 = now_s();
    g_ar_wait += t0 - tw;
    int rc = 0;
    if (g_dev_fn && ctx && !strcmp(ps_ctx_backend_name(ctx), g_dev_backend)) rc = g_dev_fn(ctx, buf, n, g_dev_user, err);
#ifdef PS_HAVE_MPI
    else if (!ctx || ps_ctx_host_visible(ctx))
        rc = sum_host_floats(buf, n, err);
    else {
        /* a device buffer and no device collective: through host memory */
        float *h = malloc((size_t)n * sizeof(float));
        if (!h) return ps_fail(err, "out of memory staging %lld floats for the all-reduce", (long long)n);
        rc = ps_buf_to_host(ctx, h, buf, n * (int64_t)sizeof(float), err) || sum_host_floats(h, n, err) ||
             ps_buf_from_host(ctx, buf, h, n * (int64_t)sizeof(float), err);
        free(h);
    }
#endif
    g_ar_calls++;
    g_ar_bytes += n * (int64_t)sizeof(float);
    g_ar_seconds += now_s() - t0;
    return rc ? -1 : 0;
}

int ps_dist_gather_ranges(void *buf, int64_t elem_bytes, const int64_t *off, const int64_t *n, ps_error *err) {
#ifdef PS_HAVE_MPI
    if (!g_mpi || g_size == 1) return 0;
    if (ps_dist_barrier(err)) return -1; /* every rank has finished its units: wait for that passively */
    char *b = buf;
    /* point to point, in chunks: no int limit on the sizes or offsets */
    for (int r = 1; r < g_size; r++) {
        int64_t bytes = n[r] * elem_bytes, base = off[r] * elem_bytes;
        for (int64_t o = 0; o < bytes; o += CHUNK) {
            int64_t c = bytes - o < CHUNK ? bytes - o : CHUNK;
            if (g_rank == 0)
                MPI_WAIT_CALL("gathering the partial results (MPI_Recv)", TRANSFER,
                              MPI_Irecv(b + base + o, (int)c, MPI_BYTE, r, 7, g_comm, &req_));
            else if (g_rank == r)
                MPI_WAIT_CALL("sending the partial results to rank 0 (MPI_Send)", TRANSFER,
                              MPI_Isend(b + base + o, (int)c, MPI_BYTE, 0, 7, g_comm, &req_));
        }
    }
#else
    (void)buf, (void)elem_bytes, (void)off, (void)n, (void)err;
#endif
    return 0;
}

int ps_dist_agree(int rc, ps_error *err) {
#ifdef PS_HAVE_MPI
    if (!g_mpi || g_size == 1) return rc ? -1 : 0;
    int mine = rc ? g_rank : g_size, first = g_size;
    ps_error tmp = {0};
    MPI_WAIT_CALL("agreeing on errors (MPI_Allreduce)", PASSIVE, MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, g_comm, &req_));
    if (first == g_size) return 0;
    if (g_rank == first) tmp = *err;
    MPI_WAIT_CALL("agreeing on errors (MPI_Bcast)", PASSIVE, MPI_Ibcast(&tmp, (int)sizeof tmp, MPI_BYTE, first, g_comm, &req_));
    tmp.msg[PS_ERROR_MAX - 1] = '\0';
    if (first == 0) *err = tmp;
    else {
        ps_fail(err, "rank %d of %d: %s", first, g_size, tmp.msg);
        err->usage = tmp.usage;
    }
    g_shared = 1;
    return -1;
#else
    (void)err;
    return rc ? -1 : 0;
#endif
}

void ps_dist_split(const int64_t *w, const unsigned char *snap, int64_t n, int64_t penalty, int part, int n_parts,
                   int64_t *u0, int64_t *u1) {
    if (n_parts < 1) n_parts = 1;
    int64_t *S = malloc((size_t)(n + 1) * sizeof *S);
    if (!S) { /* cannot weigh: equal counts */
        *u0 = n * part / n_parts;
        *u1 = n * (part + 1) / n_parts;
        return;
    }
    S[0] = 0;
    for (int64_t u = 0; u < n; u++) S[u + 1] = S[u] + (w ? (w[u] > 0 ? w[u] : 0) : 1);
    int64_t W = S[n], prev = 0, lo = 0, hi = n;
    /* boundary k: the unit index b (units before b go left) whose prefix weight is nearest k·W/n_parts
     * (compared scaled by n_parts: integers only) */
#define DIST(b) (S[b] * n_parts - k * W < 0 ? k * W - S[b] * n_parts : S[b] * n_parts - k * W)
    for (int64_t k = 1; k <= part + 1 && k < n_parts; k++) {
        int64_t b = prev;
        while (b < n && S[b + 1] * n_parts <= k * W) b++;
        if (b < n && DIST(b + 1) < DIST(b)) b++;
        if (snap) { /* the nearest group start on either side */
            int64_t best = -1;
            for (int64_t s = b; s >= prev; s--)
                if (snap[s]) {
                    best = s;
                    break;
                }
            for (int64_t s = b; s < n; s++)
                if (snap[s]) {
                    if (best < 0 || DIST(s) < DIST(best)) best = s;
                    break;
                }
            if (best >= 0 && DIST(best) - DIST(b) <= penalty * n_parts) b = best;
        }
        if (b < prev) b = prev;
        if (k == part) lo = b;
        if (k == part + 1) hi = b;
        prev = b;
    }
#undef DIST
    free(S);
    *u0 = part == 0 ? 0 : lo;
    *u1 = part + 1 >= n_parts ? n : hi;
}
