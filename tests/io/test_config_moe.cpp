// Mixture-of-experts configs (Hugging Face Mixtral's keys): parsing, writing, validation, the
// parameter layout, and the refusal by name wherever the model does not run them yet.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/model/params.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using test::expect_error;
using json = nlohmann::json;

// mistralai/Mixtral-8x7B-v0.1 config.json as published on the Hugging Face hub.
const char* kMixtral8x7B = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000
})";

// A small Mixtral shape: 2 layers of 4 experts, 2 per token.
LlamaConfig tiny_mixtral() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.router_aux_loss_coef = 0.02;
  c.output_router_logits = true;
  return c;
}

TEST(ConfigMoe, ParsesMixtral8x7BWithItsPublishedParameterCount) {
  const LlamaConfig c = LlamaConfig::from_json(json::parse(kMixtral8x7B));
  EXPECT_TRUE(c.moe());
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.02);
  EXPECT_FALSE(c.output_router_logits);
  // Mistral AI's announcement: 46.7B parameters; the exact count Hugging Face reports for the
  // checkpoint's tensors is 46,702,792,704.
  EXPECT_EQ(c.num_parameters(), 46702792704LL);
}

TEST(ConfigMoe, MixtralDefaultsAreTransformers) {
  json j = LlamaConfig::preset("tiny").to_json();
  j["model_type"] = "mixtral";
  const LlamaConfig c = LlamaConfig::from_json(j);
  EXPECT_EQ(c.num_local_experts, 8);  // MixtralConfig's defaults
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(c.output_router_logits);
}

TEST(ConfigMoe, JsonRoundTripWritesMixtral) {
  const LlamaConfig c = tiny_mixtral();
  const json j = c.to_json();
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(j["num_local_experts"], 4);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["output_router_logits"], true);
  EXPECT_TRUE(j["sliding_window"].is_null());
  const LlamaConfig back = LlamaConfig::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  const json dense = LlamaConfig::preset("tiny").to_json();
  EXPECT_EQ(dense["model_type"], "llama");
  EXPECT_FALSE(dense.contains("num_local_experts"));
}

TEST(ConfigMoe, MixtralKeysOnALlamaConfigAreRefusedNotIgnored) {
  for (const char* key : {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
                          "router_jitter_noise", "sliding_window"}) {
    json j = LlamaConfig::preset("tiny").to_json();
    j[key] = 1;
    expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {key, "model_type 'mixtral'"});
    j.erase("model_type");
    expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {key, "model_type 'mixtral'"});
  }
}

TEST(ConfigMoe, UnsupportedMixtralVariantsAreRefused) {
  json j = json::parse(kMixtral8x7B);
  j["sliding_window"] = 4096;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"sliding_window", "4096"});
  j["sliding_window"] = nullptr;
  j["router_jitter_noise"] = 0.01;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"router_jitter_noise"});
  j["router_jitter_noise"] = 0.0;
  j["num_experts_per_tok"] = 9;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"num_experts_per_tok (9)", "num_local_experts = 8"});
  j["num_experts_per_tok"] = 0;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"num_experts_per_tok (0)"});
  j["num_experts_per_tok"] = 2;
  j["num_local_experts"] = 0;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"num_local_experts", "positive"});
  j["num_local_experts"] = 8;
  j["router_aux_loss_coef"] = -1;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"router_aux_loss_coef"});
}

TEST(ConfigMoe, DenseConfigWithExpertSettingsIsInvalid) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_experts_per_tok = 2;
  expect_error<InputError>([&] { c.validate(); }, {"num_local_experts > 0"});
  c.num_experts_per_tok = 0;
  c.output_router_logits = true;
  expect_error<InputError>([&] { c.validate(); }, {"num_local_experts > 0"});
}

TEST(ConfigMoe, ParameterLayoutUsesMixtralNamesInOrder) {
  const LlamaConfig c = tiny_mixtral();
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const std::vector<ParamSpec> specs = llama_param_specs(c);
  EXPECT_EQ(flat_numel(specs), c.num_parameters());
  const ParamSpec& gate = find_param(specs, "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(gate.shape, (std::vector<int64_t>{4, C}));
  EXPECT_EQ(find_param(specs, "model.layers.1.post_attention_layernorm.weight").offset + C, gate.offset);
  // experts.e.w1 [I,C], w2 [C,I], w3 [I,C], one expert after the other (MoeWeights' order)
  int64_t at = gate.offset + 4 * C;
  for (int e = 0; e < 4; ++e)
    for (const char* w : {"w1", "w2", "w3"}) {
      const ParamSpec& p =
          find_param(specs, "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
      EXPECT_EQ(p.offset, at) << p.name;
      EXPECT_EQ(p.shape, std::string(w) == "w2" ? (std::vector<int64_t>{C, I}) : (std::vector<int64_t>{I, C}));
      EXPECT_EQ(p.layer, 1);
      at += p.numel;
    }
  for (const ParamSpec& p : specs) EXPECT_EQ(p.name.find("mlp."), std::string::npos) << p.name;
  EXPECT_EQ(find_param(specs, "model.norm.weight").offset, at);
}

TEST(ConfigMoe, PresetsAreMixtralShapes) {
  // tiny-moe: tiny's attention, 4 experts of half tiny's SwiGLU width (176 / 2), 2 per token.
  const LlamaConfig t = LlamaConfig::preset("tiny-moe");
  EXPECT_EQ(t.num_local_experts, 4);
  EXPECT_EQ(t.num_experts_per_tok, 2);
  EXPECT_EQ(t.intermediate_size, 88);
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_TRUE(t.output_router_logits);
  EXPECT_EQ(t.moe_aux_coef(), 0.02);
  // Per layer by hand: norms 2·64, q, o 2·64·64, k, v 2·64·32, router 4·64, experts 4·3·64·88.
  EXPECT_EQ(t.num_parameters_per_layer(), 128 + 8192 + 4096 + 256 + 67584);
  const LlamaConfig s = LlamaConfig::preset("small-moe");
  EXPECT_EQ(s.num_local_experts, 8);
  EXPECT_EQ(s.num_experts_per_tok, 2);
  EXPECT_EQ(s.intermediate_size, 384);
}

}  // namespace
}  // namespace llama4d
