#pragma once
// Helpers for the I/O tests: a scratch directory per test, a byte-level safetensors builder
// that is independent of the writer under test, and exception-message checks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace llama4d::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("llama4d_io_" + std::to_string(long(::getpid())) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  // Names of entries directly inside, sorted.
  std::vector<std::string> list(const std::string& sub = "") const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(sub.empty() ? path_ : path_ / sub))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

// Runs fn and checks that it throws exactly E with every `parts` substring in its message.
template <class E>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file assembled by hand: 8-byte little-endian length, header text, data.
// `claimed_len` overrides the length field, to make the header lie.
inline std::string raw_safetensors(const std::string& header, const std::string& data,
                                   std::optional<uint64_t> claimed_len = std::nullopt) {
  uint64_t n = claimed_len ? *claimed_len : header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + header + data;
}

// Little-endian bytes of plain values.
template <class V>
std::string le_bytes(const std::vector<V>& values) {
  std::string s(values.size() * sizeof(V), '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

// Float -> bfloat16 bits, round to nearest, ties to even, written independently of dtype.h:
// pick the nearer of the two bf16 neighbours by comparing distances in double.
inline uint16_t reference_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  double dlo = std::abs(double(x) - double(flo)), dhi = std::abs(double(fhi) - double(x));
  if (dlo < dhi) return uint16_t(lo >> 16);
  if (dhi < dlo) return uint16_t(hi >> 16);
  return (lo >> 16) % 2 == 0 ? uint16_t(lo >> 16) : uint16_t(hi >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Deterministic pseudo-random values in (-1, 1) (a 64-bit LCG; no dependence on <random>).
inline std::vector<double> lcg_values(size_t n, uint64_t seed) {
  std::vector<double> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = double(int64_t(s >> 11) - (int64_t(1) << 52)) / double(int64_t(1) << 52);
  }
  return v;
}

}  // namespace llama4d::test
