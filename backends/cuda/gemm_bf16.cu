// The linear layer's products for bf16 mixed precision, on tensor cores (GemmOperands::bf16).
//
// The operands are fp32 buffers that hold bf16 values (the model rounds every tensor a product
// reads, core/model/block.h). Each element is narrowed to bf16 as it is staged into shared
// memory, exactly since it is a bf16 value already, and the tiles are multiplied by WMMA's
// 16 x 16 x 16 bf16 steps with fp32 accumulation (sm_80 and later).
//
// The order of the sum, which the equivalence harness needs fixed: every output element is
// summed over K in steps of 16 (one tensor-core step, whose 16 exact products the hardware adds
// the same way every time), k ascending, grouped in blocks of kGemmDepthBlock = 256 as the fp32
// GEMM groups them (gemm.cu): each block from zero, then added to the element (its old value when
// accumulating). Nothing but K and the element's row and column vectors decides its bits, so a
// slice of the rows (data, sequence, context parallelism) or of the columns (tensor parallelism)
// has the bits of the whole product's slice, and a run repeats bit for bit. A step that runs past
// K reads zeros, whose products are exact zeros. The CPU backend adds the same exact products
// one fused multiply-add at a time: the two agree to fp32 rounding, not bitwise.
//
// The kernel: 128 x 64 output tiles; 8 warps, each holding 32 x 32 of them in 2 x 2
// accumulator fragments (twice over: the element so far and the current block); K staged 32 at a time in two shared buffers, the next slice read from
// global memory into registers while the tensor cores work on this one. Each operand is staged
// with its contiguous direction kept contiguous (a row- or column-major fragment, chosen at
// compile time), so global reads are coalesced whichever transpose the product needs.
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>

#include "backends/cpu/gemm.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/gemm.cuh"

namespace llama4d::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileM = 128, kTileN = 64, kSlice = 32, kStep = 16;  // output tile, K staged, K per mma
constexpr int kWarpsM = 4, kWarpsN = 2, kThreadsBf16 = 32 * kWarpsM * kWarpsN;  // 256
constexpr int kWarpM = kTileM / kWarpsM, kWarpN = kTileN / kWarpsN;             // 32 x 32 per warp
constexpr int kFragsM = kWarpM / kStep, kFragsN = kWarpN / kStep;               // 2 x 2 fragments
// Padding of a staged row in bf16 elements: keeps the leading dimension a multiple of 8 (WMMA's
// rule for 16-bit types) and neighbouring rows off the same shared-memory banks.
constexpr int kPad = 8;
constexpr int64_t kDepthBlock = cpu::kGemmDepthBlock;
static_assert(kDepthBlock % kSlice == 0, "a staged slice must not straddle a depth block");

// Where one operand's slice [Rows, kSlice] sits in shared memory: `row` is its M (left operand)
// or N (right operand) index in the tile, `depth` its k in the slice. KContiguous: the operand is
// contiguous along k in global memory, so it is staged with k contiguous too; else its rows are
// contiguous. Element e of a slice, in the order threads take them, runs along the contiguous
// direction, so neighbouring threads read neighbouring addresses.
template <bool KContiguous, int Rows>
struct Staged {
  static constexpr int ld = KContiguous ? kSlice + kPad : Rows + kPad;
  static constexpr int size = Rows * (kSlice + kPad);  // fits either layout
  static_assert(size >= kSlice * (Rows + kPad), "a staged slice must fit either layout");
  static constexpr int per_thread = Rows * kSlice / kThreadsBf16;  // elements a thread stages
  __device__ static int row(int e) { return KContiguous ? e / kSlice : e % Rows; }
  __device__ static int depth(int e) { return KContiguous ? e % kSlice : e / Rows; }
  __device__ static int at(int r, int k) { return KContiguous ? r * ld + k : k * ld + r; }

  // This thread's elements of the slice at k0 of an operand whose element (row, k) is at
  // p[row * row_stride + k * depth_stride], narrowed to bf16; zeros past `rows` or K.
  __device__ static void read(__nv_bfloat16 (&r)[per_thread], const float* p, int64_t row_stride, int64_t depth_stride,
                              int64_t row0, int64_t rows, int64_t k0, int64_t K) {
  #pragma unroll
    for (int s = 0; s < per_thread; ++s) {
      const int e = int(threadIdx.x) + s * kThreadsBf16;
      const int64_t i = row0 + row(e), k = k0 + depth(e);
      r[s] = __float2bfloat16_rn(i < rows && k < K ? p[i * row_stride + k * depth_stride] : 0.0f);
    }
  }
  __device__ static void stage(__nv_bfloat16* staged, const __nv_bfloat16 (&r)[per_thread]) {
  #pragma unroll
    for (int s = 0; s < per_thread; ++s) {
      const int e = int(threadIdx.x) + s * kThreadsBf16;
      staged[at(row(e), depth(e))] = r[s];
    }
  }
};

using Accumulator = wmma::fragment<wmma::accumulator, kStep, kStep, kStep, float>;

// out[M, N] = or += A[M, K] * B[K, N]. AK: A contiguous along k; BK: B contiguous along k.
template <bool AK, bool BK>
__global__ void __launch_bounds__(kThreadsBf16)
    gemm_bf16_kernel(float* out, Operands<float> x, int64_t M, int64_t N, int64_t K, bool accumulate) {
#if LLAMA4D_BF16_TENSOR_CORES
  using SA = Staged<AK, kTileM>;
  using SB = Staged<BK, kTileN>;
  // A staged (row, k) with k contiguous is a row-major fragment; B staged (column, k) with k
  // contiguous is a column-major one; and the other way round.
  using ALayout = std::conditional_t<AK, wmma::row_major, wmma::col_major>;
  using BLayout = std::conditional_t<BK, wmma::col_major, wmma::row_major>;
  // [buffer][staged slice]. Before and after the K loop, each warp's kStep * kStep floats of
  // a_staged carry accumulator fragments to and from `out`.
  __shared__ __align__(128) __nv_bfloat16 a_staged[2][SA::size];
  __shared__ __align__(128) __nv_bfloat16 b_staged[2][SB::size];
  static_assert(sizeof(a_staged) >= kWarpsM * kWarpsN * kStep * kStep * sizeof(float), "exchange area");
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wr = (warp / kWarpsN) * kWarpM, wc = (warp % kWarpsN) * kWarpN;  // the warp's corner in the tile
  const int64_t row0 = int64_t(blockIdx.y) * kTileM, col0 = int64_t(blockIdx.x) * kTileN;
  float* exchange = reinterpret_cast<float*>(&a_staged[0][0]) + warp * kStep * kStep;
  auto element = [&](int fi, int fj, int e, int64_t* i, int64_t* j) {
    *i = row0 + wr + fi * kStep + e / kStep;
    *j = col0 + wc + fj * kStep + e % kStep;
  };

  // total: the element so far (its old value when accumulating); acc: the current 256-block.
  Accumulator total[kFragsM][kFragsN], acc[kFragsM][kFragsN];
  #pragma unroll
  for (int fi = 0; fi < kFragsM; ++fi)
    #pragma unroll
    for (int fj = 0; fj < kFragsN; ++fj) {
      wmma::fill_fragment(acc[fi][fj], 0.0f);
      wmma::fill_fragment(total[fi][fj], 0.0f);
      if (!accumulate) continue;
      for (int e = lane; e < kStep * kStep; e += 32) {
        int64_t i, j;
        element(fi, fj, e, &i, &j);
        exchange[e] = i < M && j < N ? out[i * N + j] : 0.0f;
      }
      __syncwarp();
      wmma::load_matrix_sync(total[fi][fj], exchange, kStep, wmma::mem_row_major);
      __syncwarp();
    }
  bool started = accumulate;
  __syncthreads();  // the exchange area becomes the staging buffers

  __nv_bfloat16 ra[SA::per_thread], rb[SB::per_thread];
  SA::read(ra, x.a, x.a_rows, x.a_depth, row0, M, 0, K);
  SB::read(rb, x.b, x.b_cols, x.b_depth, col0, N, 0, K);
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
    // One barrier per slice: a warp writing buffer `buf` here has passed the previous slice's
    // barrier, which every warp reached after its work on `buf` two slices ago.
    SA::stage(a_staged[buf], ra);
    SB::stage(b_staged[buf], rb);
    __syncthreads();
    if (k0 + kSlice < K) {  // the next slice's loads are in flight while the tensor cores work
      SA::read(ra, x.a, x.a_rows, x.a_depth, row0, M, k0 + kSlice, K);
      SB::read(rb, x.b, x.b_cols, x.b_depth, col0, N, k0 + kSlice, K);
    }
    const int kc = int(K - k0 < kSlice ? K - k0 : kSlice);
    for (int kk = 0; kk < kc; kk += kStep) {  // no step lies wholly past K
      wmma::fragment<wmma::matrix_a, kStep, kStep, kStep, __nv_bfloat16, ALayout> af[kFragsM];
      wmma::fragment<wmma::matrix_b, kStep, kStep, kStep, __nv_bfloat16, BLayout> bf[kFragsN];
      #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi) wmma::load_matrix_sync(af[fi], &a_staged[buf][SA::at(wr + fi * kStep, kk)], SA::ld);
      #pragma unroll
      for (int fj = 0; fj < kFragsN; ++fj) wmma::load_matrix_sync(bf[fj], &b_staged[buf][SB::at(wc + fj * kStep, kk)], SB::ld);
      #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi)
        #pragma unroll
        for (int fj = 0; fj < kFragsN; ++fj) wmma::mma_sync(acc[fi][fj], af[fi], bf[fj], acc[fi][fj]);
    }
    const int64_t next = k0 + kc;
    if (next % kDepthBlock == 0 || next == K) {  // a 256-block is complete: add it to the element
      // Fragments of one type share their element layout, so x[t] pairs the same (row, column).
      #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi)
        #pragma unroll
        for (int fj = 0; fj < kFragsN; ++fj) {
          #pragma unroll
          for (int t = 0; t < acc[fi][fj].num_elements; ++t)
            total[fi][fj].x[t] = started ? total[fi][fj].x[t] + acc[fi][fj].x[t] : acc[fi][fj].x[t];
          wmma::fill_fragment(acc[fi][fj], 0.0f);
        }
      started = true;
    }
    buf ^= 1;
  }
  __syncthreads();  // every warp is done with the staging buffers: they become the exchange area
  #pragma unroll
  for (int fi = 0; fi < kFragsM; ++fi)
    #pragma unroll
    for (int fj = 0; fj < kFragsN; ++fj) {
      wmma::store_matrix_sync(exchange, total[fi][fj], kStep, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kStep * kStep; e += 32) {
        int64_t i, j;
        element(fi, fj, e, &i, &j);
        if (i < M && j < N) out[i * N + j] = exchange[e];
      }
      __syncwarp();
    }
#else
  __trap();  // never launched on this architecture (has_bf16_tensor_cores)
#endif
}

}  // namespace

void launch_gemm_bf16(float* out, const Operands<float>& x, int64_t M, int64_t N, int64_t K, bool accumulate) {
  const dim3 grid(unsigned((N + kTileN - 1) / kTileN), unsigned((M + kTileM - 1) / kTileM));
  if (grid.y > 65535) throw InputError("bf16 GEMM: more than 8 million rows in one product");
  const bool ak = x.a_depth == 1, bk = x.b_depth == 1;
  if (ak && bk) gemm_bf16_kernel<true, true><<<grid, kThreadsBf16, 0, stream()>>>(out, x, M, N, K, accumulate);
  else if (ak) gemm_bf16_kernel<true, false><<<grid, kThreadsBf16, 0, stream()>>>(out, x, M, N, K, accumulate);
  else if (bk) gemm_bf16_kernel<false, true><<<grid, kThreadsBf16, 0, stream()>>>(out, x, M, N, K, accumulate);
  else gemm_bf16_kernel<false, false><<<grid, kThreadsBf16, 0, stream()>>>(out, x, M, N, K, accumulate);
}

}  // namespace llama4d::cuda
