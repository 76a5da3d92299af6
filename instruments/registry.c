/* registry.c — the table of commands (instruments/registry.h). */
#include "instruments/registry.h"

#include <string.h>

#include "instruments/instrument.h"

const ps_registry_entry ps_registry[] = {
    /* command              finish               kind           result            splits instrument changes_model */
    {&ps_cmd_train,         NULL,                NULL,          NULL,             1,     1,         0},
    {&ps_cmd_sweep,         ps_sweep_finish,     "sweep",       "sweep.json",     1,     1,         0},
    {&ps_cmd_knockout,      ps_knockout_finish,  "knockout",    "knockout.json",  1,     1,         0},
    {&ps_cmd_recall,        ps_recall_finish,    "recall",      "recall.json",    1,     1,         0},
    {&ps_cmd_patch,         ps_knockout_finish,  "patch",       "patch.json",     1,     1,         0}, /* the knockout's finish, by its meta's method */
    {&ps_cmd_gatecycle,     ps_gatecycle_finish, "gatecycle",   "gatecycle.json", 1,     1,         1},
    {&ps_cmd_gates,         ps_gates_finish,     "gates",       "gates.json",     1,     1,         0},
    {&ps_cmd_fillers,       NULL,                "fillers",     "fillers.json",   0,     1,         0},
    {&ps_cmd_merge,         NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_atp_compare,   NULL,                "atp_compare", "atp_compare.json", 0,   1,         0},
    {&ps_cmd_render,        NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_theory,        NULL,                "theory",      "theory.json",    0,     1,         0},
    {&ps_cmd_table,         NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_init,          NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_info,          NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_forward,       NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_grad,          NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_tokenize,      NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_probe,         NULL,                NULL,          NULL,             0,     1,         0}, /* sweep.json or fillers.json */
    {&ps_cmd_serve,         NULL,                NULL,          NULL,             0,     0,         0},
    {&ps_cmd_generate,      NULL,                NULL,          NULL,             0,     0,         0}, /* generate.json (no figure kind) */
};
const int ps_registry_n = (int)(sizeof ps_registry / sizeof ps_registry[0]);

const ps_registry_entry *ps_registry_find(const char *name) {
    for (int i = 0; name && i < ps_registry_n; i++)
        if (!strcmp(ps_registry[i].cmd->name, name)) return &ps_registry[i];
    return NULL;
}
