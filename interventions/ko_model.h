/* ko_model.h — the controlled model's knockout targets by name, as the tests, benches and gatecycle's per-head
 * measure pick them (the targets themselves are the family's data: core/ko_targets.c; the one spec that
 * runs every family's targets: ko_spec.h). */
#ifndef PS_KO_MODEL_H
#define PS_KO_MODEL_H

#include "interventions/ko_spec.h"

/* bit 1: raw k/v, bit 2: compressed ck/cv; the family's target index is ps_ko_target − 1 ("raw",
 * "compressed", "both": ps_family_model.ko.targets) */
typedef enum { PS_KO_RAW = 1, PS_KO_COMPRESSED = 2, PS_KO_BOTH = 3 } ps_ko_target;
const char *ps_ko_target_name(ps_ko_target t);

#endif
