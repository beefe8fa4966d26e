// Causal grouped-query attention on tensor cores, for calls whose q, k, v hold bf16 values
// (AttentionShape::operands == bf16: bf16 mixed precision). The forward of attention.cu, with its
// two products, the scores q.k and the weighted sum p.v, done by WMMA's 16 x 16 x 16 bf16 steps
// with fp32 accumulation, in the tiling of FlashAttention-2 (Dao, 2023).
//
// A block takes 64 query rows of one (batch item, head), 4 warps of 16 rows each, and walks the
// keys in blocks of 64 from key 0 up to the last key its last row can see:
//   S = Q K^T on the tensor cores, then scaled and masked (causal, documents, past the ends) in fp32;
//   per row the online softmax of attention.cu: m' = max(m, max_j s), alpha = exp(m - m'),
//   p = exp(s - m'), l' = l alpha + sum_j p, O' = O alpha + P V;
//   P V on the tensor cores from P split into two bf16 parts, P = hi + lo (hi: P rounded to bf16;
//   lo: the rest, rounded again), so P keeps about 16 significant bits, not bf16's 8 (which
//   FlashAttention keeps): the result differs from fp32's by summation order and about 2^-17
//   relative, not by bf16's 2^-9.
// Then out = O / l and lse = m + log(l), or 0 and -inf for a row that saw no key.
//
// Bits: a score depends only on its query and key vectors, and a row's softmax and sums see its
// keys in blocks of 64 from key 0, ascending, whichever rows share its block; a block the row
// cannot see adds exact zeros (p = 0), which changes nothing but a -0 to +0. So a row's result
// does not depend on the call's other rows, and a run repeats bit for bit. The backward runs on
// CUDA cores (attention.cu) from the saved lse, as for fp32.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <string>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_common.cuh"

// WMMA's bf16 steps need sm_80 or later; the build targets sm_90 (CMAKE_CUDA_ARCHITECTURES).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "bf16 tensor-core kernels need CMAKE_CUDA_ARCHITECTURES of 80 or later"
#endif

namespace llama4d::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;

constexpr int kRows = 64;                  // query rows per block
constexpr int kKeys = 64;                  // keys per step
constexpr int kWarps = kRows / 16;         // 4: one per 16 query rows
constexpr int kThreads = 32 * kWarps;      // 128
constexpr int kLdS = kKeys + 4;            // fp32 scores: a row's stride (WMMA: a multiple of 4)
constexpr int kLdP = kKeys + 8;            // bf16 probabilities (WMMA: a multiple of 8)
constexpr int kMaxHeadDim = 128;

// The shared memory of a block for head_dim 16 * KD, in the order the kernel lays it out; every
// array starts 32-byte aligned (WMMA's rule), since each size is a multiple of 32.
template <int KD>
struct Layout {
  static constexpr int hd = 16 * KD;
  static constexpr int ld = hd + 8;   // a staged q, k or v row (bf16)
  static constexpr int ld_o = hd + 4;  // the output accumulator's row (fp32)
  static constexpr size_t q = 0, k = q + size_t(kRows) * ld * 2, v = k + size_t(kKeys) * ld * 2,
                          s = v + size_t(kKeys) * ld * 2, p_hi = s + size_t(kRows) * kLdS * 4,
                          p_lo = p_hi + size_t(kRows) * kLdP * 2, o = p_lo + size_t(kRows) * kLdP * 2,
                          bytes = o + size_t(kRows) * ld_o * 4;
};

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
// The same bits in every lane (each butterfly step adds the same two numbers in either order).
__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int KD>
__global__ void __launch_bounds__(kThreads)
    forward_bf16_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Geometry G,
                        float scale) {
  using L = Layout<KD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem + L::q);     // [kRows][ld]
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem + L::k);     // [kKeys][ld]
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem + L::v);     // [kKeys][ld]
  float* Ss = reinterpret_cast<float*>(smem + L::s);       // [kRows][kLdS]
  bf16_t* Ph = reinterpret_cast<bf16_t*>(smem + L::p_hi);  // [kRows][kLdP]
  bf16_t* Pl = reinterpret_cast<bf16_t*>(smem + L::p_lo);  // [kRows][kLdP]
  float* Os = reinterpret_cast<float*>(smem + L::o);       // [kRows][ld_o]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, r0 = warp * 16;
  const int64_t i0 = int64_t(blockIdx.x) * kRows, h = blockIdx.y, b = blockIdx.z, g = h / G.group;
  const int64_t last_row = (i0 + kRows < G.Tq ? i0 + kRows : G.Tq) - 1;
  float* Sw = Ss + r0 * kLdS;  // this warp's scores, then its exchange area for P V

  for (int e = int(threadIdx.x); e < kRows * L::hd; e += kThreads) {
    const int r = e / L::hd, d = e % L::hd;
    const int64_t i = i0 + r;
    Qs[r * L::ld + d] = __float2bfloat16_rn(i < G.Tq ? q[G.q_index(b, i, h) + d] : 0.0f);  // exact: bf16 values
  }
  for (int e = int(threadIdx.x); e < kRows * L::ld_o; e += kThreads) Os[e] = 0.0f;
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> qf[KD];
#pragma unroll
  for (int kd = 0; kd < KD; ++kd) wmma::load_matrix_sync(qf[kd], Qs + r0 * L::ld + kd * 16, L::ld);
  float m[16], l[16];  // each row's running max and sum, the same in every lane
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) m[rr] = -INFINITY, l[rr] = 0.0f;

  const int64_t n_keys = G.visible_keys(last_row);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeys) {
    __syncthreads();  // every warp is done with the previous keys and values
    for (int e = int(threadIdx.x); e < kKeys * L::hd; e += kThreads) {
      const int r = e / L::hd, d = e % L::hd;
      const int64_t j = j0 + r;
      const bool in = j < G.Tk;
      Ks[r * L::ld + d] = __float2bfloat16_rn(in ? k[G.kv_index(b, j, g) + d] : 0.0f);
      Vs[r * L::ld + d] = __float2bfloat16_rn(in ? v[G.kv_index(b, j, g) + d] : 0.0f);
    }
    __syncthreads();

    // S[16, 64] = Q K^T for this warp's rows: K staged [key][d] is K^T in column-major.
#pragma unroll
    for (int c = 0; c < kKeys / 16; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
      wmma::fill_fragment(sf, 0.0f);
#pragma unroll
      for (int kd = 0; kd < KD; ++kd) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, Ks + (c * 16) * L::ld + kd * 16, L::ld);
        wmma::mma_sync(sf, qf[kd], kf, sf);
      }
      wmma::store_matrix_sync(Sw + c * 16, sf, kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // The online softmax, row by row; lane l holds keys l and l + 32 of the block.
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
      const int64_t i = i0 + r0 + rr;
      const int64_t seen = i < G.Tq ? G.visible_keys(i) : 0;
      float s[2], p[2] = {0.0f, 0.0f}, block_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int jj = lane + 32 * t;
        const int64_t j = j0 + jj;
        s[t] = j < seen && G.same_document(b, i, j) ? Sw[rr * kLdS + jj] * scale : -INFINITY;
        block_max = fmaxf(block_max, s[t]);
      }
      const float m_new = fmaxf(m[rr], warp_max(block_max));
      float alpha = 1.0f;
      if (m_new != -INFINITY) {  // else the row has seen no key yet: nothing to add or rescale
        alpha = expf(m[rr] - m_new);  // 0 while m was -inf (O and l are 0 then)
#pragma unroll
        for (int t = 0; t < 2; ++t) p[t] = expf(s[t] - m_new);  // 0 for a masked key
      }
      l[rr] = l[rr] * alpha + warp_sum(p[0] + p[1]);
      m[rr] = m_new;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const bf16_t hi = __float2bfloat16_rn(p[t]);
        Ph[(r0 + rr) * kLdP + lane + 32 * t] = hi;
        Pl[(r0 + rr) * kLdP + lane + 32 * t] = __float2bfloat16_rn(p[t] - __bfloat162float(hi));
      }
      for (int d = lane; d < L::hd; d += 32) Os[(r0 + rr) * L::ld_o + d] *= alpha;
    }
    __syncwarp();

    // O[16, hd] += P V, 16 columns at a time, through the exchange area.
#pragma unroll
    for (int c = 0; c < KD; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
      wmma::fill_fragment(of, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major> vf;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> hi, lo;
        wmma::load_matrix_sync(vf, Vs + (kk * 16) * L::ld + c * 16, L::ld);
        wmma::load_matrix_sync(hi, Ph + r0 * kLdP + kk * 16, kLdP);
        wmma::load_matrix_sync(lo, Pl + r0 * kLdP + kk * 16, kLdP);
        wmma::mma_sync(of, hi, vf, of);
        wmma::mma_sync(of, lo, vf, of);
      }
      wmma::store_matrix_sync(Sw, of, kLdS, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32) Os[(r0 + e / 16) * L::ld_o + c * 16 + e % 16] += Sw[(e / 16) * kLdS + e % 16];
      __syncwarp();
    }
  }

#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    const int64_t i = i0 + r0 + rr;
    if (i >= G.Tq) continue;
    const bool any = m[rr] != -INFINITY;  // no visible key: out = 0, lse = -inf (core/ops.h)
    const float inv = any ? 1.0f / l[rr] : 0.0f;
    float* o = out + G.q_index(b, i, h);
    for (int d = lane; d < L::hd; d += 32) o[d] = any ? Os[(r0 + rr) * L::ld_o + d] * inv : 0.0f;
    if (lane == 0) lse[G.lse_index(b, h, i)] = any ? m[rr] + logf(l[rr]) : -INFINITY;
  }
}

template <int KD>
void launch_forward(float* out, float* lse, const float* q, const float* k, const float* v, const Geometry& G,
                    float scale) {
  constexpr size_t bytes = Layout<KD>::bytes;
  // Past 48 KB a kernel must ask for its dynamic shared memory (once per kernel and device).
  static const cudaError_t allowed =
      cudaFuncSetAttribute(forward_bf16_kernel<KD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  check(allowed, "attention_forward (bf16): shared memory");
  const dim3 grid(unsigned((G.Tq + kRows - 1) / kRows), unsigned(G.nh), unsigned(G.B));
  forward_bf16_kernel<KD><<<grid, kThreads, bytes, stream()>>>(out, lse, q, k, v, G, scale);
}

}  // namespace

bool attention_bf16_fits(int64_t hd) { return hd > 0 && hd % 16 == 0 && hd <= kMaxHeadDim; }

void launch_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const Geometry& G, float scale) {
  if (G.nh > 65535 || G.B > 65535) throw InputError("attention_forward (bf16): more than 65535 heads or batch items");
  switch (G.hd / 16) {
    case 1: return launch_forward<1>(out, lse, q, k, v, G, scale);
    case 2: return launch_forward<2>(out, lse, q, k, v, G, scale);
    case 3: return launch_forward<3>(out, lse, q, k, v, G, scale);
    case 4: return launch_forward<4>(out, lse, q, k, v, G, scale);
    case 5: return launch_forward<5>(out, lse, q, k, v, G, scale);
    case 6: return launch_forward<6>(out, lse, q, k, v, G, scale);
    case 7: return launch_forward<7>(out, lse, q, k, v, G, scale);
    case 8: return launch_forward<8>(out, lse, q, k, v, G, scale);
    default: throw InputError("attention_forward (bf16): head_dim " + std::to_string(G.hd) + " is not 16..128 in 16s");
  }
}

}  // namespace llama4d::cuda
