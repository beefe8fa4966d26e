#pragma once
// What the CUDA backend's kernel files share: errors, the stream an op runs on, launch sizes and
// block-wide reductions in a fixed order.
//
// Streams and completion. Every op launches on cudaStreamPerThread: each virtual GPU is one
// thread of the process, so ranks sharing a GPU queue their kernels on streams of their own.
// By default every op waits for its kernels before it returns (finish_op), and the memory is
// managed (device_memory.cu), so host code that reads a buffer after an op (the harness, a
// checkpoint) sees its result, exactly as on the CPU backend, and so do the other ranks' streams,
// which read it in the virtual backend's collectives. The price is one stream synchronization per
// op. A thread that only touches backend memory through ops may drop that wait (QueueOnly, or
// ops::QueuedOps through the backend table): its ops then run in stream order and it waits once,
// at the end. Ops whose result the host reads as they return (host outputs, a copy to or from
// host memory, collective_reduce, cross-entropy's target check) wait whatever the setting
// (finish_op_for_host), and so do copies from host memory (document ids).
//
// Determinism. No floating-point atomics: every output element is written by one thread that
// sums in a fixed order, or by one block through block_reduce's fixed tree. The grid size
// never changes which thread adds what, so a run repeats bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace llama4d::cuda {

// Throws Error("<what>: <CUDA's message>") unless e is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline cudaStream_t stream() { return cudaStreamPerThread; }

// Whether this process's GPU has bf16 tensor cores (compute capability 8.0 or later, where the
// kernels of gemm_bf16.cu and attention_bf16.cu are built); older GPUs run bf16 operands on CUDA
// cores. One GPU per process, so asked once.
inline bool has_bf16_tensor_cores() {
  static const bool has = [] {
    int device = 0, major = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
    return major >= 8;
  }();
  return has;
}

// Kernels of WMMA's bf16 steps compile for sm_80 and later only: their bodies are wrapped in
// #if LLAMA4D_BF16_TENSOR_CORES ... #else __trap(); #endif, and the dispatch never launches them
// on an older GPU (has_bf16_tensor_cores), so a build for several architectures still works.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define LLAMA4D_BF16_TENSOR_CORES 1
#else
#define LLAMA4D_BF16_TENSOR_CORES 0
#endif

// Whether ops on this thread return once their kernels are queued instead of waiting for them
// (QueueOnly below).
inline bool& queue_only() {
  static thread_local bool on = false;
  return on;
}

// Checks that the op's launches were accepted, then waits for them (see the header comment),
// unless a QueueOnly guard lives on this thread.
inline void finish_op(const char* op) {
  check(cudaGetLastError(), op);
  if (!queue_only()) check(cudaStreamSynchronize(stream()), op);
}

// The end of an op whose result the host reads as soon as it returns: waits for its kernels
// whatever QueueOnly says.
inline void finish_op_for_host(const char* op) {
  check(cudaGetLastError(), op);
  check(cudaStreamSynchronize(stream()), op);
}

// What the driver knows of p: device, managed, pinned host or (unregistered) pageable host memory.
inline cudaPointerAttributes pointer_attributes(const void* p, const char* what) {
  cudaPointerAttributes a{};
  check(cudaPointerGetAttributes(&a, p), what);
  return a;
}

// Whether p is host memory (pageable or pinned) rather than device or managed memory: a copy to or
// from it must be over before the op returns, since the host may read or reuse it at once.
inline bool is_host_memory(const void* p) {
  const cudaMemoryType type = pointer_attributes(p, "cudaPointerGetAttributes").type;
  return type == cudaMemoryTypeUnregistered || type == cudaMemoryTypeHost;
}

// While it lives, this thread's ops return as soon as their kernels are queued: a timing with
// CUDA events around back-to-back ops then measures the GPU, not the host's wake-up after each
// wait (the peak GEMM probe; cuBLAS's reference is timed the same way). Only for ops whose
// results no host code reads before the stream is synchronized.
class QueueOnly {
 public:
  QueueOnly() : previous_(queue_only()) { queue_only() = true; }
  ~QueueOnly() { queue_only() = previous_; }
  QueueOnly(const QueueOnly&) = delete;
  QueueOnly& operator=(const QueueOnly&) = delete;

 private:
  bool previous_;
};

// A tally of calls by the unit they ran on (cuda_kernels.h's UnitCalls), kept by gemm.cu and
// attention.cu: atomic, since virtual GPUs are threads of one process.
struct UnitCallCounters {
  std::atomic<int64_t> tensor_cores{0}, cuda_cores{0}, library{0};
};

// Device scratch of n elements, allocated and freed in stream order (freed even when the op
// throws after allocating).
template <class E>
class StreamScratch {
 public:
  StreamScratch(int64_t n, const char* what) {
    if (n > 0) check(cudaMallocAsync(reinterpret_cast<void**>(&p_), size_t(n) * sizeof(E), stream()), what);
  }
  ~StreamScratch() {
    if (p_ != nullptr) cudaFreeAsync(p_, stream());  // nothing to do about an error here
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  E* get() const { return p_; }

 private:
  E* p_ = nullptr;
};

// Threads per block of the element-wise kernels and of the one-block-per-row reductions (a
// power of two: block_reduce halves it).
inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill an H100 (132 SMs x 2048
// threads) several times over, never more than the elements need.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t wanted = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(wanted, 1, 4096));
}

// Blocks for a one-block-per-row kernel that loops over rows with stride gridDim.x, so any row
// count fits (at least one block, so a launch is always valid).
inline unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535)); }

// Index and stride of a grid-stride loop: for (i = first_index(); i < n; i += index_stride()).
__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t index_stride() { return int64_t(gridDim.x) * blockDim.x; }

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// Reduces v over the block's threads (blockDim.x a power of two, at most 1024) in a fixed tree:
// at each level thread i combines i and i + s, s = blockDim.x / 2 down to 1. Every thread gets
// the result. `scratch` holds blockDim.x values; the call ends with the block synchronised, so
// the same scratch can serve the next reduction.
template <class T, class Op>
__device__ T block_reduce(T v, T* scratch, Op op) {
  const unsigned t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s) scratch[t] = op(scratch[t], scratch[t + s]);
    __syncthreads();
  }
  const T result = scratch[0];
  __syncthreads();
  return result;
}

// Shared memory for block_reduce of type T in a kernel templated on T (extern __shared__ arrays
// of different types would clash): one aligned byte array viewed as T.
template <class T>
__device__ T* shared_scratch() {
  extern __shared__ __align__(sizeof(double)) unsigned char shared_bytes[];
  return reinterpret_cast<T*>(shared_bytes);
}

}  // namespace llama4d::cuda
