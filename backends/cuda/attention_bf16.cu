// Causal grouped-query attention on tensor cores, for calls whose q, k, v (and dout, out) hold
// bf16 values (AttentionShape::operands == bf16: bf16 mixed precision). attention.cu's forward
// and backward, with every product (scores q.k, weighted sums p.v, and the backward's dO.v,
// dS.k, P^T.dO, dS^T.q) done by WMMA's 16 x 16 x 16 bf16 steps with fp32 accumulation, in the
// tiling of FlashAttention-2 (Dao, 2023). The softmax, its statistics and every elementwise
// step stay in fp32, in attention.cu's formulas.
//
// Probabilities and score gradients are not bf16 values, so a product that reads one (P V,
// dS K, P^T dO, dS^T Q) takes it in two bf16 parts, x = hi + lo (hi: x rounded to bf16; lo: the
// rest, rounded again), two steps each: x keeps about 16 significant bits, not bf16's 8 (which
// FlashAttention keeps), so the results differ from fp32's by summation order and about 2^-17
// relative, not by bf16's 2^-9.
//
// Forward: a block takes 64 query rows of one (batch item, head), 4 warps of 16 rows each, and
// walks the keys in blocks of 64 from key 0 up to the last key its last row can see:
//   S = Q K^T, scaled and masked (causal, documents, past the ends);
//   per row the online softmax: m' = max(m, max_j s), alpha = exp(m - m'), p = exp(s - m'),
//   l' = l alpha + sum_j p, O' = O alpha + P V;
// then out = O / l and lse = m + log(l), or 0 and -inf for a row that saw no key.
// Backward (no atomics), two kernels as in attention.cu:
//   query blocks (64 rows of one head): D_i = dO_i . O_i, then over the key blocks
//   p = exp(s - lse_i), dS = p (dO_i . v_j - D_i) scale, dQ += dS K;
//   key blocks (64 keys of one KV head, after, in stream order): over the query blocks that can
//   see them and each query head of the group, dV += P^T dO and dK += dS^T Q.
//
// Bits: a score depends only on its query and key vectors; a row's sums see its keys in blocks
// of 64 counted from key 0, ascending, and a key's sums its query rows in blocks of 64 counted
// from query 0 (those before the first block that can see the key are skipped: they would add
// zeros), whichever rows share the block; a pair that cannot see each other adds exact zeros
// (p = 0), which changes nothing but a -0 to +0. So a row's result does not depend on the call's
// other rows, and a run repeats bit for bit.
//
// Shared memory: up to 205 KB a block (the key blocks at head_dim 128), within an H100's 227 KB;
// a GPU that offers a block less runs the call on CUDA cores (attention_bf16_fits).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_common.cuh"

namespace llama4d::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;

constexpr int kTile = 64;              // query rows or keys a block holds at once
constexpr int kWarps = kTile / 16;     // 4: one per 16 rows
constexpr int kTileThreads = 32 * kWarps;  // 128
constexpr int kLdS = kTile + 4;        // fp32 scores [rows][64] (WMMA: a multiple of 4)
constexpr int kLdP = kTile + 8;        // bf16 parts of probabilities [rows][64] (WMMA: a multiple of 8)
constexpr int kMaxHeadDim = 128;

// Shared-memory arrays start 128-byte aligned (WMMA needs 32).
constexpr size_t aligned(size_t bytes) { return (bytes + 127) / 128 * 128; }
// The sizes of a block's arrays for head_dim 16 * KD.
template <int KD>
struct Sizes {
  static constexpr int hd = 16 * KD;
  static constexpr int ld = hd + 8;    // a staged row of q, k, v or dout (bf16)
  static constexpr int ld_o = hd + 4;  // an fp32 accumulator row (O, dQ, dK, dV)
  static constexpr size_t staged = aligned(size_t(kTile) * ld * 2), scores = aligned(size_t(kTile) * kLdS * 4),
                          part = aligned(size_t(kTile) * kLdP * 2), acc = aligned(size_t(kTile) * ld_o * 4),
                          stats = aligned(kTile * 4);
  static constexpr size_t forward = 3 * staged + scores + 2 * part + acc;                 // Q K V, S, P, O
  static constexpr size_t query = 4 * staged + 2 * scores + 2 * part + acc + 2 * stats;   // Q dO K V, S dP, dS, dQ
  static constexpr size_t key = 4 * staged + 2 * scores + 4 * part + 2 * acc + 2 * stats;  // + P, dK dV
};

// Hands out a block's dynamic shared memory in order.
struct Carver {
  unsigned char* at;
  template <class E>
  __device__ E* take(size_t bytes) {
    E* p = reinterpret_cast<E*>(at);
    at += bytes;
    return p;
  }
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

// dst[64][ld] = 64 rows of hd values narrowed to bf16 (exact: they are bf16 values), row r from
// src + at(r) for r < rows, zeros after. The whole block calls it.
template <int HD, class At>
__device__ void stage_rows(bf16_t* dst, int ld, const float* src, At at, int64_t rows) {
  for (int e = int(threadIdx.x); e < kTile * HD; e += kTileThreads) {
    const int r = e / HD, d = e % HD;
    dst[r * ld + d] = __float2bfloat16_rn(r < rows ? src[at(r) + d] : 0.0f);
  }
}

// x as two bf16 parts at hi[i], lo[i].
__device__ inline void split(bf16_t* hi, bf16_t* lo, int i, float x) {
  const bf16_t h = __float2bfloat16_rn(x);
  hi[i] = h;
  lo[i] = __float2bfloat16_rn(x - __bfloat162float(h));
}

// One warp: dst[16][64] (fp32, kLdS) = a[16][hd] b[64][hd]^T, both staged row by row (ld).
template <int KD>
__device__ void scores(float* dst, const bf16_t* a, const bf16_t* b, int ld) {
#pragma unroll
  for (int c = 0; c < kTile / 16; ++c) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> af;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major> bf;  // b's rows are b^T's columns
      wmma::load_matrix_sync(af, a + kd * 16, ld);
      wmma::load_matrix_sync(bf, b + (c * 16) * ld + kd * 16, ld);
      wmma::mma_sync(acc, af, bf, acc);
    }
    wmma::store_matrix_sync(dst + c * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// One warp: dst[16][hd] (fp32, ld_dst) += (hi + lo)[16][64] b[64][hd], b staged row by row (ld),
// 16 columns at a time through `exchange` (16 x kLdS floats of the warp's own).
template <int KD>
__device__ void add_split_product(float* dst, int ld_dst, const bf16_t* hi, const bf16_t* lo, const bf16_t* b, int ld,
                                  float* exchange, int lane) {
#pragma unroll
  for (int c = 0; c < KD; ++c) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major> bf;
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> h, l;
      wmma::load_matrix_sync(bf, b + (kk * 16) * ld + c * 16, ld);
      wmma::load_matrix_sync(h, hi + kk * 16, kLdP);
      wmma::load_matrix_sync(l, lo + kk * 16, kLdP);
      wmma::mma_sync(acc, h, bf, acc);
      wmma::mma_sync(acc, l, bf, acc);
    }
    wmma::store_matrix_sync(exchange, acc, kLdS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 16; e += 32) dst[(e / 16) * ld_dst + c * 16 + e % 16] += exchange[(e / 16) * kLdS + e % 16];
    __syncwarp();
  }
}

template <int KD>
__global__ void __launch_bounds__(kTileThreads)
    forward_bf16_kernel(float* out, float* lse, const float* q, const float* k, const float* v, Geometry G,
                        float scale) {
#if LLAMA4D_BF16_TENSOR_CORES
  using Z = Sizes<KD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  bf16_t* Qs = carve.take<bf16_t>(Z::staged);  // [64][ld]
  bf16_t* Ks = carve.take<bf16_t>(Z::staged);  // [64][ld]
  bf16_t* Vs = carve.take<bf16_t>(Z::staged);  // [64][ld]
  float* Ss = carve.take<float>(Z::scores);    // [64][kLdS]
  bf16_t* Ph = carve.take<bf16_t>(Z::part);    // [64][kLdP]
  bf16_t* Pl = carve.take<bf16_t>(Z::part);    // [64][kLdP]
  float* Os = carve.take<float>(Z::acc);       // [64][ld_o]
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, r0 = warp * 16;
  const int64_t i0 = int64_t(blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z, g = h / G.group;
  const int64_t rows = G.Tq - i0 < kTile ? G.Tq - i0 : kTile;
  float* Sw = Ss + r0 * kLdS;  // this warp's scores, then its exchange area

  stage_rows<Z::hd>(Qs, Z::ld, q, [&](int r) { return G.q_index(b, i0 + r, h); }, rows);
  for (int e = int(threadIdx.x); e < kTile * Z::ld_o; e += kTileThreads) Os[e] = 0.0f;
  __syncthreads();  // Qs and Os are ready (a block whose rows see no key reads Os unchanged)
  float m[16], l[16];  // each row's running max and sum, the same in every lane
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) m[rr] = -INFINITY, l[rr] = 0.0f;

  const int64_t n_keys = G.visible_keys(i0 + rows - 1);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous keys and values
    stage_rows<Z::hd>(Ks, Z::ld, k, [&](int r) { return G.kv_index(b, j0 + r, g); }, G.Tk - j0);
    stage_rows<Z::hd>(Vs, Z::ld, v, [&](int r) { return G.kv_index(b, j0 + r, g); }, G.Tk - j0);
    __syncthreads();
    scores<KD>(Sw, Qs + r0 * Z::ld, Ks, Z::ld);
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
      for (int t = 0; t < 2; ++t) split(Ph, Pl, (r0 + rr) * kLdP + lane + 32 * t, p[t]);
      for (int d = lane; d < Z::hd; d += 32) Os[(r0 + rr) * Z::ld_o + d] *= alpha;
    }
    __syncwarp();
    add_split_product<KD>(Os + r0 * Z::ld_o, Z::ld_o, Ph + r0 * kLdP, Pl + r0 * kLdP, Vs, Z::ld, Sw, lane);
  }

#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    const int64_t i = i0 + r0 + rr;
    if (i >= G.Tq) continue;
    const bool any = m[rr] != -INFINITY;  // no visible key: out = 0, lse = -inf (core/ops.h)
    const float inv = any ? 1.0f / l[rr] : 0.0f;
    float* o = out + G.q_index(b, i, h);
    for (int d = lane; d < Z::hd; d += 32) o[d] = any ? Os[(r0 + rr) * Z::ld_o + d] * inv : 0.0f;
    if (lane == 0) lse[G.lse_index(b, h, i)] = any ? m[rr] + logf(l[rr]) : -INFINITY;
  }
#else
  __trap();  // never launched on this architecture (has_bf16_tensor_cores)
#endif
}

// Query blocks of the backward: D = rowsum(dO * O) into D [B, nh, Tq], and dq += dS K.
template <int KD>
__global__ void __launch_bounds__(kTileThreads)
    backward_query_bf16_kernel(float* dq, float* D, const float* dout, const float* q, const float* k, const float* v,
                               const float* out, const float* lse, Geometry G, float scale) {
#if LLAMA4D_BF16_TENSOR_CORES
  using Z = Sizes<KD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  bf16_t* Qs = carve.take<bf16_t>(Z::staged);
  bf16_t* dOs = carve.take<bf16_t>(Z::staged);
  bf16_t* Ks = carve.take<bf16_t>(Z::staged);
  bf16_t* Vs = carve.take<bf16_t>(Z::staged);
  float* Ss = carve.take<float>(Z::scores);   // S, then the exchange area
  float* dPs = carve.take<float>(Z::scores);  // dO V^T
  bf16_t* Sh = carve.take<bf16_t>(Z::part);   // dS in two parts
  bf16_t* Sl = carve.take<bf16_t>(Z::part);
  float* dQs = carve.take<float>(Z::acc);
  float* Ls = carve.take<float>(Z::stats);  // lse of each row
  float* Ds = carve.take<float>(Z::stats);  // D of each row
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, r0 = warp * 16;
  const int64_t i0 = int64_t(blockIdx.x) * kTile, h = blockIdx.y, b = blockIdx.z, g = h / G.group;
  const int64_t rows = G.Tq - i0 < kTile ? G.Tq - i0 : kTile;

  auto q_at = [&](int r) { return G.q_index(b, i0 + r, h); };
  stage_rows<Z::hd>(Qs, Z::ld, q, q_at, rows);
  stage_rows<Z::hd>(dOs, Z::ld, dout, q_at, rows);
  for (int e = int(threadIdx.x); e < kTile * Z::ld_o; e += kTileThreads) dQs[e] = 0.0f;
  // D_i = dO_i . O_i in fp32, each lane over d = lane, lane + 32, ..., then the warp's sum.
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr;
    float Di = 0.0f, li = -INFINITY;
    if (r < rows) {
      float partial = 0.0f;
      for (int d = lane; d < Z::hd; d += 32) partial += dout[q_at(r) + d] * out[q_at(r) + d];
      Di = warp_sum(partial);
      li = lse[G.lse_index(b, h, i0 + r)];
      if (lane == 0) D[G.lse_index(b, h, i0 + r)] = Di;
    }
    if (lane == 0) Ds[r] = Di, Ls[r] = li;
  }
  __syncthreads();  // Qs, dOs and dQs are ready, even for a block whose rows see no key

  const int64_t n_keys = G.visible_keys(i0 + rows - 1);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kTile) {
    __syncthreads();
    stage_rows<Z::hd>(Ks, Z::ld, k, [&](int r) { return G.kv_index(b, j0 + r, g); }, G.Tk - j0);
    stage_rows<Z::hd>(Vs, Z::ld, v, [&](int r) { return G.kv_index(b, j0 + r, g); }, G.Tk - j0);
    __syncthreads();
    float* Sw = Ss + r0 * kLdS;
    float* dPw = dPs + r0 * kLdS;
    scores<KD>(Sw, Qs + r0 * Z::ld, Ks, Z::ld);
    scores<KD>(dPw, dOs + r0 * Z::ld, Vs, Z::ld);
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = r0 + rr;
      const int64_t i = i0 + r;
      const int64_t seen = i < G.Tq ? G.visible_keys(i) : 0;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int jj = lane + 32 * t;
        const int64_t j = j0 + jj;
        float ds = 0.0f;
        if (j < seen && G.same_document(b, i, j)) {
          const float p = expf(Sw[rr * kLdS + jj] * scale - Ls[r]);
          ds = p * (dPw[rr * kLdS + jj] - Ds[r]) * scale;  // attention.cu's order
        }
        split(Sh, Sl, r * kLdP + jj, ds);
      }
    }
    __syncwarp();
    add_split_product<KD>(dQs + r0 * Z::ld_o, Z::ld_o, Sh + r0 * kLdP, Sl + r0 * kLdP, Ks, Z::ld, Sw, lane);
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr;
    if (r >= rows) break;
    for (int d = lane; d < Z::hd; d += 32) dq[q_at(r) + d] += dQs[r * Z::ld_o + d];
  }
#else
  __trap();  // never launched on this architecture (has_bf16_tensor_cores)
#endif
}

// Key blocks of the backward (after the query blocks: they read D): dk += dS^T Q and
// dv += P^T dO over the query blocks that can see the keys, each query head of the group in turn.
template <int KD>
__global__ void __launch_bounds__(kTileThreads)
    backward_key_bf16_kernel(float* dk, float* dv, const float* D, const float* dout, const float* q, const float* k,
                             const float* v, const float* lse, Geometry G, float scale) {
#if LLAMA4D_BF16_TENSOR_CORES
  using Z = Sizes<KD>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carver carve{smem};
  bf16_t* Ks = carve.take<bf16_t>(Z::staged);
  bf16_t* Vs = carve.take<bf16_t>(Z::staged);
  bf16_t* Qs = carve.take<bf16_t>(Z::staged);
  bf16_t* dOs = carve.take<bf16_t>(Z::staged);
  float* Ss = carve.take<float>(Z::scores);   // S^T [key][query], then the exchange area
  float* dPs = carve.take<float>(Z::scores);  // dP^T = V dO^T
  bf16_t* Ph = carve.take<bf16_t>(Z::part);   // P^T in two parts
  bf16_t* Pl = carve.take<bf16_t>(Z::part);
  bf16_t* Sh = carve.take<bf16_t>(Z::part);   // dS^T in two parts
  bf16_t* Sl = carve.take<bf16_t>(Z::part);
  float* dKs = carve.take<float>(Z::acc);
  float* dVs = carve.take<float>(Z::acc);
  float* Ls = carve.take<float>(Z::stats);  // lse of each query row of the block
  float* Ds = carve.take<float>(Z::stats);  // D of each query row of the block
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, r0 = warp * 16;
  const int64_t j0 = int64_t(blockIdx.x) * kTile, g = blockIdx.y, b = blockIdx.z;
  const int64_t keys = G.Tk - j0 < kTile ? G.Tk - j0 : kTile;

  auto kv_at = [&](int r) { return G.kv_index(b, j0 + r, g); };
  stage_rows<Z::hd>(Ks, Z::ld, k, kv_at, keys);
  stage_rows<Z::hd>(Vs, Z::ld, v, kv_at, keys);
  for (int e = int(threadIdx.x); e < kTile * Z::ld_o; e += kTileThreads) dKs[e] = dVs[e] = 0.0f;
  __syncthreads();  // Ks, Vs, dKs and dVs are ready, even for keys no query sees
  float* Sw = Ss + r0 * kLdS;
  float* dPw = dPs + r0 * kLdS;

  // Query rows before first_query(j0) see none of these keys; blocks of queries start at multiples of 64.
  for (int64_t i0 = G.first_query(j0) / kTile * kTile; i0 < G.Tq; i0 += kTile) {
    const int64_t rows = G.Tq - i0 < kTile ? G.Tq - i0 : kTile;
    for (int64_t hh = 0; hh < G.group; ++hh) {
      const int64_t h = g * G.group + hh;
      __syncthreads();  // every warp is done with the previous queries
      auto q_at = [&](int r) { return G.q_index(b, i0 + r, h); };
      stage_rows<Z::hd>(Qs, Z::ld, q, q_at, rows);
      stage_rows<Z::hd>(dOs, Z::ld, dout, q_at, rows);
      for (int r = int(threadIdx.x); r < kTile; r += kTileThreads) {
        Ls[r] = r < rows ? lse[G.lse_index(b, h, i0 + r)] : -INFINITY;
        Ds[r] = r < rows ? D[G.lse_index(b, h, i0 + r)] : 0.0f;
      }
      __syncthreads();
      scores<KD>(Sw, Ks + r0 * Z::ld, Qs, Z::ld);    // S^T[16 keys][64 queries]
      scores<KD>(dPw, Vs + r0 * Z::ld, dOs, Z::ld);  // dP^T: v_j . dO_i
      __syncwarp();
      for (int rr = 0; rr < 16; ++rr) {
        const int64_t j = j0 + r0 + rr;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int ii = lane + 32 * t;
          const int64_t i = i0 + ii;
          float p = 0.0f, ds = 0.0f;
          if (i < G.Tq && j < G.Tk && j < G.visible_keys(i) && G.same_document(b, i, j)) {
            p = expf(Sw[rr * kLdS + ii] * scale - Ls[ii]);
            ds = p * (dPw[rr * kLdS + ii] - Ds[ii]) * scale;  // attention.cu's order
          }
          split(Ph, Pl, (r0 + rr) * kLdP + ii, p);
          split(Sh, Sl, (r0 + rr) * kLdP + ii, ds);
        }
      }
      __syncwarp();
      add_split_product<KD>(dVs + r0 * Z::ld_o, Z::ld_o, Ph + r0 * kLdP, Pl + r0 * kLdP, dOs, Z::ld, Sw, lane);
      add_split_product<KD>(dKs + r0 * Z::ld_o, Z::ld_o, Sh + r0 * kLdP, Sl + r0 * kLdP, Qs, Z::ld, Sw, lane);
    }
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr;
    if (r >= keys) break;
    for (int d = lane; d < Z::hd; d += 32) {
      dk[kv_at(r) + d] += dKs[r * Z::ld_o + d];
      dv[kv_at(r) + d] += dVs[r * Z::ld_o + d];
    }
  }
#else
  __trap();  // never launched on this architecture (has_bf16_tensor_cores)
#endif
}

// Past 48 KB a kernel must ask for its dynamic shared memory, once per kernel (and device).
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, const char* op) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), op);
}

// Calls f(std::integral_constant<int, hd / 16>) for head_dim 16..128 in 16s.
template <class F>
void with_head_blocks(int64_t hd, const char* op, F&& f) {
  switch (hd / 16) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: throw InputError(std::string(op) + " (bf16): head_dim " + std::to_string(hd) + " is not 16..128 in 16s");
  }
}

void check_grid(const Geometry& G, const char* op) {
  if (G.nh > 65535 || G.B > 65535) throw InputError(std::string(op) + " (bf16): more than 65535 heads or batch items");
}

}  // namespace

bool attention_bf16_fits(int64_t hd) {
  if (hd <= 0 || hd % 16 != 0 || hd > kMaxHeadDim || !has_bf16_tensor_cores()) return false;
  // The most shared memory a block of this GPU may opt into (one GPU per process).
  static const int limit = [] {
    int device = 0, bytes = 0;
    check(cudaGetDevice(&device), "attention (bf16): cudaGetDevice");
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "attention (bf16): shared memory per block");
    return bytes;
  }();
  size_t needed = 0;
  with_head_blocks(hd, "attention", [&](auto blocks) {
    using Z = Sizes<decltype(blocks)::value>;
    needed = std::max({Z::forward, Z::query, Z::key});
  });
  return needed <= size_t(limit);
}

void launch_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const Geometry& G, float scale) {
  const char* op = "attention_forward";
  check_grid(G, op);
  with_head_blocks(G.hd, op, [&](auto blocks) {
    constexpr int KD = decltype(blocks)::value;
    constexpr size_t bytes = Sizes<KD>::forward;
    static const bool allowed = (allow_shared_memory(forward_bf16_kernel<KD>, bytes, op), true);
    (void)allowed;
    const dim3 grid(unsigned((G.Tq + kTile - 1) / kTile), unsigned(G.nh), unsigned(G.B));
    forward_bf16_kernel<KD><<<grid, kTileThreads, bytes, stream()>>>(out, lse, q, k, v, G, scale);
  });
}

void launch_attention_backward_bf16(float* dq, float* dk, float* dv, float* D, const float* dout, const float* q,
                                    const float* k, const float* v, const float* out, const float* lse,
                                    const Geometry& G, float scale) {
  const char* op = "attention_backward";
  check_grid(G, op);
  with_head_blocks(G.hd, op, [&](auto blocks) {
    constexpr int KD = decltype(blocks)::value;
    constexpr size_t query_bytes = Sizes<KD>::query, key_bytes = Sizes<KD>::key;
    static const bool allowed = (allow_shared_memory(backward_query_bf16_kernel<KD>, query_bytes, op),
                                 allow_shared_memory(backward_key_bf16_kernel<KD>, key_bytes, op), true);
    (void)allowed;
    const dim3 query_grid(unsigned((G.Tq + kTile - 1) / kTile), unsigned(G.nh), unsigned(G.B));
    backward_query_bf16_kernel<KD><<<query_grid, kTileThreads, query_bytes, stream()>>>(dq, D, dout, q, k, v, out, lse, G,
                                                                                     scale);
    const dim3 key_grid(unsigned((G.Tk + kTile - 1) / kTile), unsigned(G.nkv), unsigned(G.B));
    backward_key_bf16_kernel<KD><<<key_grid, kTileThreads, key_bytes, stream()>>>(dk, dv, D, dout, q, k, v, lse, G, scale);
  });
}

}  // namespace llama4d::cuda
