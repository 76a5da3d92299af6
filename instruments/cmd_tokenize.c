/* cmd_tokenize.c — `phasescope tokenize`: text to token ids (and back) with a model's own
 * tokenizer.json (text/tokenizer.h; docs/tokenizers.md). Checks the flags into a request and makes one call,
 * ps_tokenize_command (instruments/exec_tokenize.c: the input, the encoding or decoding, the output). */
#include "instruments/command.h"
#include "instruments/commands.h"

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--tokenizer", "FILE", "the model's tokenizer.json", 1},
    {"--in", "FILE", "input: a JSON list of strings (of id lists with --decode)", 1},
    {"--out", "FILE", "output (written atomically)", 1},
    {"--add-special", NULL, "add the post-processor's special tokens around each string", 0},
    {"--decode", NULL, "ids to strings", 0},
    {"--skip-special", NULL, "with --decode: leave out special tokens", 0},
    {0},
};

const ps_command ps_cmd_tokenize = {
    .name = "tokenize",
    .summary = "text to token ids (and back) with a model's tokenizer.json",
    .synopsis = "phasescope tokenize --tokenizer FILE --in STRINGS.json --out IDS.json [--add-special]\n"
                "phasescope tokenize --tokenizer FILE --decode --in IDS.json --out STRINGS.json [--skip-special]\n",
    .description =
        "Encodes every string of STRINGS.json (a JSON list of strings) with a Hugging Face tokenizer.json\n"
        "(byte-level BPE: Qwen3, DeepSeek-V3 and their kin) and writes a JSON list of token-id lists, one\n"
        "per string, in order: the T.json that `phasescope forward` reads. Added tokens written in the\n"
        "text (<|im_start|>, <|endoftext|>, ...) are recognised as themselves; the post-processor's special\n"
        "tokens (a BOS, say) are added only with --add-special. With --decode the input is a list of id\n"
        "lists and the output a list of strings. See docs/tokenizers.md.\n",
    .flags = FLAGS,
    .run = run,
};

static int run(const ps_args *a, ps_error *err) {
    ps_tokenize_req r = {.tokenizer = ps_args_get(a, "--tokenizer"),
                         .in = ps_args_get(a, "--in"),
                         .out = ps_args_get(a, "--out"),
                         .decode = ps_args_has(a, "--decode"),
                         .add_special = ps_args_has(a, "--add-special"),
                         .skip_special = ps_args_has(a, "--skip-special")};
    if (r.decode && r.add_special) return ps_cli_usage(err, "--add-special applies to encoding, not to --decode");
    if (!r.decode && r.skip_special) return ps_cli_usage(err, "--skip-special applies to --decode only");
    return ps_tokenize_command(&r, err);
}
