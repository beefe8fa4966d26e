// Laid-out tensor files filled range by range by several writers at once (what every rank of a
// sharded save does) must hold exactly the bytes one sequential writer produces.
#include <gtest/gtest.h>

#include <thread>

#include "core/io/atomic_dir.h"
#include "core/io/checkpoint.h"
#include "core/io/tensor_files.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using test::expect_error;
using test::read_bytes;
using test::ScratchDir;

template <class T>
std::vector<T> values(size_t n, uint64_t seed) {
  const std::vector<double> v = test::lcg_values(n, seed);
  return std::vector<T>(v.begin(), v.end());
}

// Cut points over [0, n) that fall inside tensors, on tensor edges, and twice on one spot (an
// empty range): writer w gets [cuts[w], cuts[w + 1]).
std::vector<int64_t> cuts_for(const std::vector<ParamSpec>& specs) {
  const int64_t n = flat_numel(specs);
  return {0, specs[1].offset + 3, specs[3].offset, specs[3].offset, n / 2 + 1, n - 5, n};
}

// Each writer is a thread with its own handle, writing its range back to front in pieces, so
// neither the order of writers nor of pieces matches the file order.
template <class T>
void write_concurrently(const std::string& dir, const TensorFilesLayout& layout, const std::vector<ParamSpec>& specs,
                        const std::vector<T>& flat, const std::vector<int64_t>& cuts) {
  std::vector<std::thread> writers;
  for (size_t w = 0; w + 1 < cuts.size(); ++w)
    writers.emplace_back([&, w] {
      TensorFilesWriter writer(dir, layout);
      int64_t end = cuts[w + 1];
      while (end > cuts[w]) {
        const int64_t begin = std::max(cuts[w], end - 1000);
        write_flat_range(writer, specs, begin, end, flat.data() + begin);
        end = begin;
      }
      writer.finish();
    });
  for (std::thread& t : writers) t.join();
}

template <class T>
void check_same_bytes_as_sequential_writer(DType storage) {
  ScratchDir dir;
  const std::vector<ParamSpec> specs = llama_param_specs(LlamaConfig::preset("tiny"));
  const std::vector<T> flat = values<T>(size_t(flat_numel(specs)), 7);
  write_safetensors(dir / "sequential.safetensors", flat_tensors(specs, flat.data(), storage), kModelMetadata);

  std::filesystem::create_directories(dir / "ranged");
  const TensorFilesLayout layout = tensor_files_layout("model", flat_tensors<T>(specs, nullptr, storage), kModelMetadata);
  ASSERT_EQ(layout.files.size(), 1u);
  create_tensor_files(dir / "ranged", layout);
  write_concurrently(dir / "ranged", layout, specs, flat, cuts_for(specs));
  const std::string a = read_bytes(dir / "sequential.safetensors"), b = read_bytes(dir / "ranged/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "ranged writes differ from one sequential write";
}

TEST(TensorFiles, ConcurrentRangesEqualOneSequentialWriteF32) { check_same_bytes_as_sequential_writer<float>(DType::f32); }
TEST(TensorFiles, ConcurrentRangesEqualOneSequentialWriteF64) { check_same_bytes_as_sequential_writer<double>(DType::f64); }
TEST(TensorFiles, ConcurrentRangesEqualOneSequentialWriteBf16) { check_same_bytes_as_sequential_writer<float>(DType::bf16); }

// The header is the one the format describes, written out by hand here: metadata first, then
// tensors in order with back-to-back offsets, padded with spaces to a multiple of 8 bytes.
TEST(TensorFiles, HeaderIsTheHandWrittenOne) {
  std::vector<TensorToWrite> t = {{"a", {2, 3}, DType::f32, nullptr, DType::f32},
                                  {"b", {5}, DType::bf16, nullptr, DType::f32}};
  const TensorFilesLayout layout = tensor_files_layout("m", t, {{"format", "pt"}});
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(layout.files.size(), 1u);
  EXPECT_EQ(layout.files[0].name, "m.safetensors");
  EXPECT_EQ(layout.files[0].layout.prefix, test::raw_safetensors(header, ""));
  EXPECT_EQ(layout.files[0].layout.file_bytes(), 8 + header.size() + 34);
  EXPECT_TRUE(layout.index.is_null());
}

// With a shard limit the files are HF shards plus an index, and ranged writes read back exactly.
TEST(TensorFiles, ShardedFilesReadBackAndIndexEveryTensor) {
  ScratchDir dir;
  const std::vector<ParamSpec> specs = llama_param_specs(LlamaConfig::preset("tiny"));
  const int64_t n = flat_numel(specs);
  const std::vector<double> flat = values<double>(size_t(n), 3);
  const TensorFilesLayout layout =
      tensor_files_layout("optimizer", flat_tensors<double>(specs, nullptr, DType::f64), {}, n * 8 / 3);
  ASSERT_GE(layout.files.size(), 3u);
  EXPECT_EQ(layout.files[0].name, "optimizer-00001-of-0000" + std::to_string(layout.files.size()) + ".safetensors");
  EXPECT_EQ(layout.index["metadata"]["total_size"].get<int64_t>(), n * 8);
  EXPECT_EQ(layout.index["weight_map"].size(), specs.size());
  create_tensor_files(dir.str(), layout);
  write_concurrently(dir.str(), layout, specs, flat, cuts_for(specs));

  std::vector<double> back(size_t(n), -7.0);
  read_flat_tensors(TensorStore::open(dir.str(), "optimizer"), specs, back.data());
  EXPECT_EQ(0, std::memcmp(back.data(), flat.data(), size_t(n) * sizeof(double)));
}

TEST(TensorFiles, BadWritesAreNamed) {
  ScratchDir dir;
  const std::vector<float> v(6, 1.0f);
  const TensorFilesLayout layout = tensor_files_layout("m", {{"a", {2, 3}, DType::f32, nullptr, DType::f32}});
  {
    TensorFilesWriter early(dir.str(), layout);  // before create_tensor_files: nothing to open
    expect_error<IoError>([&] { early.write("a", 0, 6, v.data(), DType::f32); }, {dir / "m.safetensors"});
  }
  create_tensor_files(dir.str(), layout);
  TensorFilesWriter w(dir.str(), layout);
  expect_error<InputError>([&] { w.write("b", 0, 1, v.data(), DType::f32); }, {"'b'", "no such tensor"});
  expect_error<InputError>([&] { w.write("a", 4, 7, v.data(), DType::f32); }, {"[4, 7)", "'a'", "has 6"});
  expect_error<InputError>([&] { w.write("a", 0, 1, nullptr, DType::f32); }, {"'a'", "no data"});
  std::vector<ParamSpec> specs = {{"a", {2, 3}, 0, 6}};
  expect_error<InputError>([&] { write_flat_range(w, specs, 2, 9, v.data()); }, {"[2, 9)", "of 6"});
}

// A staged directory that is never committed leaves nothing behind; committing moves it into
// place and replaces an older checkpoint.
TEST(StagedDirectory, UncommittedIsRemovedCommittedReplaces) {
  ScratchDir dir;
  const std::string target = dir / "ck";
  std::string staging;
  {
    StagedDirectory staged(target, "config.json");
    staging = staged.staging();
    test::write_bytes(staging + "/config.json", "{}");
  }
  EXPECT_FALSE(std::filesystem::exists(staging));
  EXPECT_FALSE(std::filesystem::exists(target));
  for (const std::string text : {"{\"v\": 1}", "{\"v\": 2}"}) {
    StagedDirectory staged(target, "config.json");
    test::write_bytes(staged.staging() + "/config.json", text);
    staged.commit();
    EXPECT_EQ(read_bytes(target + "/config.json"), text);
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"ck"}) << "no staging or old directory left behind";
}

}  // namespace
}  // namespace llama4d
