// Fills, copies, axpy, the chunked sums of squares, the loss sum, bf16 rounding and conversion, and
// the finiteness check.
// Compiled with --fmad=false (CMakeLists.txt), as the CPU's vector_ops.cpp is with
// -ffp-contract=off: a*b+c is rounded twice, never fused, so add_scaled and the sums of squares
// give the CPU backend's bits and core/optim's sharded norm reproduces them.
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/tensor/bf16_rounding.h"
#include "core/tensor/dtype.h"

namespace llama4d::cuda {
namespace {

template <class T>
__global__ void round_to_bf16_kernel(T* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) x[i] = nearest_bf16(x[i]);
}

// The bf16 nearest x (rounded in T, then its float's top half, which is exact), and back.
template <class T>
__global__ void to_bf16_kernel(bf16* out, const T* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride())
    out[i].bits = uint16_t(__float_as_uint(static_cast<float>(nearest_bf16(x[i]))) >> 16);
}

template <class T>
__global__ void from_bf16_kernel(T* y, const bf16* x, int64_t n, bool accumulate) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const T v = static_cast<T>(__uint_as_float(uint32_t(x[i].bits) << 16));
    y[i] = accumulate ? y[i] + v : v;
  }
}

template <class T>
__global__ void fill_kernel(T* x, T value, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) x[i] = value;
}

template <class T>
__global__ void add_scaled_kernel(T* y, const T* x, T a, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) y[i] += a * x[i];
}

// In the order ops.h fixes: element i of a chunk goes to accumulator i % 8, and the eight are
// added accumulator 0 first, all in double. Eight threads per chunk, thread j holding accumulator
// j, so a group reads eight adjacent elements at a time (one thread per chunk walking 512 of them
// alone made 14 calls 4.5 ms of the 124M step on an H200, about 110 GB/s); thread 0 of the group
// then adds the eight in order.
constexpr int kSquareLanes = 8;
template <class T>
__global__ void sum_squares_kernel(double* partials, const T* x, int64_t n, int64_t chunk, int64_t chunks) {
  const int lane = int(threadIdx.x) % kSquareLanes;
  // The group's eight lanes of its warp: every group member runs the same iterations.
  const unsigned group = 0xffu << (int(threadIdx.x) % 32 / kSquareLanes * kSquareLanes);
  const int64_t first = first_index() / kSquareLanes, stride = index_stride() / kSquareLanes;
  for (int64_t k = first; k < chunks; k += stride) {
    const int64_t begin = k * chunk, end = begin + chunk < n ? begin + chunk : n;
    double acc = 0.0;
    for (int64_t i = begin + lane; i < end; i += kSquareLanes) {
      const double v = static_cast<double>(x[i]);
      acc += v * v;
    }
    double s = 0.0;
    for (int j = 0; j < kSquareLanes; ++j) s += __shfl_sync(group, acc, j, kSquareLanes);
    if (lane == 0) partials[k] = s;
  }
}

// Sets *bad when an element is NaN or infinite. Threads that find one all store the same 1: an
// integer flag, not a floating-point reduction, so the outcome does not depend on their order.
template <class T>
__global__ void finite_kernel(int* bad, const T* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride())
    if (!isfinite(x[i])) *bad = 1;
}

// A small device buffer for one op's results, freed in stream order.
template <class T>
class Scratch {
 public:
  explicit Scratch(int64_t n) { check(cudaMallocAsync(&p_, size_t(n) * sizeof(T), stream()), "scratch allocation"); }
  ~Scratch() { cudaFreeAsync(p_, stream()); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

}  // namespace

template <class T>
void fill(T* x, T value, int64_t N) {
  if (N <= 0) return;
  fill_kernel<<<grid_for(N), kThreads, 0, stream()>>>(x, value, N);
  finish_op("fill");
}

template <class T>
void copy(T* dst, const T* src, int64_t N) {
  if (N <= 0) return;
  check(cudaMemcpyAsync(dst, src, size_t(N) * sizeof(T), cudaMemcpyDefault, stream()), "copy");
  // Both wait when ops wait; queued, a copy touching host memory still must (ops.h), so only
  // then is it worth asking the driver where the pointers live.
  if (queue_only() && (is_host_memory(dst) || is_host_memory(src)))
    finish_op_for_host("copy");
  else
    finish_op("copy");
}

template <class T>
void add_scaled(T* y, const T* x, T a, int64_t N) {
  if (N <= 0) return;
  add_scaled_kernel<<<grid_for(N), kThreads, 0, stream()>>>(y, x, a, N);
  finish_op("add_scaled");
}

// partials is host memory (ops.h): the chunk sums are computed on the device and copied back.
template <class T>
void sum_squares_chunks(double* partials, const T* x, int64_t N, int64_t chunk) {
  if (chunk <= 0) throw InputError("sum_squares_chunks: chunk must be > 0, got " + std::to_string(chunk));
  const int64_t chunks = (N + chunk - 1) / chunk;
  if (chunks == 0) return;
  Scratch<double> device_partials(chunks);
  sum_squares_kernel<<<grid_for(chunks * kSquareLanes, 128), 128, 0, stream()>>>(device_partials.get(), x, N, chunk,
                                                                                   chunks);
  check(cudaMemcpyAsync(partials, device_partials.get(), size_t(chunks) * sizeof(double), cudaMemcpyDefault, stream()),
        "sum_squares_chunks");
  finish_op_for_host("sum_squares_chunks");
}

// loss_sum and count are host memory, and ops.h fixes the row order of the sum: the BT losses
// and targets (a few thousand values) come to the host and are added there, in row order.
template <class T>
void sum_losses(double* loss_sum, int64_t* count, const T* losses, const int32_t* targets, int64_t BT) {
  std::vector<T> l(size_t(std::max<int64_t>(BT, 0)));
  std::vector<int32_t> t(l.size());
  if (BT > 0) {
    check(cudaMemcpyAsync(l.data(), losses, l.size() * sizeof(T), cudaMemcpyDefault, stream()), "sum_losses");
    check(cudaMemcpyAsync(t.data(), targets, t.size() * sizeof(int32_t), cudaMemcpyDefault, stream()), "sum_losses");
    finish_op_for_host("sum_losses");
  }
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (t[i] >= 0) {
      sum += static_cast<double>(l[i]);
      ++n;
    }
  *loss_sum = sum;
  *count = n;
}

template <class T>
void round_to_bf16(T* x, int64_t N) {
  if (N <= 0) return;
  round_to_bf16_kernel<<<grid_for(N), kThreads, 0, stream()>>>(x, N);
  finish_op("round_to_bf16");
}

template <class T>
void to_bf16(bf16* out, const T* x, int64_t N) {
  if (N <= 0) return;
  to_bf16_kernel<<<grid_for(N), kThreads, 0, stream()>>>(out, x, N);
  finish_op("to_bf16");
}

template <class T>
void from_bf16(T* y, const bf16* x, int64_t N, bool accumulate) {
  if (N <= 0) return;
  from_bf16_kernel<<<grid_for(N), kThreads, 0, stream()>>>(y, x, N, accumulate);
  finish_op("from_bf16");
}

template <class T>
bool all_finite(const T* x, int64_t N) {
  if (N <= 0) return true;
  Scratch<int> bad(1);
  check(cudaMemsetAsync(bad.get(), 0, sizeof(int), stream()), "all_finite");
  finite_kernel<<<grid_for(N), kThreads, 0, stream()>>>(bad.get(), x, N);
  int host_bad = 0;
  check(cudaMemcpyAsync(&host_bad, bad.get(), sizeof(int), cudaMemcpyDefault, stream()), "all_finite");
  finish_op_for_host("all_finite");
  return host_bad == 0;
}

#define LLAMA4D_INSTANTIATE(T)                                                               \
  template void fill<T>(T*, T, int64_t);                                                     \
  template void copy<T>(T*, const T*, int64_t);                                              \
  template void add_scaled<T>(T*, const T*, T, int64_t);                                     \
  template void sum_squares_chunks<T>(double*, const T*, int64_t, int64_t);                  \
  template void sum_losses<T>(double*, int64_t*, const T*, const int32_t*, int64_t);         \
  template void round_to_bf16<T>(T*, int64_t);                                               \
  template void to_bf16<T>(bf16*, const T*, int64_t);                                        \
  template void from_bf16<T>(T*, const bf16*, int64_t, bool);                                \
  template bool all_finite<T>(const T*, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
