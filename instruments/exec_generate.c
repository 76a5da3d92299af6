/* exec_generate.c — the body of `phasescope generate` (instruments/commands.h): text generation through the
 * KV cache (core/kvcache.h, core/generate.h) on a checkpoint of any family with a cache (the controlled model,
 * DeepSeek-V4). Records the hooks asked for, makes the one generation call (ps_generate) and writes what it
 * returns: the text on stdout, and with an output folder generate.json (provenance, options, per sequence the
 * prompt, the generated tokens, their text and log-probabilities) and, with hooks, hooks.safetensors
 * ({hook}.{i}: every firing of sequence i concatenated along axis 1 — positions for token points, compressed
 * entries for attn.hook_gate_k/gate_v/ck/cv; and for the cache points blocks.{l}.attn.cache_ck / cache_cv,
 * the entries the cache holds at the end, [n, KV heads, hd]). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/fileio.h"
#include "core/generate.h"
#include "core/kvcache.h"
#include "core/model.h"
#include "core/runtime.h"
#include "core/safetensors.h"
#include "core/tokens.h"
#include "instruments/command.h"
#include "instruments/commands.h"
#include "instruments/tensor_list.h"
#include "text/tokenizer.h"

/* ---- hook recording: every firing appended, per (hook, sequence) ---- */

typedef struct {
    char name[96];
    int ndim;
    int64_t inner; /* floats per unit of axis 1 */
    int64_t shape[4];
    int64_t n1;    /* units of axis 1 so far */
    int started;   /* fired at least once (a firing may hold no floats: a top-k over no entries yet) */
    float *data;
    int64_t cap;
} rec_item;

typedef struct {
    const ps_kvcache *kv;
    int n_seq, n_names;
    rec_item *items; /* [n_names * n_seq] */
    char **names;
} recorder;

/* Firing f's rows into it. A point whose last axis grows between firings (DeepSeek-V4's indexer.scores and
 * indexer.topk: over the entries that exist so far) is kept at its widest: the recorded rows are re-laid
 * out when a wider firing comes, and every row narrower than the recording is padded with NaN ("no such
 * entry yet"). Any other change of shape is an error naming the hook. */
static int on_hook(const ps_hook_event *ev, void *user, ps_error *err) {
    recorder *r = user;
    int seq = ps_kvcache_event(r->kv)->seq, k = -1;
    for (int i = 0; i < r->n_names; i++)
        if (!strcmp(r->names[i], ev->name)) k = i;
    if (k < 0 || seq < 0 || seq >= r->n_seq) return 0;
    rec_item *it = &r->items[k * r->n_seq + seq];
    int nd = ev->ndim;
    int64_t rows = 1, last = nd > 2 ? ev->shape[nd - 1] : 1; /* per unit of axis 1: rows × last floats */
    for (int d = 2; d < nd - 1; d++) rows *= ev->shape[d];
    if (!it->started) {
        it->started = 1;
        snprintf(it->name, sizeof it->name, "%s.%d", ev->name, seq);
        it->ndim = nd - 1;
        it->inner = rows * last;
        for (int d = 1; d < nd; d++) it->shape[d - 1] = ev->shape[d];
    } else {
        int same = nd - 1 == it->ndim;
        for (int d = 2; same && d < nd - 1; d++) same = ev->shape[d] == it->shape[d - 1];
        if (!same) return ps_fail(err, "recording hook %s: its shape changed between firings (only the last axis may grow)", ev->name);
    }
    int64_t have = nd > 2 ? it->shape[nd - 2] : 1, wide = last > have ? last : have;
    int64_t add = ev->shape[1], need = (it->n1 + add) * rows * wide;
    if (need > it->cap) {
        int64_t cap = need > 2 * it->cap ? need : 2 * it->cap;
        float *nd_ = realloc(it->data, (size_t)cap * sizeof(float));
        if (!nd_) return ps_fail(err, "out of memory recording hook %s", ev->name);
        it->data = nd_;
        it->cap = cap;
    }
    if (wide > have) { /* widen what is recorded, from the end backwards (in place) */
        for (int64_t i = it->n1 * rows - 1; i >= 0; i--) {
            if (have) memmove(it->data + i * wide, it->data + i * have, (size_t)have * sizeof(float));
            for (int64_t j = have; j < wide; j++) it->data[i * wide + j] = NAN;
        }
        it->shape[nd - 2] = wide;
        it->inner = rows * wide;
    }
    for (int64_t i = 0; wide && i < add * rows; i++) { /* a firing over no entries yet holds no floats */
        float *dst = it->data + (it->n1 * rows + i) * wide;
        if (last) memcpy(dst, ev->data + i * last, (size_t)last * sizeof(float));
        for (int64_t j = last; j < wide; j++) dst[j] = NAN;
    }
    it->n1 += add;
    return 0;
}

static json_t *int_array(const int32_t *x, int64_t n) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_integer(x[i]));
    return a;
}

/* The prompts (--prompt through the tokenizer, or --tokens), each checked against the model: not empty, within
 * its length, every id in its vocabulary. */
static int read_prompts(const ps_generate_req *r, ps_tokenizer *tk, const ps_runtime *rt, ps_token_lists *toks, ps_error *err) {
    const char *prompt = r->prompt, *tokens = r->tokens;
    if (prompt) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ps_tokenize(tk, prompt, strlen(prompt), true, &ids, &n, err)) return -1;
        if (n == 0) {
            free(ids);
            ps_cli_usage(err, "--prompt: the text has no tokens");
            return -1;
        }
        toks->n = 1;
        toks->len = malloc(sizeof *toks->len);
        toks->seq = malloc(sizeof *toks->seq);
        if (!toks->len || !toks->seq) {
            free(ids);
            ps_fail(err, "out of memory for the prompt");
            return -1;
        }
        toks->len[0] = (int64_t)n;
        toks->seq[0] = ids;
    } else if (ps_tokens_load(tokens, 0, 0, toks, err))
        return -1;
    for (int i = 0; i < toks->n; i++) {
        if (toks->len[i] < 1) {
            ps_fail(err, "%s: sequence %d is empty (a prompt needs at least one token)", tokens ? tokens : "--prompt", i);
            return -1;
        }
        if (toks->len[i] > rt->max_pos) {
            ps_fail(err, "%s: sequence %d has %lld tokens, more than %s %lld by %lld", tokens ? tokens : "--prompt", i,
                    (long long)toks->len[i], rt->family->max_pos_name, (long long)rt->max_pos, (long long)(toks->len[i] - rt->max_pos));
            return -1;
        }
        for (int64_t t = 0; t < toks->len[i]; t++)
            if (toks->seq[i][t] >= rt->family->vocab(rt)) {
                ps_fail(err, "%s: token %d (sequence %d, position %lld) is outside the model's vocabulary [0, %lld)",
                        tokens ? tokens : "--prompt", toks->seq[i][t], i, (long long)t, (long long)rt->family->vocab(rt));
                return -1;
            }
    }
    return 0;
}

/* --edit: comma-separated edits of the cache (ps_generate_edit_parse_kv), usage errors naming the flag. */
static int parse_edits(const char *edit_flag, const ps_kvcache *kv, ps_generate_edit **edits, int *n_edits, ps_error *err) {
    char *s = strdup(edit_flag);
    int rc = s ? 0 : ps_fail(err, "out of memory");
    for (char *save = NULL, *e = s ? strtok_r(s, ",", &save) : NULL; e && !rc; e = strtok_r(NULL, ",", &save)) {
        ps_generate_edit *ne = realloc(*edits, (size_t)(*n_edits + 1) * sizeof *ne);
        if (!ne) {
            rc = ps_fail(err, "out of memory");
            break;
        }
        *edits = ne;
        if (ps_generate_edit_parse_kv(kv, e, &ne[*n_edits], err)) {
            ps_fail_prefix(err, "--edit: ");
            rc = ps_cli_mark_usage(err);
            break;
        }
        (*n_edits)++;
    }
    free(s);
    return rc;
}

/* The cache points --hooks names (blocks.L.attn.cache_*): every entry each of the n_seq sequences holds at the
 * end, [n, KV heads, hd], into out as "NAME.SEQ". */
static int push_cache_points(const recorder *rec, const ps_kvcache *kv, int n_seq, ps_tensor_list *out, ps_error *err) {
    for (int k = 0; k < rec->n_names; k++) {
        int cl, cv;
        if (!strstr(rec->names[k], ".attn.cache_") || ps_kvcache_point_parse_kv(kv, rec->names[k], &cl, &cv, err)) continue;
        int64_t nh = ps_kvcache_entry_heads(kv), hd = ps_kvcache_entry_width(kv, cl, cv);
        for (int i = 0; i < n_seq; i++) {
            int64_t ne = ps_kvcache_n_entries(kv, i, cl, 0);
            float *buf = malloc((size_t)((ne ? ne : 1) * nh * hd) * sizeof(float));
            if (!buf) return ps_fail(err, "out of memory");
            int bad = 0;
            for (int64_t j = 0; j < ne && !bad; j++)
                for (int64_t g = 0; g < nh && !bad; g++) {
                    if (ps_kvcache_n_entries(kv, i, cl, (int)g) <= j) /* a staggered head without entry j yet */
                        memset(buf + (j * nh + g) * hd, 0, (size_t)hd * sizeof(float));
                    else bad = ps_kvcache_entry(kv, i, cl, (int)g, cv, j, buf + (j * nh + g) * hd, err);
                }
            char nm[128];
            snprintf(nm, sizeof nm, "%s.%d", rec->names[k], i);
            int64_t shp[3] = {ne, nh, hd};
            bad = bad || ps_tensor_list_push(out, nm, 3, shp, buf, err);
            free(buf);
            if (bad) return -1;
        }
    }
    return 0;
}

/* generate.json's provenance and options (the options as given: the edits as written) */
static json_t *gen_provenance(const ps_runtime *rt, const char *cmdline, const char *dir, const char *hash, int64_t seed,
                              const char *backend) {
    json_t *prov = json_object();
    json_object_set_new(prov, "command", json_string(cmdline ? cmdline : "generate"));
    json_object_set_new(prov, "model", json_string(dir));
    json_object_set_new(prov, "config_hash", json_string(hash));
    json_object_set_new(prov, "version", json_string(PS_VERSION));
    json_object_set_new(prov, "seed", json_integer((json_int_t)seed));
    json_object_set_new(prov, "backend", json_string(backend));
    json_t *cfg = rt->family->config_json(rt);
    if (cfg) json_object_set_new(prov, "config", cfg);
    return prov;
}

static json_t *gen_options(const ps_generate_req *r, const ps_generate_opts *o) {
    json_t *opt = json_object(), *ed = json_array();
    json_object_set_new(opt, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(opt, "temperature", json_real(o->temperature));
    json_object_set_new(opt, "top_p", json_real(o->top_p));
    if (r->n_stop) {
        json_t *st = json_array();
        for (int k = 0; k < r->n_stop; k++) json_array_append_new(st, json_integer(r->stop[k]));
        json_object_set_new(opt, "stop", st);
    }
    char *es = r->edits ? strdup(r->edits) : NULL;
    if (r->edits && !es) return json_decref(opt), json_decref(ed), NULL;
    for (char *save = NULL, *e = es ? strtok_r(es, ",", &save) : NULL; e; e = strtok_r(NULL, ",", &save))
        json_array_append_new(ed, json_string(e));
    free(es);
    json_object_set_new(opt, "edits", ed);
    return opt;
}

/* sequence i of the generation as JSON (its prompt, tokens, log-probabilities and, with a tokenizer, its
 * text), said on stdout (the text, or the token ids); NULL with err set */
static json_t *sequence_json(const ps_generate_result *res, const ps_token_lists *toks, ps_tokenizer *tk, int i, ps_error *err) {
    json_t *s = json_object(), *lp = json_array();
    json_object_set_new(s, "prompt", int_array(toks->seq[i], toks->len[i]));
    json_object_set_new(s, "tokens", int_array(res->tok[i], res->n_gen[i]));
    for (int64_t t = 0; t < res->n_gen[i]; t++) json_array_append_new(lp, json_real(res->logprob[i][t]));
    json_object_set_new(s, "logprobs", lp);
    if (tk) {
        char *txt = NULL;
        size_t tl = 0;
        if (ps_detokenize(tk, res->tok[i], (size_t)res->n_gen[i], true, &txt, &tl, err)) {
            json_decref(s);
            return NULL;
        }
        json_object_set_new(s, "text", json_stringn(txt, tl));
        printf("%s%s\n", res->n > 1 ? "---\n" : "", txt);
        free(txt);
    } else {
        printf("sequence %d:", i);
        for (int64_t t = 0; t < res->n_gen[i]; t++) printf(" %d", res->tok[i][t]);
        printf("\n");
    }
    return s;
}

/* --hooks with --out: what the hooks recorded and the cache points read after the generation (n_seq
 * sequences), as out_dir/hooks.safetensors (out collects them) */
static int write_hooks(recorder *rec, ps_kvcache *kv, int n_seq, const char *out_dir, ps_tensor_list *out, ps_error *err) {
    char path[4200];
    for (int k = 0; k < rec->n_names * rec->n_seq; k++) {
        rec_item *it = &rec->items[k];
        if (!it->data) continue;
        it->shape[0] = it->n1;
        if (ps_tensor_list_push(out, it->name, it->ndim, it->shape, it->data, err)) return -1;
    }
    if (push_cache_points(rec, kv, n_seq, out, err)) return -1;
    if (ps_path_join(path, sizeof path, out_dir, "hooks.safetensors", err) || ps_st_save(path, out->t, out->n, NULL, NULL, 0, err))
        return -1;
    printf("wrote %d tensors to %s\n", out->n, path);
    return 0;
}

int ps_generate_command(const ps_args *args, const ps_generate_req *r, ps_error *err) {
    const char *tokfile = r->tokenizer, *hooks_flag = r->hooks, *edit_flag = r->edits, *out_dir = r->out_dir;
    int64_t max_tokens = r->max_tokens, seed = r->seed;
    ps_generate_opts o = {.temperature = r->temperature, .top_p = r->top_p};
    o.max_tokens = max_tokens;
    o.seed = (uint64_t)seed;
    int32_t stop_ids[64];
    for (int k = 0; k < r->n_stop; k++) stop_ids[k] = (int32_t)r->stop[k];
    o.stop = stop_ids, o.n_stop = r->n_stop;
    int rc = -1;
    char dir[4096], *names = NULL, *cmdline = NULL;
    ps_runtime rt;
    int have_rt = 0, have_kv = 0;
    ps_kvcache kv;
    ps_tokenizer *tk = NULL;
    ps_token_lists toks = {0};
    ps_hooks hooks;
    ps_hooks_init(&hooks);
    recorder rec = {0};
    ps_generate_edit *edits = NULL;
    int n_edits = 0;
    ps_generate_result res = {0};
    ps_tensor_list out = {0};
    json_t *root = NULL;
    /* any family with a KV cache (the controlled model, DeepSeek-V4): the runtime picks it */
    const char *backend = r->backend ? r->backend : "cpu";
    ps_runtime_opts ro = {.backend = backend, .weights = 1, .lazy = -1};
    if (ps_cli_model_dir(r->model, dir, sizeof dir, err)) goto done;
    have_rt = 1;
    if (ps_runtime_open(&rt, dir, &ro, err)) goto done;
    int64_t vocab = rt.family->vocab(&rt);
    for (int k = 0; k < r->n_stop; k++)
        if (r->stop[k] >= vocab) {
            ps_cli_usage(err, "--stop: token %d is outside the model's vocabulary [0, %lld)", r->stop[k], (long long)vocab);
            goto done;
        }
    if (tokfile && ps_tokenizer_load(tokfile, &tk, err)) goto done;
    if (read_prompts(r, tk, &rt, &toks, err)) goto done;
    if (ps_kvcache_create_rt(&kv, &rt, NULL, err)) goto done;
    have_kv = 1;
    if (edit_flag && parse_edits(edit_flag, &kv, &edits, &n_edits, err)) goto done;
    if (hooks_flag) {
        if (!(names = strdup(hooks_flag))) goto oom;
        rec.kv = &kv;
        rec.n_seq = toks.n;
        for (char *save = NULL, *h = strtok_r(names, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            char **nn = realloc(rec.names, (size_t)(rec.n_names + 1) * sizeof *nn);
            if (!nn) goto oom;
            rec.names = nn;
            rec.names[rec.n_names++] = h;
        }
        if (!(rec.items = calloc((size_t)(rec.n_names * rec.n_seq), sizeof *rec.items))) goto oom;
        for (int i = 0; i < rec.n_names; i++) {
            int cl, cv;
            if (strstr(rec.names[i], ".attn.cache_")) { /* the cache itself: read after the generation */
                if (ps_kvcache_point_parse_kv(&kv, rec.names[i], &cl, &cv, err)) {
                    ps_fail_prefix(err, "--hooks: ");
                    ps_cli_mark_usage(err);
                    goto done;
                }
                continue;
            }
            if (rt.family->hook_add(&rt, &hooks, rec.names[i], on_hook, &rec, err)) {
                ps_fail_prefix(err, "--hooks: ");
                ps_cli_mark_usage(err);
                goto done;
            }
        }
    }
    if (ps_generate(&kv, toks.n, toks.seq, toks.len, &o, edits, n_edits, &hooks, &res, err)) goto done;
    /* the text */
    root = json_object();
    json_t *seqs = json_array();
    json_object_set_new(root, "provenance", json_object()); /* (filled below with --out: first in the file) */
    json_object_set_new(root, "options", json_object());
    json_object_set_new(root, "sequences", seqs);
    for (int i = 0; i < res.n; i++) {
        json_t *s = sequence_json(&res, &toks, tk, i, err);
        if (!s) goto done;
        json_array_append_new(seqs, s);
    }
    if (out_dir) {
        char path[4200], hash[17];
        if (ps_mkdir(out_dir, err)) goto done;
        rt.family->config_hash(&rt, hash);
        cmdline = ps_args_command_line(args);
        json_t *prov = gen_provenance(&rt, cmdline, dir, hash, seed, backend), *opt = gen_options(r, &o);
        if (!prov || !opt) {
            json_decref(prov), json_decref(opt);
            goto oom;
        }
        json_object_set_new(root, "provenance", prov);
        json_object_set_new(root, "options", opt);
        char *txt = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        if (!txt) goto oom;
        int w = ps_path_join(path, sizeof path, out_dir, "generate.json", err) || ps_write_file_atomic(path, txt, strlen(txt), err);
        free(txt);
        if (w) goto done;
        printf("wrote %s\n", path);
        if (rec.n_names && write_hooks(&rec, &kv, res.n, out_dir, &out, err)) goto done;
    }
    rc = 0;
    goto done;
oom:
    ps_fail(err, "out of memory");
done:
    json_decref(root);
    ps_tensor_list_free(&out);
    ps_generate_result_free(&res);
    for (int k = 0; rec.items && k < rec.n_names * rec.n_seq; k++) free(rec.items[k].data);
    free(rec.items);
    free(rec.names);
    free(names);
    free(edits);
    free(cmdline);
    ps_hooks_free(&hooks);
    if (have_kv) ps_kvcache_free(&kv);
    ps_tokens_free(&toks);
    if (tk) ps_tokenizer_free(tk);
    if (have_rt) ps_runtime_free(&rt);
    return rc;
}
