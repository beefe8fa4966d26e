// The flat parameter layout: Hugging Face names in order, contiguous offsets, shapes, decay
// flags, per-layer ranges, tied heads.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/model/params.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

TEST(Params, TinyLayoutInHuggingFaceOrder) {
  LlamaConfig cfg = LlamaConfig::preset("tiny");  // V 264, C 64, I 176, L 2, nh 4, nkv 2, hd 16
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  struct Expect {
    std::string name;
    std::vector<int64_t> shape;
    int layer;
    bool decay;
  };
  std::vector<Expect> want = {{"model.embed_tokens.weight", {264, 64}, -1, true}};
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    want.push_back({p + "input_layernorm.weight", {64}, l, false});
    want.push_back({p + "self_attn.q_proj.weight", {64, 64}, l, true});
    want.push_back({p + "self_attn.k_proj.weight", {32, 64}, l, true});
    want.push_back({p + "self_attn.v_proj.weight", {32, 64}, l, true});
    want.push_back({p + "self_attn.o_proj.weight", {64, 64}, l, true});
    want.push_back({p + "post_attention_layernorm.weight", {64}, l, false});
    want.push_back({p + "mlp.gate_proj.weight", {176, 64}, l, true});
    want.push_back({p + "mlp.up_proj.weight", {176, 64}, l, true});
    want.push_back({p + "mlp.down_proj.weight", {64, 176}, l, true});
  }
  want.push_back({"model.norm.weight", {64}, -1, false});
  want.push_back({"lm_head.weight", {264, 64}, -1, true});

  ASSERT_EQ(specs.size(), want.size());
  int64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(specs[i].name, want[i].name);
    EXPECT_EQ(specs[i].shape, want[i].shape);
    EXPECT_EQ(specs[i].layer, want[i].layer);
    EXPECT_EQ(specs[i].weight_decay, want[i].decay);
    EXPECT_EQ(specs[i].offset, offset);
    int64_t numel = 1;
    for (int64_t d : want[i].shape) numel *= d;
    EXPECT_EQ(specs[i].numel, numel);
    offset += numel;
  }
  EXPECT_EQ(offset, 126'272);
  EXPECT_EQ(offset, cfg.num_parameters());
}

TEST(Params, TiedHasNoLmHeadAndCountsMatch) {
  for (const char* name : {"tiny", "small", "medium"}) {
    for (bool tied : {false, true}) {
      LlamaConfig cfg = LlamaConfig::preset(name);
      cfg.tie_word_embeddings = tied;
      std::vector<ParamSpec> specs = llama_param_specs(cfg);
      EXPECT_EQ(specs.back().offset + specs.back().numel, cfg.num_parameters());
      bool has_head = false;
      for (const ParamSpec& s : specs) has_head |= s.name == "lm_head.weight";
      EXPECT_EQ(has_head, !tied);
      EXPECT_EQ(specs.back().name, tied ? "model.norm.weight" : "lm_head.weight");
    }
  }
}

TEST(Params, LayerRangesCoverExactlyTheirLayer) {
  LlamaConfig cfg = LlamaConfig::preset("small");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  int64_t prev_end = find_param(specs, "model.embed_tokens.weight").numel;
  for (int l = 0; l < int(cfg.num_hidden_layers); ++l) {
    ParamRange r = layer_param_range(specs, l);
    EXPECT_EQ(r.begin, prev_end) << "layers follow each other without gaps";
    EXPECT_EQ(r.end - r.begin, cfg.num_parameters_per_layer());
    const ParamSpec& first = find_param(specs, "model.layers." + std::to_string(l) + ".input_layernorm.weight");
    const ParamSpec& last = find_param(specs, "model.layers." + std::to_string(l) + ".mlp.down_proj.weight");
    EXPECT_EQ(r.begin, first.offset);
    EXPECT_EQ(r.end, last.offset + last.numel);
    prev_end = r.end;
  }
  EXPECT_EQ(find_param(specs, "model.norm.weight").offset, prev_end);
  test::expect_error<InputError>([&] { layer_param_range(specs, 6); }, {"layer 6"});
  test::expect_error<InputError>([&] { layer_param_range(specs, -1); }, {"layer -1"});
}

TEST(Params, FindParamByName) {
  std::vector<ParamSpec> specs = llama_param_specs(LlamaConfig::preset("tiny"));
  const ParamSpec& k = find_param(specs, "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(k.layer, 1);
  test::expect_error<InputError>([&] { find_param(specs, "model.layers.9.mlp.up_proj.weight"); },
                                 {"model.layers.9.mlp.up_proj.weight"});
}

TEST(Params, Llama3_8bSpecsSumToTheExactCount) {
  std::vector<ParamSpec> specs = llama_param_specs(LlamaConfig::preset("llama3-8b"));
  EXPECT_EQ(specs.size(), size_t(1 + 32 * 9 + 2));
  EXPECT_EQ(specs.back().offset + specs.back().numel, 8'030'261'248);
  EXPECT_EQ(find_param(specs, "model.layers.31.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{1024, 4096}));
}

}  // namespace
}  // namespace llama4d
