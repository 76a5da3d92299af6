/* tokenizer.c — Hugging Face tokenizer.json byte-level BPE: loader, encoder, decoder (see tokenizer.h).
 * Semantics follow the Rust `tokenizers` library (added_vocabulary.rs, normalizer.rs split behaviours,
 * models/bpe word merging); docs/tokenizers.md lists what is supported and the known differences. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_ID (1 << 24)      /* ids at or above this are refused (hostile files: no giant tables) */
#define MAX_STAGES 64         /* normalizer / pre-tokenizer / post-processor stages, nesting included */
#define CACHE_SLOTS 8192      /* per-call BPE cache (direct-mapped) */
#define CACHE_MAX_PIECE 256   /* pieces at most this long are cached */

/* ------------------------------------------------------------------ small containers */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

typedef struct {
    char *k; /* owned, NUL-terminated */
    uint32_t klen;
    int32_t v;
} sm_ent;

typedef struct {
    sm_ent *e;
    size_t cap, n; /* cap: power of two */
} strmap;

static int sm_init(strmap *m, size_t expect) {
    size_t cap = 16;
    while (cap < 2 * expect + 16) cap <<= 1;
    m->e = calloc(cap, sizeof *m->e);
    m->cap = cap;
    m->n = 0;
    return m->e ? 0 : -1;
}

static void sm_free(strmap *m) {
    if (!m->e) return;
    for (size_t i = 0; i < m->cap; i++) free(m->e[i].k);
    free(m->e);
    m->e = NULL;
}

static sm_ent *sm_slot(const strmap *m, const char *k, size_t klen) {
    size_t mask = m->cap - 1, i = (size_t)hash_bytes(k, klen) & mask;
    for (;;) {
        sm_ent *e = &m->e[i];
        if (!e->k || (e->klen == klen && !memcmp(e->k, k, klen))) return e;
        i = (i + 1) & mask;
    }
}

static int32_t sm_get(const strmap *m, const char *k, size_t klen) {
    if (!m->e) return -1;
    sm_ent *e = sm_slot(m, k, klen);
    return e->k ? e->v : -1;
}

/* Insert (the table never fills: sized at init from the element count). Returns the stored key,
 * NULL when out of memory; *existed set when the key was already there (value unchanged). */
static const char *sm_put(strmap *m, const char *k, size_t klen, int32_t v, int *existed) {
    sm_ent *e = sm_slot(m, k, klen);
    *existed = e->k != NULL;
    if (e->k) return e->k;
    if (2 * (m->n + 1) > m->cap) { /* grow */
        strmap g;
        if (sm_init(&g, m->n + 1)) return NULL;
        for (size_t i = 0; i < m->cap; i++)
            if (m->e[i].k) *sm_slot(&g, m->e[i].k, m->e[i].klen) = m->e[i];
        free(m->e);
        *m = g;
        e = sm_slot(m, k, klen);
    }
    char *c = malloc(klen + 1);
    if (!c) return NULL;
    memcpy(c, k, klen);
    c[klen] = 0;
    e->k = c;
    e->klen = (uint32_t)klen;
    e->v = v;
    m->n++;
    return c;
}

typedef struct {
    uint64_t key; /* (a << 32) | b; UINT64_MAX: empty */
    int32_t rank, id;
} mm_ent;

typedef struct {
    mm_ent *e;
    size_t cap;
} mergemap;

static int mm_init(mergemap *m, size_t expect) {
    size_t cap = 16;
    while (cap < 2 * expect + 16) cap <<= 1;
    m->e = malloc(cap * sizeof *m->e);
    if (!m->e) return -1;
    for (size_t i = 0; i < cap; i++) m->e[i].key = UINT64_MAX;
    m->cap = cap;
    return 0;
}

static mm_ent *mm_slot(const mergemap *m, uint64_t key) {
    size_t mask = m->cap - 1, i = (size_t)hash_u64(key) & mask;
    while (m->e[i].key != UINT64_MAX && m->e[i].key != key) i = (i + 1) & mask;
    return &m->e[i];
}

static inline const mm_ent *mm_get(const mergemap *m, int32_t a, int32_t b) {
    if (!m->e) return NULL;
    const mm_ent *e = mm_slot(m, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
    return e->key == UINT64_MAX ? NULL : e;
}

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

static int iv_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    char *v;
    size_t n, cap;
} bvec;

static int bv_add(bvec *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *v = realloc(b->v, cap);
        if (!v) return -1;
        b->v = v;
        b->cap = cap;
    }
    if (n) memcpy(b->v + b->n, p, n);
    b->n += n;
    b->v[b->n] = 0;
    return 0;
}

/* ------------------------------------------------------------------ UTF-8 */

static size_t utf8_put(char *o, int32_t c) {
    unsigned char *u = (unsigned char *)o;
    if (c < 0x80) { u[0] = (unsigned char)c; return 1; }
    if (c < 0x800) { u[0] = (unsigned char)(0xC0 | (c >> 6)); u[1] = (unsigned char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (c >> 12));
        u[1] = (unsigned char)(0x80 | ((c >> 6) & 63));
        u[2] = (unsigned char)(0x80 | (c & 63));
        return 3;
    }
    u[0] = (unsigned char)(0xF0 | (c >> 18));
    u[1] = (unsigned char)(0x80 | ((c >> 12) & 63));
    u[2] = (unsigned char)(0x80 | ((c >> 6) & 63));
    u[3] = (unsigned char)(0x80 | (c & 63));
    return 4;
}

/* Decode one code point of valid UTF-8 at s (n bytes left). Returns its length. */
static size_t utf8_get(const char *s, size_t n, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) { *cp = 0xFFFD; return 1; }
    *cp = c;
    return (size_t)k;
}

/* Length of the code point ending at s[end-1] (valid UTF-8). */
static size_t utf8_prev_len(const char *s, size_t end) {
    size_t k = 1;
    while (k < end && k < 4 && ((unsigned char)s[end - k] & 0xC0) == 0x80) k++;
    return k;
}

/* Length of a maximal valid prefix of s[i..n) that forms one code point, or 0 with *bad = bytes of the
 * maximal subpart to replace. */
static size_t utf8_valid_at(const unsigned char *s, size_t i, size_t n, size_t *bad) {
    unsigned c = s[i];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (; k < need; k++) {
        if (i + k >= n) break;
        unsigned b = s[i + k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) break;
    }
    if (k == need) return need;
    *bad = k;
    return 0;
}

char *ps_utf8_lossy(const char *s, size_t len, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t extra = 0;
    for (size_t i = 0; i < len;) {
        size_t bad = 0, k = utf8_valid_at(u, i, len, &bad);
        if (k) i += k;
        else {
            extra += 3;
            i += bad;
        }
    }
    char *o = malloc(len + extra + 1);
    if (!o) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < len;) {
        size_t bad = 0, k = utf8_valid_at(u, i, len, &bad);
        if (k) {
            memcpy(o + w, s + i, k);
            w += k;
            i += k;
        } else {
            w += utf8_put(o + w, 0xFFFD);
            i += bad;
        }
    }
    o[w] = 0;
    *out_len = w;
    return o;
}

static bool utf8_is_valid(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t bad, k = utf8_valid_at(u, i, len, &bad);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* White_Space (what Rust's regex \s matches). */
static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ------------------------------------------------------------------ the GPT-2 byte map */

static int32_t byte_to_cp(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
    return 256 + n;
}

/* ------------------------------------------------------------------ the tokenizer */

enum { NORM_NFC = 1, NORM_NFD, NORM_NFKC, NORM_NFKD };
enum { PRE_SPLIT = 1, PRE_BYTELEVEL };
enum { B_REMOVED = 1, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

typedef struct {
    int type;
    pcre2_code *re;
    int behavior;
    bool invert;
    bool add_prefix_space;
} pre_stage;

typedef struct {
    char *content, *pattern; /* pattern: what is matched (normalized content for normalized tokens) */
    size_t len, plen;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added_tok;

typedef struct {
    int32_t child, sibling, tok; /* tok: index into added[], or -1 */
    unsigned char byte;
} tnode;

typedef struct {
    tnode *n;
    int32_t nn, cap;
    int32_t root[256]; /* first-level nodes */
} trie;

struct ps_tokenizer {
    strmap vocab;  /* model vocabulary */
    strmap added_map;
    const char **id_tok; /* [n_ids] stored strings (added content takes precedence), NULL if none */
    uint32_t *id_len;
    uint8_t *id_special;
    int32_t n_ids;
    mergemap merges;
    int32_t unk_id;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t bf_id[256]; /* <0xXX> tokens, -1 when absent */
    bool byte_level;    /* a ByteLevel pre-tokenizer: BPE works on the mapped bytes */
    int32_t bl_id[256];
    char bl_str[256][3];
    uint8_t bl_len[256];
    int16_t cp_to_byte[324];
    int norm[MAX_STAGES];
    int n_norm;
    pre_stage pre[MAX_STAGES];
    int n_pre;
    added_tok *added;
    int n_added;
    trie raw_trie, norm_trie;
    pcre2_code *word_re; /* \w of the reference, for single_word added tokens */
    int32_t *added_ids; /* while loading: the ids of added_tokens[i] */
    int32_t *sp_pre, *sp_post; /* special ids around a single sequence */
    int n_sp_pre, n_sp_post;
    int decoder; /* 0: none (tokens joined by spaces), 1: ByteLevel */
};

/* ------------------------------------------------------------------ JSON helpers */

typedef struct {
    const char *file;
    ps_error *err;
    void *cats; /* cat_cache of this load */
} ctx;

#define FAILK(c, ...) ps_fail_prefix((ps_fail((c)->err, __VA_ARGS__), (c)->err), "%s: ", (c)->file)

static int get_bool(ctx *c, json_t *obj, const char *key, const char *path, bool dflt, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return FAILK(c, "%s.%s: expected true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static const char *get_type(ctx *c, json_t *obj, const char *path) {
    json_t *t = json_object_get(obj, "type");
    if (!json_is_string(t)) {
        FAILK(c, "%s.type: missing or not a string", path);
        return NULL;
    }
    return json_string_value(t);
}

/* ------------------------------------------------------------------ the trie of added tokens */

static int trie_add(trie *t, const char *s, size_t len, int32_t tok) {
    int32_t *link = &t->root[(unsigned char)s[0]];
    int32_t node = -1;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t cur = *link;
        while (cur >= 0 && t->n[cur].byte != b) cur = t->n[cur].sibling;
        if (cur < 0) {
            if (t->nn == t->cap) {
                int32_t cap = t->cap ? 2 * t->cap : 256;
                tnode *n = realloc(t->n, (size_t)cap * sizeof *n);
                if (!n) return -1;
                t->n = n;
                t->cap = cap;
            }
            cur = t->nn++;
            t->n[cur] = (tnode){.child = -1, .sibling = *link, .tok = -1, .byte = b};
            *link = cur;
        }
        node = cur;
        if (i + 1 < len) link = &t->n[cur].child;
    }
    if (t->n[node].tok < 0) t->n[node].tok = tok; /* first token with this pattern wins */
    return 0;
}

/* Longest token matching at s[i..n): its index, *mlen its length; -1 when none. */
static int32_t trie_longest(const trie *t, const char *s, size_t i, size_t n, size_t *mlen) {
    int32_t cur = t->root[(unsigned char)s[i]], best = -1;
    size_t j = i;
    while (cur >= 0) {
        if (t->n[cur].tok >= 0) {
            best = t->n[cur].tok;
            *mlen = j + 1 - i;
        }
        if (++j >= n) break;
        unsigned char b = (unsigned char)s[j];
        cur = t->n[cur].child;
        while (cur >= 0 && t->n[cur].byte != b) cur = t->n[cur].sibling;
    }
    return best;
}

/* ------------------------------------------------------------------ loading */

#define WORD_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"

static const char *const CAT2[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
                                   "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};

/* Code points utf8proc (Unicode 15) puts in general category `cat` (L, Lu, N, ...) that this PCRE2's
 * tables (Unicode 14 in Debian 12) leave unassigned: a class fragment "\x{..}-\x{..}..." to add to
 * \p{cat}, so that the pre-tokenizer sees newer letters as the reference (Oniguruma, Unicode 15) does. */
static int newer_in_category(const char *cat, size_t clen, bvec *o) {
    bool known = false;
    for (size_t i = 1; i < sizeof CAT2 / sizeof CAT2[0]; i++)
        if (!strncmp(CAT2[i], cat, clen) && (clen == 1 || clen == 2)) known = true;
    if (!known || cat[0] == 'C' || cat[0] == 'Z') return 0;
    char pat[16];
    snprintf(pat, sizeof pat, "\\p{%.*s}", (int)clen, cat);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec, &eo, NULL);
    if (!re) return 0;
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = md ? 0 : -1;
    int32_t run = -1;
    for (int32_t c = 0x80; c <= 0x110000 && !rc; c++) {
        bool extra = false;
        if (c < 0x110000 && !(c >= 0xD800 && c < 0xE000)) {
            const char *k = CAT2[utf8proc_category(c)];
            if (!strncmp(k, cat, clen)) {
                char u[4];
                size_t n = utf8_put(u, c);
                extra = pcre2_match(re, (PCRE2_SPTR)u, n, 0, PCRE2_NO_UTF_CHECK, md, NULL) < 0;
            }
        }
        if (extra && run < 0) run = c;
        if (!extra && run >= 0) {
            char r[48];
            int k = c - 1 == run ? snprintf(r, sizeof r, "\\x{%X}", (unsigned)run)
                                 : snprintf(r, sizeof r, "\\x{%X}-\\x{%X}", (unsigned)run, (unsigned)(c - 1));
            rc = bv_add(o, r, (size_t)k);
            run = -1;
        }
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc;
}

/* The reference compiles its patterns with Oniguruma, whose \s is the White_Space property and whose \w
 * is Alphabetic, marks, Nd, Pc and Join_Control (UTS #18). PCRE2's \s under UCP also matches U+180E
 * and its \w is narrower, so \s \S \w (and \W outside a class) are spelled out before compiling; and
 * \p{X} for a letter, mark, number, punctuation or symbol category gets the code points that are newer
 * than PCRE2's tables. */
typedef struct {
    char name[8][3];
    bvec val[8];
    int n;
} cat_cache;

static int newer_cached(cat_cache *cc, const char *cat, size_t clen, bvec *o) {
    if (clen > 2) return 0;
    for (int i = 0; i < cc->n; i++)
        if (strlen(cc->name[i]) == clen && !strncmp(cc->name[i], cat, clen)) return bv_add(o, cc->val[i].v ? cc->val[i].v : "", cc->val[i].n);
    bvec v = {0};
    if (newer_in_category(cat, clen, &v)) {
        free(v.v);
        return -1;
    }
    int rc = bv_add(o, v.v ? v.v : "", v.n);
    if (cc->n < 8) {
        memcpy(cc->name[cc->n], cat, clen);
        cc->name[cc->n][clen] = 0;
        cc->val[cc->n++] = v;
    } else
        free(v.v);
    return rc;
}

static int rewrite_classes(cat_cache *cc, const char *p, size_t n, bvec *o) {
    bool in_class = false;
    size_t class_start = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[++i];
            if (e == 's') rc = bv_add(o, "\\p{White_Space}", 15);
            else if (e == 'S') rc = bv_add(o, "\\P{White_Space}", 15);
            else if (e == 'w') rc = in_class ? bv_add(o, WORD_CLASS, sizeof WORD_CLASS - 1)
                                             : bv_add(o, "[" WORD_CLASS "]", sizeof WORD_CLASS + 1);
            else if (e == 'W' && !in_class) rc = bv_add(o, "[^" WORD_CLASS "]", sizeof WORD_CLASS + 2);
            else if (e == 'p' && i + 1 < n && p[i + 1] == '{' && memchr(p + i + 1, '}', n - i - 1)) {
                const char *name = p + i + 2, *end = memchr(p + i + 1, '}', n - i - 1);
                size_t nl = (size_t)(end - name);
                bvec extra = {0};
                if (newer_cached(cc, name, nl, &extra)) rc = -1;
                else if (!extra.n) rc = bv_add(o, p + i - 1, nl + 4);
                else
                    rc = (!in_class && bv_add(o, "[", 1)) || bv_add(o, p + i - 1, nl + 4) || bv_add(o, extra.v, extra.n) ||
                         (!in_class && bv_add(o, "]", 1));
                free(extra.v);
                i = (size_t)(end - p);
            } else if (e == 'Q') { /* literal up to \E */
                size_t j = i + 1;
                while (j + 1 < n && !(p[j] == '\\' && p[j + 1] == 'E')) j++;
                if (j + 1 >= n) j = n;
                rc = bv_add(o, p + i - 1, (j < n ? j + 2 : n) - (i - 1));
                i = j < n ? j + 1 : n;
            } else {
                char two[2] = {c, e};
                rc = bv_add(o, two, 2);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = i + 1;
            if (class_start < n && p[class_start] == '^') class_start++;
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') { end = p + j + 2; break; }
            if (end) {
                rc = bv_add(o, p + i, (size_t)(end - (p + i)));
                i = (size_t)(end - p) - 1;
                continue;
            }
        } else if (in_class && c == ']' && i != class_start)
            in_class = false;
        rc = bv_add(o, &c, 1);
    }
    return rc;
}

static int compile_regex(ctx *c, const char *pat, size_t len, bool literal, const char *path, pcre2_code **out) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    if (!utf8_is_valid(pat, len)) return FAILK(c, "%s: pattern is not valid UTF-8", path);
    bvec rw = {0};
    if (!literal && rewrite_classes(c->cats, pat, len, &rw)) {
        free(rw.v);
        return FAILK(c, "out of memory");
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : rw.v), literal ? len : rw.n, opts, &ec, &eo, NULL);
    free(rw.v);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return FAILK(c, "%s: regex does not compile (%s)", path, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: the interpreter is used when JIT is unavailable */
    *out = re;
    return 0;
}

static int parse_normalizer(ctx *c, ps_tokenizer *t, json_t *n, const char *path, int depth) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return FAILK(c, "%s: expected an object or null", path);
    if (depth > 8) return FAILK(c, "%s: nested too deeply", path);
    const char *type = get_type(c, n, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return FAILK(c, "%s.normalizers: expected a list", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            if (parse_normalizer(c, t, json_array_get(list, i), sub, depth + 1)) return -1;
        }
        return 0;
    }
    int kind = !strcmp(type, "NFC") ? NORM_NFC : !strcmp(type, "NFD") ? NORM_NFD : !strcmp(type, "NFKC") ? NORM_NFKC
             : !strcmp(type, "NFKD") ? NORM_NFKD : 0;
    if (!kind)
        return FAILK(c, "%s.type: normalizer \"%.64s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)", path,
                     type);
    if (t->n_norm >= MAX_STAGES) return FAILK(c, "%s: more than %d normalizers", path, MAX_STAGES);
    t->norm[t->n_norm++] = kind;
    return 0;
}

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pre(ctx *c, ps_tokenizer *t, json_t *p, const char *path, int depth) {
    if (!p || json_is_null(p)) return 0;
    if (!json_is_object(p)) return FAILK(c, "%s: expected an object or null", path);
    if (depth > 8) return FAILK(c, "%s: nested too deeply", path);
    const char *type = get_type(c, p, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return FAILK(c, "%s.pretokenizers: expected a list", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            if (parse_pre(c, t, json_array_get(list, i), sub, depth + 1)) return -1;
        }
        return 0;
    }
    if (t->n_pre >= MAX_STAGES) return FAILK(c, "%s: more than %d pre-tokenizers", path, MAX_STAGES);
    if (t->byte_level) return FAILK(c, "%s: a pre-tokenizer after ByteLevel is not supported", path);
    pre_stage *s = &t->pre[t->n_pre];
    memset(s, 0, sizeof *s);
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        if (!json_is_object(pat)) return FAILK(c, "%s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", path);
        json_t *rx = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
        json_t *v = rx ? rx : str;
        if (!json_is_string(v) || (rx && str))
            return FAILK(c, "%s.pattern: expected {\"Regex\": STRING} or {\"String\": STRING}", path);
        char sub[256];
        snprintf(sub, sizeof sub, "%s.pattern.%s", path, rx ? "Regex" : "String");
        if (json_string_length(v) == 0 && str) return FAILK(c, "%s: empty string", sub);
        if (compile_regex(c, json_string_value(v), json_string_length(v), str != NULL, sub, &s->re)) return -1;
        t->n_pre++; /* owns the regex from here on */
        json_t *b = json_object_get(p, "behavior");
        if (!json_is_string(b)) return FAILK(c, "%s.behavior: missing or not a string", path);
        const char *bs = json_string_value(b);
        s->behavior = !strcmp(bs, "Removed") ? B_REMOVED : !strcmp(bs, "Isolated") ? B_ISOLATED
                    : !strcmp(bs, "MergedWithPrevious") ? B_MERGED_PREV : !strcmp(bs, "MergedWithNext") ? B_MERGED_NEXT
                    : !strcmp(bs, "Contiguous") ? B_CONTIGUOUS : 0;
        if (!s->behavior)
            return FAILK(c, "%s.behavior: \"%.64s\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                         path, bs);
        if (get_bool(c, p, "invert", path, false, &s->invert)) return -1;
        s->type = PRE_SPLIT;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex = true;
        if (get_bool(c, p, "add_prefix_space", path, true, &s->add_prefix_space) ||
            get_bool(c, p, "use_regex", path, true, &use_regex))
            return -1;
        s->type = PRE_BYTELEVEL;
        if (use_regex) {
            if (compile_regex(c, GPT2_RE, sizeof GPT2_RE - 1, false, path, &s->re)) return -1;
            s->behavior = B_ISOLATED;
        }
        t->n_pre++;
        t->byte_level = true;
        return 0;
    }
    return FAILK(c, "%s.type: pre-tokenizer \"%.64s\" is not supported (supported: Sequence, Split, ByteLevel)", path, type);
}

static int special_ids(ctx *c, ps_tokenizer *t, json_t *specials, const char *name, const char *path, ivec *out) {
    json_t *sp = json_object_get(specials, name);
    if (!json_is_object(sp)) return FAILK(c, "%s: special token \"%.64s\" is not in special_tokens", path, name);
    json_t *ids = json_object_get(sp, "ids");
    if (!json_is_array(ids)) return FAILK(c, "%s.special_tokens[\"%.64s\"].ids: expected a list", path, name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= t->n_ids)
            return FAILK(c, "%s.special_tokens[\"%.64s\"].ids[%zu]: not an id of the vocabulary", path, name, i);
        if (iv_push(out, (int32_t)json_integer_value(v))) return FAILK(c, "out of memory");
    }
    return 0;
}

/* A [token, id] pair of Roberta/BertProcessing. */
static int pair_id(ctx *c, ps_tokenizer *t, json_t *p, const char *key, const char *path, ivec *out) {
    json_t *v = json_object_get(p, key);
    json_t *id = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(id) || json_integer_value(id) < 0 ||
        json_integer_value(id) >= t->n_ids)
        return FAILK(c, "%s.%s: expected [TOKEN, ID] with an id of the vocabulary", path, key);
    return iv_push(out, (int32_t)json_integer_value(id)) ? FAILK(c, "out of memory") : 0;
}

static int parse_post(ctx *c, ps_tokenizer *t, json_t *p, const char *path, int depth, ivec *pre, ivec *post) {
    if (!p || json_is_null(p)) return 0;
    if (!json_is_object(p)) return FAILK(c, "%s: expected an object or null", path);
    if (depth > 8) return FAILK(c, "%s: nested too deeply", path);
    const char *type = get_type(c, p, path);
    if (!type) return -1;
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list)) return FAILK(c, "%s.processors: expected a list", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if (parse_post(c, t, json_array_get(list, i), sub, depth + 1, pre, post)) return -1;
        }
        return 0;
    }
    if (pre->n || post->n) return FAILK(c, "%s: more than one processor adds special tokens", path);
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
        if (!json_is_array(single)) return FAILK(c, "%s.single: expected a list", path);
        if (!json_is_object(specials)) return FAILK(c, "%s.special_tokens: expected an object", path);
        int seen_seq = 0;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i);
            json_t *st = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (json_is_object(sq)) {
                json_t *id = json_object_get(sq, "id");
                if (!json_is_string(id) || strcmp(json_string_value(id), "A") || seen_seq)
                    return FAILK(c, "%s.single[%zu]: a single-sequence template has one Sequence, \"A\"", path, i);
                seen_seq = 1;
            } else if (json_is_object(st)) {
                json_t *id = json_object_get(st, "id");
                if (!json_is_string(id)) return FAILK(c, "%s.single[%zu].SpecialToken.id: expected a string", path, i);
                char sub[256];
                snprintf(sub, sizeof sub, "%s.single[%zu]", path, i);
                if (special_ids(c, t, specials, json_string_value(id), sub, seen_seq ? post : pre)) return -1;
            } else
                return FAILK(c, "%s.single[%zu]: expected {\"SpecialToken\": ...} or {\"Sequence\": ...}", path, i);
        }
        if (!seen_seq) return FAILK(c, "%s.single: no Sequence \"A\"", path);
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing"))
        return pair_id(c, t, p, "cls", path, pre) || pair_id(c, t, p, "sep", path, post) ? -1 : 0;
    return FAILK(c, "%s.type: post-processor \"%.64s\" is not supported (supported: ByteLevel, TemplateProcessing, "
                    "RobertaProcessing, BertProcessing, Sequence)", path, type);
}

static int set_id_string(ctx *c, ps_tokenizer *t, int32_t id, const char *s, size_t len, const char *path) {
    (void)path;
    if (id < 0 || id >= t->n_ids) return FAILK(c, "internal: id %d out of range", (int)id);
    t->id_tok[id] = s;
    t->id_len[id] = (uint32_t)len;
    return 0;
}

static int normalize_str(const ps_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len);

static int parse_model(ctx *c, ps_tokenizer *t, json_t *root) {
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m)) return FAILK(c, "model: missing or not an object");
    json_t *type = json_object_get(m, "type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "BPE")))
        return FAILK(c, "model.type: only \"BPE\" is supported");
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return FAILK(c, "model.dropout: BPE dropout is not supported (must be null)");
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(m, affix[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return FAILK(c, "model.%s: only null or \"\" is supported", affix[i]);
    }
    if (get_bool(c, m, "fuse_unk", "model", false, &t->fuse_unk) ||
        get_bool(c, m, "byte_fallback", "model", false, &t->byte_fallback) ||
        get_bool(c, m, "ignore_merges", "model", false, &t->ignore_merges))
        return -1;
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return FAILK(c, "model.vocab: missing or not an object");
    if (sm_init(&t->vocab, json_object_size(vocab))) return FAILK(c, "out of memory");
    /* ids: the model's, then the added tokens' */
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        size_t klen = strlen(key);
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_ID)
            return FAILK(c, "model.vocab[\"%.64s\"]: expected an id in [0, %d)", key, MAX_ID);
        if (klen == 0) return FAILK(c, "model.vocab: empty token");
        if (!utf8_is_valid(key, klen)) return FAILK(c, "model.vocab[\"%.64s\"]: not valid UTF-8", key);
        int existed;
        if (!sm_put(&t->vocab, key, klen, (int32_t)json_integer_value(val), &existed)) return FAILK(c, "out of memory");
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    /* Added tokens get the ids Hugging Face gives them when it reads the file (AddedVocabulary::add_tokens,
     * in file order): the model's id when the content is in model.vocab, otherwise one past the largest
     * added id so far, or the vocabulary's size (its number of entries) when that is larger. The file's
     * `id` is what these give in every published file; where it is not, the library's ids are used. */
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) return FAILK(c, "added_tokens: expected a list");
    size_t na = json_array_size(added);
    t->added_ids = malloc((na ? na : 1) * sizeof *t->added_ids);
    if (!t->added_ids) return FAILK(c, "out of memory");
    int64_t max_added = -1, vocab_n = (int64_t)t->vocab.n;
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i), *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_object(a)) return FAILK(c, "added_tokens[%zu]: expected an object", i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_ID)
            return FAILK(c, "added_tokens[%zu].id: expected an id in [0, %d)", i, MAX_ID);
        if (!json_is_string(content) || json_string_length(content) == 0)
            return FAILK(c, "added_tokens[%zu].content: expected a non-empty string", i);
        int64_t hf = sm_get(&t->vocab, json_string_value(content), json_string_length(content));
        if (hf < 0) hf = max_added >= 0 && (max_added >= vocab_n || vocab_n == 0) ? max_added + 1 : vocab_n;
        if (hf >= MAX_ID) return FAILK(c, "added_tokens[%zu]: id %lld is too large", i, (long long)hf);
        t->added_ids[i] = (int32_t)hf;
        if (hf > max_added) max_added = hf;
        if (hf > max_id) max_id = hf;
    }
    t->n_ids = (int32_t)(max_id + 1);
    size_t nid = (size_t)(t->n_ids ? t->n_ids : 1);
    t->id_tok = calloc(nid, sizeof *t->id_tok);
    t->id_len = calloc(nid, sizeof *t->id_len);
    t->id_special = calloc(nid, 1);
    if (!t->id_tok || !t->id_len || !t->id_special) return FAILK(c, "out of memory");
    for (size_t i = 0; i < t->vocab.cap; i++) {
        const sm_ent *e = &t->vocab.e[i];
        if (!e->k) continue;
        if (t->id_tok[e->v]) {
            /* name the two tokens in a fixed order, whatever the hash order */
            const char *x = t->id_tok[e->v], *y = e->k;
            if (strcmp(x, y) > 0) {
                const char *z = x;
                x = y;
                y = z;
            }
            return FAILK(c, "model.vocab[\"%.64s\"]: id %d is also the id of \"%.64s\"", y, (int)e->v, x);
        }
        set_id_string(c, t, e->v, e->k, e->klen, "model.vocab");
    }
    json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) return FAILK(c, "model.unk_token: expected a string or null");
        t->unk_id = sm_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) return FAILK(c, "model.unk_token: \"%.64s\" is not in model.vocab", json_string_value(unk));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->bf_id[b] = sm_get(&t->vocab, name, 6);
    }
    /* merges */
    json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return FAILK(c, "model.merges: missing or not a list");
    if (mm_init(&t->merges, json_array_size(merges))) return FAILK(c, "out of memory");
    bvec buf = {0};
    int rc = 0;
    for (size_t i = 0; i < json_array_size(merges) && !rc; i++) {
        json_t *mg = json_array_get(merges, i);
        const char *a, *b;
        size_t la, lb;
        if (json_is_array(mg) && json_array_size(mg) == 2 && json_is_string(json_array_get(mg, 0)) &&
            json_is_string(json_array_get(mg, 1))) {
            a = json_string_value(json_array_get(mg, 0));
            la = json_string_length(json_array_get(mg, 0));
            b = json_string_value(json_array_get(mg, 1));
            lb = json_string_length(json_array_get(mg, 1));
        } else if (json_is_string(mg)) {
            const char *s = json_string_value(mg), *sp = memchr(s, ' ', json_string_length(mg));
            if (!sp || memchr(sp + 1, ' ', json_string_length(mg) - (size_t)(sp + 1 - s))) {
                rc = FAILK(c, "model.merges[%zu]: \"%.64s\" is not two tokens separated by one space", i, s);
                break;
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = json_string_length(mg) - la - 1;
        } else {
            rc = FAILK(c, "model.merges[%zu]: expected [\"A\", \"B\"] or \"A B\"", i);
            break;
        }
        int32_t ia = sm_get(&t->vocab, a, la), ib = sm_get(&t->vocab, b, lb);
        buf.n = 0;
        if (bv_add(&buf, a, la) || bv_add(&buf, b, lb)) {
            rc = FAILK(c, "out of memory");
            break;
        }
        int32_t im = sm_get(&t->vocab, buf.v, buf.n);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = FAILK(c, "model.merges[%zu]: \"%.64s\" is not in model.vocab", i,
                       ia < 0 ? a : ib < 0 ? b : buf.v);
            break;
        }
        mm_ent *e = mm_slot(&t->merges, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib);
        e->key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        e->rank = (int32_t)i; /* a repeated pair takes its last rank, as the reference does */
        e->id = im;
    }
    free(buf.v);
    return rc;
}

static int parse_added(ctx *c, ps_tokenizer *t, json_t *root) {
    json_t *added = json_object_get(root, "added_tokens");
    size_t n = json_array_size(added);
    if (sm_init(&t->added_map, n)) return FAILK(c, "out of memory");
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return FAILK(c, "out of memory");
    for (int i = 0; i < 256; i++) t->raw_trie.root[i] = t->norm_trie.root[i] = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(added, i);
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        added_tok *at = &t->added[t->n_added];
        json_t *content = json_object_get(a, "content");
        at->id = t->added_ids[i];
        at->len = json_string_length(content);
        if (!utf8_is_valid(json_string_value(content), at->len)) return FAILK(c, "%s.content: not valid UTF-8", path);
        if (get_bool(c, a, "special", path, false, &at->special) ||
            get_bool(c, a, "single_word", path, false, &at->single_word) ||
            get_bool(c, a, "lstrip", path, false, &at->lstrip) || get_bool(c, a, "rstrip", path, false, &at->rstrip) ||
            get_bool(c, a, "normalized", path, !at->special, &at->normalized))
            return -1;
        at->content = malloc(at->len + 1);
        if (!at->content) return FAILK(c, "out of memory");
        memcpy(at->content, json_string_value(content), at->len + 1);
        t->n_added++;
        int existed;
        if (!sm_put(&t->added_map, at->content, at->len, at->id, &existed)) return FAILK(c, "out of memory");
        if (existed) return FAILK(c, "%s.content: \"%.64s\" is added twice", path, at->content);
        if (t->id_tok[at->id] && sm_get(&t->vocab, t->id_tok[at->id], t->id_len[at->id]) != at->id)
            return FAILK(c, "%s.id: %d is also the id of added token \"%.64s\"", path, (int)at->id, t->id_tok[at->id]);
        set_id_string(c, t, at->id, at->content, at->len, path);
        t->id_special[at->id] = at->special;
    }
    return 0;
}

static int build_tries(ctx *c, ps_tokenizer *t) {
    for (int i = 0; i < t->n_added; i++) {
        added_tok *at = &t->added[i];
        if (at->single_word && !t->word_re && compile_regex(c, "\\w", 2, false, "added_tokens", &t->word_re)) return -1;
        if (at->normalized && t->n_norm) {
            if (normalize_str(t, at->content, at->len, &at->pattern, &at->plen))
                return FAILK(c, "added_tokens: \"%.64s\" does not normalize", at->content);
        } else {
            at->pattern = malloc(at->len + 1);
            if (!at->pattern) return FAILK(c, "out of memory");
            memcpy(at->pattern, at->content, at->len + 1);
            at->plen = at->len;
        }
        if (!at->plen) continue; /* normalized away: never matches */
        if (trie_add(at->normalized ? &t->norm_trie : &t->raw_trie, at->pattern, at->plen, i)) return FAILK(c, "out of memory");
    }
    return 0;
}

static int parse_decoder(ctx *c, ps_tokenizer *t, json_t *d) {
    if (!d || json_is_null(d)) {
        t->decoder = 0;
        return 0;
    }
    if (!json_is_object(d)) return FAILK(c, "decoder: expected an object or null");
    const char *type = get_type(c, d, "decoder");
    if (!type) return -1;
    if (!strcmp(type, "ByteLevel")) {
        t->decoder = 1;
        return 0;
    }
    return FAILK(c, "decoder.type: decoder \"%.64s\" is not supported (supported: ByteLevel)", type);
}

static int parse_root(ctx *c, ps_tokenizer *t, json_t *root) {
    if (!json_is_object(root)) return FAILK(c, "expected a JSON object (a tokenizer.json)");
    const char *unsupported[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v)) return FAILK(c, "%s: not supported (must be null)", unsupported[i]);
    }
    if (parse_model(c, t, root) || parse_added(c, t, root)) return -1;
    if (parse_normalizer(c, t, json_object_get(root, "normalizer"), "normalizer", 0)) return -1;
    if (parse_pre(c, t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", 0)) return -1;
    ivec pre = {0}, post = {0};
    int rc = parse_post(c, t, json_object_get(root, "post_processor"), "post_processor", 0, &pre, &post);
    t->sp_pre = pre.v;
    t->n_sp_pre = (int)pre.n;
    t->sp_post = post.v;
    t->n_sp_post = (int)post.n;
    if (rc || parse_decoder(c, t, json_object_get(root, "decoder")) || build_tries(c, t)) return -1;
    for (int b = 0; b < 256; b++) {
        int32_t cp = byte_to_cp(b);
        t->bl_len[b] = (uint8_t)utf8_put(t->bl_str[b], cp);
        t->bl_id[b] = sm_get(&t->vocab, t->bl_str[b], t->bl_len[b]);
    }
    for (int i = 0; i < 324; i++) t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) t->cp_to_byte[byte_to_cp(b)] = (int16_t)b;
    return 0;
}

void ps_tokenizer_free(ps_tokenizer *t) {
    if (!t) return;
    sm_free(&t->vocab);
    sm_free(&t->added_map);
    free(t->merges.e);
    free(t->id_tok);
    free(t->id_len);
    free(t->id_special);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pattern);
    }
    free(t->added);
    free(t->raw_trie.n);
    free(t->norm_trie.n);
    free(t->added_ids);
    free(t->sp_pre);
    free(t->sp_post);
    free(t);
}

static int load_json(json_t *root, const char *name, ps_tokenizer **out, ps_error *err) {
    cat_cache cats = {0};
    ctx c = {name, err, &cats};
    ps_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return ps_fail(err, "%s: out of memory", name);
    }
    int rc = parse_root(&c, t, root);
    json_decref(root);
    for (int i = 0; i < cats.n; i++) free(cats.val[i].v);
    if (rc) {
        ps_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int ps_tokenizer_parse(const char *json, size_t len, const char *name, ps_tokenizer **out, ps_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", name, je.line, je.text);
    return load_json(root, name, out, err);
}

int ps_tokenizer_load(const char *path, ps_tokenizer **out, ps_error *err) {
    *out = NULL;
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) return ps_fail(err, "%s: cannot open: %s", path, strerror(errno));
    fclose(f);
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ps_fail(err, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    return load_json(root, path, out, err);
}

int32_t ps_tokenizer_vocab_size(const ps_tokenizer *t) { return t->n_ids; }

int32_t ps_tokenizer_token_to_id(const ps_tokenizer *t, const char *s, size_t len) {
    int32_t id = sm_get(&t->added_map, s, len);
    return id >= 0 ? id : sm_get(&t->vocab, s, len);
}

const char *ps_tokenizer_id_to_token(const ps_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->id_tok[id]) return NULL;
    if (len) *len = t->id_len[id];
    return t->id_tok[id];
}

/* ------------------------------------------------------------------ encoding */

static int normalize_str(const ps_tokenizer *t, const char *s, size_t len, char **out, size_t *out_len) {
    char *cur = malloc(len + 1);
    if (!cur) return -1;
    memcpy(cur, s, len);
    cur[len] = 0;
    size_t n = len;
    for (int i = 0; i < t->n_norm; i++) {
        int opt = UTF8PROC_STABLE;
        switch (t->norm[i]) {
        case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t k = n ? utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)n, &o, (utf8proc_option_t)opt) : 0;
        if (k < 0) {
            free(cur);
            return -1;
        }
        if (n) {
            free(cur);
            cur = (char *)o;
            n = (size_t)k;
        }
    }
    *out = cur;
    *out_len = n;
    return 0;
}

typedef struct {
    const char *s;
    size_t len;
    int32_t id; /* >= 0: an added token, final */
} piece;

typedef struct {
    piece *p;
    size_t n, cap;
} pvec;

static int pv_push(pvec *v, const char *s, size_t len, int32_t id) {
    if (len == 0) return 0; /* empty pieces are dropped, as the reference does */
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        piece *p = realloc(v->p, cap * sizeof *p);
        if (!p) return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (piece){s, len, id};
    return 0;
}

typedef struct {
    char **b;
    size_t n, cap;
} arena;

static char *arena_keep(arena *a, char *p) {
    if (!p) return NULL;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        char **b = realloc(a->b, cap * sizeof *b);
        if (!b) {
            free(p);
            return NULL;
        }
        a->b = b;
        a->cap = cap;
    }
    a->b[a->n++] = p;
    return p;
}

static void arena_free(arena *a) {
    for (size_t i = 0; i < a->n; i++) free(a->b[i]);
    free(a->b);
}

/* A word character (\w of the reference) at a code point. */
static bool is_word(const ps_tokenizer *t, pcre2_match_data *md, int32_t cp) {
    char u[4];
    size_t n = utf8_put(u, cp);
    return pcre2_match(t->word_re, (PCRE2_SPTR)u, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

/* Split s by the added tokens of trie tr (find_matches of added_vocabulary.rs). */
static int split_added(const ps_tokenizer *t, const trie *tr, pcre2_match_data *md, const char *s, size_t n, pvec *out) {
    size_t start_offset = 0;
    for (size_t i = 0; i < n;) {
        size_t mlen = 0;
        int32_t k = tr->root[(unsigned char)s[i]] >= 0 ? trie_longest(tr, s, i, n, &mlen) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const added_tok *at = &t->added[k];
        size_t start = i, stop = i + mlen;
        if (at->single_word) {
            int32_t cp;
            bool start_space = start == 0, stop_space = stop == n;
            if (!start_space) {
                size_t pl = utf8_prev_len(s, start);
                utf8_get(s + start - pl, pl, &cp);
                start_space = !is_word(t, md, cp);
            }
            if (!stop_space) {
                utf8_get(s + stop, n - stop, &cp);
                stop_space = !is_word(t, md, cp);
            }
            if (!start_space || !stop_space) {
                i = stop; /* the match is consumed, as aho-corasick's iterator does */
                continue;
            }
        }
        if (at->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t pl = utf8_prev_len(s, ns);
                int32_t cp;
                utf8_get(s + ns - pl, pl, &cp);
                if (!is_ws(cp)) break;
                ns -= pl;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (at->rstrip) {
            while (stop < n) {
                int32_t cp;
                size_t l = utf8_get(s + stop, n - stop, &cp);
                if (!is_ws(cp)) break;
                stop += l;
            }
        }
        if (start < start_offset) start = start_offset;
        if (pv_push(out, s + start_offset, start - start_offset, -1) || pv_push(out, s + start, stop - start, at->id))
            return -1;
        start_offset = stop;
        i = stop;
    }
    return pv_push(out, s + start_offset, n - start_offset, -1);
}

typedef struct {
    size_t a, b;
    bool m;
} span;

typedef struct {
    span *s;
    size_t n, cap;
} svec;

static int sv_push(svec *v, size_t a, size_t b, bool m) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        span *s = realloc(v->s, cap * sizeof *s);
        if (!s) return -1;
        v->s = s;
        v->cap = cap;
    }
    v->s[v->n++] = (span){a, b, m};
    return 0;
}

typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    svec spans, merged;
    ps_error *err;
} rx_work;

/* One Split stage on one piece (NormalizedString::split with a Pattern and a behaviour). */
static int split_regex(const pre_stage *st, rx_work *w, const piece *pc, pvec *out) {
    w->spans.n = 0;
    size_t prev = 0, pos = 0, n = pc->len;
    while (pos <= n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)pc->s, n, pos, PCRE2_NO_UTF_CHECK, w->md, w->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            ps_fail(w->err, "tokenize: pre_tokenizer regex failed on a %zu-byte piece: %s", n, (char *)msg);
            return -2;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t a = ov[0], b = ov[1];
        if (a != prev && sv_push(&w->spans, prev, a, false)) return -1;
        if (sv_push(&w->spans, a, b, true)) return -1;
        prev = b;
        if (b == a) { /* empty match: step one character */
            if (b >= n) break;
            int32_t cp;
            pos = b + utf8_get(pc->s + b, n - b, &cp);
        } else
            pos = b;
    }
    if (prev != n && sv_push(&w->spans, prev, n, false)) return -1;
    if (st->invert)
        for (size_t i = 0; i < w->spans.n; i++) w->spans.s[i].m = !w->spans.s[i].m;
    svec *sp = &w->spans, *mg = &w->merged;
    mg->n = 0;
    switch (st->behavior) {
    case B_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->s[i].m && pv_push(out, pc->s + sp->s[i].a, sp->s[i].b - sp->s[i].a, -1)) return -1;
        return 0;
    case B_ISOLATED:
        for (size_t i = 0; i < sp->n; i++)
            if (pv_push(out, pc->s + sp->s[i].a, sp->s[i].b - sp->s[i].a, -1)) return -1;
        return 0;
    case B_MERGED_PREV: {
        bool pm = false;
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->s[i].m && !pm && mg->n) mg->s[mg->n - 1].b = sp->s[i].b;
            else if (sv_push(mg, sp->s[i].a, sp->s[i].b, false)) return -1;
            pm = sp->s[i].m;
        }
        break;
    }
    case B_MERGED_NEXT: {
        bool pm = false;
        for (size_t i = sp->n; i-- > 0;) {
            if (sp->s[i].m && !pm && mg->n) mg->s[mg->n - 1].a = sp->s[i].a;
            else if (sv_push(mg, sp->s[i].a, sp->s[i].b, false)) return -1;
            pm = sp->s[i].m;
        }
        for (size_t i = 0; i < mg->n / 2; i++) {
            span x = mg->s[i];
            mg->s[i] = mg->s[mg->n - 1 - i];
            mg->s[mg->n - 1 - i] = x;
        }
        break;
    }
    default: { /* Contiguous */
        bool pm = false;
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->s[i].m == pm && mg->n) mg->s[mg->n - 1].b = sp->s[i].b;
            else if (sv_push(mg, sp->s[i].a, sp->s[i].b, false)) return -1;
            pm = sp->s[i].m;
        }
        break;
    }
    }
    for (size_t i = 0; i < mg->n; i++)
        if (pv_push(out, pc->s + mg->s[i].a, mg->s[i].b - mg->s[i].a, -1)) return -1;
    return 0;
}

/* ---- BPE on one piece */

typedef struct {
    int32_t *id, *prev, *next;
    uint8_t *alive;
    uint64_t *heap; /* (rank << 32) | pos */
    int32_t *hid;   /* parallel: new id */
    size_t cap, hcap, hn;
} bpe_work;

static int bw_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(w->id, cap * sizeof *a);
    if (a) w->id = a;
    int32_t *b = realloc(w->prev, cap * sizeof *b);
    if (b) w->prev = b;
    int32_t *c = realloc(w->next, cap * sizeof *c);
    if (c) w->next = c;
    uint8_t *d = realloc(w->alive, cap);
    if (d) w->alive = d;
    if (!a || !b || !c || !d) return -1;
    w->cap = cap;
    return 0;
}

static int heap_push(bpe_work *w, int32_t rank, int32_t pos, int32_t id) {
    if (w->hn == w->hcap) {
        size_t cap = w->hcap ? 2 * w->hcap : 64;
        uint64_t *h = realloc(w->heap, cap * sizeof *h);
        if (h) w->heap = h;
        int32_t *i = realloc(w->hid, cap * sizeof *i);
        if (i) w->hid = i;
        if (!h || !i) return -1;
        w->hcap = cap;
    }
    uint64_t key = ((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos;
    size_t k = w->hn++;
    while (k > 0) {
        size_t p = (k - 1) / 2;
        if (w->heap[p] <= key) break;
        w->heap[k] = w->heap[p];
        w->hid[k] = w->hid[p];
        k = p;
    }
    w->heap[k] = key;
    w->hid[k] = id;
    return 0;
}

static void heap_pop(bpe_work *w, uint64_t *key, int32_t *id) {
    *key = w->heap[0];
    *id = w->hid[0];
    uint64_t lk = w->heap[--w->hn];
    int32_t li = w->hid[w->hn];
    size_t k = 0, n = w->hn;
    for (;;) {
        size_t c = 2 * k + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= lk) break;
        w->heap[k] = w->heap[c];
        w->hid[k] = w->hid[c];
        k = c;
    }
    if (n) {
        w->heap[k] = lk;
        w->hid[k] = li;
    }
}

/* Symbols of one piece before merging (merge_word of models/bpe/model.rs): each character (each byte
 * under ByteLevel) looked up in the vocabulary; otherwise byte fallback, then the unknown token. */
static int bpe_symbols(const ps_tokenizer *t, const char *s, size_t n, bpe_work *w, size_t *ns) {
    if (bw_reserve(w, 4 * n + 4)) return -1; /* byte fallback: up to 4 symbols per character */
    size_t k = 0;
    int32_t unk = -1;
    for (size_t i = 0; i < n;) {
        const char *cs;
        size_t cl, step;
        int32_t id;
        if (t->byte_level) {
            unsigned char b = (unsigned char)s[i];
            cs = t->bl_str[b];
            cl = t->bl_len[b];
            id = t->bl_id[b];
            step = 1;
        } else {
            int32_t cp;
            cs = s + i;
            cl = step = utf8_get(s + i, n - i, &cp);
            id = sm_get(&t->vocab, cs, cl);
        }
        i += step;
        if (id >= 0) {
            if (unk >= 0) w->id[k++] = unk, unk = -1;
            w->id[k++] = id;
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < cl; j++) all = all && t->bf_id[(unsigned char)cs[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < cl; j++) w->id[k++] = t->bf_id[(unsigned char)cs[j]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) w->id[k++] = unk;
            unk = t->unk_id;
        }
    }
    if (unk >= 0) w->id[k++] = unk;
    *ns = k;
    return 0;
}

static int bpe_piece(const ps_tokenizer *t, const char *s, size_t n, bpe_work *w, ivec *out) {
    if (t->ignore_merges) {
        int32_t id = -1;
        if (t->byte_level) {
            char small[512], *m = n * 2 < sizeof small ? small : malloc(2 * n + 1);
            if (!m) return -1;
            size_t ml = 0;
            for (size_t i = 0; i < n; i++) {
                memcpy(m + ml, t->bl_str[(unsigned char)s[i]], t->bl_len[(unsigned char)s[i]]);
                ml += t->bl_len[(unsigned char)s[i]];
            }
            id = sm_get(&t->vocab, m, ml);
            if (m != small) free(m);
        } else
            id = sm_get(&t->vocab, s, n);
        if (id >= 0) return iv_push(out, id);
    }
    size_t ns;
    if (bpe_symbols(t, s, n, w, &ns)) return -1;
    for (size_t i = 0; i < ns; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
        w->alive[i] = 1;
    }
    w->hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const mm_ent *e = mm_get(&t->merges, w->id[i], w->id[i + 1]);
        if (e && heap_push(w, e->rank, (int32_t)i, e->id)) return -1;
    }
    while (w->hn) {
        uint64_t key;
        int32_t nid;
        heap_pop(w, &key, &nid);
        int32_t pos = (int32_t)(uint32_t)key;
        if (!w->alive[pos] || w->next[pos] < 0) continue;
        int32_t nx = w->next[pos];
        const mm_ent *e = mm_get(&t->merges, w->id[pos], w->id[nx]);
        if (!e || e->id != nid) continue; /* an expired entry */
        w->id[pos] = nid;
        w->alive[nx] = 0;
        w->next[pos] = w->next[nx];
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = pos;
        if (w->prev[pos] >= 0) {
            const mm_ent *p = mm_get(&t->merges, w->id[w->prev[pos]], nid);
            if (p && heap_push(w, p->rank, w->prev[pos], p->id)) return -1;
        }
        if (w->next[pos] >= 0) {
            const mm_ent *q = mm_get(&t->merges, nid, w->id[w->next[pos]]);
            if (q && heap_push(w, q->rank, pos, q->id)) return -1;
        }
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->next[i])
        if (iv_push(out, w->id[i])) return -1;
    return 0;
}

typedef struct {
    uint64_t h;
    uint32_t koff, klen, ioff, ni;
    bool used;
} cache_ent;

typedef struct {
    cache_ent *e;
    bvec keys;
    ivec ids;
} bpe_cache;

static int bpe_cached(const ps_tokenizer *t, bpe_cache *c, const char *s, size_t n, bpe_work *w, ivec *out) {
    if (n > CACHE_MAX_PIECE || !c->e) return bpe_piece(t, s, n, w, out);
    uint64_t h = hash_bytes(s, n);
    cache_ent *e = &c->e[h & (CACHE_SLOTS - 1)];
    if (e->used && e->h == h && e->klen == n && !memcmp(c->keys.v + e->koff, s, n)) {
        for (uint32_t i = 0; i < e->ni; i++)
            if (iv_push(out, c->ids.v[e->ioff + i])) return -1;
        return 0;
    }
    size_t before = out->n;
    if (bpe_piece(t, s, n, w, out)) return -1;
    if (c->keys.n + n > UINT32_MAX / 2 || c->ids.n + (out->n - before) > UINT32_MAX / 2) return 0;
    size_t koff = c->keys.n, ioff = c->ids.n;
    if (bv_add(&c->keys, s, n)) return -1;
    for (size_t i = before; i < out->n; i++)
        if (iv_push(&c->ids, out->v[i])) return -1;
    *e = (cache_ent){h, (uint32_t)koff, (uint32_t)n, (uint32_t)ioff, (uint32_t)(out->n - before), true};
    return 0;
}

int ps_tokenize(const ps_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids_out, size_t *n_out,
                ps_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (!text && len) return ps_fail(err, "tokenize: no text");
    int rc = -1;
    arena ar = {0};
    pvec a = {0}, b = {0};
    ivec ids = {0};
    rx_work rw = {0};
    bpe_work bw = {0};
    bpe_cache cache = {0};
    rw.err = err;
    size_t clen = 0;
    char *clean = arena_keep(&ar, ps_utf8_lossy(text ? text : "", len, &clen));
    if (!clean) goto oom;
    for (int i = 0; i < t->n_sp_pre; i++)
        if (add_special && iv_push(&ids, t->sp_pre[i])) goto oom;
    rw.md = pcre2_match_data_create(1, NULL);
    if (!rw.md) goto oom;
    /* 1. added tokens on the raw text */
    if (split_added(t, &t->raw_trie, rw.md, clean, clen, &a)) goto oom;
    /* 2. normalize the other pieces, then split out the normalized added tokens */
    for (size_t i = 0; i < a.n; i++) {
        piece *p = &a.p[i];
        if (p->id >= 0) {
            if (pv_push(&b, p->s, p->len, p->id)) goto oom;
            continue;
        }
        const char *s = p->s;
        size_t n = p->len;
        if (t->n_norm) {
            char *o;
            if (normalize_str(t, p->s, p->len, &o, &n)) {
                ps_fail(err, "tokenize: the normalizer failed");
                goto done;
            }
            if (!arena_keep(&ar, o)) goto oom;
            s = o;
        }
        if (n && split_added(t, &t->norm_trie, rw.md, s, n, &b)) goto oom;
    }
    /* 3. pre-tokenizer stages */
    if (t->n_pre) {
        rw.mc = pcre2_match_context_create(NULL);
        rw.js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!rw.mc || !rw.js) goto oom;
        pcre2_jit_stack_assign(rw.mc, NULL, rw.js);
    }
    for (int s = 0; s < t->n_pre; s++) {
        const pre_stage *st = &t->pre[s];
        pvec *src = s % 2 ? &a : &b, *dst = s % 2 ? &b : &a;
        dst->n = 0;
        for (size_t i = 0; i < src->n; i++) {
            piece p = src->p[i];
            if (p.id >= 0) {
                if (pv_push(dst, p.s, p.len, p.id)) goto oom;
                continue;
            }
            if (st->type == PRE_BYTELEVEL && st->add_prefix_space && p.s[0] != ' ') {
                char *q = arena_keep(&ar, malloc(p.len + 2));
                if (!q) goto oom;
                q[0] = ' ';
                memcpy(q + 1, p.s, p.len);
                q[p.len + 1] = 0;
                p.s = q;
                p.len++;
            }
            if (!st->re) {
                if (pv_push(dst, p.s, p.len, -1)) goto oom;
            } else if ((rc = split_regex(st, &rw, &p, dst)) != 0) {
                int why = rc;
                rc = -1;
                if (why == -2) goto done;
                goto oom;
            }
        }
    }
    pvec *fin = t->n_pre % 2 ? &a : &b;
    /* 4. the model */
    cache.e = calloc(CACHE_SLOTS, sizeof *cache.e); /* no cache when this fails: slower, same ids */
    for (size_t i = 0; i < fin->n; i++) {
        const piece *p = &fin->p[i];
        if (p->id >= 0) {
            if (iv_push(&ids, p->id)) goto oom;
        } else if (bpe_cached(t, &cache, p->s, p->len, &bw, &ids))
            goto oom;
    }
    for (int i = 0; i < t->n_sp_post; i++)
        if (add_special && iv_push(&ids, t->sp_post[i])) goto oom;
    if (!ids.v && !(ids.v = malloc(sizeof *ids.v))) goto oom;
    *ids_out = ids.v;
    *n_out = ids.n;
    ids.v = NULL;
    rc = 0;
    goto done;
oom:
    ps_fail(err, "tokenize: out of memory");
done:
    free(ids.v);
    free(a.p);
    free(b.p);
    arena_free(&ar);
    pcre2_match_data_free(rw.md);
    pcre2_match_context_free(rw.mc);
    pcre2_jit_stack_free(rw.js);
    free(rw.spans.s);
    free(rw.merged.s);
    free(bw.id);
    free(bw.prev);
    free(bw.next);
    free(bw.alive);
    free(bw.heap);
    free(bw.hid);
    free(cache.e);
    free(cache.keys.v);
    free(cache.ids.v);
    return rc;
}

/* ------------------------------------------------------------------ decoding */

int ps_detokenize(const ps_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out, size_t *out_len,
                  ps_error *err) {
    *out = NULL;
    *out_len = 0;
    bvec raw = {0};
    if (bv_add(&raw, "", 0)) return ps_fail(err, "detokenize: out of memory");
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_tok[id]) {
            free(raw.v);
            return ps_fail(err, "detokenize: id %lld at position %zu is not in the vocabulary (%d ids)", (long long)id, i,
                           (int)t->n_ids);
        }
        if (skip_special && t->id_special[id]) continue;
        const char *s = t->id_tok[id];
        size_t len = t->id_len[id];
        int fail = 0;
        if (t->decoder == 1) {
            /* ByteLevel: every character back to its byte, or the token's own bytes when one does not map */
            bool all = true;
            for (size_t j = 0; j < len && all;) {
                int32_t cp;
                j += utf8_get(s + j, len - j, &cp);
                all = cp < 324 && t->cp_to_byte[cp] >= 0;
            }
            if (all)
                for (size_t j = 0; j < len && !fail;) {
                    int32_t cp;
                    j += utf8_get(s + j, len - j, &cp);
                    char c = (char)t->cp_to_byte[cp];
                    fail = bv_add(&raw, &c, 1);
                }
            else
                fail = bv_add(&raw, s, len);
        } else
            fail = (!first && bv_add(&raw, " ", 1)) || bv_add(&raw, s, len);
        first = false;
        if (fail) {
            free(raw.v);
            return ps_fail(err, "detokenize: out of memory");
        }
    }
    *out = ps_utf8_lossy(raw.v, raw.n, out_len);
    free(raw.v);
    return *out ? 0 : ps_fail(err, "detokenize: out of memory");
}
