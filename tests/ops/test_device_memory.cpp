// The CPU backend's memory (backends/cpu/device_memory.cpp): aligned blocks that round-trip
// bytes, small ones from malloc and large ones from the mapped-block cache; and a block whose
// header was overwritten, or which is freed twice, stops the process with a message naming the
// problem instead of corrupting the heap.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d::test {
namespace {

// One below the mapped-block threshold (32 KiB, malloc) and one above it (the block cache).
constexpr int64_t kSmall = 1000, kLarge = int64_t(1) << 20;
// The backend's block header: the 64 bytes (one alignment unit) before each block.
constexpr size_t kHeaderBytes = 64;

TEST(DeviceMemory, AlignedRoundTripAndZeroSize) {
  for (int64_t bytes : {int64_t(1), int64_t(63), int64_t(64), kSmall, kLarge}) {
    void* a = ops::device_alloc(bytes);
    void* b = ops::device_alloc(bytes);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u) << bytes;
    std::vector<unsigned char> src(static_cast<size_t>(bytes)), back(src.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
    ops::device_memcpy(a, src.data(), bytes);  // host -> device
    ops::device_memcpy(b, a, bytes);           // device -> device
    ops::device_memcpy(back.data(), b, bytes);  // device -> host
    EXPECT_EQ(back, src);
    ops::device_free(a);
    ops::device_free(b);
  }
  EXPECT_EQ(ops::device_alloc(0), nullptr);
  ops::device_free(nullptr);
  ops::device_memcpy(nullptr, nullptr, 0);
  EXPECT_THROW(ops::device_alloc(-1), InputError);
  EXPECT_THROW(ops::device_alloc(std::numeric_limits<int64_t>::max()), OutOfMemoryError);
}

constexpr const char* kBadHeader = "device_free\\(.*\\): the block's header is not one device_alloc wrote";

class DeviceMemoryDeathTest : public ::testing::TestWithParam<int64_t> {
 protected:
  // The child runs this binary afresh, up to the statement, instead of forking a process
  // whose other threads (the backend's pool) may hold locks.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// An index of -1 into a buffer: the byte just before it changes.
TEST_P(DeviceMemoryDeathTest, AWriteJustBeforeTheBufferIsCaughtWhenFreed) {
  unsigned char* p = static_cast<unsigned char*>(ops::device_alloc(GetParam()));
  ASSERT_NE(p, nullptr);
  const unsigned char kept = p[-1];
  p[-1] = static_cast<unsigned char>(kept ^ 1);
  EXPECT_DEATH(ops::device_free(p), kBadHeader);
  p[-1] = kept;  // the child died; here the block is freed as it should be
  ops::device_free(p);
}

// The whole header gone to zeros, as a page of memory handed back zeroed would leave it.
TEST_P(DeviceMemoryDeathTest, AZeroedHeaderIsCaughtWhenFreed) {
  unsigned char* p = static_cast<unsigned char*>(ops::device_alloc(GetParam()));
  ASSERT_NE(p, nullptr);
  unsigned char kept[kHeaderBytes];
  std::memcpy(kept, p - kHeaderBytes, kHeaderBytes);
  std::memset(p - kHeaderBytes, 0, kHeaderBytes);
  EXPECT_DEATH(ops::device_free(p), kBadHeader);
  std::memcpy(p - kHeaderBytes, kept, kHeaderBytes);
  ops::device_free(p);
}

// A header copied from another live block (same size, so the same size field) does not pass.
TEST_P(DeviceMemoryDeathTest, AHeaderCopiedFromAnotherBlockIsCaughtWhenFreed) {
  unsigned char* a = static_cast<unsigned char*>(ops::device_alloc(GetParam()));
  unsigned char* b = static_cast<unsigned char*>(ops::device_alloc(GetParam()));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  unsigned char kept[kHeaderBytes];
  std::memcpy(kept, b - kHeaderBytes, kHeaderBytes);
  std::memcpy(b - kHeaderBytes, a - kHeaderBytes, kHeaderBytes);
  EXPECT_DEATH(ops::device_free(b), kBadHeader);
  std::memcpy(b - kHeaderBytes, kept, kHeaderBytes);
  ops::device_free(a);
  ops::device_free(b);
}

INSTANTIATE_TEST_SUITE_P(MallocAndMapped, DeviceMemoryDeathTest, ::testing::Values(kSmall, kLarge),
                         [](const auto& info) { return info.param == kSmall ? "malloc" : "mapped"; });

// A mapped block stays mapped in the cache after it is freed, so glibc cannot see a second
// free; the cleared seal does. (Under AddressSanitizer every block comes from malloc, and
// AddressSanitizer itself reports the second free as a use after free.)
#if !defined(__SANITIZE_ADDRESS__)
TEST(DeviceMemoryMappedDeathTest, ASecondFreeIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* p = ops::device_alloc(kLarge);
  ASSERT_NE(p, nullptr);
  EXPECT_DEATH(
      {
        ops::device_free(p);
        ops::device_free(p);
      },
      kBadHeader);
  ops::device_free(p);
}
#endif

}  // namespace
}  // namespace llama4d::test
