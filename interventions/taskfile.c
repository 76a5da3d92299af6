/* taskfile.c — the prompts' task of a checkpoint that carries none, from a task file (taskfile.h). */
#include "interventions/taskfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"

/* ---- the task ---- */

void ps_task_file_free(ps_task_file *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static int id_list(json_t *ids, const char *key, int64_t want, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *a = json_object_get(ids, key);
    if (!json_is_array(a) || (int64_t)json_array_size(a) != want)
        return ps_fail(err, "%s: key \"ids.%s\" must be a list of %lld token ids (the task's n_%s)", src, key, (long long)want, key);
    for (int64_t i = 0; i < want; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
            return ps_fail(err, "%s: key \"ids.%s[%lld]\" must be a token id in [0, %lld)", src, key, (long long)i, (long long)vocab);
        out[i] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int one_id(json_t *ids, const char *key, int64_t vocab, int32_t *out, const char *src, ps_error *err) {
    json_t *x = json_object_get(ids, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
        return ps_fail(err, "%s: key \"ids.%s\" must be a token id in [0, %lld)", src, key, (long long)vocab);
    *out = (int32_t)json_integer_value(x);
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

int ps_task_file_load(ps_task_file *t, const char *task_path, const char *model_dir, const char *title, int64_t vocab, int64_t max_pos,
                      ps_error *err) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (task_path) snprintf(t->source, sizeof t->source, "%s", task_path);
    else {
        snprintf(t->source, sizeof t->source, "%s/phasescope_task.json", model_dir);
        if (stat(t->source, &st) != 0)
            return ps_fail(err, "%s is a %s checkpoint, which carries no phasescope task: give the prompts' task with "
                                "--task FILE.json ({\"task\": {...}, \"ids\": {...}}; docs/results-schema.md, \"DeepSeek-V4\"), "
                                "or put it in %s",
                           model_dir, title, t->source);
    }
    char *text;
    size_t len;
    if (ps_read_file(t->source, 1 << 20, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", t->source, je.line, je.text);
    int rc = -1;
    json_t *tj = json_object_get(root, "task"), *ids = json_object_get(root, "ids");
    if (!json_is_object(root)) {
        ps_fail(err, "%s: expected an object {\"task\": {...}, \"ids\": {...}}", t->source);
        goto done;
    }
    if (!tj) tj = root, ids = NULL; /* a bare task */
    else {
        const char *k;
        json_t *v;
        json_object_foreach(root, k, v) if (strcmp(k, "task") && strcmp(k, "ids")) {
            ps_fail(err, "%s: unknown key \"%s\" (valid: task, ids)", t->source, k);
            goto done;
        }
    }
    if (ps_task_from_json(tj, t->source, &t->task, err)) goto done;
    int64_t need = ps_task_vocab_needed(&t->task);
    if (ps_task_validate(&t->task, ids ? need : vocab, max_pos, t->source, err)) goto done;
    t->n_ids = need;
    t->ids = malloc((size_t)need * sizeof(int32_t));
    if (!t->ids) {
        ps_fail(err, "out of memory for %lld token ids", (long long)need);
        goto done;
    }
    if (!ids) {
        for (int64_t i = 0; i < need; i++) t->ids[i] = (int32_t)i;
        rc = 0;
        goto done;
    }
    t->mapped = 1;
    if (!json_is_object(ids)) {
        ps_fail(err, "%s: key \"ids\" must be an object {\"bos\", \"marker\", \"keys\", \"values\", \"fillers\"}", t->source);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(ids, k, v) if (strcmp(k, "bos") && strcmp(k, "marker") && strcmp(k, "keys") && strcmp(k, "values") &&
                                       strcmp(k, "fillers")) {
        ps_fail(err, "%s: unknown key \"ids.%s\" (valid: bos, marker, keys, values, fillers)", t->source, k);
        goto done;
    }
    const ps_task *tk = &t->task;
    if (one_id(ids, "bos", vocab, &t->ids[PS_BOS], t->source, err) || one_id(ids, "marker", vocab, &t->ids[PS_MARKER], t->source, err) ||
        id_list(ids, "keys", tk->n_keys, vocab, t->ids + ps_task_key0(tk), t->source, err) ||
        (tk->n_values > 0 && id_list(ids, "values", tk->n_values, vocab, t->ids + ps_task_val0(tk), t->source, err)) ||
        id_list(ids, "fillers", tk->n_fillers, vocab, t->ids + ps_task_fill0(tk), t->source, err))
        goto done;
    /* one role per token: a token both key and value (or filler) would make the answers ambiguous */
    int32_t *sorted = malloc((size_t)need * sizeof(int32_t));
    if (!sorted) {
        ps_fail(err, "out of memory");
        goto done;
    }
    memcpy(sorted, t->ids, (size_t)need * sizeof(int32_t));
    qsort(sorted, (size_t)need, sizeof(int32_t), cmp_i32);
    for (int64_t i = 1; i < need; i++)
        if (sorted[i] == sorted[i - 1]) {
            ps_fail(err, "%s: token id %d appears twice in \"ids\" (every task token needs its own id)", t->source, sorted[i]);
            free(sorted);
            goto done;
        }
    free(sorted);
    rc = 0;
done:
    json_decref(root);
    if (rc) ps_task_file_free(t);
    return rc;
}

json_t *ps_task_file_source_json(const ps_task_file *t) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(t->source));
    if (!t->mapped) {
        json_object_set_new(o, "ids", json_string("identity"));
        return o;
    }
    json_t *ids = json_object(), *a;
    const ps_task *tk = &t->task;
    json_object_set_new(ids, "bos", json_integer(t->ids[PS_BOS]));
    json_object_set_new(ids, "marker", json_integer(t->ids[PS_MARKER]));
    struct { const char *k; int64_t off, n; } L[] = {{"keys", ps_task_key0(tk), tk->n_keys},
                                                   {"values", ps_task_val0(tk), tk->n_values},
                                                   {"fillers", ps_task_fill0(tk), tk->n_fillers}};
    for (int i = 0; i < 3; i++) {
        if (!L[i].n) continue;
        a = json_array();
        for (int64_t j = 0; j < L[i].n; j++) json_array_append_new(a, json_integer(t->ids[L[i].off + j]));
        json_object_set_new(ids, L[i].k, a);
    }
    json_object_set_new(o, "ids", ids);
    return o;
}

