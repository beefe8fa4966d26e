// The golden test: llama4d's hand-written forward/backward against an independent PyTorch
// Llama (torch_llama.py, Hugging Face LlamaForCausalLM semantics) that autograd differentiates.
//
// For each config the test saves the model with core/io's save_model (config.json +
// model.safetensors, HF names), writes the batch next to it, runs the Python reference once
// over an fp32 and an fp64 copy, and compares per tensor: the mean loss, the logits, and every
// parameter gradient. Relative error = max|ours - torch| / max(max|torch|, tiny).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/model/llama.h"

#ifndef LLAMA4D_TORCH_SCRIPT
#error "LLAMA4D_TORCH_SCRIPT (path of torch_llama.py) must be defined by the build"
#endif

namespace llama4d {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";  // Debian's, the one with python3-torch

// Runs `cmd` through the shell, returns its exit status and combined output.
int run_command(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), int(buf.size()), p)) output += buf.data();
  return pclose(p);
}

bool torch_available(std::string& why) {
  std::string out;
  const int rc = run_command(std::string(kPython) + " -c 'import torch, numpy'", out);
  if (rc != 0) why = std::string(kPython) + " cannot import torch/numpy: " + out;
  return rc == 0;
}

// A scratch directory removed when the test ends, pass or fail.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("llama4d_torch_" + tag + "_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// splitmix64 -> uniform [0, 1), to move weights away from the N(0, 0.02) init so attention is
// not uniform and RMSNorm gains are not all 1.
double uniform(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

struct Case {
  const char* name;
  LlamaConfig cfg;
  int64_t B, seq;
};

Case gqa_untied() {
  LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.rope_theta = 500000.0;  // Llama 3's
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = false;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  return {"gqa_untied", c, 2, 9};
}

Case tied_rope_scaling() {
  LlamaConfig c = gqa_untied().cfg;
  c.num_hidden_layers = 3;
  c.num_key_value_heads = 1;  // multi-query: all four query heads share one kv head
  c.head_dim = 16;  // q_dim 64 != hidden 32: HF's explicit head_dim key must be honoured
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  // head_dim 16, theta 1e4: wavelengths 2*pi*10^(i/4), i = 0..7, i.e. 6.3, 20, 63, 199, 628,
  // 1987, 6283, 19869. With original length 1024, low factor 1, high factor 8, the first three
  // (< 128) are kept, 199 and 628 fall in the blended band, and the last three are divided by 8.
  c.rope_scaling = RopeScaling{.rope_type = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                               .high_freq_factor = 8.0, .original_max_position_embeddings = 1024};
  return {"tied_rope_scaling", c, 2, 12};
}

struct Batch {
  std::vector<int32_t> tokens, targets;  // [B, T]
};

Batch make_batch(const Case& c) {
  Batch b;
  uint64_t s = 77;
  const int64_t n = c.B * c.seq;
  for (int64_t i = 0; i < n; ++i) b.tokens.push_back(int32_t(uniform(s) * double(c.cfg.vocab_size)));
  for (int64_t i = 0; i < n; ++i) b.targets.push_back(int32_t(uniform(s) * double(c.cfg.vocab_size)));
  b.targets[2] = -1;  // ignored positions, in both rows
  b.targets[size_t(n - 1)] = -1;
  b.targets[size_t(c.seq + 4)] = -1;
  return b;
}

void write_batch(const fs::path& dir, const Case& c, const Batch& b) {
  write_safetensors((dir / "batch.safetensors").string(),
                    {TensorToWrite{"tokens", {c.B, c.seq}, DType::i32, b.tokens.data(), DType::i32},
                     TensorToWrite{"targets", {c.B, c.seq}, DType::i32, b.targets.data(), DType::i32}});
}

// The keys transformers' LlamaConfig / LlamaForCausalLM read to build the same architecture.
void expect_hf_config_keys(const fs::path& dir, const LlamaConfig& cfg) {
  const nlohmann::json j = read_json_file((dir / "config.json").string());
  for (const char* key : {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                          "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
                          "rope_scaling", "hidden_act", "attention_bias", "mlp_bias", "bos_token_id",
                          "eos_token_id", "torch_dtype"})
    EXPECT_TRUE(j.contains(key)) << "config.json lacks '" << key << "'";
  EXPECT_EQ(j.value("model_type", ""), "llama");
  EXPECT_EQ(j.value("hidden_act", ""), "silu");
  ASSERT_TRUE(j["architectures"].is_array());
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["num_key_value_heads"].get<int64_t>(), cfg.num_key_value_heads);
  EXPECT_EQ(j["tie_word_embeddings"].get<bool>(), cfg.tie_word_embeddings);
  if (cfg.rope_scaling) {
    const auto& rs = j["rope_scaling"];
    ASSERT_TRUE(rs.is_object());
    for (const char* key : {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"})
      EXPECT_TRUE(rs.contains(key)) << "rope_scaling lacks '" << key << "'";
    EXPECT_EQ(rs.value("rope_type", ""), "llama3");
  } else {
    EXPECT_TRUE(j["rope_scaling"].is_null());
  }
}

// max|ours - ref| / max(max|ref|, tiny); +inf if anything is NaN or infinite (std::max would
// silently skip a NaN).
double rel_error(const std::vector<double>& ours, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(ours[i] - ref[i]);
    if (!std::isfinite(d)) return HUGE_VAL;
    num = std::max(num, d);
    den = std::max(den, std::abs(ref[i]));
  }
  return num / std::max(den, 1e-300);
}

template <class T>
std::vector<double> as_double(const T* p, int64_t n) {
  return std::vector<double>(p, p + n);
}

// Forward/backward of our model on the batch and per-tensor comparison with what the Python
// reference wrote into dir/torch_reference.safetensors.
template <class T>
void compare_with_torch(Llama<T>& m, const Case& c, const Batch& b, const fs::path& dir, double tol) {
  const char* prec = sizeof(T) == 8 ? "fp64" : "fp32";
  m.zero_grad();
  const LossSum ls = m.forward(b.tokens.data(), b.targets.data(), c.B, c.seq);
  ASSERT_GT(ls.tokens, 0);
  const std::vector<double> logits = as_double(m.logits(), c.B * c.seq * c.cfg.vocab_size);
  m.backward(T(1) / T(ls.tokens));  // gradient of the MEAN loss, as torch's reduction="mean"

  const SafetensorsFile ref((dir / "torch_reference.safetensors").string());
  std::vector<double> torch_loss(1);
  ref.read("loss", {1}, torch_loss.data());
  std::vector<double> torch_logits(size_t(c.B * c.seq * c.cfg.vocab_size));
  ref.read("logits", {c.B, c.seq, c.cfg.vocab_size}, torch_logits.data());

  const double loss_rel = rel_error({ls.mean()}, torch_loss);
  EXPECT_LE(loss_rel, tol) << prec << " loss: ours " << ls.mean() << " torch " << torch_loss[0];
  const double logits_rel = rel_error(logits, torch_logits);
  EXPECT_LE(logits_rel, tol) << prec << " logits";

  double worst = 0;
  std::string worst_name;
  std::set<std::string> expected;
  for (const ParamSpec& p : m.param_specs()) {
    expected.insert("grad." + p.name);
    std::vector<double> g(size_t(p.numel));
    ref.read("grad." + p.name, p.shape, g.data());
    const double rel = rel_error(as_double(m.grads() + p.offset, p.numel), g);
    EXPECT_LE(rel, tol) << prec << " gradient of " << p.name;
    if (rel >= worst) worst = rel, worst_name = p.name;
  }
  // torch must not know of parameters we lack (e.g. an lm_head in a tied model).
  for (const TensorInfo& t : ref.tensors())
    EXPECT_TRUE(t.name.rfind("grad.", 0) != 0 || expected.count(t.name)) << "torch has an extra " << t.name;
  std::printf("[%s %s] loss %.12g (torch %.12g) rel %.3g | logits rel %.3g | worst grad rel %.3g in %s\n", c.name,
              prec, ls.mean(), torch_loss[0], loss_rel, logits_rel, worst, worst_name.c_str());
}

void run_case(const Case& c) {
  std::string why;
  if (!torch_available(why)) GTEST_SKIP() << why;

  Llama<double> m64(c.cfg);
  m64.init_weights(2024);
  uint64_t s = 31;
  for (const ParamSpec& p : m64.param_specs())  // std ~0.3 matrices, gains in [0.5, 1.5]
    for (int64_t i = 0; i < p.numel; ++i) {
      const double u = uniform(s) - 0.5;
      m64.params()[p.offset + i] = p.shape.size() == 1 ? 1.0 + u : 0.6 * u;
    }
  Llama<float> m32(c.cfg);
  for (int64_t i = 0; i < m64.num_params(); ++i) m32.params()[i] = float(m64.params()[i]);
  const Batch b = make_batch(c);

  TempDir tmp(c.name);
  const fs::path d64 = tmp.path / "fp64", d32 = tmp.path / "fp32";
  save_model(d64.string(), c.cfg, m64.param_specs(), m64.params(), DType::f64);
  save_model(d32.string(), c.cfg, m32.param_specs(), m32.params(), DType::f32);
  write_batch(d64, c, b);  // after save_model, which replaces the whole directory
  write_batch(d32, c, b);
  expect_hf_config_keys(d64, c.cfg);

  std::string out;
  const std::string cmd = std::string(kPython) + " " + LLAMA4D_TORCH_SCRIPT + " " + d32.string() + " " + d64.string();
  const int rc = run_command(cmd, out);
  ASSERT_EQ(rc, 0) << "the PyTorch reference failed:\n" << cmd << "\n" << out;

  compare_with_torch(m64, c, b, d64, 1e-10);
  compare_with_torch(m32, c, b, d32, 1e-5);
}

TEST(TorchReference, GqaUntied) { run_case(gqa_untied()); }
TEST(TorchReference, TiedWithLlama3RopeScaling) { run_case(tied_rope_scaling()); }

}  // namespace
}  // namespace llama4d
