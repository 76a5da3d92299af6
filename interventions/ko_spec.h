/* ko_spec.h — the one mean-replacement knockout spec (grid.h) of every family: it reads what the family's
 * core table says a target replaces (core/runtime.h: ko.arrays, ps_ko_array; ko.mean for a mean finished on
 * the host) and builds the grid from it. Per chosen layer and replaced array, the sources are sum actions
 * (PS_ACT_SUM) on the clean run's sum point divided into means ([npos, ...] as the family's point_shape
 * gives it, on the model's context), and a cell is a PS_ACT_SET action on the set point from the mean —
 * on the cell's head when the target's cells are heads, on the whole array for a per-layer target. The
 * cells restart where the family says (PS_KO_RESTART_ATTENTION: the controlled model's attention inputs),
 * else a full forward each. knockout.c runs it, atp.c's estimate reads its means. */
#ifndef PS_KO_SPEC_H
#define PS_KO_SPEC_H

#include "interventions/grid.h"

/* The spec of the family's target (an index of rt->family->ko.targets) over the chosen heads (the cells'
 * labels; any value for a per-layer target, whose one cell is 0). heads must outlive the spec. */
int ps_ko_spec(const ps_runtime *rt, int target, const int *heads, int n_heads, ps_grid_spec *spec, ps_error *err);
void ps_ko_spec_free(ps_grid_spec *spec);
/* After its sources_done: the mean the spec sets layer index li's point `point` from (on the model's
 * context), or NULL when its target does not replace that point there (or it has no positions). */
const float *ps_ko_spec_mean(const ps_grid_spec *spec, int li, int point);

#endif
