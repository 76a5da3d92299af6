/* test_config.c — config.json parsing (SPEC §2): defaults, the nested attention object, the Hugging
 * Face Qwen3 key map, the round trip, and every bad input: each error names the key and the file. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/config.h"

#define BASE "\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, " \
             "\"head_dim\": 32, \"d_ff\": 384, \"max_seq_len\": 512"

static int parse(const char *text, ps_config *c, ps_error *err) {
    return ps_config_parse(text, strlen(text), "cfg/config.json", c, err);
}

int main(void) {
    ps_config c;
    ps_error err;
    /* the spec's example */
    CHECK_OK(parse("{" BASE ", \"rope\": true, \"rope_theta\": 10000, \"qk_norm\": true, \"rms_eps\": 1e-6, "
                   "\"tie_embeddings\": true, \"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 8, "
                   "\"local_window\": 8, \"gate\": \"learned\", \"payload\": \"per_offset\"}}",
                   &c, &err),
             &err);
    CHECK(c.kind == PS_ATTN_COMPRESSED && c.window == 8 && c.stride == 8 && c.local_window == 8 && c.n_kv_heads == 4,
          "example parsed wrong");
    /* defaults: full attention, W = 8, S = W, local_window = W */
    CHECK_OK(parse("{" BASE "}", &c, &err), &err);
    CHECK(c.kind == PS_ATTN_FULL && c.rope && c.qk_norm && c.tie_embeddings && c.rope_theta == 10000 &&
              c.rms_eps == 1e-6 && c.window == 8 && c.stride == 8 && c.local_window == 8,
          "defaults wrong");
    CHECK_OK(parse("{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 6}}", &c, &err), &err);
    CHECK(c.stride == 6 && c.local_window == 6 && c.gate == PS_GATE_LEARNED && c.payload == PS_PAYLOAD_PER_OFFSET,
          "stride/local_window default to W");
    CHECK_OK(parse("{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 3, \"local_window\": 2, "
                   "\"gate\": \"uniform\", \"payload\": \"shared\"}, \"rope\": false, \"head_dim\": 33}",
                   &c, &err) == 0 ? -1 : 0, &err); /* duplicate head_dim key: refused */
    CHECK_OK(parse("{\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, "
                   "\"head_dim\": 33, \"d_ff\": 384, \"max_seq_len\": 512, \"rope\": false, \"rms_eps\": 1}",
                   &c, &err), &err); /* odd head_dim is fine without RoPE; integer for a number key */
    /* full attention: other attention keys accepted and ignored, even values impossible for compressed */
    CHECK_OK(parse("{" BASE ", \"attention\": {\"kind\": \"full\", \"window\": 4, \"stride\": 9}}", &c, &err), &err);
    /* round trip */
    CHECK_OK(parse("{" BASE ", \"tie_embeddings\": false, \"attention\": {\"kind\": \"compressed\", \"window\": 8, "
                   "\"stride\": 4, \"gate\": \"uniform\"}}", &c, &err), &err);
    char *js = ps_config_to_json(&c);
    ps_config c2;
    CHECK_OK(ps_config_parse(js, strlen(js), "roundtrip", &c2, &err), &err);
    CHECK(memcmp(&c, &c2, sizeof c) == 0, "round trip changed the config");
    char h1[17], h2[17];
    ps_config_hash(&c, h1);
    ps_config_hash(&c2, h2);
    CHECK(strcmp(h1, h2) == 0 && strlen(h1) == 16, "hash not stable");
    c2.stride = 8;
    ps_config_hash(&c2, h2);
    CHECK(strcmp(h1, h2) != 0, "hash ignores stride");
    free(js);
    /* Hugging Face Qwen3 */
    CHECK_OK(parse("{\"model_type\": \"qwen3\", \"vocab_size\": 151936, \"hidden_size\": 1024, \"num_hidden_layers\": 28, "
                   "\"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 3072, "
                   "\"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, "
                   "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"architectures\": [\"Qwen3ForCausalLM\"]}",
                   &c, &err), &err);
    CHECK(c.d_model == 1024 && c.n_layers == 28 && c.n_heads == 16 && c.n_kv_heads == 8 && c.head_dim == 128 &&
              c.d_ff == 3072 && c.max_seq_len == 40960 && c.rope_theta == 1e6 && c.kind == PS_ATTN_FULL,
          "HF key map wrong");

    /* Hugging Face Qwen3 as published today: rope_parameters, dtype, layer_types, architectures */
#define HF "\"model_type\": \"qwen3\", \"vocab_size\": 160, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
           "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"max_position_embeddings\": 128"
    CHECK_OK(parse("{" HF ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"rms_norm_eps\": 1e-06, \"rope_parameters\": "
                   "{\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}, \"layer_types\": [\"full_attention\", "
                   "\"full_attention\"], \"sliding_window\": null, \"use_sliding_window\": false, \"tie_word_embeddings\": true, "
                   "\"dtype\": \"bfloat16\", \"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_act\": \"silu\", "
                   "\"attention_bias\": false, \"rope_scaling\": null}", &c, &err), &err);
    CHECK(c.rope_theta == 1e6 && c.n_kv_heads == 2 && c.head_dim == 16 && c.tie_embeddings && c.kind == PS_ATTN_FULL,
          "newer HF keys read wrong");
    /* transformers' Qwen3Config defaults: head_dim 128, untied, num_key_value_heads = heads, rope_theta 10000 */
    CHECK_OK(parse("{" HF "}", &c, &err), &err);
    CHECK(c.head_dim == 128 && !c.tie_embeddings && c.n_kv_heads == 4 && c.rope_theta == 10000, "HF defaults wrong");
    CHECK_OK(parse("{" HF ", \"rope_theta\": 5e5, \"rope_parameters\": {\"rope_theta\": 5e5}, \"torch_dtype\": \"float32\", "
                   "\"use_sliding_window\": true, \"max_window_layers\": 2}", &c, &err), &err);
    CHECK(c.rope_theta == 5e5, "rope_theta in both places");
    /* the phasescope extension: a compressed model in a Hugging Face config */
    CHECK_OK(parse("{" HF ", \"head_dim\": 16, \"attention\": {\"kind\": \"compressed\", \"window\": 4}}", &c, &err), &err);
    CHECK(c.kind == PS_ATTN_COMPRESSED && c.window == 4 && c.stride == 4, "attention extension in an HF config");
    /* the HF writer's output reads back as the same model */
    c.rope_theta = 1e6;
    char *hf = ps_config_to_hf_json(&c, "bfloat16", &err);
    CHECK(hf != NULL, "%s", err.msg);
    if (hf) {
        ps_config c3;
        CHECK_OK(ps_config_parse(hf, strlen(hf), "hf", &c3, &err), &err);
        CHECK(memcmp(&c, &c3, sizeof c) == 0, "HF config round trip changed the config");
        free(hf);
    }
    struct { const char *json; const char *key; const char *what; } badhf[] = {
        {"{" HF ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]}", "layer_types[1]", "only \"full_attention\""},
        {"{" HF ", \"layer_types\": [\"full_attention\"]}", "layer_types", "1 entries"},
        {"{" HF ", \"layer_types\": \"full_attention\"}", "layer_types", "array"},
        {"{" HF ", \"layer_types\": [\"full_attention\", 3]}", "layer_types[1]", "string"},
        {"{" HF ", \"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 1}", "use_sliding_window", "layers 1.."},
        {"{" HF ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "rope_parameters.rope_type", "\"yarn\""},
        {"{" HF ", \"rope_parameters\": {\"rope_theta\": \"1e6\"}}", "rope_parameters.rope_theta", "number"},
        {"{" HF ", \"rope_parameters\": [1]}", "rope_parameters", "object"},
        {"{" HF ", \"rope_parameters\": {\"rope_theta\": 1e6, \"factor\": 2}}", "rope_parameters.factor", "not supported"},
        {"{" HF ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", "rope_scaling.type", "\"linear\""},
        {"{" HF ", \"rope_theta\": 1e4, \"rope_parameters\": {\"rope_theta\": 1e6}}", "rope_parameters.rope_theta", "disagrees"},
        {"{" HF ", \"rope_parameters\": {\"rope_theta\": 0}}", "rope_theta", "> 0"},
        {"{" HF ", \"dtype\": 16}", "\"dtype\"", "string"},
        {"{" HF ", \"dtype\": \"int8\"}", "\"dtype\"", "int8"},
        {"{" HF ", \"dtype\": \"bfloat16\", \"torch_dtype\": \"float32\"}", "\"dtype\"", "disagrees"},
        {"{" HF ", \"architectures\": [\"LlamaForCausalLM\"]}", "architectures", "Qwen3ForCausalLM"},
        {"{" HF ", \"architectures\": \"Qwen3ForCausalLM\"}", "architectures", "array"},
        {"{" HF ", \"architectures\": [7]}", "architectures[0]", "string"},
        {"{" HF ", \"hidden_act\": \"gelu\"}", "hidden_act", "silu"},
        {"{" HF ", \"attention_bias\": true}", "attention_bias", "false"},
        {"{" HF ", \"attention\": {\"kind\": \"compressed\", \"stride\": 99}}", "attention.stride", "must not exceed"},
    };
    for (size_t i = 0; i < sizeof badhf / sizeof badhf[0]; i++) {
        CHECK_ERR(parse(badhf[i].json, &c, &err), &err, badhf[i].key, badhf[i].what, "cfg/config.json");
        CHECK(strchr(err.msg, '\n') == NULL, "error is not one line: %s", err.msg);
    }
    c.rope = false;
    CHECK_ERR(ps_config_to_hf_json(&c, "float32", &err) == NULL ? -1 : 0, &err, "rope");

    /* bad inputs: each error names the key and the file */
    struct { const char *json; const char *key; } bad[] = {
        {"{" BASE ", \"dropout\": 0.1}", "\"dropout\""},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"pool\": 1}}", "attention.pool"},
        {"{" BASE ", \"attention\": {\"kind\": \"sparse\"}}", "attention.kind"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"gate\": \"hard\"}}", "attention.gate"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"payload\": 3}}", "attention.payload"},
        {"{" BASE ", \"attention\": [1]}", "\"attention\""},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 9}}", "attention.stride"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 8, \"stride\": 0}}", "attention.stride"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 0}}", "attention.window"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"local_window\": 0}}", "attention.local_window"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"window\": 8.0}}", "attention.window"},
        {"{" BASE ", \"attention\": {\"kind\": \"compressed\", \"stride\": \"4\"}}", "attention.stride"},
        {"{\"vocab_size\": 512.0, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 32, "
         "\"d_ff\": 384, \"max_seq_len\": 512}", "\"vocab_size\""},
        {"{\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 3, \"head_dim\": 32, "
         "\"d_ff\": 384, \"max_seq_len\": 512}", "\"n_kv_heads\""},
        {"{\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 31, "
         "\"d_ff\": 384, \"max_seq_len\": 512}", "\"head_dim\""},
        {"{\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 0, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 32, "
         "\"d_ff\": 384, \"max_seq_len\": 512}", "\"n_layers\""},
        {"{\"vocab_size\": 512, \"d_model\": -128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 32, "
         "\"d_ff\": 384, \"max_seq_len\": 512}", "\"d_model\""},
        {"{\"vocab_size\": 512, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, \"head_dim\": 32, "
         "\"d_ff\": 384}", "\"max_seq_len\""},
        {"{\"vocab_size\": 99999999999, \"d_model\": 128, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, "
         "\"head_dim\": 32, \"d_ff\": 384, \"max_seq_len\": 512}", "\"vocab_size\""},
        {"{\"vocab_size\": 16000000, \"d_model\": 16000000, \"n_layers\": 4, \"n_heads\": 8, \"n_kv_heads\": 4, "
         "\"head_dim\": 32, \"d_ff\": 384, \"max_seq_len\": 512}", "parameters"},
        {"{" BASE ", \"rms_eps\": 0}", "\"rms_eps\""},
        {"{" BASE ", \"rms_eps\": -1e-6}", "\"rms_eps\""},
        {"{" BASE ", \"rope_theta\": 0}", "\"rope_theta\""},
        {"{" BASE ", \"rope_theta\": \"1e4\"}", "\"rope_theta\""},
        {"{" BASE ", \"rope\": 1}", "\"rope\""},
        {"{" BASE ", \"qk_norm\": \"yes\"}", "\"qk_norm\""},
        {"{" BASE ", \"tie_embeddings\": null}", "\"tie_embeddings\""},
        {"{" BASE ", \"d_model\": 64}", "duplicate"},
        {"{" BASE, "not valid JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 8}", "\"model_type\""},
        {"{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"num_hidden_layers\": 2}", "\"hidden_size\""},
        {"{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 8, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 2, \"intermediate_size\": 8, \"max_position_embeddings\": 8, \"rms_norm_eps\": \"x\"}",
         "\"rms_norm_eps\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ERR(parse(bad[i].json, &c, &err), &err, bad[i].key, "cfg/config.json");
        CHECK(strchr(err.msg, '\n') == NULL, "error is not one line: %s", err.msg);
    }
    /* files */
    CHECK_ERR(ps_config_load("/nonexistent/config.json", &c, &err), &err, "/nonexistent/config.json", "cannot open");
    CHECK_ERR(ps_config_load("/tmp", &c, &err), &err, "/tmp", "directory");
    CHECK_DONE();
}
