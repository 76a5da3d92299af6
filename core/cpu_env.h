/* cpu_env.h — the process's CPU environment: which BLAS kernels run, and how OpenMP threads wait.
 *
 * Owns two start-up decisions that must be made before OpenBLAS and libgomp initialise (both read
 * their environment when the program is loaded, so a setenv() in main() comes too late):
 *
 *   - BLAS kernels. Debian's DYNAMIC_ARCH OpenBLAS (0.3.21) does not recognise some newer CPUs and
 *     falls back to its Prescott (SSE3) kernels, a 4–5× loss. When the library reports a kernel
 *     family below what the CPU supports (AVX2+FMA → Haswell, AVX-512 → SkylakeX), the program is
 *     re-executed once with OPENBLAS_CORETYPE set; the chosen kernels are then checked once against
 *     a plain double-precision loop, and a kernel that fails the check is replaced by the next lower
 *     one. A user-set OPENBLAS_CORETYPE always wins and is never changed.
 *   - OpenMP wait policy. libgomp's threads spin while they wait; when other processes share the
 *     cores, spinning threads burn the time slices of the ones doing the work (measured 50× slower).
 *     Unless the user set OMP_WAIT_POLICY (or GOMP_SPINCOUNT), it is set to PASSIVE.
 *   - Threads. Unless the user set OMP_NUM_THREADS, the thread count is the number of cores that no
 *     other runnable task occupies at start-up (the kernel's count of runnable tasks), at least 1.
 *     A quiet machine gets every core; a machine busy with other sweeps gets its fair share. A rank of
 *     an MPI job (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, ... > 1) gets those cores divided by the
 *     ranks on its machine (the sibling ranks count as ours), at least 1.
 *
 * PS_CPU_ENV_TEST_REPORTED=NAME pretends the library reported kernel family NAME (for tests).
 * PS_NO_REEXEC=1 turns the re-execution off (nothing is changed then). Library code never calls
 * ps_cpu_env_prepare; programs do, first thing in main(). */
#ifndef PS_CPU_ENV_H
#define PS_CPU_ENV_H

#include <stddef.h>

#include "core/error.h"

/* Called first in main(). May replace the process image (execv of /proc/self/exe with the same
 * argv); returns normally when nothing needs to change, when re-execution is off or fails, or in
 * the re-executed process. Writes a warning line into `warning` (empty when none) for the caller to
 * print, e.g. when the chosen kernels failed their check. */
void ps_cpu_env_prepare(char **argv, char *warning, size_t n);

/* One line describing the BLAS in use, e.g. "OpenBLAS 0.3.21 SkylakeX (auto: CPU has AVX-512, library
 * reported Prescott), 2 threads, OMP_WAIT_POLICY=PASSIVE". */
void ps_cpu_env_describe(char *out, size_t n);

/* The kernel family name the BLAS reports ("Haswell", "SkylakeX", "Prescott", …). */
const char *ps_blas_corename(void);

/* The best kernel family this CPU supports for sgemm: "SkylakeX", "Haswell", "Sandybridge" or
 * "Prescott". */
const char *ps_cpu_best_core(void);

/* Check sgemm against a plain double-precision loop on awkward shapes (odd sizes, transposes,
 * accumulate). Returns 0 and the worst relative error when it is within float rounding, −1 with a
 * message otherwise. */
int ps_blas_selfcheck(double *worst_rel, ps_error *err);

#endif
