/* rng.h — a small deterministic random generator (splitmix64 seeding, xoshiro256**), owned by the
 * caller: no global state, so the same seed always gives the same stream. */
#ifndef PS_RNG_H
#define PS_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} ps_rng;

void ps_rng_seed(ps_rng *r, uint64_t seed);
uint64_t ps_rng_u64(ps_rng *r);
double ps_rng_uniform(ps_rng *r);            /* [0, 1) */
int64_t ps_rng_below(ps_rng *r, int64_t n);  /* uniform in [0, n), n >= 1 */
double ps_rng_normal(ps_rng *r);             /* standard normal (Box–Muller) */

#endif
