/* taskfile.h — the prompts' task of a checkpoint that carries none (a family with task_file set in its core
 * table, core/runtime.h: DeepSeek-V4), from a task file (--task FILE.json, or DIR/phasescope_task.json when the
 * checkpoint directory has one):
 *
 *   {"task": {...a training task, docs/training.md...},
 *    "ids": {"bos": 0, "marker": 1, "keys": [...], "values": [...], "fillers": [...]}}
 *
 * The prompts are generated in the task's own layout (0 BOS, 1 marker, keys, values, fillers) and every
 * token is mapped through "ids" to a model token id before the forward (the answers too: a query is correct
 * when each mapped answer token is the top-1 over the model's whole vocabulary; ps_eval_mapped, eval.h, with
 * the runtime's token_map = ids). Without "ids" the task's ids are used as they are (they must lie inside the
 * vocabulary). A bare task object is accepted too. */
#ifndef PS_TASKFILE_H
#define PS_TASKFILE_H

#include <jansson.h>
#include <stdint.h>

#include "core/error.h"
#include "tasks/tasks.h"

typedef struct {
    ps_task task;
    int32_t *ids;       /* [ps_task_vocab_needed]: the model's token of each task token */
    int64_t n_ids;
    int mapped;         /* the file gave "ids" */
    char source[4200];  /* the task file */
} ps_task_file;

/* The task for a checkpoint of MODEL_DIR: task_path (--task) if given, else MODEL_DIR/phasescope_task.json; an
 * error says how to give one when neither exists ("DIR is a TITLE checkpoint, which carries no phasescope
 * task: ..."). vocab / max_pos: the model's. */
int ps_task_file_load(ps_task_file *t, const char *task_path, const char *model_dir, const char *title, int64_t vocab, int64_t max_pos,
                      ps_error *err);
void ps_task_file_free(ps_task_file *t);
/* {"file", "ids": {...} or "identity"} for provenance. */
json_t *ps_task_file_source_json(const ps_task_file *t);

#endif
