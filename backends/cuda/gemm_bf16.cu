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
// K reads zeros, whose products are exact zeros. The weight gradient (split_depth) groups the
// blocks once more, in depth chunks of kDepthChunk = 2,048 as the CPU's weight gradient does
// (backends/cpu/gemm_tiling.h), but from K alone: chunk 0 is added to the element as above, each
// later chunk is summed from zero on its own and then added to the element, in chunk order. The
// CPU backend adds the same exact products one fused multiply-add at a time: the two agree to
// fp32 rounding, not bitwise.
//
// The kernel: 128 x 128 output tiles; 8 warps in 2 x 4, each holding 64 x 32 of them in 4 x 2
// accumulator fragments for the current block, while the element so far waits in shared memory
// (in registers too it spilled: 255 registers); K staged 32 at a time in two shared buffers, the
// next slice read from global memory into registers while the tensor cores work on this one.
// Each operand is staged with its contiguous direction kept contiguous (a row- or column-major
// fragment, chosen at compile time), read four floats at a time where it is 16-byte aligned
// along that direction, and written to shared memory four bf16 at a time. The tile shape and the
// loads decide only where elements go, never the order of a sum. On an H200, 8192^3: 88 TFLOP/s
// with these tiles and loads, 22 with 128 x 64 tiles of scalar loads (cuBLAS: 784).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cpu/gemm.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/gemm.cuh"

namespace llama4d::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTileM = 128, kTileN = 128, kSlice = 32, kStep = 16;  // output tile, K staged, K per mma
constexpr int kWarpsM = 2, kWarpsN = 4, kThreadsBf16 = 32 * kWarpsM * kWarpsN;  // 256
constexpr int kWarpM = kTileM / kWarpsM, kWarpN = kTileN / kWarpsN;             // 64 x 32 per warp
constexpr int kFragsM = kWarpM / kStep, kFragsN = kWarpN / kStep;               // 4 x 2 fragments
// Padding of a staged row in bf16 elements: keeps the leading dimension a multiple of 8 (WMMA's
// rule for 16-bit types) and neighbouring rows off the same shared-memory banks.
constexpr int kPad = 8;
constexpr int64_t kDepthBlock = cpu::kGemmDepthBlock;
static_assert(kDepthBlock % kSlice == 0, "a staged slice must not straddle a depth block");
// The weight gradient's depth chunks: 8 depth blocks each. Its output is small next to its K
// (124M: q, o 768 x 768 = 36 tiles, k, v 12, the MLP's 96, on 132 SMs, over K = 16,384 tokens),
// so without them most SMs idle through these products; 8 chunks make 288, 96 and 768 tasks.
// Their partial sums take at most kMaxPartialBytes at a time (at least one chunk's).
constexpr int64_t kDepthChunk = 8 * kDepthBlock;
constexpr int64_t kMaxPartialBytes = int64_t(256) << 20;

// Where one operand's slice [Rows, kSlice] sits in shared memory: `row` is its M (left operand)
// or N (right operand) index in the tile, `depth` its k in the slice. KContiguous: the operand is
// contiguous along k in global memory, so it is staged with k contiguous too; else its rows are
// contiguous. The slice is read as groups of four elements along the contiguous direction
// (group g of a slice, in the order threads take them, runs along it, so neighbouring threads
// read neighbouring addresses).
template <bool KContiguous, int Rows>
struct Staged {
  static constexpr int ld = KContiguous ? kSlice + kPad : Rows + kPad;
  static constexpr int size = Rows * (kSlice + kPad);  // fits either layout
  static_assert(size >= kSlice * (Rows + kPad), "a staged slice must fit either layout");
  static constexpr int per_row = (KContiguous ? kSlice : Rows) / 4;  // groups along the contiguous direction
  static constexpr int per_thread = Rows * kSlice / 4 / kThreadsBf16;  // groups a thread stages
  static_assert(Rows * kSlice % (4 * kThreadsBf16) == 0, "the slice divides into the threads' groups");
  __device__ static int row(int g) { return KContiguous ? g / per_row : g % per_row * 4; }
  __device__ static int depth(int g) { return KContiguous ? g % per_row * 4 : g / per_row; }
  __device__ static int at(int r, int k) { return KContiguous ? r * ld + k : k * ld + r; }

  // This thread's groups of the slice at k0 of an operand whose element (row, k) is at
  // p[row * row_stride + k * depth_stride]; zeros past `rows` or K. vec: the contiguous stride
  // is 1 and every group inside the operand starts 16-byte aligned (launch_gemm_bf16 checks).
  __device__ static void read(float4 (&r)[per_thread], const float* p, int64_t row_stride, int64_t depth_stride,
                              int64_t row0, int64_t rows, int64_t k0, int64_t K, bool vec) {
  #pragma unroll
    for (int s = 0; s < per_thread; ++s) {
      const int g = int(threadIdx.x) + s * kThreadsBf16;
      const int64_t i = row0 + row(g), k = k0 + depth(g);
      const int64_t step = KContiguous ? depth_stride : row_stride;  // between the group's elements
      const float* q = p + i * row_stride + k * depth_stride;
      const bool whole = KContiguous ? i < rows && k + 3 < K : i + 3 < rows && k < K;
      if (vec && whole) {
        r[s] = *reinterpret_cast<const float4*>(q);
        continue;
      }
      float e[4];
  #pragma unroll
      for (int u = 0; u < 4; ++u) {
        const bool in = KContiguous ? i < rows && k + u < K : i + u < rows && k < K;
        e[u] = in ? q[u * step] : 0.0f;
      }
      r[s] = make_float4(e[0], e[1], e[2], e[3]);
    }
  }
  // Four bf16 in one 8-byte store: `at` of a group is a multiple of 4 elements from a
  // 128-byte-aligned buffer (ld and the group's start are multiples of 4).
  __device__ static void stage(__nv_bfloat16* staged, const float4 (&r)[per_thread]) {
  #pragma unroll
    for (int s = 0; s < per_thread; ++s) {
      const int g = int(threadIdx.x) + s * kThreadsBf16;
      const __nv_bfloat162 lo = __floats2bfloat162_rn(r[s].x, r[s].y), hi = __floats2bfloat162_rn(r[s].z, r[s].w);
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned*>(&lo);
      packed.y = *reinterpret_cast<const unsigned*>(&hi);
      *reinterpret_cast<uint2*>(&staged[at(row(g), depth(g))]) = packed;
    }
  }
};

using Accumulator = wmma::fragment<wmma::accumulator, kStep, kStep, kStep, float>;

// Shared memory of the kernel: the tile's elements so far, [kTileM, kTileN] fp32, then the two
// staging buffers of each operand.
constexpr int kTotalBytes = kTileM * kTileN * int(sizeof(float));
template <bool AK, bool BK>
constexpr int kSharedBytes = kTotalBytes + 2 * (Staged<AK, kTileM>::size + Staged<BK, kTileN>::size) * 2;

// out[M, N] = or += A[M, K] * B[K, N]. AK: A contiguous along k; BK: B contiguous along k.
// a_vec, b_vec: the operand may be read four floats at a time (Staged::read).
// Depth chunks: block z computes chunk first_chunk + z, k in [chunk * chunk_depth, + chunk_depth)
// (chunk_depth a multiple of the 256-blocks, so they fall where they do in the whole sum); chunk 0
// goes into out as the whole product would, chunk c >= 1 from zero into partial slot
// c - max(first_chunk, 1), [M, N] each. Without chunks: chunk_depth = K, first_chunk 0, one z.
template <bool AK, bool BK>
__global__ void __launch_bounds__(kThreadsBf16, 1)
    gemm_bf16_kernel(float* out, Operands<float> x, int64_t M, int64_t N, int64_t K, bool accumulate, bool a_vec,
                     bool b_vec, int64_t chunk_depth, int64_t first_chunk, float* partial) {
#if LLAMA4D_BF16_TENSOR_CORES
  const int64_t chunk = first_chunk + int64_t(blockIdx.z), k_begin = chunk * chunk_depth;
  K = K - k_begin < chunk_depth ? K - k_begin : chunk_depth;
  x.a += k_begin * x.a_depth;  // still 16-byte aligned for a_vec, b_vec: k_begin is a multiple of 4
  x.b += k_begin * x.b_depth;
  if (chunk > 0) {
    out = partial + (chunk - (first_chunk > 1 ? first_chunk : 1)) * M * N;
    accumulate = false;
  }
  using SA = Staged<AK, kTileM>;
  using SB = Staged<BK, kTileN>;
  // A staged (row, k) with k contiguous is a row-major fragment; B staged (column, k) with k
  // contiguous is a column-major one; and the other way round.
  using ALayout = std::conditional_t<AK, wmma::row_major, wmma::col_major>;
  using BLayout = std::conditional_t<BK, wmma::col_major, wmma::row_major>;
  extern __shared__ __align__(128) unsigned char shared[];
  float* total = reinterpret_cast<float*>(shared);  // [kTileM, kTileN]: the elements so far
  // [buffer][staged slice] of each operand: buffer b of A at a_staged + b * SA::size.
  __nv_bfloat16* const a_staged = reinterpret_cast<__nv_bfloat16*>(shared + kTotalBytes);
  __nv_bfloat16* const b_staged = a_staged + 2 * SA::size;
  const int warp = int(threadIdx.x) / 32;
  const int wr = (warp / kWarpsN) * kWarpM, wc = (warp % kWarpsN) * kWarpN;  // the warp's corner in the tile
  const int64_t row0 = int64_t(blockIdx.y) * kTileM, col0 = int64_t(blockIdx.x) * kTileN;

  // When accumulating, the element so far starts as its old value (zeros outside `out`, never
  // written back).
  if (accumulate)
    for (int e = int(threadIdx.x); e < kTileM * kTileN; e += kThreadsBf16) {
      const int64_t i = row0 + e / kTileN, j = col0 + e % kTileN;
      total[e] = i < M && j < N ? out[i * N + j] : 0.0f;
    }
  bool started = accumulate;
  Accumulator acc[kFragsM][kFragsN];  // the current 256-block
  #pragma unroll
  for (int fi = 0; fi < kFragsM; ++fi)
  #pragma unroll
    for (int fj = 0; fj < kFragsN; ++fj) wmma::fill_fragment(acc[fi][fj], 0.0f);

  float4 ra[SA::per_thread], rb[SB::per_thread];
  SA::read(ra, x.a, x.a_rows, x.a_depth, row0, M, 0, K, a_vec);
  SB::read(rb, x.b, x.b_cols, x.b_depth, col0, N, 0, K, b_vec);
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
    // One barrier per slice: a warp writing buffer `buf` here has passed the previous slice's
    // barrier, which every warp reached after its work on `buf` two slices ago.
    SA::stage(a_staged + buf * SA::size, ra);
    SB::stage(b_staged + buf * SB::size, rb);
    __syncthreads();
    if (k0 + kSlice < K) {  // the next slice's loads are in flight while the tensor cores work
      SA::read(ra, x.a, x.a_rows, x.a_depth, row0, M, k0 + kSlice, K, a_vec);
      SB::read(rb, x.b, x.b_cols, x.b_depth, col0, N, k0 + kSlice, K, b_vec);
    }
    const int kc = int(K - k0 < kSlice ? K - k0 : kSlice);
  #pragma unroll
    for (int kk = 0; kk < kSlice; kk += kStep) {
      if (kk >= kc) break;  // no step lies wholly past K
      wmma::fragment<wmma::matrix_a, kStep, kStep, kStep, __nv_bfloat16, ALayout> af[kFragsM];
      wmma::fragment<wmma::matrix_b, kStep, kStep, kStep, __nv_bfloat16, BLayout> bf[kFragsN];
  #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi) wmma::load_matrix_sync(af[fi], a_staged + buf * SA::size + SA::at(wr + fi * kStep, kk), SA::ld);
  #pragma unroll
      for (int fj = 0; fj < kFragsN; ++fj) wmma::load_matrix_sync(bf[fj], b_staged + buf * SB::size + SB::at(wc + fj * kStep, kk), SB::ld);
  #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi)
  #pragma unroll
        for (int fj = 0; fj < kFragsN; ++fj) wmma::mma_sync(acc[fi][fj], af[fi], bf[fj], acc[fi][fj]);
    }
    const int64_t next = k0 + kc;
    if (next % kDepthBlock == 0 || next == K) {  // a 256-block is complete: add it to the element
      // Each warp adds into its own part of `total`, so no barrier. Fragments of one type share
      // their element layout, so x[t] pairs the same (row, column).
  #pragma unroll
      for (int fi = 0; fi < kFragsM; ++fi)
  #pragma unroll
        for (int fj = 0; fj < kFragsN; ++fj) {
          float* t = total + (wr + fi * kStep) * kTileN + wc + fj * kStep;
          if (started) {
            Accumulator so_far;
            wmma::load_matrix_sync(so_far, t, kTileN, wmma::mem_row_major);
  #pragma unroll
            for (int e = 0; e < so_far.num_elements; ++e) acc[fi][fj].x[e] = so_far.x[e] + acc[fi][fj].x[e];
          }
          wmma::store_matrix_sync(t, acc[fi][fj], kTileN, wmma::mem_row_major);
          wmma::fill_fragment(acc[fi][fj], 0.0f);
        }
      started = true;
    }
    buf ^= 1;
  }
  __syncthreads();  // every warp's part of `total` is complete
  for (int e = int(threadIdx.x); e < kTileM * kTileN; e += kThreadsBf16) {
    const int64_t i = row0 + e / kTileN, j = col0 + e % kTileN;
    if (i < M && j < N) out[i * N + j] = total[e];
  }
#else
  __trap();  // never launched on this architecture (has_bf16_tensor_cores)
#endif
}

// The chunks of one launch (gemm_bf16_kernel): chunk_depth, the first chunk, and where the
// chunks after chunk 0 put their sums.
struct Chunks {
  int64_t depth, first;
  float* partial;
};

// Launches one layout's kernel, its shared memory (above the default 48 KiB) allowed once.
template <bool AK, bool BK>
void launch_layout(dim3 grid, float* out, const Operands<float>& x, int64_t M, int64_t N, int64_t K, bool accumulate,
                   bool a_vec, bool b_vec, const Chunks& c) {
  static const bool allowed = [] {
    check(cudaFuncSetAttribute(gemm_bf16_kernel<AK, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kSharedBytes<AK, BK>),
          "bf16 GEMM: shared memory");
    return true;
  }();
  (void)allowed;
  gemm_bf16_kernel<AK, BK><<<grid, kThreadsBf16, kSharedBytes<AK, BK>, stream()>>>(
      out, x, M, N, K, accumulate, a_vec, b_vec, c.depth, c.first, c.partial);
}

// out[i] += partial[0][i], then partial[1][i], ... (count slots of n): the chunks in order.
__global__ void add_partials_kernel(float* out, const float* partial, int64_t n, int64_t count) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    float v = out[i];
    for (int64_t c = 0; c < count; ++c) v += partial[c * n + i];
    out[i] = v;
  }
}

// Whether an operand may be read four floats at a time: contiguous along its staged direction,
// its base 16-byte aligned and the other stride a multiple of four floats, so every group of
// four (which starts at a multiple of 4 along the contiguous direction) is 16-byte aligned.
bool vector_reads(const float* p, int64_t contiguous_stride, int64_t other_stride) {
  return contiguous_stride == 1 && other_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace

void launch_gemm_bf16(float* out, const Operands<float>& x, int64_t M, int64_t N, int64_t K, bool accumulate,
                      bool split_depth) {
  dim3 grid(unsigned((N + kTileN - 1) / kTileN), unsigned((M + kTileM - 1) / kTileM));
  if (grid.y > 65535) throw InputError("bf16 GEMM: more than 8 million rows in one product");
  const bool ak = x.a_depth == 1, bk = x.b_depth == 1;
  // A's contiguous direction is k (ak) or its rows; B's is k (bk) or its columns.
  const bool a_vec = ak ? vector_reads(x.a, x.a_depth, x.a_rows) : vector_reads(x.a, x.a_rows, x.a_depth);
  const bool b_vec = bk ? vector_reads(x.b, x.b_depth, x.b_cols) : vector_reads(x.b, x.b_cols, x.b_depth);
  auto launch = [&](const Chunks& c) {
    if (ak && bk) launch_layout<true, true>(grid, out, x, M, N, K, accumulate, a_vec, b_vec, c);
    else if (ak) launch_layout<true, false>(grid, out, x, M, N, K, accumulate, a_vec, b_vec, c);
    else if (bk) launch_layout<false, true>(grid, out, x, M, N, K, accumulate, a_vec, b_vec, c);
    else launch_layout<false, false>(grid, out, x, M, N, K, accumulate, a_vec, b_vec, c);
  };
  const int64_t chunks = split_depth ? (K + kDepthChunk - 1) / kDepthChunk : 1;
  if (chunks == 1) return launch({K, 0, nullptr});
  // Partial sums of as many chunks at once as kMaxPartialBytes holds (at least one): launches
  // of chunks 0..g, then g+1..2g, ..., each followed by adding its partials to out in chunk order.
  // How many share a launch decides only what runs side by side, never the order of a sum.
  const int64_t slot = M * N;
  const int64_t at_once = std::clamp<int64_t>(kMaxPartialBytes / int64_t(sizeof(float)) / slot, 1, chunks - 1);
  const StreamScratch<float> partial(at_once * slot, "bf16 GEMM: depth-chunk partial sums");
  for (int64_t first = 0; first < chunks;) {
    const int64_t first_partial = std::max<int64_t>(first, 1), end = std::min(chunks, first_partial + at_once);
    grid.z = unsigned(end - first);
    launch({kDepthChunk, first, partial.get()});
    add_partials_kernel<<<grid_for(slot), kThreads, 0, stream()>>>(out, partial.get(), slot, end - first_partial);
    first = end;
  }
}

}  // namespace llama4d::cuda
