// Files that could mean two things or never end: special files (FIFOs, devices, symlink loops)
// refused by name before they are read, JSON with a key twice or a NUL byte, non-finite weights,
// and a fuzz test of the safetensors header (duplicate keys, NUL, overlapping and stray ranges)
// against an independent reading of what a valid file is.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/model/config.h"
#include "core/regular_file.h"
#include "core/strict_json.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using test::expect_error;
using test::raw_safetensors;
using test::ScratchDir;
using test::write_bytes;

const char* kTinyConfig = R"({"vocab_size": 264, "hidden_size": 64, "intermediate_size": 176,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5})";

TEST(UntrustedFiles, FifoDeviceAndSymlinkLoopAreRefusedByName) {
  ScratchDir dir;
  const std::string fifo = dir / "config.json", loop = dir / "loop.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(symlink(loop.c_str(), loop.c_str()), 0);  // resolves to itself
  // No writer ever opens the FIFO: a blocking open() would hang the test here.
  expect_error<InputError>([&] { LlamaConfig::from_file(fifo); }, {fifo, "FIFO"});
  expect_error<InputError>([&] { LlamaConfig::from_file("/dev/zero"); }, {"/dev/zero", "character device"});
  expect_error<InputError>([&] { LlamaConfig::from_file(loop); }, {loop, "symlink loop"});
  expect_error<InputError>([&] { LlamaConfig::from_file(dir.str()); }, {dir.str(), "directory"});
  expect_error<InputError>([&] { SafetensorsFile f(fifo); }, {fifo, "FIFO"});
  expect_error<InputError>([&] { SafetensorsFile f("/dev/zero"); }, {"/dev/zero", "character device"});
  expect_error<InputError>([&] { SafetensorsFile f(loop); }, {loop, "symlink loop"});
  expect_error<InputError>([&] { read_json_file(fifo); }, {fifo, "FIFO"});
}

TEST(UntrustedFiles, AFifoShardOrIndexIsRefused) {
  ScratchDir dir;
  write_bytes(dir / "config.json", kTinyConfig);
  ASSERT_EQ(mkfifo((dir / "model.safetensors.index.json").c_str(), 0600), 0);
  expect_error<InputError>([&] { TensorStore::open(dir.str()); }, {"model.safetensors.index.json", "FIFO"});
  ASSERT_EQ(unlink((dir / "model.safetensors.index.json").c_str()), 0);
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "a.safetensors"}})");
  ASSERT_EQ(mkfifo((dir / "a.safetensors").c_str(), 0600), 0);
  expect_error<InputError>([&] { TensorStore::open(dir.str()); }, {"a.safetensors", "FIFO"});
}

TEST(UntrustedFiles, JsonBeyondTheLimitIsRefused) {
  ScratchDir dir;
  const std::string big = dir / "big.json";
  write_bytes(big, "[" + std::string(kMaxJsonFileBytes, ' ') + "]");
  expect_error<InputError>([&] { read_json_file(big); }, {big, "larger than"});
}

TEST(UntrustedFiles, JsonThatMeansTwoThingsIsRefused) {
  expect_error<InputError>([] { parse_strict_json(R"({"a": 1, "b": {"c": 1, "c": 2}})", "x"); },
                           {"x", "key 'c' appears twice"});
  EXPECT_NO_THROW(parse_strict_json(R"({"a": {"c": 1}, "b": {"c": 2}, "l": [{"c": 1}, {"c": 2}]})", "x"))
      << "the same key in two objects is fine";
  expect_error<InputError>([] { parse_strict_json(std::string("{\"a\": 1}\0garbage", 16), "x"); },
                           {"x", "NUL byte at byte 8"});
  expect_error<InputError>([] { parse_strict_json(R"({"a\u0000b": 1})", "x"); }, {"x", "a\\u0000b", "NUL"});
  expect_error<InputError>([] { parse_strict_json(R"({"f": "a.safetensors\u0000.txt"})", "x"); }, {"x", "NUL"});
}

TEST(UntrustedFiles, ConfigWithADuplicateKeyOrPartialRotaryIsRefused) {
  ScratchDir dir;
  const std::string p = dir / "config.json";
  std::string twice = kTinyConfig;
  twice.insert(1, R"("num_hidden_layers": 4, )");
  write_bytes(p, twice);
  expect_error<InputError>([&] { LlamaConfig::from_file(p); }, {p, "num_hidden_layers", "twice"});

  nlohmann::json j = nlohmann::json::parse(kTinyConfig);
  j["partial_rotary_factor"] = 0.5;
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"partial_rotary_factor", "0.5"});
  j["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(LlamaConfig::from_json(j));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}, {"partial_rotary_factor", 0.25}};
  expect_error<InputError>([&] { LlamaConfig::from_json(j); }, {"rope_parameters.partial_rotary_factor", "0.25"});
}

TEST(UntrustedFiles, SafetensorsWithADuplicateKeyOrNulIsRefused) {
  ScratchDir dir;
  const std::string p = dir / "t.safetensors";
  const std::string data(16, '\0');
  write_bytes(p, raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("t":{"dtype":"F16","shape":[4],"data_offsets":[8,16]}})",
                                 data));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "key 't' appears twice"});
  write_bytes(p, raw_safetensors(std::string(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") +
                                     std::string("\0\0\0\0", 4),
                                 data));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "NUL byte"});
  write_bytes(p, raw_safetensors(R"({"t\u0000x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data));
  expect_error<InputError>([&] { SafetensorsFile f(p); }, {p, "NUL"});
}

TEST(UntrustedFiles, NonFiniteWeightsAreRefusedNamingTheTensor) {
  ScratchDir dir;
  ParamSpec spec;
  spec.name = "model.norm.weight", spec.shape = {4}, spec.numel = 4;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> w = {1, 2, bad, 4};
    write_safetensors(dir / "model.safetensors", {{"model.norm.weight", {4}, DType::f32, w.data(), DType::f32}});
    const TensorStore store = TensorStore::open(dir.str());
    std::vector<double> out(4);
    expect_error<InputError>([&] { read_flat_tensors(store, {spec}, out.data()); },
                             {"model.norm.weight", std::isnan(bad) ? "NaN" : "inf", "element 2"});
    expect_error<InputError>([&] { read_flat_range(store, {spec}, 1, 3, out.data()); }, {"element 2"});
    EXPECT_NO_THROW(read_flat_range(store, {spec}, 3, 4, out.data())) << "the finite part reads";
  }
}

// ---- Fuzz: random headers built from valid, duplicated, overlapping, stray and NUL pieces ------

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

int64_t element_size(const std::string& dtype) { return dtype == "F64" ? 8 : dtype == "F32" ? 4 : 2; }

// What the reader must decide, worked out from the pieces: accept exactly when names are
// distinct and free of NUL, every range matches its shape, and the ranges tile [0, data).
bool should_accept(const std::vector<Entry>& entries, uint64_t data, bool nul_byte) {
  if (nul_byte) return false;
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const Entry& e : entries) {
    if (!names.insert(e.name).second || e.name.find('\0') != std::string::npos) return false;
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    if (e.end < e.begin || e.end - e.begin != uint64_t(n * element_size(e.dtype))) return false;
    ranges.push_back({e.begin, e.end});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    if (b != at) return false;
    at = e;
  }
  return at == data;
}

std::string header_text(const std::vector<Entry>& entries) {
  std::string h = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    // The name through nlohmann so that a NUL is written as \u0000.
    h += (i ? "," : "") + nlohmann::json(e.name).dump() + ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  return h + "}";
}

TEST(UntrustedFiles, FuzzedSafetensorsHeaders) {
  ScratchDir dir;
  const std::string p = dir / "f.safetensors";
  std::mt19937_64 rng(5);
  const char* dtypes[] = {"F32", "F16", "BF16", "F64"};
  int accepted = 0, refused = 0;
  for (int c = 0; c < 600; ++c) {
    std::vector<Entry> entries;
    uint64_t at = 0;
    const size_t n = 1 + rng() % 4;
    for (size_t i = 0; i < n; ++i) {
      Entry e{"t" + std::to_string(i), dtypes[rng() % 4], {int64_t(1 + rng() % 3), int64_t(1 + rng() % 3)}};
      const uint64_t bytes = uint64_t(e.shape[0] * e.shape[1] * element_size(e.dtype));
      e.begin = at, e.end = at + bytes, at += bytes;
      entries.push_back(e);
    }
    uint64_t data = at;
    bool nul_byte = false;
    switch (rng() % 7) {
      case 0: entries.push_back(entries[rng() % entries.size()]); break;  // a key twice
      case 1: entries[rng() % entries.size()].name += std::string(1, '\0') + "x"; break;
      case 2: nul_byte = true; break;
      case 3: {  // a range shifted over its neighbour
        Entry& e = entries[rng() % entries.size()];
        const uint64_t shift = 1 + rng() % 4;
        if (e.begin >= shift) e.begin -= shift, e.end -= shift;
        break;
      }
      case 4: data += 1 + rng() % 8; break;                     // bytes no tensor owns
      case 5: entries[rng() % entries.size()].end += 2; break;  // a range longer than its shape
      default: break;                                           // valid
    }
    std::string header = header_text(entries);
    if (nul_byte) header.insert(header.size() / 2 + rng() % (header.size() / 2), 1, '\0');
    write_bytes(p, raw_safetensors(header, std::string(data, '\x01')));
    const bool want = should_accept(entries, data, nul_byte);
    try {
      SafetensorsFile f(p);
      ASSERT_TRUE(want) << "accepted: " << header;
      ASSERT_EQ(f.tensors().size(), entries.size());
      ++accepted;
    } catch (const InputError& e) {
      ASSERT_FALSE(want) << "refused a valid file: " << e.what() << "\n" << header;
      ASSERT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(accepted, 40);  // both outcomes are exercised, many times
  EXPECT_GT(refused, 200);
}

}  // namespace
}  // namespace llama4d
