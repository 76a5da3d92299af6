/* kinds.c — the registry of result kinds (viz/kinds.h). */
#include "viz/kinds.h"

#include <stdio.h>
#include <string.h>

/* One line per kind, in the order errors list them. A gatecycle figure admits sweeps after it in the file
 * order check (as ps_render_docs always has), but draws one result at a time, so in effect only sweeps
 * share a figure (several models' curves on one axis) and knockouts one (panels side by side). */
static const ps_kind KINDS[] = {
    /* name        check               render               shares   multi  several (multi = 0)
     * (which command writes a kind, and how its partial results are finished: instruments/registry.c,
     * whose kinds tests/check_api_symbols.sh checks against this table) */
    {"sweep",      ps_check_sweep,     ps_render_curves,    "",      1,     NULL},
    {"knockout",   ps_check_knockout,  ps_render_knockout,  "",      1,     NULL},
    {"recall",     ps_check_recall,    ps_render_recall,    "",      1,     NULL},
    {"patch",      ps_check_patch,     ps_render_knockout,  "",      1,     NULL},
    {"gatecycle",  ps_check_gatecycle, ps_render_curves,    "sweep", 0,     "gate-cycling results"},
    {"gates",      ps_check_gates,     ps_render_gates,     "",      0,     "gates results"},
    {"theory",     ps_check_theory,    ps_render_theory,    "",      0,     "theory results"},
    {"fillers",    ps_check_fillers,   ps_render_fillers,   "",      0,     "filler experiments"},
    {"atp_compare", ps_check_atp_compare, ps_render_atp_compare, "",  0,     "attribution comparisons"},
};
#define N_KINDS (sizeof KINDS / sizeof KINDS[0])

const ps_kind *ps_kind_find(const char *name) {
    for (size_t i = 0; name && i < N_KINDS; i++)
        if (!strcmp(KINDS[i].name, name)) return &KINDS[i];
    return NULL;
}

int ps_kind_shares(const ps_kind *k, const char *other) {
    if (!k || !other || !*other) return 0;
    size_t l = strlen(other);
    for (const char *s = k->shares; *s;) { /* whole words of the space-separated list */
        size_t w = strcspn(s, " ");
        if (w == l && !strncmp(s, other, l)) return 1;
        s += w;
        s += strspn(s, " ");
    }
    return 0;
}

void ps_kind_names(char *buf, size_t n) {
    size_t o = 0;
    if (n) buf[0] = '\0';
    for (size_t i = 0; i < N_KINDS && o < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? ", " : "", KINDS[i].name);
        if (w < 0) break;
        o += (size_t)w;
    }
}
