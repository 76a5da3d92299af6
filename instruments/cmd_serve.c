/* cmd_serve.c — `phasescope serve`: an OpenAI-compatible server in front of a model (serve/serve.h,
 * docs/served-models.md). */
#include "instruments/command.h"
#include "instruments/commands.h"
#ifdef PS_HAVE_SERVE /* the serve layer: built when libmicrohttpd is found (CMakeLists.txt) */
#include "serve/serve.h"
#endif

static int run(const ps_args *a, ps_error *err);

static const ps_flag_spec FLAGS[] = {
    {"--model", "DIR", "the checkpoint: a phasescope model, a Hugging Face Qwen3 checkpoint, a DeepSeek-V4\ncheckpoint or a MiniCPM4 checkpoint (default: the shipped model)", 0},
    {"--host", "ADDR", "IPv4 address to listen on (default 127.0.0.1: this machine only)", 0},
    {"--port", "N", "port (default 8000; 0: any free port, printed and written to --port-file)", 0},
    {"--port-file", "FILE", "write the port to FILE once listening (for scripts)", 0},
    {"--tokenizer", "FILE", "tokenizer.json for text prompts and token texts (default: the one a text-kv model\n"
                            "trained with, else DIR/tokenizer.json, else none: token-id prompts only)", 0},
    {"--name", "NAME", "the model's name in the API (default: the directory's name)", 0},
    {"--max-body", "BYTES", "largest request body (default 67108864): larger is refused with 413", 0},
    {"--max-prompt-tokens", "N", "longest prompt (default: the model's context)", 0},
    {"--max-logprobs", "N", "largest logprobs / prompt_logprobs N (default 20)", 0},
    {"--max-tokens", "N", "largest max_tokens (default 1024)", 0},
    {"--max-prompts", "N", "prompts in one request (default 256)", 0},
    {"--max-connections", "N", "open connections at once (default 64): more are refused with 429", 0},
    {"--max-batch", "N", "sequences decoded per step (default 32): concurrent requests join the running batch up to it", 0},
    PS_BACKEND_FLAG,
    {0},
};

const ps_command ps_cmd_serve = {
    .name = "serve",
    .summary = "OpenAI-compatible server (/v1/completions with echo, logprobs, prompt_logprobs) in front of a model",
    .description =
        "Serves a model over the OpenAI completions API (docs/served-models.md): POST /v1/completions (prompt as\n"
        "a string, a token-id list or a list of either; max_tokens, temperature 0 = greedy, echo, logprobs N,\n"
        "vLLM's prompt_logprobs and return_tokens_as_token_ids; \"stream\": true answers with server-sent events),\n"
        "GET /v1/models, GET /health. Concurrent requests share each decode step (continuous batching: they join\n"
        "and leave between steps); a client that goes away frees its sequences at the next step. Every refusal\n"
        "is a 4xx JSON error naming the limit or the field.\n"
        "Listens on 127.0.0.1 unless --host says otherwise; SIGINT or SIGTERM stops it.\n",
    .flags = FLAGS,
    .run = run,
};

#ifdef PS_HAVE_SERVE
/* the server's options from their flags, through the table ps_api_serve_start reads its options JSON through
 * (instruments/commands.h: ps_serve_options) */
static int run(const ps_args *a, ps_error *err) {
    ps_serve_opts o;
    ps_serve_defaults(&o);
    for (const ps_serve_option *p = ps_serve_options; p->key; p++) {
        const char *v = ps_args_get(a, p->flag);
        if (v && ps_serve_option_set(&o, p, v, err)) return -1;
    }
    char dir[4096];
    if (ps_cli_model_dir(ps_args_get(a, "--model"), dir, sizeof dir, err)) return -1;
    o.model_dir = dir;
    o.backend = ps_args_backend(a);
    return ps_serve_run(&o, ps_args_get(a, "--port-file"), err);
}
#else
static int run(const ps_args *a, ps_error *err) {
    (void)a;
    return ps_fail(err, "built without libmicrohttpd: `phasescope serve` needs it (Debian libmicrohttpd-dev); "
                        "install it and configure again (cmake -S . -B build)");
}
#endif
