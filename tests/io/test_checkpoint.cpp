// Checkpoint directories: round trips in f32 / f64 / bf16, sharded checkpoints (ours and a
// hand-built HF-style one), strictness about missing or misshapen tensors, and atomic,
// never-half-written directory replacement.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/params.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::ScratchDir;

template <class T>
std::vector<T> values_for(const LlamaConfig& cfg, uint64_t seed) {
  std::vector<double> v = test::lcg_values(size_t(cfg.num_parameters()), seed);
  return std::vector<T>(v.begin(), v.end());
}

TEST(Checkpoint, RoundTripF32AndF64AreExact) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);

  std::vector<float> pf = values_for<float>(cfg, 1);
  save_model(dir / "f32", cfg, specs, pf.data(), DType::f32);
  EXPECT_EQ(dir.list("f32"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  std::vector<float> back(pf.size(), 0.0f);
  load_model(dir / "f32", specs, back.data());
  EXPECT_EQ(back, pf);

  std::vector<double> pd = values_for<double>(cfg, 2);
  save_model(dir / "f64", cfg, specs, pd.data(), DType::f64);
  std::vector<double> backd(pd.size(), 0.0);
  load_model(dir / "f64", specs, backd.data());
  EXPECT_EQ(backd, pd);

  // A double model saved as F32 loads as float(x) into either precision.
  save_model(dir / "d_as_f", cfg, specs, pd.data(), DType::f32);
  load_model(dir / "d_as_f", specs, backd.data());
  for (size_t i = 0; i < pd.size(); ++i) ASSERT_EQ(backd[i], double(float(pd[i])));

  EXPECT_EQ(dir.list(), (std::vector<std::string>{"d_as_f", "f32", "f64"})) << "no staging directories left";
}

// A mixture-of-experts checkpoint is a Hugging Face Mixtral directory: config.json says
// MixtralForCausalLM with the expert keys, and model.safetensors holds
// model.layers.N.block_sparse_moe.gate.weight [E, C] and ...experts.e.w1/w3 [I, C], w2 [C, I]. Each
// flat parameter holds its own index, so where a tensor's values came from in the flat buffer is
// read off the file and compared with offsets worked out by hand for tiny-moe (V 264, C 64, 4 heads
// of 16, 2 key/value heads, I 88, E 4): embedding 264·64 = 16'896; layer 0's norms and attention
// 64 + 4'096 + 2·2'048 + 4'096 + 64 = 12'416, so its router starts at 29'312 and its experts at
// 29'312 + 4·64 = 29'568, each 3·88·64 = 16'896 long (w1, then w2 at +5'632, w3 at +11'264).
TEST(Checkpoint, MixtralCheckpointHasHuggingFaceNamesAndRoundTrips) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny-moe");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> p(size_t(cfg.num_parameters()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = float(i);  // exact: fewer than 2^24 parameters
  ASSERT_LT(p.size(), size_t(1) << 24);
  save_model(dir / "moe", cfg, specs, p.data(), DType::f32);

  const json written = read_json_file(dir / "moe/config.json");
  EXPECT_EQ(written["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(written["model_type"], "mixtral");
  EXPECT_EQ(written["num_local_experts"], 4);
  EXPECT_EQ(written["num_experts_per_tok"], 2);

  const SafetensorsFile file(dir / "moe/model.safetensors");
  std::vector<float> gate(4 * 64), w2(64 * 88), w3(88 * 64);
  file.read("model.layers.0.block_sparse_moe.gate.weight", {4, 64}, gate.data());
  file.read("model.layers.0.block_sparse_moe.experts.2.w2.weight", {64, 88}, w2.data());
  file.read("model.layers.0.block_sparse_moe.experts.3.w3.weight", {88, 64}, w3.data());
  for (size_t j = 0; j < gate.size(); ++j) ASSERT_EQ(gate[j], float(29'312 + j)) << j;
  for (size_t j = 0; j < w2.size(); ++j) ASSERT_EQ(w2[j], float(29'568 + 2 * 16'896 + 5'632 + j)) << j;
  for (size_t j = 0; j < w3.size(); ++j) ASSERT_EQ(w3[j], float(29'568 + 3 * 16'896 + 11'264 + j)) << j;
  EXPECT_EQ(file.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_NE(file.find("model.layers.1.block_sparse_moe.experts.0.w1.weight"), nullptr);

  const LlamaConfig back_cfg = load_config(dir / "moe");
  EXPECT_EQ(back_cfg.to_json(), cfg.to_json());
  std::vector<float> back(p.size(), -1.0f);
  load_model(dir / "moe", llama_param_specs(back_cfg), back.data());
  EXPECT_EQ(back, p);
}

TEST(Checkpoint, RoundTripBf16RoundsEachValueToNearestEven) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> p = values_for<float>(cfg, 3);
  save_model(dir / "ck", cfg, specs, p.data(), DType::bf16);

  json written = read_json_file(dir / "ck/config.json");
  EXPECT_EQ(written["torch_dtype"], "bfloat16");
  EXPECT_EQ(written["architectures"], json::array({"LlamaForCausalLM"}));

  std::vector<float> back(p.size());
  load_model(dir / "ck", specs, back.data());
  std::vector<double> backd(p.size());
  load_model(dir / "ck", specs, backd.data());
  for (size_t i = 0; i < p.size(); ++i) {
    const float want = test::bf16_bits_to_float(test::reference_bf16_bits(p[i]));
    ASSERT_EQ(back[i], want) << i;
    ASSERT_EQ(backd[i], double(want)) << i;
    ASSERT_LE(std::abs(back[i] - p[i]), std::abs(p[i]) * 0x1p-8f);  // within half a bf16 ulp
  }
}

TEST(Checkpoint, ConfigRoundTripsThroughTheDirectory) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  cfg.rope_scaling = RopeScaling{};
  cfg.tie_word_embeddings = true;
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> p = values_for<float>(cfg, 4);
  save_model(dir / "ck", cfg, specs, p.data());
  LlamaConfig back = load_config(dir / "ck");
  EXPECT_EQ(back.num_parameters(), cfg.num_parameters());
  EXPECT_TRUE(back.tie_word_embeddings);
  ASSERT_TRUE(back.rope_scaling.has_value());
  EXPECT_EQ(back.rope_scaling->factor, 8.0);
  EXPECT_EQ(load_config(dir / "ck/config.json").hidden_size, 64) << "a config file path works too";

  test::write_bytes(dir / "ck/config.json", "{ not json");
  expect_error<InputError>([&] { load_config(dir / "ck"); }, {dir / "ck/config.json", "not valid JSON"});
  expect_error<InputError>([&] { load_config(dir / "nowhere"); }, {dir / "nowhere/config.json"});
}

TEST(Checkpoint, ShardedSaveWritesAnIndexAndLoadsBack) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> p = values_for<float>(cfg, 5);
  const int64_t total_bytes = cfg.num_parameters() * 2;
  save_model(dir / "ck", cfg, specs, p.data(), DType::bf16, /*max_shard_bytes=*/total_bytes / 3);

  std::vector<std::string> files = dir.list("ck");
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors"), 0);
  ASSERT_EQ(std::count(files.begin(), files.end(), "model.safetensors.index.json"), 1);
  json index = read_json_file(dir / "ck/model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], total_bytes);
  std::set<std::string> shard_files;
  for (const ParamSpec& s : specs) {
    ASSERT_TRUE(index["weight_map"].contains(s.name)) << s.name;
    shard_files.insert(index["weight_map"][s.name].get<std::string>());
  }
  EXPECT_GE(shard_files.size(), 3u);
  const size_t k = shard_files.size();
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", k);
  EXPECT_EQ(*shard_files.begin(), first);
  EXPECT_EQ(files.size(), k + 2);  // shards + index + config.json

  std::vector<float> back(p.size());
  load_model(dir / "ck", specs, back.data());
  for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(back[i], test::bf16_bits_to_float(test::reference_bf16_bits(p[i])));
}

// A Hugging Face style checkpoint assembled byte by byte: two bf16 shards, a tied config (no
// lm_head.weight), and an extra rotary inv_freq buffer that older exports carry.
class HandBuiltShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = LlamaConfig::preset("tiny");
    cfg_.tie_word_embeddings = true;
    specs_ = llama_param_specs(cfg_);
    // Values exactly representable in bf16, so loading must reproduce them bit for bit.
    std::vector<double> v = test::lcg_values(size_t(cfg_.num_parameters()), 11);
    bits_.resize(v.size());
    expect_.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      bits_[i] = test::reference_bf16_bits(float(v[i]));
      expect_[i] = test::bf16_bits_to_float(bits_[i]);
    }
    json weight_map = json::object();
    const size_t half = specs_.size() / 2;
    for (int shard = 0; shard < 2; ++shard) {
      const std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
      json header = {{"__metadata__", {{"format", "pt"}}}};
      std::string data;
      for (size_t s = shard == 0 ? 0 : half; s < (shard == 0 ? half : specs_.size()); ++s) {
        const ParamSpec& p = specs_[s];
        std::vector<uint16_t> slice(bits_.begin() + p.offset, bits_.begin() + p.offset + p.numel);
        header[p.name] = {{"dtype", "BF16"}, {"shape", p.shape}, {"data_offsets", {data.size(), data.size() + 2 * p.numel}}};
        data += test::le_bytes(slice);
        weight_map[p.name] = file;
      }
      if (shard == 1) {
        std::vector<float> inv_freq(8, 0.5f);
        header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {
            {"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {data.size(), data.size() + 32}}};
        data += test::le_bytes(inv_freq);
        weight_map["model.layers.0.self_attn.rotary_emb.inv_freq"] = file;
      }
      test::write_bytes(dir_ / file, test::raw_safetensors(header.dump(), data));
    }
    index_ = {{"metadata", {{"total_size", 2 * cfg_.num_parameters() + 32}}}, {"weight_map", weight_map}};
    test::write_bytes(dir_ / "model.safetensors.index.json", index_.dump(2));
    json c = cfg_.to_json();
    c["torch_dtype"] = "bfloat16";
    test::write_bytes(dir_ / "config.json", c.dump(2));
  }

  ScratchDir dir_;
  LlamaConfig cfg_;
  std::vector<ParamSpec> specs_;
  std::vector<uint16_t> bits_;
  std::vector<float> expect_;
  json index_;
};

TEST_F(HandBuiltShardedCheckpoint, LoadsBitExactIntoFloatAndDouble) {
  LlamaConfig cfg = load_config(dir_.str());
  EXPECT_TRUE(cfg.tie_word_embeddings);
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> pf(size_t(cfg.num_parameters()), -7.0f);
  load_model(dir_.str(), specs, pf.data());
  EXPECT_EQ(pf, expect_);
  std::vector<double> pd(pf.size());
  load_model(dir_.str(), specs, pd.data());
  for (size_t i = 0; i < pd.size(); ++i) ASSERT_EQ(pd[i], double(expect_[i]));

  TensorStore store = TensorStore::open(dir_.str());
  EXPECT_NE(store.find("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);
  EXPECT_EQ(store.names().size(), specs.size() + 1);
}

TEST_F(HandBuiltShardedCheckpoint, UntiedModelNeedsLmHead) {
  LlamaConfig untied = cfg_;
  untied.tie_word_embeddings = false;
  std::vector<ParamSpec> specs = llama_param_specs(untied);
  std::vector<float> p(size_t(untied.num_parameters()), -7.0f);
  expect_error<InputError>([&] { load_model(dir_.str(), specs, p.data()); },
                           {"lm_head.weight", "model.safetensors.index.json"});
  EXPECT_EQ(p[0], -7.0f) << "a failed load leaves the parameters untouched";
}

TEST_F(HandBuiltShardedCheckpoint, IndexPointingAtAMissingShard) {
  std::filesystem::remove(dir_ / "model-00002-of-00002.safetensors");
  std::vector<float> p(size_t(cfg_.num_parameters()));
  expect_error<InputError>([&] { load_model(dir_.str(), specs_, p.data()); },
                           {"model-00002-of-00002.safetensors", "model.safetensors.index.json", "No such file"});
}

TEST_F(HandBuiltShardedCheckpoint, IndexMustStayInsideTheDirectoryAndTellTheTruth) {
  std::vector<float> p(size_t(cfg_.num_parameters()));
  json bad = index_;
  bad["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  test::write_bytes(dir_ / "model.safetensors.index.json", bad.dump());
  expect_error<InputError>([&] { load_model(dir_.str(), specs_, p.data()); }, {"model.norm.weight", "not a file name"});

  bad = index_;
  bad["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // it lives in shard 2
  test::write_bytes(dir_ / "model.safetensors.index.json", bad.dump());
  expect_error<InputError>([&] { load_model(dir_.str(), specs_, p.data()); },
                           {"model.norm.weight", "model-00001-of-00002.safetensors", "no such tensor"});

  test::write_bytes(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error<InputError>([&] { load_model(dir_.str(), specs_, p.data()); }, {"weight_map"});
  test::write_bytes(dir_ / "model.safetensors.index.json", R"({"weight_map": )");
  expect_error<InputError>([&] { load_model(dir_.str(), specs_, p.data()); },
                           {"model.safetensors.index.json", "not valid JSON"});
}

TEST(Checkpoint, MissingOrMisshapenTensorsAreNamed) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> p = values_for<float>(cfg, 6);
  save_model(dir / "ck", cfg, specs, p.data());

  LlamaConfig deeper = cfg;
  deeper.num_hidden_layers = 3;
  std::vector<float> q(size_t(deeper.num_parameters()), -7.0f);
  expect_error<InputError>([&] { load_model(dir / "ck", llama_param_specs(deeper), q.data()); },
                           {"missing tensor 'model.layers.2.input_layernorm.weight'", dir / "ck"});

  LlamaConfig wider = cfg;
  wider.intermediate_size = 128;
  std::vector<float> w(size_t(wider.num_parameters()), -7.0f);
  expect_error<InputError>([&] { load_model(dir / "ck", llama_param_specs(wider), w.data()); },
                           {"model.layers.0.mlp.gate_proj.weight", "[176, 64]", "expected [128, 64]"});
  EXPECT_EQ(w[0], -7.0f) << "shapes are checked before anything is overwritten";

  expect_error<InputError>([&] { load_model(dir / "nowhere", specs, p.data()); }, {dir / "nowhere", "does not exist"});
  std::filesystem::create_directories(dir / "empty");
  expect_error<InputError>([&] { load_model(dir / "empty", specs, p.data()); },
                           {"model.safetensors", "model.safetensors.index.json"});
}

// Weights that config.json does not describe are an error, not silently skipped: a layer beyond
// num_hidden_layers, an lm_head.weight next to tie_word_embeddings: true, a tensor of another
// architecture. (rotary_emb.inv_freq buffers stay accepted: HandBuiltShardedCheckpoint.)
TEST(Checkpoint, WeightsTheConfigDoesNotDescribeAreRefused) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");  // 2 layers, untied
  std::vector<float> p = values_for<float>(cfg, 16);
  save_model(dir / "ck", cfg, llama_param_specs(cfg), p.data());

  LlamaConfig shallower = cfg;
  shallower.num_hidden_layers = 1;
  std::vector<float> q(size_t(shallower.num_parameters()), -7.0f);
  expect_error<InputError>([&] { load_model(dir / "ck", llama_param_specs(shallower), q.data()); },
                           {dir / "ck", "'model.layers.1.", "num_hidden_layers (1)", "disagree"});
  EXPECT_EQ(q[0], -7.0f) << "nothing is read before the check";

  LlamaConfig tied = cfg;
  tied.tie_word_embeddings = true;
  std::vector<float> t(size_t(tied.num_parameters()), -7.0f);
  expect_error<InputError>([&] { load_model(dir / "ck", llama_param_specs(tied), t.data()); },
                           {"'lm_head.weight'", "tie_word_embeddings: true"});

  // An extra tensor of another kind (a bias Llama does not have).
  std::vector<TensorToWrite> tensors = flat_tensors(llama_param_specs(cfg), p.data(), DType::f32);
  const std::vector<float> bias(64, 0.25f);
  tensors.push_back(TensorToWrite{"model.layers.0.self_attn.q_proj.bias", {64}, DType::f32, bias.data(), DType::f32});
  write_directory_atomically(
      dir / "biased",
      [&](const std::string& staging) {
        write_config_file(staging, cfg, DType::f32);
        write_tensor_files(staging, kModelBase, tensors, kModelMetadata);
      },
      kConfigFile);
  std::vector<float> b(p.size());
  expect_error<InputError>([&] { load_model(dir / "biased", llama_param_specs(cfg), b.data()); },
                           {"'model.layers.0.self_attn.q_proj.bias'", "does not have"});
}

TEST(Checkpoint, SavingReplacesAnOlderCheckpointAtomically) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> a = values_for<float>(cfg, 7), b = values_for<float>(cfg, 8);
  save_model(dir / "ck", cfg, specs, a.data(), DType::bf16, cfg.num_parameters());  // sharded
  save_model(dir / "ck", cfg, specs, b.data());                                      // single file
  std::vector<float> back(b.size());
  load_model(dir / "ck", specs, back.data());
  EXPECT_EQ(back, b);
  EXPECT_EQ(dir.list("ck"), (std::vector<std::string>{"config.json", "model.safetensors"}))
      << "no stale shards of the old checkpoint";
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"});

  // An existing empty directory is fine to fill; a trailing slash names the same directory.
  std::filesystem::create_directories(dir / "empty");
  save_model(dir / "empty/", cfg, specs, a.data());
  load_model(dir / "empty", specs, back.data());
  EXPECT_EQ(back, a);
}

TEST(Checkpoint, FailedWriteLeavesTheOldCheckpointIntact) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> a = values_for<float>(cfg, 9);
  save_model(dir / "ck", cfg, specs, a.data());

  // Dies half way: one file written, then an error (think: disk full, a bad flag).
  EXPECT_THROW(write_directory_atomically(
                   dir / "ck",
                   [&](const std::string& staging) {
                     write_json_file(staging + "/config.json", cfg.to_json());
                     throw std::runtime_error("boom");
                   },
                   kConfigFile),
               std::runtime_error);
  // Unsupported storage dtype fails inside the writer.
  expect_error<InputError>([&] { save_model(dir / "ck", cfg, specs, a.data(), DType::f16); }, {"F16"});

  std::vector<float> back(a.size());
  load_model(dir / "ck", specs, back.data());
  EXPECT_EQ(back, a);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"}) << "staging directories are cleaned up";
  EXPECT_EQ(dir.list("ck"), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

TEST(Checkpoint, RefusesToReplaceSomethingThatIsNotACheckpoint) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> a = values_for<float>(cfg, 10);
  std::filesystem::create_directories(dir / "docs");
  test::write_bytes(dir / "docs/notes.txt", "precious");
  expect_error<InputError>([&] { save_model(dir / "docs", cfg, specs, a.data()); },
                           {"refusing", dir / "docs", "config.json"});
  EXPECT_EQ(test::read_bytes(dir / "docs/notes.txt"), "precious");

  test::write_bytes(dir / "file", "x");
  expect_error<InputError>([&] { save_model(dir / "file", cfg, specs, a.data()); }, {dir / "file", "not a directory"});
  expect_error<InputError>([&] { save_model(".", cfg, specs, a.data()); }, {"'.'"});
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"docs", "file"}));
}

TEST(Checkpoint, UnwritableLocationFailsCleanly) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<float> a = values_for<float>(cfg, 12);
  // Tests run as root, which ignores permission bits; a regular file in the path stops anyone.
  test::write_bytes(dir / "blocker", "x");
  expect_error<IoError>([&] { save_model(dir / "blocker/ck", cfg, specs, a.data()); }, {dir / "blocker"});
  expect_error<IoError>([&] { save_model(dir / "blocker/deeper/ck", cfg, specs, a.data()); }, {dir / "blocker"});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"blocker"});
  EXPECT_EQ(test::read_bytes(dir / "blocker"), "x");
}

TEST(Checkpoint, TrainerStyleDirectoryWithOptimizerState) {
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<ParamSpec> specs = llama_param_specs(cfg);
  std::vector<double> params = values_for<double>(cfg, 13), m = values_for<double>(cfg, 14),
                      v = values_for<double>(cfg, 15);
  write_directory_atomically(
      dir / "step-100",
      [&](const std::string& staging) {
        write_model_files(staging, cfg, specs, params.data(), DType::f64);
        std::vector<TensorToWrite> state = flat_tensors(specs, m.data(), DType::f64, "exp_avg.");
        std::vector<TensorToWrite> second = flat_tensors(specs, v.data(), DType::f64, "exp_avg_sq.");
        state.insert(state.end(), second.begin(), second.end());
        write_tensor_files(staging, "optimizer", state, {{"step", "100"}});
        write_json_file(staging + "/trainer_state.json", {{"step", 100}});
      },
      kConfigFile);
  EXPECT_EQ(dir.list("step-100"), (std::vector<std::string>{"config.json", "model.safetensors",
                                                            "optimizer.safetensors", "trainer_state.json"}));
  ASSERT_TRUE(TensorStore::exists(dir / "step-100", "optimizer"));
  TensorStore opt = TensorStore::open(dir / "step-100", "optimizer");
  std::vector<double> m2(m.size()), v2(v.size()), p2(params.size());
  read_flat_tensors(opt, specs, m2.data(), "exp_avg.");
  read_flat_tensors(opt, specs, v2.data(), "exp_avg_sq.");
  load_model(dir / "step-100", specs, p2.data());
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);
  EXPECT_EQ(p2, params);
  EXPECT_EQ(read_json_file(dir / "step-100/trainer_state.json")["step"], 100);
  EXPECT_FALSE(TensorStore::exists(dir / "step-100", "scheduler"));
}

}  // namespace
}  // namespace llama4d
