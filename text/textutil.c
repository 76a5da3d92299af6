/* textutil.c — id arrays, the vocabulary check, line files and text filler families (textutil.h). */
#include "text/textutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/names.h"

#define MAX_TEXT_FILE ((size_t)64 << 20) /* a word list or sentence file */
#define MAX_FAMILY_TEXT ((size_t)64 << 20) /* the text a repeating family may grow to */
#define MAX_FAMILIES 1000

/* ---- id arrays ---- */

int ps_ids_push(ps_ids *a, const int32_t *v, int64_t n, ps_error *err) {
    if (n <= 0) return 0;
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap : 64;
        while (cap < a->n + n) cap *= 2;
        int32_t *nv = realloc(a->v, (size_t)cap * sizeof *nv);
        if (!nv) return ps_fail(err, "out of memory for %lld token ids", (long long)cap);
        a->v = nv;
        a->cap = cap;
    }
    memcpy(a->v + a->n, v, (size_t)n * sizeof *v);
    a->n += n;
    return 0;
}

int ps_ids_text(ps_ids *a, const ps_tokenizer *tok, const char *s, size_t len, ps_error *err) {
    if (len == 0) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    if (ps_tokenize(tok, s, len, false, &ids, &n, err)) return -1;
    int rc = ps_ids_push(a, ids, (int64_t)n, err);
    free(ids);
    return rc;
}

void ps_ids_free(ps_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- model and tokenizer ---- */

int ps_text_check_vocab(const ps_tokenizer *tok, const char *tok_path, int64_t model_vocab, const char *model_dir,
                        ps_error *err) {
    int64_t tv = ps_tokenizer_vocab_size(tok);
    if (tv > model_vocab)
        return ps_fail(err, "%s: the tokenizer has %lld ids but the model %s has vocab_size %lld: they do not belong together",
                       tok_path, (long long)tv, model_dir, (long long)model_vocab);
    if (model_vocab - tv > PS_TEXT_VOCAB_SLACK)
        return ps_fail(err, "%s: the tokenizer has %lld ids but the model %s has vocab_size %lld (%lld more; a model pads "
                            "at most %d): they do not belong together",
                       tok_path, (long long)tv, model_dir, (long long)model_vocab, (long long)(model_vocab - tv),
                       PS_TEXT_VOCAB_SLACK);
    return 0;
}

char *ps_text_id_string(const ps_tokenizer *tok, int32_t id) {
    char *s = NULL;
    size_t len = 0;
    ps_error e;
    if (id >= 0 && id < ps_tokenizer_vocab_size(tok) && ps_tokenizer_id_to_token(tok, id, &len) &&
        !ps_detokenize(tok, &id, 1, false, &s, &len, &e))
        return s;
    s = malloc(32);
    if (s) snprintf(s, 32, "<id %d>", (int)id);
    return s;
}

/* ---- line files ---- */

void ps_text_lines_free(char **lines, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

int ps_text_read_lines(const char *path, char ***lines, int64_t *n, ps_error *err) {
    *lines = NULL;
    *n = 0;
    char *text;
    size_t len;
    if (ps_read_file(path, MAX_TEXT_FILE, &text, &len, err)) return -1;
    int64_t cap = 0, cnt = 0;
    char **out = NULL;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        size_t e = j;
        if (e > i && text[e - 1] == '\r') e--;
        int blank = 1;
        for (size_t k = i; k < e && blank; k++) blank = text[k] == ' ' || text[k] == '\t';
        if (!blank) {
            if (cnt == cap) {
                cap = cap ? 2 * cap : 64;
                char **no = realloc(out, (size_t)cap * sizeof *no);
                if (!no) {
                    rc = ps_fail(err, "%s: out of memory for %lld lines", path, (long long)cap);
                    break;
                }
                out = no;
            }
            if (memchr(text + i, '\0', e - i)) {
                rc = ps_fail(err, "%s: line %lld holds a NUL byte", path, (long long)cnt + 1);
                break;
            }
            out[cnt] = strndup(text + i, e - i);
            if (!out[cnt]) {
                rc = ps_fail(err, "%s: out of memory", path);
                break;
            }
            cnt++;
        }
        i = j + 1;
    }
    free(text);
    if (!rc && cnt == 0) rc = ps_fail(err, "%s: no lines (the file is empty or blank)", path);
    if (rc) {
        ps_text_lines_free(out, cnt);
        return -1;
    }
    *lines = out;
    *n = cnt;
    return 0;
}

/* ---- families ---- */

void ps_text_dirname(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

static void family_free(ps_text_family *f) {
    free(f->name);
    ps_text_lines_free(f->sentences, f->n_sentences);
    free(f->separator);
    free(f->source);
    memset(f, 0, sizeof *f);
}

void ps_text_families_free(ps_text_family *f, int n) {
    if (!f) return;
    for (int i = 0; i < n; i++) family_free(&f[i]);
    free(f);
}

static int parse_family(json_t *o, const char *base_dir, const char *source, size_t i, ps_text_family *f, ps_error *err) {
    static const char *const KEYS[] = {"name", "sentences", "file", "separator", "repeat", "description", NULL};
    if (!json_is_object(o)) return ps_fail(err, "%s[%zu]: expected an object, got %s", source, i, ps_json_type_name(o));
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int known = 0;
        for (int j = 0; KEYS[j] && !known; j++) known = !strcmp(k, KEYS[j]);
        if (!known)
            return ps_fail(err, "%s[%zu]: unknown key \"%s\" (a family has name, sentences or file, separator, repeat, "
                                "description)",
                           source, i, k);
    }
    json_t *nm = json_object_get(o, "name"), *se = json_object_get(o, "sentences"), *fi = json_object_get(o, "file"),
           *sp = json_object_get(o, "separator"), *rp = json_object_get(o, "repeat");
    if (!json_is_string(nm) || !json_string_length(nm) || json_string_length(nm) > 64)
        return ps_fail(err, "%s[%zu].name: expected a string of 1 to 64 characters, got %s", source, i, ps_json_type_name(nm));
    const char *name = json_string_value(nm);
    if (!!se == !!fi) return ps_fail(err, "%s[%zu] (\"%s\"): give \"sentences\" (a list) or \"file\" (a text file), one of them", source, i, name);
    if (sp && !json_is_string(sp))
        return ps_fail(err, "%s[%zu].separator: expected a string, got %s", source, i, ps_json_type_name(sp));
    if (rp && !json_is_boolean(rp))
        return ps_fail(err, "%s[%zu].repeat: expected true or false, got %s", source, i, ps_json_type_name(rp));
    f->name = strdup(name);
    f->separator = strdup(sp ? json_string_value(sp) : "\n");
    f->repeat = rp ? json_is_true(rp) : 0;
    if (!f->name || !f->separator) return ps_fail(err, "%s: out of memory", source);
    if (se) {
        if (!json_is_array(se) || json_array_size(se) == 0 || json_array_size(se) > (1u << 20))
            return ps_fail(err, "%s[%zu].sentences: expected a non-empty list of strings", source, i);
        f->sentences = calloc(json_array_size(se), sizeof *f->sentences);
        if (!f->sentences) return ps_fail(err, "%s: out of memory", source);
        for (size_t j = 0; j < json_array_size(se); j++) {
            json_t *s = json_array_get(se, j);
            if (!json_is_string(s) || !json_string_length(s))
                return ps_fail(err, "%s[%zu].sentences[%zu]: expected a non-empty string, got %s", source, i, j,
                               json_is_string(s) ? "an empty string" : ps_json_type_name(s));
            if (!(f->sentences[j] = strdup(json_string_value(s)))) return ps_fail(err, "%s: out of memory", source);
            f->n_sentences++;
        }
        f->source = strdup("inline");
    } else {
        if (!json_is_string(fi) || !json_string_length(fi))
            return ps_fail(err, "%s[%zu].file: expected a file name, got %s", source, i, ps_json_type_name(fi));
        char path[4096];
        const char *fn = json_string_value(fi);
        if (fn[0] == '/') snprintf(path, sizeof path, "%s", fn);
        else if (snprintf(path, sizeof path, "%s/%s", base_dir, fn) >= (int)sizeof path)
            return ps_fail(err, "%s[%zu].file: path too long", source, i);
        if (ps_text_read_lines(path, &f->sentences, &f->n_sentences, err))
            return ps_fail_prefix(err, "%s[%zu] (\"%s\"): ", source, i, name);
        f->source = strdup(path);
    }
    if (!f->source) return ps_fail(err, "%s: out of memory", source);
    return 0;
}

int ps_text_families_parse(json_t *arr, const char *base_dir, const char *source, ps_text_family **out, int *n,
                           ps_error *err) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > MAX_FAMILIES)
        return ps_fail(err, "%s: expected a list of 1 to %d families, got %s", source, MAX_FAMILIES,
                       json_is_array(arr) ? "an empty list" : ps_json_type_name(arr));
    size_t m = json_array_size(arr);
    ps_text_family *f = calloc(m, sizeof *f);
    if (!f) return ps_fail(err, "%s: out of memory", source);
    int rc = 0;
    for (size_t i = 0; i < m && !rc; i++) {
        rc = parse_family(json_array_get(arr, i), base_dir, source, i, &f[i], err);
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(f[j].name, f[i].name))
                rc = ps_fail(err, "%s[%zu]: family \"%s\" again (first at [%zu]); names must be unique", source, i, f[i].name, j);
    }
    if (rc) {
        ps_text_families_free(f, (int)m);
        return -1;
    }
    *out = f;
    *n = (int)m;
    return 0;
}

int ps_text_families_load(const char *path, ps_text_family **out, int *n, ps_error *err) {
    char *text;
    size_t len;
    *out = NULL;
    *n = 0;
    if (ps_read_file(path, 1 << 24, &text, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    char dir[4096], src[4200];
    ps_text_dirname(path, dir, sizeof dir);
    snprintf(src, sizeof src, "%s: families", path);
    int rc = json_is_object(root) ? ps_text_families_parse(json_object_get(root, "families"), dir, src, out, n, err)
                                  : ps_fail(err, "%s: expected an object with \"families\"", path);
    json_decref(root);
    return rc;
}

static const char *text_family_name(const void *f, int i) { return ((const ps_text_family *)f)[i].name; }

int ps_text_family_find(const ps_text_family *f, int n, const char *name, const ps_text_family **out, ps_error *err) {
    int i;
    if (ps_family_by_name(f, n, text_family_name, name, "text filler family", &i, err)) return -1;
    *out = &f[i];
    return 0;
}

/* k rounds of the sentences joined by the separator */
static char *family_text(const ps_text_family *f, int64_t rounds, size_t *len) {
    size_t sl = strlen(f->separator), total = 0;
    for (int64_t i = 0; i < f->n_sentences; i++) total += strlen(f->sentences[i]) + sl;
    if (total == 0 || (size_t)rounds > MAX_FAMILY_TEXT / total) return NULL;
    char *s = malloc(total * (size_t)rounds + 1), *p = s;
    if (!s) return NULL;
    for (int64_t r = 0; r < rounds; r++)
        for (int64_t i = 0; i < f->n_sentences; i++) {
            if (p != s) {
                memcpy(p, f->separator, sl);
                p += sl;
            }
            size_t l = strlen(f->sentences[i]);
            memcpy(p, f->sentences[i], l);
            p += l;
        }
    *p = '\0';
    *len = (size_t)(p - s);
    return s;
}

int ps_text_family_ids(const ps_text_family *f, const ps_tokenizer *tok, int64_t need, ps_ids *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    for (int64_t rounds = 1;; rounds *= 2) {
        size_t len = 0;
        char *s = family_text(f, rounds, &len);
        if (!s)
            return ps_fail(err, "family \"%s\": %lld tokens needed, but its text would exceed %zu MB", f->name, (long long)need,
                           MAX_FAMILY_TEXT >> 20);
        ps_ids ids = {0};
        int rc = ps_ids_text(&ids, tok, s, len, err);
        free(s);
        if (rc) return ps_fail_prefix(err, "family \"%s\": ", f->name);
        if (ids.n >= need) {
            *out = ids;
            return 0;
        }
        if (!f->repeat) {
            int64_t got = ids.n;
            ps_ids_free(&ids);
            return ps_fail(err, "family \"%s\" (%s): its %lld sentences give %lld tokens, fewer than the %lld needed (add "
                                "sentences, or set \"repeat\": true)",
                           f->name, f->source, (long long)f->n_sentences, (long long)got, (long long)need);
        }
        if (ids.n == 0) {
            ps_ids_free(&ids);
            return ps_fail(err, "family \"%s\": its text gives no tokens", f->name);
        }
        ps_ids_free(&ids);
    }
}
