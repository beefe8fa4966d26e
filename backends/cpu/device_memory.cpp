// Backend-owned memory. On the CPU "device" memory is host memory, aligned to 64 bytes so a
// buffer starts on a cache line and every AVX-512 load of its first vector is aligned.
//
// Large blocks (>= kMapThreshold) are mapped from the kernel and kept in a cache when freed,
// the way GPU frameworks' caching allocators keep device memory (PyTorch's CUDA caching
// allocator): the same shapes come back every step, so a freed block is handed out again
// without a system call or page faults. Why not malloc: with many virtual GPUs (threads) glibc
// serves each thread from its own arena and keeps what a thread freed for that thread, so the
// process ends up holding the sum of every rank's peaks plus fragmentation (measured: 16 ranks
// of `small` under ZeRO-3 held 1.8x one device's resident memory, with 1.3x live). Here freed
// blocks are shared by all ranks, and cached + live large bytes stay within the peak of live
// ones plus 1/16: resident memory follows what the virtual GPUs really allocate.
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <string>

#include "backends/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::cpu {

namespace {

constexpr int64_t kDeviceAlign = 64;
#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer every block comes from malloc, so a read of a freed buffer is caught
// instead of landing in a cached block.
constexpr bool kUseMappedBlocks = false;
#else
constexpr bool kUseMappedBlocks = true;
#endif
// Below this, malloc (its arenas are fast for small blocks and waste little).
constexpr int64_t kMapThreshold = int64_t(32) << 10;
// Mapped sizes are rounded to this, so blocks of nearly equal size serve each other.
constexpr int64_t kMapGranule = int64_t(4) << 10;

// Every block starts with this header (one alignment unit), so device_free knows its origin.
// The seal sits last, next to the caller's bytes, so a write just before a buffer (an index of
// -1) or a header that changed underneath the process is caught in device_free with a message,
// instead of glibc's "free(): invalid pointer" or a munmap of the wrong size. device_free
// clears it, so a second free of the same block, before it is handed out again, is caught too.
struct alignas(kDeviceAlign) Header {
  int64_t mapped_bytes;  // 0: from malloc; else the size of the mapping (header included)
  char unused[kDeviceAlign - 2 * sizeof(int64_t)];
  uint64_t seal;  // seal_of(this, mapped_bytes) while the block is allocated
};
static_assert(sizeof(Header) == kDeviceAlign);
static_assert(offsetof(Header, seal) == kDeviceAlign - sizeof(uint64_t));

// Depends on the address too, so a header copied from another block does not pass; never 0.
// (The address and the size are multiples of 64, the constant is odd.)
uint64_t seal_of(const Header* h, int64_t mapped_bytes) {
  constexpr uint64_t kLlama4d1 = 0x6C6C616D61346431ull;  // "llama4d1" in ASCII
  return uint64_t(reinterpret_cast<uintptr_t>(h)) ^ uint64_t(mapped_bytes) ^ kLlama4d1;
}

class MappedBlockCache {
 public:
  void* allocate(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->bytes == bytes) {
          void* p = it->base;
          free_.erase(it);
          cached_ -= bytes;
          live_ += bytes;
          peak_live_ = std::max(peak_live_, live_);
          return p;
        }
      // A miss maps new memory: first give back cached blocks (oldest first) so that cached +
      // live stays within the peak of live bytes plus 1/16 (or what is now needed). The slack
      // matters: with none, ranks whose peaks interleave evicted the very blocks they were
      // about to reuse, and page faults cost ZeRO-2/3 on 4 virtual GPUs a quarter of their
      // speed (4,150 vs 5,600 tokens/s measured on `small`); 1/16 keeps resident memory at
      // 1.42x one device for 16 ranks under ZeRO-3 (tests/parallel/process_rss.py).
      const int64_t limit = std::max(peak_live_ + peak_live_ / 16, live_ + bytes);
      while (!free_.empty() && cached_ + live_ + bytes > limit) {
        munmap(free_.front().base, size_t(free_.front().bytes));
        cached_ -= free_.front().bytes;
        free_.pop_front();
      }
      live_ += bytes;
      peak_live_ = std::max(peak_live_, live_);
    }
    void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(mu_);
      live_ -= bytes;
      return nullptr;
    }
    return p;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Block& b : free_) munmap(b.base, size_t(b.bytes));
    free_.clear();
    cached_ = 0;
  }

  void release(void* base, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ -= bytes;
    cached_ += bytes;
    free_.push_back({base, bytes});
  }

 private:
  struct Block {
    void* base;
    int64_t bytes;
  };
  std::mutex mu_;
  std::list<Block> free_;  // oldest first
  int64_t live_ = 0, cached_ = 0, peak_live_ = 0;
};

MappedBlockCache& mapped_blocks() {
  static MappedBlockCache* cache = new MappedBlockCache;  // never destroyed: buffers may outlive main
  return *cache;
}

}  // namespace

void* device_alloc(int64_t bytes) {
  if (bytes < 0) throw InputError("device_alloc: negative size " + std::to_string(bytes));
  if (bytes == 0) return nullptr;
  if (bytes > INT64_MAX / 2)
    throw OutOfMemoryError("device_alloc: " + std::to_string(bytes) + " bytes is more than any host has");
  // Header + data, a multiple of the alignment (std::aligned_alloc requires it).
  const int64_t total = (bytes + int64_t(sizeof(Header)) + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
  void* base = nullptr;
  int64_t mapped = 0;
  if (kUseMappedBlocks && total >= kMapThreshold) {
    mapped = (total + kMapGranule - 1) / kMapGranule * kMapGranule;
    base = mapped_blocks().allocate(mapped);
  } else {
    base = std::aligned_alloc(kDeviceAlign, static_cast<size_t>(total));
  }
  if (!base)
    throw OutOfMemoryError("device_alloc: the cpu backend could not allocate " + std::to_string(bytes) + " bytes");
  Header* header = static_cast<Header*>(base);
  header->mapped_bytes = mapped;
  header->seal = seal_of(header, mapped);
  return static_cast<char*>(base) + sizeof(Header);
}

void device_free(void* p) {
  if (!p) return;
  void* base = static_cast<char*>(p) - sizeof(Header);
  Header* header = static_cast<Header*>(base);
  const int64_t mapped = header->mapped_bytes;
  if (header->seal != seal_of(header, mapped)) {
    // Freeing with this header would corrupt the heap or unmap the wrong range, and device_free
    // runs in destructors, where an exception cannot travel: stop here, saying what was found.
    std::fprintf(stderr,
                 "llama4d: device_free(%p): the block's header is not one device_alloc wrote (size "
                 "field %lld): the block was freed twice, something wrote just before it, or the "
                 "memory changed underneath the process\n",
                 p, static_cast<long long>(mapped));
    std::abort();
  }
  header->seal = 0;
  if (mapped > 0)
    mapped_blocks().release(base, mapped);
  else
    std::free(base);
}

void device_release_cached() { mapped_blocks().release_cached(); }

void device_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) throw InputError("device_memcpy: negative size " + std::to_string(bytes));
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

}  // namespace llama4d::cpu
