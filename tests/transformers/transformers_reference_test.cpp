// llama4d against Hugging Face transformers on model directories transformers wrote
// (make_models.py): Llama 3.0, 3.1 (rope_scaling llama3), 3.2 (tied embeddings), bf16 weights
// and a sharded checkpoint, each opened as a user's download is (open_model_directory: its
// tokenizer, stop ids and chat template) and loaded by load_model. Per case: the prompt's ids,
// the logits of the prompt within 1e-5 of transformers' (fp32), and 32 greedy tokens identical
// to transformers' generate. Then chat prompts: encode_chat's ids equal to apply_chat_template's
// (add_generation_prompt=True) for Llama 3.2's, Llama 3.0's and Llama 3.1's templates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/data/chat_format.h"
#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/model/decode.h"
#include "core/model/llama.h"
#include "core/model/sampler.h"
#include "core/train/model_directory.h"

#ifndef LLAMA4D_TRANSFORMERS_REFERENCE
#error "LLAMA4D_TRANSFORMERS_REFERENCE must be defined by the build"
#endif

namespace llama4d {
namespace {

namespace fs = std::filesystem;

#define REQUIRE_MODELS(dir)                                                                                 \
  const std::string dir = LLAMA4D_TRANSFORMERS_REFERENCE;                                                    \
  if (dir.empty())                                                                                           \
    GTEST_SKIP() << "no Python with transformers configured: configure with "                               \
                    "-DLLAMA4D_TEST_TRANSFORMERS_PYTHON=\"$(scripts/python_env.sh tests/transformers/requirements.txt)\"";             \
  ASSERT_TRUE(fs::exists(fs::path(dir) / "chat.json"))                                                       \
      << dir << " has no models: run this test through ctest, whose fixture "                               \
      << "TransformersReference.Models runs tests/transformers/make_models.py first"

template <class T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error(name + " missing from the reference");
  std::vector<T> out(size_t(t->numel));
  f.read(name, t->shape, out.data());
  return out;
}

std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  std::vector<int32_t> out(size_t(t->numel));
  f.read_raw(name, DType::i32, t->shape, out.data());
  return out;
}

class TransformersModel : public ::testing::TestWithParam<const char*> {};

TEST_P(TransformersModel, SameLogitsAndGreedyTokensAsTransformers) {
  REQUIRE_MODELS(root);
  const std::string dir = (fs::path(root) / GetParam()).string();
  const ModelDirectory md = open_model_directory(dir);
  EXPECT_EQ(md.tokenizer->describe().rfind("bpe", 0), 0u) << md.tokenizer->describe();
  for (int32_t eos : {3841, 3848, 3849})
    EXPECT_NE(std::find(md.stop_ids.begin(), md.stop_ids.end(), eos), md.stop_ids.end()) << eos;
  const SafetensorsFile ref((fs::path(dir) / "reference.safetensors").string());
  const std::vector<int32_t> ids = read_ids(ref, "input_ids"), greedy = read_ids(ref, "greedy");
  const std::vector<float> want = read_tensor<float>(ref, "logits");
  EXPECT_EQ(md.tokenizer->encode("Pipeline parallelism cuts the layers into stages; each stage", {.add_bos = true}), ids);

  const LlamaConfig& cfg = md.config;
  Llama<float> model(cfg);
  load_model(dir, model.param_specs(), model.params());
  const int64_t T = int64_t(ids.size()), V = cfg.vocab_size;
  ASSERT_EQ(int64_t(want.size()), T * V);
  model.forward(ids.data(), nullptr, 1, T);
  const float* got = model.logits();
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < T * V; ++i) {
    worst = std::max(worst, double(std::fabs(got[i] - want[size_t(i)])));
    largest = std::max(largest, double(std::fabs(want[size_t(i)])));
  }
  std::printf("%s: max |llama4d - transformers| = %.3g over logits up to %.3g\n", GetParam(), worst, largest);
  EXPECT_LE(worst, 1e-5) << GetParam() << ": max |llama4d - transformers| over the logits, whose largest is " << largest;
  EXPECT_GT(largest, 1.0) << "logits this small would not test much";

  Decoder<float> decoder(model, 1, T + 32);
  std::vector<float> logits(static_cast<size_t>(V));
  decoder.feed(ids.data(), T, logits.data());
  Sampler argmax({});
  std::vector<int32_t> ours;
  for (int i = 0; i < 32; ++i) {
    ours.push_back(argmax.next(logits, V));
    if (i + 1 < 32) decoder.feed(&ours.back(), 1, logits.data());
  }
  EXPECT_EQ(ours, greedy) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Llama3, TransformersModel,
                         ::testing::Values("llama3_0", "llama3_1", "llama3_2_tied", "bf16", "sharded"));

TEST(TransformersChat, ChatPromptsTokenizedAsApplyChatTemplate) {
  REQUIRE_MODELS(root);
  const ModelDirectory md = open_model_directory((fs::path(root) / "llama3_1").string());
  std::ifstream in(fs::path(root) / "chat.json");
  const nlohmann::json chat = nlohmann::json::parse(in);
  const ChatFormat llama32 = md.chat_format();
  EXPECT_EQ(llama32.name, "llama3.2");
  const ChatFormat llama30 = recognise_chat_template(chat.at("llama3_0_template").get<std::string>(), "chat.json");
  EXPECT_EQ(llama30.name, "llama3.0");
  const ChatFormat llama31 = recognise_chat_template(chat.at("llama3_1_template").get<std::string>(), "chat.json");
  EXPECT_EQ(llama31.name, "llama3.1");
  size_t checked = 0;
  for (const nlohmann::json& c : chat.at("cases")) {
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    const ChatFormat& format = c.at("format") == "llama3.0" ? llama30 : c.at("format") == "llama3.1" ? llama31 : llama32;
    const std::vector<int32_t> ids = encode_chat(*md.tokenizer, format, messages, {.date = c.at("date")});
    EXPECT_EQ(ids, c.at("ids").get<std::vector<int32_t>>()) << format.name << ": " << c.at("messages").dump();
    ++checked;
  }
  EXPECT_GE(checked, 18u);
}

}  // namespace
}  // namespace llama4d
