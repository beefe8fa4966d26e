// Backend-owned memory. On the CPU "device" memory is host memory, aligned to 64 bytes so a
// buffer starts on a cache line and every AVX-512 load of its first vector is aligned.
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

namespace {
constexpr int64_t kDeviceAlign = 64;
}  // namespace

void* device_alloc(int64_t bytes) {
  if (bytes < 0) throw InputError("device_alloc: negative size " + std::to_string(bytes));
  if (bytes == 0) return nullptr;
  if (bytes > INT64_MAX - kDeviceAlign)
    throw OutOfMemoryError("device_alloc: " + std::to_string(bytes) + " bytes is more than any host has");
  // std::aligned_alloc wants the size to be a multiple of the alignment.
  const int64_t rounded = (bytes + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
  void* p = std::aligned_alloc(kDeviceAlign, static_cast<size_t>(rounded));
  if (!p)
    throw OutOfMemoryError("device_alloc: the cpu backend could not allocate " + std::to_string(bytes) +
                           " bytes");
  return p;
}

void device_free(void* p) { std::free(p); }

void device_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) throw InputError("device_memcpy: negative size " + std::to_string(bytes));
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

}  // namespace llama4d::ops
