// safetensors: the writer's bytes checked by an independent parser in the test, conversions
// against hand-computed bit patterns, and a crafted file for every way a header can lie.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/convert.h"
#include "core/io/safetensors.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::raw_safetensors;
using test::ScratchDir;
using test::write_bytes;

TEST(Safetensors, WriterBytesFollowTheFormat) {
  ScratchDir dir;
  const std::string path = dir / "a.safetensors";
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  std::vector<double> b = {0.1, -0.2};
  write_safetensors(path,
                    {{"a", {2, 3}, DType::f32, a.data(), DType::f32}, {"b", {2}, DType::f64, b.data(), DType::f64}},
                    {{"format", "pt"}});

  // Parse the bytes by hand.
  std::string bytes = test::read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section starts 8-byte aligned";
  json h = json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"], json({{"format", "pt"}}));
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], json({2, 3}));
  EXPECT_EQ(h["a"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "F64");
  EXPECT_EQ(h["b"]["data_offsets"], json({24, 40}));
  EXPECT_EQ(bytes.size(), 8 + n + 40);
  EXPECT_EQ(bytes.substr(8 + n, 24), test::le_bytes(a));
  EXPECT_EQ(bytes.substr(8 + n + 24, 16), test::le_bytes(b));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.safetensors"}) << "no temporary file left";
}

TEST(Safetensors, RoundTripF32F64Exact) {
  ScratchDir dir;
  std::vector<double> src = test::lcg_values(1000, 7);
  std::vector<float> srcf(src.begin(), src.end());
  write_safetensors(dir / "x.safetensors", {{"d", {10, 100}, DType::f64, src.data(), DType::f64},
                                            {"f", {1000}, DType::f32, srcf.data(), DType::f32},
                                            {"d_as_f", {1000}, DType::f32, src.data(), DType::f64},
                                            {"empty", {0, 4}, DType::f32, nullptr, DType::f32}});
  SafetensorsFile f(dir / "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 4u);
  std::vector<double> d(1000);
  f.read("d", {10, 100}, d.data());
  EXPECT_EQ(d, src);
  std::vector<float> ff(1000);
  f.read("f", {1000}, ff.data());
  EXPECT_EQ(ff, srcf);
  f.read("d_as_f", {1000}, ff.data());
  EXPECT_EQ(ff, srcf) << "double stored as F32 = float(double)";
  f.read("f", {1000}, d.data());
  for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i], double(srcf[i]));
  EXPECT_EQ(f.info("empty").numel, 0);
  float dummy = 0;
  f.read("empty", {0, 4}, &dummy);
}

TEST(Safetensors, Bf16StorageRoundsToNearestEven) {
  ScratchDir dir;
  // 1 + 2^-8 is halfway between bf16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): ties go to even 0x3F80.
  // 1 + 3*2^-8 is halfway between 0x3F81 and 0x3F82: goes to even 0x3F82.
  std::vector<float> v = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.0f, 0.15625f, 1.0f + 0x1p-7f + 0x1p-12f};
  std::vector<uint16_t> want = {0x3F80, 0x3F80, 0x3F82, 0xC000, 0x3E20, 0x3F81};
  write_safetensors(dir / "b.safetensors", {{"v", {6}, DType::bf16, v.data(), DType::f32}});
  SafetensorsFile f(dir / "b.safetensors");
  EXPECT_EQ(f.info("v").dtype, DType::bf16);
  std::vector<uint16_t> raw(6);
  f.read_raw("v", DType::bf16, {6}, raw.data());
  EXPECT_EQ(raw, want);
  std::vector<float> back(6);
  f.read("v", {6}, back.data());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(back[i], test::bf16_bits_to_float(want[i]));

  // Many random values: bits equal an independent round-to-nearest-even.
  std::vector<double> r = test::lcg_values(5000, 3);
  std::vector<float> rf(r.begin(), r.end());
  write_safetensors(dir / "r.safetensors", {{"r", {5000}, DType::bf16, rf.data(), DType::f32}});
  std::vector<uint16_t> rb(5000);
  SafetensorsFile(dir / "r.safetensors").read_raw("r", DType::bf16, {5000}, rb.data());
  for (size_t i = 0; i < rb.size(); ++i) ASSERT_EQ(rb[i], test::reference_bf16_bits(rf[i])) << rf[i];
}

TEST(Safetensors, ReadsF16AndBf16FromHandWrittenBytes) {
  ScratchDir dir;
  // IEEE half: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), 0x3555 = 1365/4096 * ... , -0.
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3555, 0x8000};
  std::vector<double> want = {1.0, -2.0, 65504.0, 0x1p-24, 0x1.554p-2, -0.0};
  std::vector<uint16_t> b = {0x3F80, 0x4049};  // 1.0, 3.140625
  std::string header = R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                       R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]}})";
  write_bytes(dir / "h.safetensors", raw_safetensors(header, test::le_bytes(h) + test::le_bytes(b)));
  SafetensorsFile f(dir / "h.safetensors");
  std::vector<double> out(6);
  f.read("h", {2, 3}, out.data());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i], want[i]) << i;
  EXPECT_TRUE(std::signbit(out[5]));
  std::vector<float> bo(2);
  f.read("b", {2}, bo.data());
  EXPECT_EQ(bo[0], 1.0f);
  EXPECT_EQ(bo[1], 3.140625f);
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, MetadataAndUnsortedOffsetsAreAccepted) {
  ScratchDir dir;
  // Tensors listed out of offset order, padded header, metadata: all legal.
  std::vector<float> x = {1, 2, 3, 4};
  std::string header = R"({"__metadata__":{"format":"pt","step":"12"},)"
                       R"("late":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                       R"("early":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}   )";
  write_bytes(dir / "m.safetensors", raw_safetensors(header, test::le_bytes(x)));
  SafetensorsFile f(dir / "m.safetensors");
  EXPECT_EQ(f.metadata().at("step"), "12");
  std::vector<float> late(2), early(2);
  f.read("late", {2}, late.data());
  f.read("early", {1, 2}, early.data());
  EXPECT_EQ(late, (std::vector<float>{3, 4}));
  EXPECT_EQ(early, (std::vector<float>{1, 2}));
  EXPECT_EQ(f.tensors()[0].name, "early") << "listed in data order";
}

// Each lying header must fail at open with an InputError naming the file and the problem.
TEST(Safetensors, LyingHeadersAreRejected) {
  ScratchDir dir;
  const std::string p = dir / "bad.safetensors";
  const std::string data16(16, '\0');
  auto expect_bad = [&](const std::string& file_bytes, std::initializer_list<std::string> parts) {
    write_bytes(p, file_bytes);
    std::vector<std::string> all(parts);
    all.push_back(p);
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << "opened a bad file; expected: " << *parts.begin();
    } catch (const InputError& e) {
      for (const std::string& s : all) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  };
  const std::string ok = R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";

  expect_bad(raw_safetensors(ok, data16, 1 << 20), {"header length 1048576", "past the end"});
  expect_bad(raw_safetensors(ok, data16, ~uint64_t(0)), {"past the end"});  // 2^64 - 1
  expect_bad(std::string("\x05\x00\x00", 3), {"too small"});
  expect_bad(raw_safetensors("{\"t\": [1, 2", data16), {"not valid JSON"});
  expect_bad(raw_safetensors("[1, 2]", data16), {"not a JSON object"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(12, '\0')),
             {"'t'", "outside the data section"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data16),
             {"'t'", "outside the data section"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", data16),
             {"'t'", "unknown dtype 'F33'"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", data16),
             {"'t'", "shape [5]", "20 bytes", "span 16"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", data16),
             {"'t'", "8 bytes", "span 16"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data16),
             {"'t'", "non-negative"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data16),
             {"'t'", "end before they begin"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", data16),
             {"'t'", "data_offsets"});
  expect_bad(raw_safetensors(R"({"t":{"shape":[4],"data_offsets":[0,16]}})", data16), {"'t'", "dtype"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","data_offsets":[0,16]}})", data16), {"'t'", "shape"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})",
                             data16),
             {"'t'", "too many"});
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                             data16),
             {"'a'", "'b'", "overlap"});
  expect_bad(raw_safetensors(R"({"__metadata__":{"step":12}})", ""), {"__metadata__"});
  // The tensors must tile the data section: a gap, trailing bytes, a missing head.
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                             data16),
             {"4 bytes before tensor 'b'", "tile"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", data16),
             {"end at byte 12 of a 16-byte data section"});
  expect_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", data16),
             {"4 bytes before tensor 't'"});
}

// A header that understates its own length by 4 (its space padding absorbs the lie, so the JSON
// still parses) would shift every tensor one float early: the data section then has 4 bytes no
// tensor claims, and the file is refused instead of read one element off.
TEST(Safetensors, HeaderThatLiesAboutItsLengthIsRefused) {
  ScratchDir dir;
  const std::vector<float> v = {1, 2, 3, 4};
  const std::string header = R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})" + std::string(8, ' ');
  test::write_bytes(dir / "honest.safetensors", raw_safetensors(header, test::le_bytes(v)));
  std::vector<float> back(4);
  SafetensorsFile(dir / "honest.safetensors").read("t", {4}, back.data());
  EXPECT_EQ(back, v);
  test::write_bytes(dir / "liar.safetensors", raw_safetensors(header, test::le_bytes(v), header.size() - 4));
  expect_error<InputError>([&] { SafetensorsFile f(dir / "liar.safetensors"); },
                           {"liar.safetensors", "tensors end at byte 16 of a 20-byte data section"});
}

TEST(Safetensors, ReadChecksNameShapeAndDtype) {
  ScratchDir dir;
  const std::string p = dir / "x.safetensors";
  std::vector<float> v(6, 1.0f);
  std::vector<int32_t> ids = {1, 2, 3};
  write_safetensors(p, {{"w", {2, 3}, DType::f32, v.data(), DType::f32}, {"ids", {3}, DType::i32, ids.data(), DType::i32}});
  SafetensorsFile f(p);
  std::vector<float> out(6);
  expect_error<InputError>([&] { f.read("missing", {2, 3}, out.data()); }, {p, "'missing'"});
  expect_error<InputError>([&] { f.read("w", {3, 2}, out.data()); }, {p, "'w'", "shape [2, 3]", "expected [3, 2]"});
  expect_error<InputError>([&] { f.read("ids", {3}, out.data()); }, {"'ids'", "I32", "floating"});
  expect_error<InputError>([&] { f.read_raw("w", DType::bf16, {2, 3}, out.data()); }, {"'w'", "F32", "expected BF16"});
  std::vector<int32_t> ids_back(3);
  f.read_raw("ids", DType::i32, {3}, ids_back.data());
  EXPECT_EQ(ids_back, ids);
  expect_error<InputError>([&] { SafetensorsFile g(dir / "none.safetensors"); }, {dir / "none.safetensors"});
}

TEST(Safetensors, WriterRejectsBadRequests) {
  ScratchDir dir;
  std::vector<float> v(4);
  const std::string p = dir / "w.safetensors";
  expect_error<InputError>(
      [&] { write_safetensors(p, {{"a", {4}, DType::f32, v.data()}, {"a", {4}, DType::f32, v.data()}}); },
      {"'a'", "twice"});
  expect_error<InputError>([&] { write_safetensors(p, {{"a", {4}, DType::f16, v.data(), DType::f32}}); },
                           {"'a'", "F16"});
  expect_error<InputError>([&] { write_safetensors(p, {{"__metadata__", {4}, DType::f32, v.data()}}); },
                           {"__metadata__"});
  EXPECT_TRUE(dir.list().empty()) << "nothing written for rejected requests";
}

TEST(Safetensors, UnwritableDestinationFailsCleanly) {
  ScratchDir dir;
  // Root ignores permission bits, so make the "directory" a regular file: no one can create
  // entries under it.
  write_bytes(dir / "blocker", "x");
  const std::string p = dir / "blocker/w.safetensors";
  std::vector<float> v(4, 1.0f);
  expect_error<IoError>([&] { write_safetensors(p, {{"a", {4}, DType::f32, v.data()}}); }, {p});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"blocker"});
}

TEST(Safetensors, RewriteReplacesAtomically) {
  ScratchDir dir;
  const std::string p = dir / "w.safetensors";
  std::vector<float> one(4, 1.0f), two(8, 2.0f);
  write_safetensors(p, {{"a", {4}, DType::f32, one.data()}});
  write_safetensors(p, {{"b", {8}, DType::f32, two.data()}});
  SafetensorsFile f(p);
  EXPECT_EQ(f.find("a"), nullptr);
  std::vector<float> back(8);
  f.read("b", {8}, back.data());
  EXPECT_EQ(back, two);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.safetensors"});
}

TEST(Convert, F64ToBf16GoesThroughF32LikePyTorch) {
  // 1 + 2^-8 + 2^-30 rounds to float 1 + 2^-8 (a bf16 tie), which then goes to even 1.0.
  double x = 1.0 + 0x1p-8 + 0x1p-30;
  uint16_t out;
  convert_elements(&out, DType::bf16, &x, DType::f64, 1);
  EXPECT_EQ(out, 0x3F80);
  EXPECT_FALSE(can_convert(DType::f16, DType::f32));
  EXPECT_FALSE(can_convert(DType::f32, DType::i32));
  EXPECT_TRUE(can_convert(DType::i32, DType::i32));
  expect_error<InputError>([&] { convert_elements(&out, DType::f32, &x, DType::i64, 1); }, {"I64", "F32"});
}

}  // namespace
}  // namespace llama4d
