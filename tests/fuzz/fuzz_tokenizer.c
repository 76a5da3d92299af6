/* fuzz_tokenizer.c — text/tokenizer on arbitrary bytes. The first byte picks the mode:
 *   even: the rest is a tokenizer.json for the loader; what loads encodes a fixed text and the input
 *         itself, and decodes the result;
 *   odd:  the rest is text for two fixed tokenizers (Qwen3-like: NFC, Split regex, ByteLevel, added
 *         tokens with every flag; DeepSeek-like: three Split stages, no normalizer); each encodes it,
 *         every id is in range, and the DeepSeek-like one decodes back to the text (after the lossy
 *         UTF-8 step) exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "text/tokenizer.h"

static const char HEAD[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {";
static const char MERGES[] = "\"Ġt\": 256, \"he\": 257, \"Ġthe\": 258, \"ĠĠ\": 259, \"in\": 260, \"Ġin\": 261, \"12\": 262}, "
                             "\"merges\": [[\"Ġ\", \"t\"], [\"h\", \"e\"], \"Ġt he\", [\"Ġ\", \"Ġ\"], [\"i\", \"n\"], \"Ġ in\", [\"1\", \"2\"]]},";
static const char QWEN_TAIL[] =
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    " \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"behavior\": "
    "\"MergedWithNext\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    "\"added_tokens\": [{\"id\": 263, \"content\": \"<|im_start|>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 264, \"content\": \"<m>\", \"single_word\": true, \"lstrip\": true, \"rstrip\": true, \"normalized\": true},"
    "{\"id\": 265, \"content\": \"\\u00c5\", \"normalized\": true}, {\"id\": 266, \"content\": \"<|\", \"normalized\": false}],"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|im_start|>\"}}, "
    "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<|im_start|>\": {\"ids\": [263]}}},"
    "\"decoder\": {\"type\": \"ByteLevel\"}}";
static const char DS_TAIL[] =
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, "
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[一-龥぀-ゟ゠-ヿ]+\"}, "
    "\"behavior\": \"Contiguous\", \"invert\": true}, {\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    "\"added_tokens\": [{\"id\": 263, \"content\": \"<｜begin▁of▁sentence｜>\", \"special\": true, \"normalized\": false}],"
    "\"decoder\": {\"type\": \"ByteLevel\"}}";

/* The 256 mapped bytes (id = byte), then the tail. */
static char *build(const char *tail) {
    size_t cap = 16384 + strlen(tail), n = 0;
    char *j = malloc(cap);
    if (!j) abort();
    n += (size_t)snprintf(j, cap, "%s", HEAD);
    for (int b = 0; b < 256; b++) {
        int c = b;
        if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
            int k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
            c = 256 + k;
        }
        n += (size_t)snprintf(j + n, cap - n, "\"%s\\u%04x\": %d, ", "", c, b);
    }
    snprintf(j + n, cap - n, "%s%s", MERGES, tail);
    return j;
}

static ps_tokenizer *fixed(int which) {
    static ps_tokenizer *t[2];
    if (!t[which]) {
        char *j = build(which ? DS_TAIL : QWEN_TAIL);
        ps_error err = {0};
        if (ps_tokenizer_parse(j, strlen(j), "fixed.json", &t[which], &err)) abort(); /* the fixed files must load */
        free(j);
    }
    return t[which];
}

static void encode_decode(const ps_tokenizer *t, const char *s, size_t n, int exact) {
    int32_t *ids = NULL;
    size_t m = 0;
    ps_error err = {0};
    if (ps_tokenize(t, s, n, exact == 0, &ids, &m, &err)) return; /* out of memory only */
    for (size_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= ps_tokenizer_vocab_size(t)) abort();
    char *d = NULL;
    size_t dl = 0;
    if (ps_detokenize(t, ids, m, false, &d, &dl, &err) == 0 && exact) {
        size_t cl;
        char *clean = ps_utf8_lossy(s, n, &cl);
        if (!clean || cl != dl || memcmp(clean, d, dl)) abort();
        free(clean);
    }
    free(d);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        encode_decode(fixed(0), s, n, 0);
        encode_decode(fixed(1), s, n, 1);
        return 0;
    }
    ps_tokenizer *t = NULL;
    ps_error err = {0};
    if (ps_tokenizer_parse(s, n, "fuzz.json", &t, &err) == 0) {
        static const char probe[] = "Hello world's <|im_start|> 12345 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80\r\n\t x";
        encode_decode(t, probe, sizeof probe - 1, 0);
        encode_decode(t, s, n < 4096 ? n : 4096, 0);
        ps_tokenizer_free(t);
    } else if (!err.msg[0] || strncmp(err.msg, "fuzz.json: ", 11))
        abort(); /* every refusal names the file */
    return 0;
}
