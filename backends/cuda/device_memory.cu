// The CUDA backend's memory: managed (unified) memory, kept in a cache when freed.
//
// Why managed memory: the model, the optimizer and the strategies run the same code on every
// backend (core/ops.h), and some host code reads buffers directly: the equivalence harness
// comparing gradients, checkpoints, tests. Managed pages migrate to whichever side touches them,
// so that code stays correct on the GPU, and the hot loop (kernels reading what kernels wrote,
// and the virtual backend's collectives between ranks that share the GPU, collective_reduce.cu)
// keeps its pages on the device.
//
// Why a cache: cudaFree synchronises the whole device and cudaMallocManaged costs far more than
// a kernel launch, while a training step asks for the same sizes every time (PyTorch's CUDA
// caching allocator exists for the same reason). Freed blocks are kept by exact size and handed
// out again; device_release_cached returns them to the driver.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"

namespace llama4d::cuda {
namespace {

// cudaMallocManaged aligns to 256 bytes, past the 64 core/ops.h promises. Sizes are rounded up
// to this granule so blocks of nearly equal size serve each other.
constexpr int64_t kGranule = 512;

class BlockCache {
 public:
  void* take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    sizes_[p] = bytes;
    return p;
  }
  void track(void* p, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
  }
  void give_back(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) throw Error("device_free: the cuda backend did not allocate this pointer");
    free_[it->second].push_back(p);
    sizes_.erase(it);
  }
  std::vector<void*> drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*> all;
    for (auto& [bytes, blocks] : free_) all.insert(all.end(), blocks.begin(), blocks.end());
    free_.clear();
    return all;
  }

 private:
  std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;  // size -> freed blocks of that size
  std::map<void*, int64_t> sizes_;              // live block -> its rounded size
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache;  // never destroyed: buffers may outlive main
  return *c;
}

}  // namespace

void* device_alloc(int64_t bytes) {
  if (bytes < 0) throw InputError("device_alloc: negative size " + std::to_string(bytes));
  if (bytes == 0) return nullptr;
  if (bytes > INT64_MAX / 2)
    throw OutOfMemoryError("device_alloc: " + std::to_string(bytes) + " bytes is more than any GPU has");
  const int64_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
  if (void* p = cache().take(rounded)) return p;
  void* p = nullptr;
  cudaError_t e = cudaMallocManaged(&p, size_t(rounded));
  if (e == cudaErrorMemoryAllocation) {
    // The cached blocks may be what is missing: give them back and try once more.
    cudaGetLastError();
    device_release_cached();
    e = cudaMallocManaged(&p, size_t(rounded));
  }
  // A size past what the driver can map at all comes back as an invalid value, not as missing memory.
  if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) {
    cudaGetLastError();
    throw OutOfMemoryError("device_alloc: the cuda backend could not allocate " + std::to_string(bytes) +
                           " bytes (" + cudaGetErrorString(e) + ")");
  }
  check(e, "device_alloc (cudaMallocManaged)");
  cache().track(p, rounded);
  return p;
}

void device_free(void* p) {
  if (p) cache().give_back(p);
}

void device_release_cached() {
  for (void* p : cache().drain()) check(cudaFree(p), "device_release_cached (cudaFree)");
}

// cudaMemcpyDefault: the driver tells device, managed and host pointers apart (unified
// addressing), so tokens come in and checkpoints go out through the same call.
void device_memcpy(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) throw InputError("device_memcpy: negative size " + std::to_string(bytes));
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault, stream()), "device_memcpy");
  check(cudaStreamSynchronize(stream()), "device_memcpy");
}

}  // namespace llama4d::cuda
