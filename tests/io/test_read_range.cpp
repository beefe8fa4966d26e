// Range reads, what a ZeRO rank uses to load only its shard: every slice of one tensor, and of
// the flat buffer across tensors and shard files, must equal the same slice of a full read bit
// for bit, in every stored dtype. Expected values come from what the test wrote or from full
// reads, never from a range read.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/model/params.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::ScratchDir;

// Bit patterns, not values: memcmp also tells -0 from +0 and compares NaN payloads.
template <class T>
bool same_bits(const T* a, const T* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, size_t(n) * sizeof(T)) == 0;
}

// Random 16-bit patterns (NaNs, infinities and subnormals included) for F16 / BF16 storage.
std::vector<uint16_t> random_bits16(size_t n, uint64_t seed) {
  std::vector<double> v = test::lcg_values(n, seed);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = uint16_t(int64_t((v[i] + 1.0) * 32768.0) & 0xffff);
  return bits;
}

// ---- One tensor -------------------------------------------------------------------------------

// A hand-built file with one [7, 13] tensor per floating dtype, none at data offset 0 except the
// first, so a range read must add the tensor's own offset.
class RangeFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<double> d = test::lcg_values(kN, 1);
    f32_.assign(d.begin(), d.end());
    f64_ = test::lcg_values(kN, 2);
    bf16_ = random_bits16(kN, 3);
    f16_ = random_bits16(kN, 4);
    std::string data;
    json header = json::object();
    auto add = [&](const std::string& name, const char* dtype, const std::string& bytes) {
      header[name] = {{"dtype", dtype}, {"shape", kShape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
      data += bytes;
    };
    add("f32", "F32", test::le_bytes(f32_));
    add("f64", "F64", test::le_bytes(f64_));
    add("bf16", "BF16", test::le_bytes(bf16_));
    add("f16", "F16", test::le_bytes(f16_));
    std::vector<int32_t> ids = {1, 2, 3};
    header["ids"] = {{"dtype", "I32"}, {"shape", {3}}, {"data_offsets", {data.size(), data.size() + 12}}};
    data += test::le_bytes(ids);
    path_ = dir_ / "r.safetensors";
    test::write_bytes(path_, test::raw_safetensors(header.dump(), data));
  }

  // Every [b, e) with 0 <= b <= e <= numel against the full read; and nothing written past e - b.
  template <class T>
  void expect_every_range_matches(const SafetensorsFile& f, const std::string& name, const std::vector<T>& full) {
    const T sentinel = T(-7);
    std::vector<T> part(full.size() + 1);
    for (int64_t b = 0; b <= kN; ++b)
      for (int64_t e = b; e <= kN; ++e) {
        std::fill(part.begin(), part.begin() + (e - b) + 1, sentinel);
        f.read_range(name, kShape, b, e, part.data());
        ASSERT_TRUE(same_bits(part.data(), full.data() + b, e - b)) << name << " [" << b << ", " << e << ")";
        ASSERT_EQ(part[size_t(e - b)], sentinel) << name << " [" << b << ", " << e << ") wrote past its end";
      }
  }

  template <class T>
  void check_all_ranges() {
    SafetensorsFile f(path_);
    for (const char* name : {"f32", "f64", "bf16", "f16"}) {
      std::vector<T> full(kN);
      f.read(name, kShape, full.data());
      expect_every_range_matches(f, name, full);
    }
  }

  static constexpr int64_t kN = 7 * 13;
  const std::vector<int64_t> kShape = {7, 13};
  ScratchDir dir_;
  std::string path_;
  std::vector<float> f32_;
  std::vector<double> f64_;
  std::vector<uint16_t> bf16_, f16_;
};

TEST_F(RangeFile, FullReadsReturnWhatWasWritten) {
  // Anchors the full reads the range tests compare against to the bytes in the file.
  SafetensorsFile f(path_);
  std::vector<float> ff(kN);
  f.read("f32", kShape, ff.data());
  EXPECT_TRUE(same_bits(ff.data(), f32_.data(), kN));
  std::vector<double> dd(kN);
  f.read("f64", kShape, dd.data());
  EXPECT_TRUE(same_bits(dd.data(), f64_.data(), kN));
  f.read("bf16", kShape, ff.data());
  for (int64_t i = 0; i < kN; ++i) {
    const float want = test::bf16_bits_to_float(bf16_[size_t(i)]);
    ASSERT_TRUE(same_bits(&ff[size_t(i)], &want, 1)) << i;
  }
}

TEST_F(RangeFile, EveryRangeEqualsTheSliceOfAFullReadAsFloat) { check_all_ranges<float>(); }
TEST_F(RangeFile, EveryRangeEqualsTheSliceOfAFullReadAsDouble) { check_all_ranges<double>(); }

TEST_F(RangeFile, BadRangesAndRequestsAreNamed) {
  SafetensorsFile f(path_);
  std::vector<float> out(kN + 1, -7.0f);
  expect_error<InputError>([&] { f.read_range("bf16", kShape, -1, 3, out.data()); },
                           {path_, "'bf16'", "[-1, 3)", "91"});
  expect_error<InputError>([&] { f.read_range("bf16", kShape, 0, kN + 1, out.data()); }, {path_, "'bf16'", "[0, 92)"});
  expect_error<InputError>([&] { f.read_range("f16", kShape, kN + 1, kN + 1, out.data()); }, {path_, "'f16'"});
  expect_error<InputError>([&] { f.read_range("f32", kShape, 5, 4, out.data()); }, {path_, "'f32'", "[5, 4)"});
  expect_error<InputError>([&] { f.read_range("f32", {13, 7}, 0, 1, out.data()); },
                           {path_, "'f32'", "shape [7, 13]", "expected [13, 7]"});
  expect_error<InputError>([&] { f.read_range("nope", kShape, 0, 1, out.data()); }, {path_, "'nope'"});
  expect_error<InputError>([&] { f.read_range("ids", {3}, 0, 1, out.data()); }, {"'ids'", "I32", "floating"});
  for (float x : out) ASSERT_EQ(x, -7.0f) << "a rejected read writes nothing";
}

TEST(SafetensorsRange, ReadsOnlyTheRequestedBytes) {
  // Truncating the file under an open reader removes the bytes a range must not touch: reads
  // inside what is left still work, anything reaching past it fails.
  ScratchDir dir;
  const std::string p = dir / "t.safetensors";
  const std::vector<double> v = test::lcg_values(2000, 5);
  const std::vector<float> a(v.begin(), v.begin() + 1000), b(v.begin() + 1000, v.end());
  write_safetensors(p, {{"a", {1000}, DType::f32, a.data()}, {"b", {1000}, DType::f32, b.data()}});
  SafetensorsFile f(p);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 2000);  // drops b[500, 1000)
  std::vector<float> out(1000);
  f.read_range("b", {1000}, 100, 500, out.data());
  EXPECT_TRUE(same_bits(out.data(), b.data() + 100, 400));
  f.read_range("a", {1000}, 0, 1000, out.data());
  EXPECT_TRUE(same_bits(out.data(), a.data(), 1000));
  std::vector<double> outd(1000);
  f.read_range("b", {1000}, 499, 500, outd.data());
  EXPECT_EQ(outd[0], double(b[499]));
  expect_error<IoError>([&] { f.read_range("b", {1000}, 499, 501, out.data()); }, {p, "ended early"});
  expect_error<IoError>([&] { f.read("b", {1000}, out.data()); }, {p, "ended early"});
}

TEST(SafetensorsRange, RangesAcrossConversionChunks) {
  // Conversions stream through a 4 MiB buffer: 2^21 BF16 elements. Ranges that start mid-chunk,
  // end one past a chunk, or straddle the boundary must still match the full read.
  ScratchDir dir;
  const std::string p = dir / "big.safetensors";
  const int64_t n = (int64_t(1) << 21) + (int64_t(1) << 20) + 5, chunk = int64_t(1) << 21;
  const std::vector<double> v = test::lcg_values(size_t(n), 6);
  const std::vector<float> vf(v.begin(), v.end());
  write_safetensors(p, {{"w", {n}, DType::bf16, vf.data(), DType::f32}});
  SafetensorsFile f(p);
  std::vector<float> full(static_cast<size_t>(n));
  f.read("w", {n}, full.data());
  for (int64_t i = 0; i < n; i += 9973)
    ASSERT_EQ(full[size_t(i)], test::bf16_bits_to_float(test::reference_bf16_bits(vf[size_t(i)]))) << i;
  std::vector<float> part(static_cast<size_t>(n));
  const std::pair<int64_t, int64_t> ranges[] = {{0, n},         {1, n - 1},         {chunk - 3, chunk + 3},
                                                {7, chunk + 7}, {7, chunk + 8},     {chunk, n},
                                                {n - 1, n},     {n, n},             {chunk + 1, chunk + 1}};
  for (auto [b, e] : ranges) {
    f.read_range("w", {n}, b, e, part.data());
    ASSERT_TRUE(same_bits(part.data(), full.data() + b, e - b)) << "[" << b << ", " << e << ")";
  }
}

// ---- The flat buffer across tensors and shard files ---------------------------------------------

int64_t total_of(const std::vector<ParamSpec>& specs) { return specs.back().offset + specs.back().numel; }

// The whole flat buffer, read tensor by tensor with full reads.
template <class T>
std::vector<T> full_read(const TensorStore& store, const std::vector<ParamSpec>& specs,
                         const std::string& prefix = "") {
  std::vector<T> out(size_t(total_of(specs)), T(-7));
  for (const ParamSpec& s : specs) store.read(prefix + s.name, s.shape, out.data() + s.offset);
  return out;
}

// Range ends worth testing: both ends of the buffer, one before / at / after every tensor
// boundary, and the boundaries of ZeRO shards for a few world sizes (uneven ones included).
std::vector<int64_t> interesting_points(const std::vector<ParamSpec>& specs) {
  const int64_t total = total_of(specs);
  std::set<int64_t> pts = {0, total};
  for (const ParamSpec& s : specs)
    for (int64_t d : {-1, 0, 1})
      for (int64_t o : {s.offset, s.offset + s.numel})
        if (o + d >= 0 && o + d <= total) pts.insert(o + d);
  for (int64_t world : {3, 7, 16})
    for (int64_t r = 0; r <= world; ++r) pts.insert(total * r / world);
  return {pts.begin(), pts.end()};
}

// Every [b, e) between interesting points must equal full[b, e) and write nothing past it;
// and the ranges of a ZeRO partition must tile the buffer.
template <class T>
void expect_flat_ranges_match(const TensorStore& store, const std::vector<ParamSpec>& specs, const std::vector<T>& full,
                              const std::string& prefix = "") {
  const int64_t total = total_of(specs);
  ASSERT_EQ(int64_t(full.size()), total);
  const std::vector<int64_t> pts = interesting_points(specs);
  const T sentinel = T(-7);
  std::vector<T> part(size_t(total) + 1);
  for (size_t i = 0; i < pts.size(); ++i)
    for (size_t j = i; j < pts.size(); ++j) {
      const int64_t b = pts[i], e = pts[j];
      std::fill(part.begin(), part.begin() + (e - b) + 1, sentinel);
      read_flat_range(store, specs, b, e, part.data(), prefix);
      ASSERT_TRUE(same_bits(part.data(), full.data() + b, e - b)) << "[" << b << ", " << e << ")";
      ASSERT_EQ(part[size_t(e - b)], sentinel) << "[" << b << ", " << e << ") wrote past its end";
    }
  std::vector<T> tiled(size_t(total), sentinel);
  const int64_t world = 16;
  for (int64_t r = 0; r < world; ++r)
    read_flat_range(store, specs, total * r / world, total * (r + 1) / world, tiled.data() + total * r / world, prefix);
  EXPECT_TRUE(same_bits(tiled.data(), full.data(), total)) << "16 shards put together";
}

TEST(FlatRange, Fp32CheckpointEveryRangeMatches) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const std::vector<double> v = test::lcg_values(size_t(cfg.num_parameters()), 21);
  const std::vector<float> p(v.begin(), v.end());
  save_model(dir / "ck", cfg, specs, p.data(), DType::f32);
  const TensorStore store = TensorStore::open(dir / "ck");
  ASSERT_TRUE(same_bits(full_read<float>(store, specs).data(), p.data(), total_of(specs)));
  expect_flat_ranges_match(store, specs, p);
  expect_flat_ranges_match(store, specs, std::vector<double>(p.begin(), p.end()));
}

TEST(FlatRange, TiedModelIgnoresTheStoredLmHead) {
  // An untied checkpoint read into a tied model: lm_head.weight is in the store but no spec
  // names it, so full and range reads both skip it. (Loaders refuse such a store before reading:
  // check_no_unexpected_tensors, tested in test_checkpoint.cpp; this is the reading layer below.)
  ScratchDir dir;
  const LlamaConfig untied = LlamaConfig::preset("tiny");
  LlamaConfig tied = untied;
  tied.tie_word_embeddings = true;
  const std::vector<double> v = test::lcg_values(size_t(untied.num_parameters()), 22);
  const std::vector<float> p(v.begin(), v.end());
  save_model(dir / "ck", untied, llama_param_specs(untied), p.data());
  const std::vector<ParamSpec> specs = llama_param_specs(tied);
  const TensorStore store = TensorStore::open(dir / "ck");
  ASSERT_NE(store.find("lm_head.weight"), nullptr);
  const std::vector<float> want(p.begin(), p.begin() + total_of(specs));
  std::vector<float> back(want.size(), -7.0f);
  read_flat_tensors(store, specs, back.data());
  EXPECT_TRUE(same_bits(back.data(), want.data(), total_of(specs)));
  expect_flat_ranges_match(store, specs, want);
}

TEST(FlatRange, Bf16CheckpointEveryRangeMatches) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const std::vector<double> v = test::lcg_values(size_t(cfg.num_parameters()), 23);
  const std::vector<float> p(v.begin(), v.end());
  save_model(dir / "ck", cfg, specs, p.data(), DType::bf16);
  std::vector<float> want(p.size());
  for (size_t i = 0; i < p.size(); ++i) want[i] = test::bf16_bits_to_float(test::reference_bf16_bits(p[i]));
  const TensorStore store = TensorStore::open(dir / "ck");
  ASSERT_TRUE(same_bits(full_read<float>(store, specs).data(), want.data(), total_of(specs)));
  expect_flat_ranges_match(store, specs, want);
  expect_flat_ranges_match(store, specs, std::vector<double>(want.begin(), want.end()));
}

TEST(FlatRange, ShardedBf16CheckpointEveryRangeMatches) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const std::vector<double> v = test::lcg_values(size_t(cfg.num_parameters()), 24);
  const std::vector<float> p(v.begin(), v.end());
  save_model(dir / "ck", cfg, specs, p.data(), DType::bf16, /*max_shard_bytes=*/cfg.num_parameters() * 2 / 4);
  const json index = read_json_file(dir / "ck/model.safetensors.index.json");
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GE(files.size(), 4u) << "ranges must cross several shard files";

  std::vector<float> want(p.size());
  for (size_t i = 0; i < p.size(); ++i) want[i] = test::bf16_bits_to_float(test::reference_bf16_bits(p[i]));
  const TensorStore store = TensorStore::open(dir / "ck");
  ASSERT_TRUE(same_bits(full_read<float>(store, specs).data(), want.data(), total_of(specs)));
  expect_flat_ranges_match(store, specs, want);
  expect_flat_ranges_match(store, specs, std::vector<double>(want.begin(), want.end()));

  // TensorStore::read_range on a tensor in the last shard.
  const ParamSpec& down = find_param(specs, "model.layers.1.mlp.down_proj.weight");
  std::vector<float> part(100);
  store.read_range(down.name, down.shape, 1000, 1100, part.data());
  EXPECT_TRUE(same_bits(part.data(), want.data() + down.offset + 1000, 100));
  expect_error<InputError>([&] { store.read_range("lm_head.bias", {4}, 0, 1, part.data()); },
                           {"model.safetensors.index.json", "'lm_head.bias'"});
}

TEST(FlatRange, HandBuiltF16ShardsEveryRangeMatches) {
  // Three F16 shards (our writer does not store F16), a tied model, and an extra inv_freq buffer
  // in the middle shard that no spec names.
  ScratchDir dir;
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  cfg.tie_word_embeddings = true;
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  // Weights are finite (a checkpoint holding NaN or inf is refused): no all-ones exponent.
  std::vector<uint16_t> bits = random_bits16(size_t(cfg.num_parameters()), 25);
  for (uint16_t& b : bits)
    if ((b & 0x7c00) == 0x7c00) b = uint16_t(b & ~0x4000);
  json weight_map = json::object();
  const size_t per_shard = (specs.size() + 2) / 3;
  for (size_t shard = 0; shard < 3; ++shard) {
    const std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00003.safetensors";
    json header = json::object();
    std::string data;
    for (size_t s = shard * per_shard; s < std::min(specs.size(), (shard + 1) * per_shard); ++s) {
      const ParamSpec& sp = specs[s];
      const std::vector<uint16_t> slice(bits.begin() + sp.offset, bits.begin() + sp.offset + sp.numel);
      header[sp.name] = {
          {"dtype", "F16"}, {"shape", sp.shape}, {"data_offsets", {data.size(), data.size() + 2 * sp.numel}}};
      data += test::le_bytes(slice);
      weight_map[sp.name] = file;
    }
    if (shard == 1) {
      const std::vector<float> inv_freq(8, 0.5f);
      header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {
          {"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {data.size(), data.size() + 32}}};
      data += test::le_bytes(inv_freq);
      weight_map["model.layers.0.self_attn.rotary_emb.inv_freq"] = file;
    }
    test::write_bytes(dir / file, test::raw_safetensors(header.dump(), data));
  }
  test::write_bytes(dir / "model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());

  const TensorStore store = TensorStore::open(dir.str());
  const std::vector<float> full = full_read<float>(store, specs);
  std::vector<float> flat(full.size(), -7.0f);
  read_flat_tensors(store, specs, flat.data());
  ASSERT_TRUE(same_bits(flat.data(), full.data(), total_of(specs))) << "read_flat_tensors = tensor-by-tensor reads";
  expect_flat_ranges_match(store, specs, full);
  expect_flat_ranges_match(store, specs, full_read<double>(store, specs));
}

TEST(FlatRange, OptimizerPrefixSelectsTheTensors) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const std::vector<double> m = test::lcg_values(size_t(cfg.num_parameters()), 26),
                            v = test::lcg_values(size_t(cfg.num_parameters()), 27);
  std::vector<TensorToWrite> tensors = flat_tensors(specs, m.data(), DType::f64, "exp_avg.");
  const std::vector<TensorToWrite> second = flat_tensors(specs, v.data(), DType::f64, "exp_avg_sq.");
  tensors.insert(tensors.end(), second.begin(), second.end());
  std::filesystem::create_directories(dir / "ck");
  write_tensor_files(dir / "ck", "optimizer", tensors, {}, /*max_shard_bytes=*/cfg.num_parameters() * 8 / 3);
  const TensorStore store = TensorStore::open(dir / "ck", "optimizer");
  expect_flat_ranges_match(store, specs, v, "exp_avg_sq.");
  expect_flat_ranges_match(store, specs, m, "exp_avg.");
  std::vector<double> out(10);
  expect_error<InputError>([&] { read_flat_range(store, specs, 0, 10, out.data()); },
                           {"missing tensor 'model.embed_tokens.weight'"});
}

TEST(FlatRange, MissingOrMisshapenTensorsMatterOnlyInsideTheRange) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const int64_t total = total_of(specs);
  const std::vector<double> v = test::lcg_values(size_t(total), 28);
  const std::vector<float> p(v.begin(), v.end());
  const ParamSpec& gone = find_param(specs, "model.layers.1.mlp.up_proj.weight");
  const ParamSpec& bent = find_param(specs, "model.layers.0.self_attn.q_proj.weight");
  std::vector<TensorToWrite> tensors;
  for (TensorToWrite& t : flat_tensors(specs, p.data(), DType::f32)) {
    if (t.name == gone.name) continue;
    if (t.name == bent.name) t.shape = {bent.numel};  // same bytes, flattened
    tensors.push_back(t);
  }
  std::filesystem::create_directories(dir / "ck");
  write_tensor_files(dir / "ck", kModelBase, tensors, {}, /*max_shard_bytes=*/total * 4 / 3);
  const TensorStore store = TensorStore::open(dir / "ck");
  const std::string where = dir / "ck/model.safetensors.index.json";

  std::vector<float> out(size_t(total), -7.0f);
  auto expect_untouched = [&] {
    for (float x : out) ASSERT_EQ(x, -7.0f) << "a failed read writes nothing";
  };
  // Inside: a range ending one element into the tensor, one starting at its last element, one
  // spanning it, and the full read.
  expect_error<InputError>([&] { read_flat_range(store, specs, bent.offset + bent.numel, gone.offset + 1, out.data()); },
                           {where, "missing tensor '" + gone.name + "'"});
  expect_untouched();
  expect_error<InputError>(
      [&] { read_flat_range(store, specs, gone.offset + gone.numel - 1, gone.offset + gone.numel, out.data()); },
      {"'" + gone.name + "'"});
  expect_error<InputError>([&] { read_flat_tensors(store, specs, out.data()); }, {"'" + bent.name + "'"});
  expect_error<InputError>([&] { read_flat_range(store, specs, bent.offset + 5, bent.offset + 6, out.data()); },
                           {where, "'" + bent.name + "'", "has shape [4096]", "expected [64, 64]"});
  expect_untouched();

  // Outside (ranges touching the tensors' edges, and empty ranges inside them): read as written.
  const std::pair<int64_t, int64_t> fine[] = {{0, bent.offset},
                                              {bent.offset + bent.numel, gone.offset},
                                              {gone.offset + gone.numel, total},
                                              {gone.offset + 10, gone.offset + 10},
                                              {bent.offset, bent.offset}};
  for (auto [b, e] : fine) {
    read_flat_range(store, specs, b, e, out.data());
    ASSERT_TRUE(same_bits(out.data(), p.data() + b, e - b)) << "[" << b << ", " << e << ")";
  }
}

TEST(FlatRange, RangesOutsideTheBufferAreRejected) {
  ScratchDir dir;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const int64_t total = total_of(specs);
  const std::vector<double> v = test::lcg_values(size_t(total), 29);
  save_model(dir / "ck", cfg, specs, v.data(), DType::f64);
  const TensorStore store = TensorStore::open(dir / "ck");
  std::vector<double> out(size_t(total) + 2, -7.0);
  const std::string n = std::to_string(total);
  expect_error<InputError>([&] { read_flat_range(store, specs, -1, 10, out.data()); },
                           {dir / "ck/model.safetensors", "[-1, 10)", n});
  expect_error<InputError>([&] { read_flat_range(store, specs, 0, total + 1, out.data()); },
                           {"[0, " + std::to_string(total + 1) + ")", n});
  expect_error<InputError>([&] { read_flat_range(store, specs, total + 1, total + 1, out.data()); }, {n});
  expect_error<InputError>([&] { read_flat_range(store, specs, 20, 10, out.data()); }, {"[20, 10)"});
  for (double x : out) ASSERT_EQ(x, -7.0);
  read_flat_range(store, specs, total, total, out.data());  // empty at the end: fine
  read_flat_range(store, specs, 0, total, out.data());
  EXPECT_TRUE(same_bits(out.data(), v.data(), total));
}

}  // namespace
}  // namespace llama4d
