// The linear layer's three products on the GPU, with a GEMM of our own (--kernels exact, the
// default) or cuBLASLt (--kernels fast, lt_gemm.cu: shape-dependent order, given up for speed),
// and the peak-rate probe, which times whichever the mode picks.
//
// Why not cuBLAS: the equivalence harness needs every element of a product summed in an order
// that depends on nothing but K. A tensor-parallel rank computes a slice of the columns, a
// data-parallel rank a slice of the rows, and the replay must reproduce their bits; cuBLAS
// picks its kernel (tile shape, split-K) from the whole shape, so a slice may be summed in
// another order than the full product. This GEMM sums each element exactly as the CPU backend
// documents for its own (backends/cpu/gemm.h): K in blocks of kGemmDepthBlock = 256, each block
// accumulated from zero with one fused multiply-add per k, k ascending, then added to the
// element. Its forward and input-gradient products are therefore bitwise the CPU backend's
// wherever the CPU build fuses (every x86-64 with FMA); the weight gradient is summed over the
// tokens without the CPU's depth chunks (which exist to give CPU threads work, gemm_tiling.h),
// so it agrees to rounding. The products of bf16 mixed precision (GemmOperands::bf16) run on
// the tensor cores instead, with their own fixed order (gemm_bf16.cu); cuBLAS's choice of kernel
// by shape would break the same slicing argument there.
//
// The kernel: 64 x 64 output tiles, 256 threads each computing 4 x 4 elements from K slices of
// 16 staged in shared memory (a slice never straddles a 256-block: 256 = 16 x 16).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gemm.cuh"
#include "backends/cuda/lt_gemm.cuh"
#include "backends/cuda/lt_gemm_plan.h"
#include "core/gemm_timing.h"
#include "core/tensor/bf16_rounding.h"

namespace llama4d::cuda {
namespace {

UnitCallCounters gemm_calls;

constexpr int kTile = 64, kSlice = 16, kPerThread = 4;
constexpr int kGemmThreads = (kTile / kPerThread) * (kTile / kPerThread);  // 256
constexpr int64_t kDepthBlock = cpu::kGemmDepthBlock;
static_assert(kDepthBlock % kSlice == 0, "a K slice must not straddle a depth block");

__device__ inline float fused(float a, float b, float c) { return fmaf(a, b, c); }
__device__ inline double fused(double a, double b, double c) { return fma(a, b, c); }

// out[M, N] (row-major) = or += A[M, K] * B[K, N].
template <class T>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(T* out, Operands<T> x, int64_t M, int64_t N, int64_t K,
                                                            bool accumulate) {
  // [k][row] and [k][col], a column of padding so that writes along k hit distinct banks.
  __shared__ T a_tile[kSlice][kTile + 1];
  __shared__ T b_tile[kSlice][kTile + 1];
  const int tr = threadIdx.x / (kTile / kPerThread), tc = threadIdx.x % (kTile / kPerThread);
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;

  // total: the element so far (its old value when accumulating); acc: the current 256-block.
  T total[kPerThread][kPerThread], acc[kPerThread][kPerThread];
  bool started = accumulate;
  for (int r = 0; r < kPerThread; ++r)
    for (int c = 0; c < kPerThread; ++c) {
      const int64_t i = row0 + tr * kPerThread + r, j = col0 + tc * kPerThread + c;
      total[r][c] = accumulate && i < M && j < N ? out[i * N + j] : T(0);
      acc[r][c] = T(0);
    }

  for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
    const int kc = int(K - k0 < kSlice ? K - k0 : kSlice);
    // Neighbouring threads read neighbouring addresses: along k where an operand is contiguous
    // in k, else along its rows (columns).
    for (int e = threadIdx.x; e < kSlice * kTile; e += kGemmThreads) {
      int kk = x.a_depth == 1 ? e % kSlice : e / kTile, ii = x.a_depth == 1 ? e / kSlice : e % kTile;
      const int64_t i = row0 + ii;
      a_tile[kk][ii] = i < M && kk < kc ? x.a[i * x.a_rows + (k0 + kk) * x.a_depth] : T(0);
      kk = x.b_depth == 1 ? e % kSlice : e / kTile, ii = x.b_depth == 1 ? e / kSlice : e % kTile;
      const int64_t j = col0 + ii;
      b_tile[kk][ii] = j < N && kk < kc ? x.b[(k0 + kk) * x.b_depth + j * x.b_cols] : T(0);
    }
    __syncthreads();
    for (int kk = 0; kk < kc; ++kk) {  // exactly the K present: no padded step touches a sum
      T av[kPerThread], bv[kPerThread];
      for (int r = 0; r < kPerThread; ++r) av[r] = a_tile[kk][tr * kPerThread + r];
      for (int c = 0; c < kPerThread; ++c) bv[c] = b_tile[kk][tc * kPerThread + c];
      for (int r = 0; r < kPerThread; ++r)
        for (int c = 0; c < kPerThread; ++c) acc[r][c] = fused(av[r], bv[c], acc[r][c]);
    }
    __syncthreads();
    const int64_t next = k0 + kc;
    if (next % kDepthBlock == 0 || next == K) {  // a 256-block is complete: add it to the element
      for (int r = 0; r < kPerThread; ++r)
        for (int c = 0; c < kPerThread; ++c) {
          total[r][c] = started ? total[r][c] + acc[r][c] : acc[r][c];
          acc[r][c] = T(0);
        }
      started = true;
    }
  }
  for (int r = 0; r < kPerThread; ++r)
    for (int c = 0; c < kPerThread; ++c) {
      const int64_t i = row0 + tr * kPerThread + r, j = col0 + tc * kPerThread + c;
      if (i < M && j < N) out[i * N + j] = total[r][c];
    }
}

// bf16 operands of fp32 products go to the tensor cores (where the GPU has bf16 ones); f64 has no
// bf16 mode (the model refuses it) and reads them as stored. split_depth (the weight gradient)
// asks for the tensor-core GEMM's depth chunks; the CUDA-core kernel sums K whole (see the header).
template <class T>
void gemm(T* out, const Operands<T>& x, int64_t M, int64_t N, int64_t K, bool accumulate, bool split_depth,
          GemmOperands operands, const char* op) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: zeros, or the element unchanged
    if (!accumulate) check(cudaMemsetAsync(out, 0, size_t(M * N) * sizeof(T), stream()), op);
    finish_op(op);
    return;
  }
  if (kernel_mode() == ops::KernelMode::fast) {
    ++gemm_calls.library;
    lt_gemm<T>(out, x, M, N, K, accumulate, operands == GemmOperands::bf16);
    finish_op(op);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (operands == GemmOperands::bf16 && has_bf16_tensor_cores()) {
      ++gemm_calls.tensor_cores;
      launch_gemm_bf16(out, x, M, N, K, accumulate, split_depth);
      finish_op(op);
      return;
    }
  }
  ++gemm_calls.cuda_cores;
  const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
  if (grid.y > 65535) throw InputError(std::string(op) + ": more than 4 million rows in one product");
  gemm_kernel<T><<<grid, kGemmThreads, 0, stream()>>>(out, x, M, N, K, accumulate);
  finish_op(op);
}

}  // namespace

UnitCalls gemm_unit_calls() {
  return {gemm_calls.tensor_cores.load(), gemm_calls.cuda_cores.load(), gemm_calls.library.load()};
}

// The operands of the linear layer's three products, strided as lt_gemm_plan.h's layouts say
// (one definition for both kernels).
template <class T>
Operands<T> operands_of(const T* left, const T* right, const ProductLayout& l) {
  return {left, l.a_rows, l.a_depth, right, l.b_depth, l.b_cols};
}

// out[BT, OC] = inp[BT, C] @ weight[OC, C]^T
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC, GemmOperands operands) {
  gemm<T>(out, operands_of(inp, weight, forward_layout(C)), BT, OC, C, false, false, operands, "matmul_forward");
}

template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT, int64_t C,
                     int64_t OC, GemmOperands operands, GradWrite dinp_write) {
  // dinp[BT, C] += (or =) dout[BT, OC] @ weight[OC, C]
  if (dinp != nullptr)
    gemm<T>(dinp, operands_of(dout, weight, input_grad_layout(C, OC)), BT, C, OC, dinp_write == GradWrite::add,
            false, operands, "matmul_backward (dinp)");
  // dweight[OC, C] += dout[BT, OC]^T @ inp[BT, C]: a sum over the tokens
  if (dweight != nullptr)
    gemm<T>(dweight, operands_of(dout, inp, weight_grad_layout(C, OC)), OC, C, BT, true, true, operands,
            "matmul_backward (dweight)");
}

// The three products of an n x n linear layer, each timed with CUDA events (around the kernels
// alone: QueueOnly) for a third of `seconds` after a warm-up, as the CPU backend and bench's
// references time them; the best rate seen (2 n^3 FLOPs per product). The operands are random bf16 values in [-1, 1), not zeros: a
// tensor core multiplying zeros draws less power and may clock higher than on a model's numbers.
double measure_peak_gemm_flops(int64_t n, double seconds, GemmOperands operands) {
  if (n <= 0) throw InputError("measure_peak_gemm_flops: n must be > 0");
  if (!(seconds >= 0)) throw InputError("measure_peak_gemm_flops: the budget must be >= 0 seconds");
  const char* op = "measure_peak_gemm_flops";
  const size_t elems = size_t(n) * size_t(n);
  // x, w, dy (random), then y, dx, dw; freed and the events destroyed however this returns.
  struct Arrays {
    float* p[6] = {};
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Arrays() {
      for (float* q : p) cudaFree(q);
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } a;
  for (float*& q : a.p) check(cudaMalloc(&q, elems * sizeof(float)), op);
  // The CPU's timing operands (core/gemm_timing.h), rounded to bf16 values: dy reads a's.
  GemmTimingOperands g(n);
  for (std::vector<float>* values : {&g.a, &g.b})
    for (float& v : *values) v = nearest_bf16(v);
  const float* host[3] = {g.a.data(), g.b.data(), g.a.data()};
  for (int i = 0; i < 3; ++i)
    check(cudaMemcpy(a.p[i], host[i], elems * sizeof(float), cudaMemcpyHostToDevice), op);
  for (int i = 3; i < 6; ++i) check(cudaMemset(a.p[i], 0, elems * sizeof(float)), op);
  check(cudaEventCreate(&a.start), op);
  check(cudaEventCreate(&a.stop), op);
  float *x = a.p[0], *w = a.p[1], *dy = a.p[2], *y = a.p[3], *dx = a.p[4], *dw = a.p[5];
  auto rate = [&](auto&& product) {
    product();  // warm-up
    double best = 0;
    const auto begin = std::chrono::steady_clock::now();
    do {
      check(cudaEventRecord(a.start, stream()), op);
      {
        const QueueOnly queued;  // the events time the kernels, not the host's wait for them
        product();
      }
      check(cudaEventRecord(a.stop, stream()), op);
      check(cudaEventSynchronize(a.stop), op);
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a.start, a.stop), op);
      if (ms > 0) best = std::max(best, 2.0 * double(n) * double(n) * double(n) / (double(ms) * 1e-3));
    } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() < seconds / 3);
    return best;
  };
  return std::max({rate([&] { cuda::matmul_forward<float>(y, x, w, n, n, n, operands); }),
                   rate([&] {
                     cuda::matmul_backward<float>(dx, nullptr, dy, nullptr, w, n, n, n, operands, GradWrite::add);
                   }),
                   rate([&] {
                     cuda::matmul_backward<float>(nullptr, dw, dy, x, nullptr, n, n, n, operands, GradWrite::add);
                   })});
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, GemmOperands);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t,
                                     GemmOperands);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, GemmOperands, GradWrite);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t, GemmOperands, GradWrite);

}  // namespace llama4d::cuda
