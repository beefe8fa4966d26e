// LlamaConfig: preset shapes and exact parameter counts, Hugging Face config.json parsing and
// writing, validation messages.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/model/config.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using test::expect_error;
using json = nlohmann::json;

// meta-llama/Llama-3.1-8B config.json as published on the Hugging Face hub (transformers 4.43).
const char* kHfLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Parameter count written out from the architecture, independently of num_parameters().
// E > 0: a mixture of experts, E routers' rows [E, C] and E SwiGLUs of width I per layer.
int64_t count_by_hand(int64_t V, int64_t C, int64_t I, int64_t L, int64_t nh, int64_t nkv, int64_t hd, bool tied,
                      int64_t E = 0) {
  int64_t attn = C * nh * hd + 2 * C * nkv * hd + nh * hd * C;
  int64_t mlp = E > 0 ? E * C + E * 3 * C * I : 3 * C * I;
  int64_t norms = 2 * C;
  return V * C + L * (attn + mlp + norms) + C + (tied ? 0 : V * C);
}

TEST(Config, Llama3ParameterCountsAreExact) {
  // 8B by hand (V 128256, C 4096, I 14336, L 32, 32 heads, 8 kv heads, head_dim 128, untied):
  //   embed = head = 128256*4096 = 525'336'576
  //   per layer: q,o 2*4096*4096 = 33'554'432; k,v 2*4096*1024 = 8'388'608;
  //              mlp 3*4096*14336 = 176'160'768; 2 norms 8'192           -> 218'112'000
  //   32 layers = 6'979'584'000; + 2*525'336'576 + final norm 4'096       = 8'030'261'248
  EXPECT_EQ(LlamaConfig::preset("llama3-8b").num_parameters(), 8'030'261'248);
  EXPECT_EQ(LlamaConfig::preset("llama3-70b").num_parameters(), 70'553'706'496);
  EXPECT_EQ(LlamaConfig::preset("llama3-405b").num_parameters(), 405'853'388'800);
}

TEST(Config, PresetShapes) {
  LlamaConfig c8 = LlamaConfig::preset("llama3-8b");
  EXPECT_EQ(c8.vocab_size, 128256);
  EXPECT_EQ(c8.hidden_size, 4096);
  EXPECT_EQ(c8.intermediate_size, 14336);
  EXPECT_EQ(c8.num_hidden_layers, 32);
  EXPECT_EQ(c8.num_attention_heads, 32);
  EXPECT_EQ(c8.num_key_value_heads, 8);
  EXPECT_EQ(c8.head_dim, 128);
  EXPECT_EQ(c8.rope_theta, 500000.0);
  EXPECT_EQ(c8.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c8.tie_word_embeddings);
  EXPECT_EQ(c8.max_position_embeddings, 131072);
  ASSERT_TRUE(c8.rope_scaling.has_value());
  EXPECT_EQ(c8.rope_scaling->factor, 8.0);
  EXPECT_EQ(c8.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c8.bos_token_id, 128000);
  EXPECT_EQ(c8.eos_token_id, 128001);

  LlamaConfig c70 = LlamaConfig::preset("llama3-70b");
  EXPECT_EQ(c70.hidden_size, 8192);
  EXPECT_EQ(c70.intermediate_size, 28672);
  EXPECT_EQ(c70.num_hidden_layers, 80);
  EXPECT_EQ(c70.num_attention_heads, 64);
  EXPECT_EQ(c70.num_key_value_heads, 8);
  LlamaConfig c405 = LlamaConfig::preset("llama3-405b");
  EXPECT_EQ(c405.hidden_size, 16384);
  EXPECT_EQ(c405.intermediate_size, 53248);
  EXPECT_EQ(c405.num_hidden_layers, 126);
  EXPECT_EQ(c405.num_attention_heads, 128);
  EXPECT_EQ(c405.head_dim, 128);

  LlamaConfig tiny = LlamaConfig::preset("tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.intermediate_size, 176);
  EXPECT_EQ(tiny.vocab_size, 264);
  EXPECT_EQ(tiny.max_position_embeddings, 128);
  EXPECT_EQ(tiny.num_parameters(), 126'272);  // 2*264*64 + 2*(128 + 2*64*64 + 2*64*32 + 3*64*176) + 64

  LlamaConfig small = LlamaConfig::preset("small");
  EXPECT_EQ(small.hidden_size, 288);
  EXPECT_EQ(small.num_hidden_layers, 6);
  EXPECT_EQ(small.num_attention_heads, 6);
  EXPECT_EQ(small.num_key_value_heads, 2);
  EXPECT_EQ(small.intermediate_size, 768);
  EXPECT_EQ(small.vocab_size, 264);
  EXPECT_EQ(small.max_position_embeddings, 4096);
  EXPECT_FALSE(small.tie_word_embeddings);
  EXPECT_EQ(small.bos_token_id, 256);
  EXPECT_EQ(small.eos_token_id, 257);
  // V 264, C 288, I 768, L 6, 6 heads of 48, 2 kv heads: per layer q,o 2*288*288 = 165'888,
  // k,v 2*288*96 = 55'296, mlp 3*288*768 = 663'552, norms 576 -> 885'312; 6 layers 5'311'872;
  // + embed and head 2*264*288 = 152'064 + final norm 288 = 5'464'224.
  EXPECT_EQ(small.num_parameters(), 5'464'224);

  LlamaConfig medium = LlamaConfig::preset("medium");
  EXPECT_EQ(medium.hidden_size, 1024);
  EXPECT_EQ(medium.num_hidden_layers, 8);
  EXPECT_EQ(medium.num_attention_heads, 16);
  EXPECT_EQ(medium.num_key_value_heads, 4);
  EXPECT_EQ(medium.head_dim, 64);
  EXPECT_EQ(medium.intermediate_size, 2816);  // 8/3 * 1024 = 2730.7, up to a multiple of 256
  EXPECT_EQ(medium.vocab_size, 264);
  EXPECT_EQ(medium.max_position_embeddings, 8192);
  EXPECT_FALSE(medium.tie_word_embeddings);
  EXPECT_EQ(medium.bos_token_id, 256);
  EXPECT_EQ(medium.eos_token_id, 257);
  // V 264, C 1024, I 2816, L 8, 16 heads of 64, 4 kv heads: per layer q,o 2*1024*1024 = 2'097'152,
  // k,v 2*1024*256 = 524'288, mlp 3*1024*2816 = 8'650'752, norms 2'048 -> 11'274'240; 8 layers
  // 90'193'920; + embed and head 2*264*1024 = 540'672 + final norm 1'024 = 90'735'616.
  EXPECT_EQ(medium.num_parameters(), 90'735'616);
  // Between small and the real shapes, as the preset list promises.
  EXPECT_GT(medium.num_parameters(), 30'000'000);
  EXPECT_LT(medium.num_parameters(), 125'000'000);
}

TEST(Config, CountMatchesHandFormulaForEveryPresetAndTying) {
  for (const std::string& name : LlamaConfig::preset_names()) {
    for (bool tied : {false, true}) {
      LlamaConfig c = LlamaConfig::preset(name);
      c.tie_word_embeddings = tied;
      EXPECT_EQ(c.num_parameters(), count_by_hand(c.vocab_size, c.hidden_size, c.intermediate_size,
                                                  c.num_hidden_layers, c.num_attention_heads,
                                                  c.num_key_value_heads, c.head_dim, tied, c.num_local_experts))
          << name << " tied=" << tied;
    }
  }
  // head_dim decoupled from hidden / heads (allowed by HF) still counts correctly.
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.head_dim = 24;
  EXPECT_EQ(c.num_parameters(), count_by_hand(264, 64, 176, 2, 4, 2, 24, false));
}

TEST(Config, UnknownPresetListsValidNames) {
  expect_error<InputError>([] { LlamaConfig::preset("llama3-7b"); },
                           {"llama3-7b", "tiny", "small", "medium", "llama3-8b", "llama3-70b", "llama3-405b"});
}

TEST(Config, ParsesHuggingFaceLlama31Config) {
  LlamaConfig c = LlamaConfig::from_json(json::parse(kHfLlama31_8B));
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // absent: hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.num_parameters(), 8'030'261'248);
}

TEST(Config, AcceptsConfigVariantsSeenInTheWild) {
  json j = json::parse(kHfLlama31_8B);
  // Instruct: several eos ids (generation stops at the first).
  j["eos_token_id"] = {128001, 128008, 128009};
  // Older writers spell rope_scaling's kind "type".
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  j["some_future_key"] = {{"nested", true}};
  LlamaConfig c = LlamaConfig::from_json(j);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.bos_token_id, 128000);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_parameters(), 8'030'261'248);  // the unknown key changed nothing

  // Llama 3 (not 3.1): no rope scaling at all; "default" means the same.
  j["rope_scaling"] = nullptr;
  EXPECT_FALSE(LlamaConfig::from_json(j).rope_scaling.has_value());
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(LlamaConfig::from_json(j).rope_scaling.has_value());

  // No num_key_value_heads: plain multi-head attention (Llama 2 7B style).
  json mha = {{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 11008},
              {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  LlamaConfig m = LlamaConfig::from_json(mha);
  EXPECT_EQ(m.num_key_value_heads, 32);
  EXPECT_EQ(m.head_dim, 128);
  // 32000*4096 = 131'072'000 each for embed and head; per layer 4*4096^2 = 67'108'864 +
  // 3*4096*11008 = 135'266'304 + 8'192 = 202'383'360; 32 layers 6'476'267'520; + 2*131'072'000
  // + 4'096 = 6'738'415'616.
  EXPECT_EQ(m.num_parameters(), 6'738'415'616);  // Llama 2 7B
  // Absent optional keys take transformers' LlamaConfig defaults.
  EXPECT_EQ(m.max_position_embeddings, 2048);
  EXPECT_EQ(m.rope_theta, 10000.0);
  EXPECT_EQ(m.rms_norm_eps, 1e-6);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_FALSE(m.rope_scaling.has_value());
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.eos_token_id, 2);
  // Without bos/eos ids the byte vocabulary's defaults stay (bos 256, eos 257).
  mha.erase("bos_token_id");
  mha.erase("eos_token_id");
  mha["vocab_size"] = 264;
  const LlamaConfig bytes = LlamaConfig::from_json(mha);
  EXPECT_EQ(bytes.bos_token_id, 256);
  EXPECT_EQ(bytes.eos_token_id, 257);
}

// A Llama 3.2 1B style config.json written by hand, mixing the current key spellings
// (rope_type, an explicit head_dim, a list of eos ids) with the classic one (type).
const char* kHandWrittenMixedKeys = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 128256,
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "num_hidden_layers": 16,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 64,
  "max_position_embeddings": 131072,
  "rope_theta": 500000.0,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": true,
  "rope_scaling": {"rope_type": "llama3", "type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "attention_bias": false,
  "mlp_bias": false
})";

TEST(Config, ParsesHandWrittenConfigWithClassicAndCurrentKeys) {
  const LlamaConfig c = LlamaConfig::from_json(json::parse(kHandWrittenMixedKeys));
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);  // the first of the list
  // By hand: embed 128256*2048 = 262'668'288 (tied: counted once); per layer q,o 2*2048*2048 =
  // 8'388'608, k,v 2*2048*512 = 2'097'152, mlp 3*2048*8192 = 50'331'648, norms 4'096 ->
  // 60'821'504; 16 layers 973'144'064; + 262'668'288 + final norm 2'048 = 1'235'814'400
  // (the published size of Llama 3.2 1B).
  EXPECT_EQ(c.num_parameters(), 1'235'814'400);

  // "rope_type" wins over the classic "type" when both are present ...
  json j = json::parse(kHandWrittenMixedKeys);
  j["rope_scaling"]["type"] = "default";
  ASSERT_TRUE(LlamaConfig::from_json(j).rope_scaling.has_value());
  // ... and "type" alone is read, with every field of the block.
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 16.0}, {"low_freq_factor", 2.0}, {"high_freq_factor", 8.0},
                       {"original_max_position_embeddings", 4096}};
  const LlamaConfig classic = LlamaConfig::from_json(j);
  ASSERT_TRUE(classic.rope_scaling.has_value());
  EXPECT_EQ(classic.rope_scaling->rope_type, "llama3");
  EXPECT_EQ(classic.rope_scaling->factor, 16.0);
  EXPECT_EQ(classic.rope_scaling->low_freq_factor, 2.0);
  EXPECT_EQ(classic.rope_scaling->high_freq_factor, 8.0);
  EXPECT_EQ(classic.rope_scaling->original_max_position_embeddings, 4096);
  // Untying adds the head: 1'235'814'400 + 262'668'288.
  j["tie_word_embeddings"] = false;
  EXPECT_EQ(LlamaConfig::from_json(j).num_parameters(), 1'498'482'688);
}

TEST(Config, JsonRoundTripForEveryPreset) {
  for (const std::string& name : LlamaConfig::preset_names()) {
    LlamaConfig a = LlamaConfig::preset(name);
    a.tie_word_embeddings = (name == "tiny");
    json j = a.to_json();
    // What transformers' LlamaConfig needs to build the same model.
    EXPECT_EQ(j["architectures"], json::array({a.moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"}));
    EXPECT_EQ(j["model_type"], a.moe() ? "mixtral" : "llama");
    EXPECT_EQ(j["hidden_act"], "silu");
    EXPECT_EQ(j["attention_bias"], false);
    EXPECT_EQ(j["mlp_bias"], false);
    EXPECT_TRUE(j.contains("torch_dtype"));
    EXPECT_EQ(j["head_dim"], a.head_dim);
    if (a.rope_scaling) {
      EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
      EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
      EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
    } else {
      EXPECT_TRUE(j["rope_scaling"].is_null());
    }
    // Through text, as a file would go.
    LlamaConfig b = LlamaConfig::from_json(json::parse(j.dump(2)));
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.intermediate_size, a.intermediate_size);
    EXPECT_EQ(b.num_hidden_layers, a.num_hidden_layers);
    EXPECT_EQ(b.num_attention_heads, a.num_attention_heads);
    EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads);
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_EQ(b.rope_scaling.has_value(), a.rope_scaling.has_value());
    EXPECT_EQ(b.bos_token_id, a.bos_token_id);
    EXPECT_EQ(b.eos_token_id, a.eos_token_id);
    EXPECT_EQ(b.num_parameters(), a.num_parameters()) << name;
  }
}

// transformers 5 writes RoPE as one `rope_parameters` object (rope_type, rope_theta and the scaling
// fields) instead of top-level rope_theta / rope_scaling. Written by hand here from the 8B file
// above: it must give exactly the classic file's config, never theta 10000 by default.
TEST(Config, ReadsTransformers5RopeParameters) {
  json j = json::parse(kHfLlama31_8B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  j["transformers_version"] = "5.0.0";
  const LlamaConfig current = LlamaConfig::from_json(j);
  EXPECT_EQ(current.rope_theta, 500000.0);
  ASSERT_TRUE(current.rope_scaling.has_value());
  EXPECT_EQ(current.rope_scaling->factor, 8.0);
  EXPECT_EQ(current.rope_scaling->low_freq_factor, 1.0);
  EXPECT_EQ(current.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(current.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(current.to_json(), LlamaConfig::from_json(json::parse(kHfLlama31_8B)).to_json());

  // Plain RoPE in the current spelling: rope_type "default" with its theta.
  j["rope_parameters"] = json::parse(R"({"rope_type": "default", "rope_theta": 250000.0})");
  const LlamaConfig plain = LlamaConfig::from_json(j);
  EXPECT_EQ(plain.rope_theta, 250000.0);
  EXPECT_FALSE(plain.rope_scaling.has_value());

  // Types we do not implement are refused, in either spelling, instead of run as plain RoPE.
  j["rope_parameters"] = json::parse(R"({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})");
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"rope_parameters", "'yarn'", "not supported"});
  json classic = json::parse(kHfLlama31_8B);
  classic["rope_scaling"]["rope_type"] = "dynamic";
  expect_error<InputError>([&] { LlamaConfig::from_json(classic); }, {"rope_scaling", "'dynamic'", "not supported"});
}

// A file carrying both spellings (as ours do) must say the same thing in both.
TEST(Config, BothRopeSpellingsMustAgree) {
  json j = json::parse(kHfLlama31_8B);
  j["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  EXPECT_EQ(LlamaConfig::from_json(j).rope_theta, 500000.0);
  j["rope_parameters"]["rope_theta"] = 10000.0;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"rope_theta", "rope_parameters.rope_theta", "disagree"});
  j["rope_parameters"]["rope_theta"] = 500000.0;
  j["rope_parameters"]["factor"] = 32.0;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"rope_scaling", "rope_parameters", "different"});
}

// What we write carries both spellings, and each alone reads back to the same config: an old
// transformers reads rope_theta / rope_scaling, transformers 5 reads rope_parameters.
TEST(Config, WrittenRopeIsReadableByOldAndNewReaders) {
  for (const std::string& name : {std::string("tiny"), std::string("llama3-8b")}) {
    const LlamaConfig a = LlamaConfig::preset(name);
    const json j = a.to_json();
    ASSERT_TRUE(j.contains("rope_parameters"));
    EXPECT_EQ(j["rope_parameters"]["rope_theta"], a.rope_theta);
    EXPECT_EQ(j["rope_parameters"]["rope_type"], a.rope_scaling ? "llama3" : "default");
    json old_only = j, new_only = j;
    old_only.erase("rope_parameters");
    new_only.erase("rope_theta");
    new_only.erase("rope_scaling");
    EXPECT_EQ(LlamaConfig::from_json(old_only).to_json(), j) << name;
    EXPECT_EQ(LlamaConfig::from_json(new_only).to_json(), j) << name;
  }
}

TEST(Config, HeadsNotDivisibleByKvHeads) {
  json j = LlamaConfig::preset("tiny").to_json();
  j["num_key_value_heads"] = 3;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); },
                           {"not divisible", "num_attention_heads (4)", "num_key_value_heads (3)"});
  LlamaConfig c = LlamaConfig::preset("small");
  c.num_key_value_heads = 4;
  expect_error<InputError>([&] { c.validate(); }, {"not divisible"});
}

TEST(Config, ValidateNamesTheProblem) {
  auto broken = [](auto edit) {
    LlamaConfig c = LlamaConfig::preset("tiny");
    edit(c);
    return c;
  };
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.hidden_size = 0; }).validate(); }, {"hidden_size"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.vocab_size = -5; }).validate(); }, {"vocab_size"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.num_hidden_layers = 0; }).validate(); },
                           {"num_hidden_layers"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.head_dim = 15; }).validate(); }, {"head_dim", "even"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.rms_norm_eps = 0; }).validate(); }, {"rms_norm_eps"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.rope_theta = -1; }).validate(); }, {"rope_theta"});
  expect_error<InputError>([&] { broken([](LlamaConfig& c) { c.eos_token_id = 264; }).validate(); },
                           {"eos_token_id", "264"});
  expect_error<InputError>(
      [&] { broken([](LlamaConfig& c) { c.rope_scaling = RopeScaling{"yarn"}; }).validate(); }, {"yarn"});
  expect_error<InputError>(
      [&] {
        broken([](LlamaConfig& c) {
          c.vocab_size = int64_t(1) << 40;
          c.hidden_size = int64_t(1) << 21;
        }).validate();
      },
      {"2^60"});
  EXPECT_NO_THROW(LlamaConfig::preset("tiny").validate());
  // The edges of the valid ranges pass, and validation changes nothing.
  LlamaConfig edge = broken([](LlamaConfig& c) {
    c.eos_token_id = 263;  // the last id of a 264-token vocabulary
    c.bos_token_id = 0;
    c.head_dim = 2;        // the smallest even head_dim
  });
  EXPECT_NO_THROW(edge.validate());
  EXPECT_EQ(edge.eos_token_id, 263);
  EXPECT_EQ(edge.bos_token_id, 0);
  EXPECT_EQ(edge.head_dim, 2);
  // tiny with head_dim 2 by hand: per layer q,o 2*64*8 = 1'024, k,v 2*64*4 = 512, mlp
  // 3*64*176 = 33'792, norms 128 -> 35'456; 2 layers 70'912; + 2*264*64 = 33'792 + 64 = 104'768.
  EXPECT_EQ(edge.num_parameters(), 104'768);
}

TEST(Config, FromJsonNamesMissingOrWrongTypedKeys) {
  json base = LlamaConfig::preset("tiny").to_json();
  json j = base;
  j.erase("hidden_size");
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"missing", "hidden_size"});
  j = base;
  j["num_hidden_layers"] = "2";
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"num_hidden_layers", "integer", "string"});
  j = base;
  j["intermediate_size"] = 176.5;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"intermediate_size", "integer"});
  j = base;
  j["rope_theta"] = "big";
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"rope_theta", "number"});
  j = base;
  j["tie_word_embeddings"] = 1;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"tie_word_embeddings", "boolean"});
  j = base;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"yarn", "not supported"});
  j = base;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"original_max_position_embeddings", 8192}};
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"factor"});
  j = base;
  j["hidden_act"] = "gelu";
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"hidden_act", "gelu"});
  j = base;
  j["eos_token_id"] = json::array();
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"eos_token_id"});
  expect_error<InputError>([&] { LlamaConfig::from_json(json::array({1, 2})); }, {"JSON object"});
}

// Another architecture's config.json (mistral, qwen2, ...) names most of the same keys and
// tensors: read as Llama it would run a different model. Absent model_type (hand-written
// configs) is fine; a present one must be "llama".
TEST(Config, ModelTypeOtherThanLlamaIsRefused) {
  json j = LlamaConfig::preset("tiny").to_json();
  ASSERT_EQ(j["model_type"], "llama");
  EXPECT_EQ(LlamaConfig::from_json(j).hidden_size, 64);
  j.erase("model_type");
  EXPECT_EQ(LlamaConfig::from_json(j).hidden_size, 64);
  j["model_type"] = "mistral";
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"model_type", "'mistral'", "not supported"});
  j["model_type"] = "Llama";
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"model_type", "'Llama'"});
  j["model_type"] = 7;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"model_type", "string"});
}

TEST(Config, FromFileErrorsNameThePath) {
  test::ScratchDir dir;
  const std::string missing = dir / "nope.json";
  expect_error<InputError>([&] { LlamaConfig::from_file(missing); }, {missing});

  const std::string bad = dir / "config.json";
  test::write_bytes(bad, "{\"hidden_size\": 64,, }");
  expect_error<InputError>([&] { LlamaConfig::from_file(bad); }, {bad, "not valid JSON", "parse error"});

  test::write_bytes(bad, "{\"hidden_size\": 64}");
  expect_error<InputError>([&] { LlamaConfig::from_file(bad); }, {bad, "vocab_size"});

  expect_error<InputError>([&] { LlamaConfig::from_file(dir.str()); }, {dir.str(), "directory"});

  test::write_bytes(bad, kHfLlama31_8B);
  EXPECT_EQ(LlamaConfig::from_file(bad).num_parameters(), 8'030'261'248);
}

}  // namespace
}  // namespace llama4d
