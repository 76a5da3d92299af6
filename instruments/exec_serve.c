/* exec_serve.c — a server's options by name (instruments/commands.h, "serve"): the table `phasescope serve`
 * (cmd_serve.c) reads its flags through and the public API (api/serve_call.c: ps_api_serve_start) reads its
 * options JSON through. */
#include <arpa/inet.h>
#include <stddef.h>
#include <string.h>

#include "instruments/command.h"
#include "instruments/commands.h"
#ifdef PS_HAVE_SERVE /* the serve layer: built when libmicrohttpd is found (CMakeLists.txt) */
#include "serve/serve.h"

#define AT(field) offsetof(ps_serve_opts, field)
const ps_serve_option ps_serve_options[] = {
    {"host", "--host", PS_SERVE_OPT_TEXT, 0, 0, AT(host)},
    {"port", "--port", PS_SERVE_OPT_INT, 0, 65535, AT(port)},
    {"tokenizer", "--tokenizer", PS_SERVE_OPT_TEXT, 0, 0, AT(tokenizer)},
    {"name", "--name", PS_SERVE_OPT_TEXT, 0, 0, AT(name)},
    {"max_body", "--max-body", PS_SERVE_OPT_I64, 1, (int64_t)1 << 34, AT(max_body)},
    {"max_prompt_tokens", "--max-prompt-tokens", PS_SERVE_OPT_I64, 1, (int64_t)1 << 31, AT(max_prompt_tokens)},
    {"max_logprobs", "--max-logprobs", PS_SERVE_OPT_I64, 0, 1 << 20, AT(max_logprobs)},
    {"max_tokens", "--max-tokens", PS_SERVE_OPT_I64, 0, 1 << 24, AT(max_tokens)},
    {"max_prompts", "--max-prompts", PS_SERVE_OPT_I64, 1, 1 << 20, AT(max_prompts)},
    {"max_connections", "--max-connections", PS_SERVE_OPT_INT, 1, 100000, AT(max_connections)},
    {"max_batch", "--max-batch", PS_SERVE_OPT_I64, 1, 1 << 16, AT(max_batch)},
    {0},
};
#else
const ps_serve_option ps_serve_options[] = {{0}};
#endif

const ps_serve_option *ps_serve_option_find(const char *key) {
    if (!key) return NULL;
    for (const ps_serve_option *p = ps_serve_options; p->key; p++) {
        size_t i = 0;
        for (; p->key[i] && (key[i] == p->key[i] || (p->key[i] == '_' && key[i] == '-')); i++) {}
        if (!p->key[i] && !key[i]) return p;
    }
    return NULL;
}

int ps_serve_option_set(struct ps_serve_opts *o, const ps_serve_option *p, const char *value, ps_error *err) {
    char *field = (char *)o + p->offset;
    if (p->kind == PS_SERVE_OPT_TEXT) {
        struct in_addr ia;
        if (!strcmp(p->key, "host") && strcmp(value, "localhost") && inet_pton(AF_INET, value, &ia) != 1)
            return ps_cli_usage(err, "--host %s: expected an IPv4 address (127.0.0.1, 0.0.0.0, ...)", value);
        memcpy(field, &value, sizeof value); /* a const char * field */
        return 0;
    }
    int64_t v;
    if (ps_cli_int(p->flag, value, p->lo, p->hi, &v, err)) return -1;
    if (p->kind == PS_SERVE_OPT_INT) {
        int x = (int)v;
        memcpy(field, &x, sizeof x);
    } else
        memcpy(field, &v, sizeof v);
    return 0;
}
