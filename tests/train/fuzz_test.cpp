// Bounded fuzzing of everything a checkpoint directory holds: model.safetensors and
// optimizer.safetensors, config.json, trainer_state.json, and a sharded model's index. Each
// mutation is applied to a pristine copy and the directory loaded the way `train --resume` (or
// `eval`) loads it. Every mutation must end in one of two ways:
//   - an InputError (what the CLI turns into one line and exit code 2), or
//   - a correct load: the shape the pristine config describes and exactly the pristine values,
//     except the elements whose stored bytes the mutation changed, and the run state the mutated
//     trainer_state.json says.
// Anything else fails: another exception type (exit 1, often a raw parser message), a load of
// wrong values, and, of course, a crash (the last mutation is printed first). The seed is fixed,
// so every run tries the same mutations; a deadline stops early on slow sanitizer builds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"
#include "train_test_util.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Mutations per file. The whole test takes about a second in a release build.
constexpr int kMutationsPerFile = 400;
constexpr auto kDeadline = std::chrono::seconds(60);
constexpr uint64_t kSeed = 20240514;

// ---- Reporting a crash ----------------------------------------------------------------------

char g_current[512] = "";  // the mutation being tried, for the signal handler

extern "C" void report_crash(int sig) {
  const char head[] = "\nfuzz_test: crashed on mutation: ";
  [[maybe_unused]] ssize_t w = write(2, head, sizeof head - 1);
  w = write(2, g_current, strnlen(g_current, sizeof g_current));
  w = write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_report() {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL}) std::signal(sig, report_crash);
#endif
}

// ---- Files ----------------------------------------------------------------------------------

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// ---- Mutations ------------------------------------------------------------------------------

struct Mutated {
  std::string bytes;
  std::string what;
  // Byte range of the data section whose bytes changed (file offsets); header intact. Only
  // these elements may load differently from the pristine values.
  uint64_t data_begin = 0, data_end = 0;
};

// JSON values that are wrong in many ways at once: types, signs, sizes, integer vs float.
json odd_value(std::mt19937_64& rng) {
  static const std::vector<json> pool = {
      nullptr, true, false, "", "llama", "F32", 0, 1, -1, 2, 3, 7, 1.5, -0.0, 1e300, -1e300, 4.9e-324,
      int64_t(1) << 31, int64_t(1) << 53, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
      std::numeric_limits<uint64_t>::max(), json::array(), json::array({1}), json::array({1, 2, 3}),
      json::object(), json{{"rope_type", "llama3"}}, json{{"rope_type", "default"}}};
  return pool[rng() % pool.size()];
}

// Every (object, key) path in j, depth first, so nested keys (options.lr, rope_parameters.*,
// a tensor's data_offsets) are mutated too.
void collect_paths(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) {
      out.push_back(at / it.key());
      collect_paths(it.value(), at / it.key(), out);
    }
  else if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(at / i);
      collect_paths(j[i], at / i, out);
    }
}

// One structural change of a JSON document: replace, delete or duplicate-rename a value, add a
// key, or write a number that the JSON type cannot hold.
std::string mutate_json(const json& doc, std::mt19937_64& rng, std::string& what) {
  json j = doc;
  std::vector<json::json_pointer> paths;
  collect_paths(j, json::json_pointer(), paths);
  const json::json_pointer p = paths[rng() % paths.size()];
  switch (rng() % 5) {
    case 0:
    case 1: {
      const json v = odd_value(rng);
      what = "set " + p.to_string() + " = " + v.dump();
      j[p] = v;
      return j.dump(rng() % 2 ? -1 : 2);
    }
    case 2: {
      what = "delete " + p.to_string();
      json& parent = j[p.parent_pointer()];
      if (parent.is_object()) parent.erase(p.back());
      else parent.erase(size_t(std::stoul(p.back())));
      return j.dump();
    }
    case 3: {
      what = "add " + p.parent_pointer().to_string() + "/extra_key";
      json& parent = j[p.parent_pointer()];
      if (parent.is_object()) parent["extra_key"] = odd_value(rng);
      else parent.push_back(odd_value(rng));
      return j.dump();
    }
    default: {
      // A number out of every range, written as text (json cannot dump it).
      static const char* raw[] = {"1e999", "-1e999", "123456789012345678901234567890", "0.0000001e-400", "-0"};
      const std::string r = raw[rng() % 5];
      what = "set " + p.to_string() + " = " + r + " (raw text)";
      j[p] = "@@RAW@@";
      std::string text = j.dump();
      text.replace(text.find("\"@@RAW@@\""), 9, r);
      return text;
    }
  }
}

// Byte-level damage to any text or binary: overwrite, truncate, append.
std::string mutate_bytes(const std::string& in, std::mt19937_64& rng, std::string& what, size_t lo, size_t hi) {
  std::string s = in;
  static const char interesting[] = "{}[]\":,0123456789-.eE \n\0\xff";
  switch (rng() % 4) {
    case 0:
    case 1: {
      const size_t at = lo + rng() % std::max<size_t>(1, hi - lo);
      const char c = rng() % 2 ? interesting[rng() % (sizeof interesting - 1)] : char(rng());
      what = "byte " + std::to_string(at) + " = " + std::to_string(uint8_t(c));
      if (at < s.size()) s[at] = c;
      return s;
    }
    case 2: {
      const size_t at = rng() % (s.size() + 1);
      what = "truncate to " + std::to_string(at) + " bytes";
      return s.substr(0, at);
    }
    default: {
      const size_t n = 1 + rng() % 16;
      what = "append " + std::to_string(n) + " bytes";
      for (size_t i = 0; i < n; ++i) s.push_back(char(rng()));
      return s;
    }
  }
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return n;
}

Mutated mutate_safetensors(const std::string& file, std::mt19937_64& rng) {
  Mutated m;
  const uint64_t n = header_length(file);
  const json header = json::parse(file.substr(8, n));
  switch (rng() % 5) {
    case 0: {  // the length field
      std::string s = file;
      const int bit = int(rng() % 64);
      uint64_t v = n ^ (uint64_t(1) << bit);
      std::memcpy(s.data(), &v, 8);
      m.what = "header length bit " + std::to_string(bit) + " flipped";
      m.bytes = s;
      return m;
    }
    case 1: {  // the header text, byte by byte
      m.bytes = mutate_bytes(file, rng, m.what, 8, 8 + n);
      m.what = "header " + m.what;
      return m;
    }
    case 2: {  // the header, structurally, re-serialised with its true length
      std::string h = mutate_json(header, rng, m.what);
      m.what = "header: " + m.what;
      std::string s(8, '\0');
      const uint64_t len = h.size();
      std::memcpy(s.data(), &len, 8);
      m.bytes = s + h + file.substr(8 + n);
      return m;
    }
    case 3: {  // a data byte: the file stays valid; only that element may change
      std::string s = file;
      const uint64_t data = 8 + n, at = data + rng() % (file.size() - data);
      s[at] = char(s[at] ^ char(1 + rng() % 255));
      m.what = "data byte " + std::to_string(at) + " changed";
      m.data_begin = at, m.data_end = at + 1;
      m.bytes = s;
      return m;
    }
    default: {  // truncation or trailing bytes
      if (rng() % 2) {
        const size_t at = rng() % file.size();
        m.what = "truncate to " + std::to_string(at) + " bytes";
        m.bytes = file.substr(0, at);
      } else {
        const size_t n = 1 + rng() % 16;
        m.what = "append " + std::to_string(n) + " bytes";
        m.bytes = file;
        for (size_t i = 0; i < n; ++i) m.bytes.push_back(char(rng()));
      }
      return m;
    }
  }
}

Mutated mutate_json_file(const std::string& text, std::mt19937_64& rng) {
  Mutated m;
  if (rng() % 3 == 0) {
    m.bytes = mutate_bytes(text, rng, m.what, 0, text.size());
  } else {
    m.bytes = mutate_json(json::parse(text), rng, m.what);
  }
  return m;
}

// ---- The checkpoint and its reference values --------------------------------------------------

// A model small enough that a file is a few KiB, trained one step so the AdamW moments are not zero.
LlamaConfig fuzz_config() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 16;
  return c;
}

struct Reference {
  LlamaConfig cfg;
  std::vector<ParamSpec> specs;
  std::vector<float> params, m, v;
};

class CheckpointFuzz : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    install_crash_report();
    root_ = fs::path(testing::TempDir()) / ("llama4d_fuzz_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    ref_.cfg = fuzz_config();
    const TextDataset data = make_dataset(test::small_corpus(), 8);
    TrainOptions opt = test::tiny_options(3);
    opt.seq_len = 8;
    Llama<float> model(ref_.cfg);
    model.init_weights(opt.seed);
    Trainer<float> trainer(model, data, opt);
    trainer.step();
    trainer.save_checkpoint((root_ / "pristine").string());
    ref_.specs = model.param_specs();
    ref_.params.assign(model.params(), model.params() + model.num_params());
    ref_.m.assign(trainer.optimizer().exp_avg().begin(), trainer.optimizer().exp_avg().end());
    ref_.v.assign(trainer.optimizer().exp_avg_sq().begin(), trainer.optimizer().exp_avg_sq().end());
    // A sharded model-only checkpoint (HF layout: index + shards), as `eval` loads it.
    save_model((root_ / "sharded").string(), ref_.cfg, ref_.specs, ref_.params.data(), DType::f32,
               int64_t(2 * ref_.params.size()));  // shards of half the fp32 weights: two or three
    for (const auto& e : fs::directory_iterator(root_ / "sharded"))
      if (e.path().filename().string().rfind("model-00001-of-", 0) == 0) first_shard_ = e.path().filename().string();
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static json read_all_json(const fs::path& p) { return json::parse(read_all(p)); }

  // Maps a changed byte range of a safetensors file to the flat elements it touches, by tensor
  // name: "name" -> element index within the tensor, for float32 storage.
  static std::vector<std::pair<std::string, int64_t>> touched(const std::string& file, uint64_t b, uint64_t e) {
    std::vector<std::pair<std::string, int64_t>> out;
    const uint64_t n = header_length(file), data = 8 + n;
    const json header = json::parse(file.substr(8, n));
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const uint64_t tb = data + it.value()["data_offsets"][0].get<uint64_t>(),
                     te = data + it.value()["data_offsets"][1].get<uint64_t>();
      for (uint64_t at = std::max(b, tb); at < std::min(e, te); ++at) out.emplace_back(it.key(), int64_t((at - tb) / 4));
    }
    return out;
  }

  // Compares loaded values with the pristine ones; `allowed` are (name, element) pairs that may
  // differ. Returns a description of the first wrong value, or "".
  static std::string compare(const std::vector<float>& got, const std::vector<float>& want, const std::string& prefix,
                             const std::vector<std::pair<std::string, int64_t>>& allowed) {
    if (got.size() != want.size()) return prefix + "loaded " + std::to_string(got.size()) + " values, not " + std::to_string(want.size());
    for (const ParamSpec& s : ref_.specs)
      for (int64_t i = 0; i < s.numel; ++i) {
        const size_t k = size_t(s.offset + i);
        if (std::memcmp(&got[k], &want[k], sizeof(float)) == 0) continue;
        bool ok = false;
        for (const auto& [name, el] : allowed) ok = ok || (name == prefix + s.name && el == i);
        if (!ok) return "value " + prefix + s.name + "[" + std::to_string(i) + "] loaded wrong";
      }
    return "";
  }

  // A valid config can describe a model far larger than memory (2^31 layers): every command
  // refuses it with an InputError before allocating anything, unless --force
  // (check_fits_in_memory in cli/common.cpp; Cli.RealShapesAreNotAllocatedUnlessForced). The
  // library itself would only try to allocate, so the oracle stops here the same way.
  static void refuse_like_the_cli(const LlamaConfig& cfg) {
    if (cfg.num_parameters() > (int64_t(1) << 30))
      throw InputError("config of " + std::to_string(cfg.num_parameters()) + " parameters: needs --force");
  }

  static bool same_shape(const std::vector<ParamSpec>& specs) {
    if (specs.size() != ref_.specs.size()) return false;
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name != ref_.specs[i].name || specs[i].shape != ref_.specs[i].shape) return false;
    return true;
  }

  // A config of another shape must not read the pristine tensors: the first chunk that reaches a
  // tensor of another shape, or one that is absent, throws. Reaching the end is the failure.
  static std::string read_other_shape(const std::function<void(int64_t, int64_t, float*)>& read, int64_t n) {
    const int64_t chunk = int64_t(ref_.params.size());
    std::vector<float> buf(static_cast<size_t>(chunk));
    for (int64_t b = 0; b < n && b < 8 * chunk; b += chunk) read(b, std::min(n, b + chunk), buf.data());
    return "a config of another shape (" + std::to_string(n) + " parameters) read the pristine weights without an error";
  }

  // JSON leaves of `loaded` that `saved` also has must be equal: a value rounded or converted on
  // the way in is a misread, not a load.
  static std::string compare_json(const json& loaded, const json& saved, const std::string& at) {
    if (loaded.is_object() && saved.is_object()) {
      for (auto it = loaded.begin(); it != loaded.end(); ++it)
        if (saved.contains(it.key()))
          if (std::string bad = compare_json(it.value(), saved.at(it.key()), at + "." + it.key()); !bad.empty()) return bad;
      return "";
    }
    if (loaded != saved) return at + " = " + saved.dump() + " loaded as " + loaded.dump();
    return "";
  }

  // Loads `dir` as `train --resume` does and applies the oracle.
  static std::string resume_oracle(const fs::path& dir, const std::string& file, const Mutated& mut) {
    using Allowed = std::vector<std::pair<std::string, int64_t>>;
    const Allowed allowed = mut.data_end > mut.data_begin ? touched(mut.bytes, mut.data_begin, mut.data_end) : Allowed{};
    const LlamaConfig cfg = load_config(dir.string());
    refuse_like_the_cli(cfg);
    const std::vector<ParamSpec> specs = llama_param_specs(cfg);
    const TrainingCheckpointReader<float> reader(dir.string(), cfg, specs);
    const int64_t n = cfg.num_parameters();
    if (!same_shape(specs)) return read_other_shape([&](int64_t b, int64_t e, float* o) { reader.params(b, e, o); }, n);
    std::vector<float> p(static_cast<size_t>(n)), m(p.size()), v(p.size());
    reader.params(0, n, p.data());
    reader.exp_avg(0, n, m.data());
    reader.exp_avg_sq(0, n, v.data());
    std::string bad = compare(p, ref_.params, "", file == "model.safetensors" ? allowed : Allowed{});
    if (bad.empty()) bad = compare(m, ref_.m, "exp_avg.", file == "optimizer.safetensors" ? allowed : Allowed{});
    if (bad.empty()) bad = compare(v, ref_.v, "exp_avg_sq.", file == "optimizer.safetensors" ? allowed : Allowed{});
    if (!bad.empty()) return bad;
    // The run state is what the (possibly mutated) trainer_state.json says, read exactly.
    const json state = read_all_json(dir / kTrainerStateFile);
    if (json(reader.info().steps_done) != state.at("steps_done"))
      return "steps_done " + state.at("steps_done").dump() + " loaded as " + std::to_string(reader.info().steps_done);
    json loaded = reader.info().options.to_json();
    loaded.erase("micro_batch_size");  // written resolved (0 -> the batch), not as given
    return compare_json(loaded, state.at("options"), "options");
  }

  // Loads a model-only directory as `eval` does (config, then weights).
  static std::string eval_oracle(const fs::path& dir, const std::string&, const Mutated& mut) {
    using Allowed = std::vector<std::pair<std::string, int64_t>>;
    const LlamaConfig cfg = load_config(dir.string());
    refuse_like_the_cli(cfg);
    const std::vector<ParamSpec> specs = llama_param_specs(cfg);
    const int64_t n = cfg.num_parameters();
    if (!same_shape(specs))
      return read_other_shape([&](int64_t b, int64_t e, float* o) {
        const TensorStore store = TensorStore::open(dir.string());
        check_no_unexpected_tensors(store, specs);
        read_flat_range(store, specs, b, e, o);
      }, n);
    std::vector<float> p(static_cast<size_t>(n));
    load_model(dir.string(), specs, p.data());
    return compare(p, ref_.params, "", mut.data_end > mut.data_begin ? touched(mut.bytes, mut.data_begin, mut.data_end) : Allowed{});
  }

  // Mutates `file` of a copy of `source` kMutationsPerFile times; every outcome must satisfy
  // `oracle` or be an InputError.
  void fuzz(const std::string& source, const std::string& file,
            const std::function<std::string(const fs::path&, const std::string&, const Mutated&)>& oracle,
            const std::function<Mutated(const std::string&, std::mt19937_64&)>& mutate) {
    const fs::path dir = root_ / ("work_" + source);
    fs::remove_all(dir);
    fs::copy(root_ / source, dir);
    const std::string pristine = read_all(dir / file);
    std::mt19937_64 rng(kSeed ^ std::hash<std::string>{}(file));
    const auto start = std::chrono::steady_clock::now();
    int errors = 0, loads = 0, tried = 0;
    for (; tried < kMutationsPerFile; ++tried) {
      if (std::chrono::steady_clock::now() - start > kDeadline) break;
      const Mutated mut = mutate(pristine, rng);
      std::snprintf(g_current, sizeof g_current, "%s/%s #%d: %s", source.c_str(), file.c_str(), tried, mut.what.c_str());
      write_all(dir / file, mut.bytes);
      try {
        const std::string wrong = oracle(dir, file, mut);
        EXPECT_EQ(wrong, "") << g_current;
        ++loads;
      } catch (const InputError&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << g_current << ": not an InputError but " << typeid(e).name() << ": " << e.what();
      }
    }
    write_all(dir / file, pristine);
    EXPECT_GT(tried, kMutationsPerFile / 4) << "the deadline cut the run short";
    // Both outcomes occur: the mutations are neither all harmless nor all fatal.
    EXPECT_GT(errors, 0) << file;
    EXPECT_GT(loads, 0) << file;
    std::printf("%s/%s: %d mutations, %d refused with InputError, %d loaded correctly\n", source.c_str(), file.c_str(),
                tried, errors, loads);
  }

  static fs::path root_;
  static Reference ref_;
  static std::string first_shard_;
};

fs::path CheckpointFuzz::root_;
Reference CheckpointFuzz::ref_;
std::string CheckpointFuzz::first_shard_;

TEST_F(CheckpointFuzz, ModelSafetensors) {
  fuzz("pristine", "model.safetensors", resume_oracle, mutate_safetensors);
}

TEST_F(CheckpointFuzz, OptimizerSafetensors) {
  fuzz("pristine", "optimizer.safetensors", resume_oracle, mutate_safetensors);
}

TEST_F(CheckpointFuzz, ConfigJson) { fuzz("pristine", "config.json", resume_oracle, mutate_json_file); }

TEST_F(CheckpointFuzz, TrainerStateJson) { fuzz("pristine", kTrainerStateFile, resume_oracle, mutate_json_file); }

TEST_F(CheckpointFuzz, ShardedModelIndexAndShard) {
  fuzz("sharded", "model.safetensors.index.json", eval_oracle, mutate_json_file);
  ASSERT_FALSE(first_shard_.empty());
  fuzz("sharded", first_shard_, eval_oracle, mutate_safetensors);
}

}  // namespace
}  // namespace llama4d
