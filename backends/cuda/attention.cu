// Causal grouped-query attention on the GPU (core/ops.h attention_forward / attention_backward /
// attention_merge), with the semantics of backends/cpu/attention.cpp: flash-attention style
// (Dao et al. 2022), the forward saves only each softmax row's log-sum-exp and the backward
// recomputes the probabilities from it. Everything is computed in T, as on the CPU.
//
// Calls with bf16 operands (AttentionShape::operands) and a head_dim of 16..128 in 16s run on
// tensor cores instead (attention_bf16.cu). With --kernels fast, the calls cuDNN can express
// (cudnn_sdpa_plan.h's sdpa_refusal) run on cuDNN's fused attention (cudnn_attention.cu).
//
// Design: one warp per row, no atomics, deterministic.
// - A row is a query row (b, h, i) in the forward and in dq, or a key row (b, g, j) of KV head g
//   in dk/dv. Lane l holds elements d = l, l + 32, ... of the row's vectors in registers (Slots
//   per lane, head_dim up to kMaxHeadDim = 256). A dot product is summed across the lanes by an
//   XOR butterfly, which leaves the same bits in every lane (each step adds the same two numbers,
//   in either order), so the lanes agree on every score and every branch.
// - The forward walks the row's visible keys in ascending order with an online softmax (running
//   max m, running sum, output accumulator rescaled when m grows), then writes
//   out = acc / sum and lse = m + log(sum). A row that sees no key gets out = 0, lse = -inf.
// - The backward (D_i = dO_i . O_i, p_ij = exp(scale q_i.k_j - lse_i), dS_ij = p_ij (dO_i.v_j -
//   D_i) scale) runs two kernels. Query warps: D_i into a scratch [B, nh, Tq], and
//   dq_i += sum_j dS_ij k_j over the visible keys. Key warps (after, in stream order):
//   dk_j += sum dS_ij q_i and dv_j += sum p_ij dO_i over the query rows that see key j
//   (ascending) and, for each, the query heads of KV head g's group (ascending).
// - Each output element is written by the one warp that owns its row, summing in a fixed
//   order that does not depend on the grid size: a run repeats bit for bit.
// - attention_merge: one warp per row (b, i, h), the formulas and -inf cases of core/ops.h.
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cudnn_attention.cuh"
#include "backends/cuda/cudnn_sdpa_plan.h"
#include "backends/cuda/lt_gemm.cuh"
#include "core/error.h"

namespace llama4d::cuda {
namespace {

UnitCallCounters attention_calls;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;                    // 128 threads per block
constexpr int kBlockThreads = kWarp * kWarpsPerBlock;
constexpr int kMaxSlots = 8;                         // registers per lane and row vector
constexpr int64_t kMaxHeadDim = int64_t(kWarp) * kMaxSlots;  // 256 (Llama 3 uses 128)

// CUDA's exp/log in the precision of T (expf for float, exp for double).
__device__ inline float dev_exp(float x) { return expf(x); }
__device__ inline double dev_exp(double x) { return ::exp(x); }
__device__ inline float dev_log(float x) { return logf(x); }
__device__ inline double dev_log(double x) { return ::log(x); }
__device__ inline float dev_log1p(float x) { return log1pf(x); }
__device__ inline double dev_log1p(double x) { return ::log1p(x); }

template <class T>
__device__ inline T neg_inf() {
  return T(-INFINITY);
}

__device__ inline int lane_index() { return int(threadIdx.x % kWarp); }
// This warp's index over the whole grid, and the grid's warp count (the grid-stride step).
__device__ inline int64_t warp_index() { return first_index() / kWarp; }
__device__ inline int64_t warp_count() { return index_stride() / kWarp; }

// Blocks for a grid-stride loop with one warp per row.
unsigned warp_grid(int64_t rows) { return grid_for(rows * kWarp, kBlockThreads); }

// Sum over the warp's lanes; every lane gets the same bits.
template <class T>
__device__ T warp_sum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A row vector [hd] spread over the warp: slot t of lane l is element d = l + 32 t (0 past hd).
template <class T, int S>
__device__ void load_row(T (&dst)[S], const T* row, int64_t hd, int lane) {
#pragma unroll
  for (int t = 0; t < S; ++t) {
    const int64_t d = lane + int64_t(kWarp) * t;
    dst[t] = d < hd ? row[d] : T(0);
  }
}

// a . row[hd], the same in every lane.
template <class T, int S>
__device__ T warp_dot(const T (&a)[S], const T* row, int64_t hd, int lane) {
  T partial = T(0);
#pragma unroll
  for (int t = 0; t < S; ++t) {
    const int64_t d = lane + int64_t(kWarp) * t;
    if (d < hd) partial += a[t] * row[d];
  }
  return warp_sum(partial);
}

// acc += c * row[hd].
template <class T, int S>
__device__ void add_scaled_row(T (&acc)[S], T c, const T* row, int64_t hd, int lane) {
#pragma unroll
  for (int t = 0; t < S; ++t) {
    const int64_t d = lane + int64_t(kWarp) * t;
    if (d < hd) acc[t] += c * row[d];
  }
}

// dst[hd] += acc (the backward accumulates into its gradients, core/ops.h).
template <class T, int S>
__device__ void add_into_row(T* dst, const T (&acc)[S], int64_t hd, int lane) {
#pragma unroll
  for (int t = 0; t < S; ++t) {
    const int64_t d = lane + int64_t(kWarp) * t;
    if (d < hd) dst[d] += acc[t];
  }
}

// out, lse of every query row (b, h, i); rows are numbered with i fastest, so the warps of a
// block share (b, h) and read the same keys.
template <class T, int S>
__global__ void forward_kernel(T* out, T* lse, const T* q, const T* k, const T* v, Geometry G, T scale) {
  const int lane = lane_index();
  const int64_t rows = G.B * G.nh * G.Tq;
  for (int64_t row = warp_index(); row < rows; row += warp_count()) {
    const int64_t i = row % G.Tq, h = (row / G.Tq) % G.nh, b = row / (G.Tq * G.nh), g = h / G.group;
    T qv[S], acc[S];
    load_row(qv, q + G.q_index(b, i, h), G.hd, lane);
#pragma unroll
    for (int t = 0; t < S; ++t) acc[t] = T(0);
    // m is the running max of the scaled scores, as the CPU's m = max(q.k) * scale (scale > 0,
    // so scaling before or after the max gives the same number); sum and acc are relative to it.
    T m = neg_inf<T>(), sum = T(0);
    bool any = false;
    const int64_t n = G.visible_keys(i);
    for (int64_t j = 0; j < n; ++j) {
      if (!G.same_document(b, i, j)) continue;  // another document: probability exactly 0
      const T s = scale * warp_dot(qv, k + G.kv_index(b, j, g), G.hd, lane);
      if (s > m) {  // every lane has the same s and m: the branch is warp-uniform
        const T c = dev_exp(m - s);  // 0 for the first key (m = -inf): acc and sum are 0 then
        sum *= c;
#pragma unroll
        for (int t = 0; t < S; ++t) acc[t] *= c;
        m = s;
      }
      const T p = dev_exp(s - m);
      sum += p;
      add_scaled_row(acc, p, v + G.kv_index(b, j, g), G.hd, lane);
      any = true;
    }
    T* o = out + G.q_index(b, i, h);
    // No visible key (causally or in the row's document): out = 0, lse = -inf (core/ops.h).
    const T inv_sum = any ? T(1) / sum : T(0);
#pragma unroll
    for (int t = 0; t < S; ++t) {
      const int64_t d = lane + int64_t(kWarp) * t;
      if (d < G.hd) o[d] = any ? acc[t] * inv_sum : T(0);
    }
    if (lane == 0) lse[G.lse_index(b, h, i)] = any ? m + dev_log(sum) : neg_inf<T>();
  }
}

// Query warps of the backward: D[b, h, i] = dO_i . O_i, and dq_i += sum over the visible keys j
// of dS_ij k_j. A row with no visible key loops over nothing: dq_i += 0, as on the CPU.
template <class T, int S>
__global__ void backward_query_kernel(T* dq, T* D, const T* dout, const T* q, const T* k, const T* v,
                                      const T* out, const T* lse, Geometry G, T scale) {
  const int lane = lane_index();
  const int64_t rows = G.B * G.nh * G.Tq;
  for (int64_t row = warp_index(); row < rows; row += warp_count()) {
    const int64_t i = row % G.Tq, h = (row / G.Tq) % G.nh, b = row / (G.Tq * G.nh), g = h / G.group;
    const int64_t at = G.q_index(b, i, h);
    T qv[S], dov[S], acc[S];
    load_row(qv, q + at, G.hd, lane);
    load_row(dov, dout + at, G.hd, lane);
#pragma unroll
    for (int t = 0; t < S; ++t) acc[t] = T(0);
    const T Di = warp_dot(dov, out + at, G.hd, lane);
    if (lane == 0) D[G.lse_index(b, h, i)] = Di;
    const T l = lse[G.lse_index(b, h, i)];
    const int64_t n = G.visible_keys(i);
    for (int64_t j = 0; j < n; ++j) {
      if (!G.same_document(b, i, j)) continue;  // p = 0: no share
      const T* kr = k + G.kv_index(b, j, g);
      const T p = dev_exp(scale * warp_dot(qv, kr, G.hd, lane) - l);
      // The CPU's order: p * (dP - D) * scale.
      const T ds = p * (warp_dot(dov, v + G.kv_index(b, j, g), G.hd, lane) - Di) * scale;
      add_scaled_row(acc, ds, kr, G.hd, lane);
    }
    add_into_row(dq + at, acc, G.hd, lane);
  }
}

// Key warps of the backward, one per key row (b, g, j) of KV head g: dk_j += sum dS_ij q_i and
// dv_j += sum p_ij dO_i over the query rows i that see key j (ascending) and, for each, the
// group's query heads h = g * group + hh (ascending hh; their vectors are adjacent in memory).
// Needs D from backward_query_kernel, launched before it on the same stream.
template <class T, int S>
__global__ void backward_key_kernel(T* dk, T* dv, const T* D, const T* dout, const T* q, const T* k,
                                    const T* v, const T* lse, Geometry G, T scale) {
  const int lane = lane_index();
  const int64_t rows = G.B * G.nkv * G.Tk;
  for (int64_t row = warp_index(); row < rows; row += warp_count()) {
    const int64_t j = row % G.Tk, g = (row / G.Tk) % G.nkv, b = row / (G.Tk * G.nkv);
    const int64_t at = G.kv_index(b, j, g);
    T kr[S], vr[S], dk_acc[S], dv_acc[S];
    load_row(kr, k + at, G.hd, lane);
    load_row(vr, v + at, G.hd, lane);
#pragma unroll
    for (int t = 0; t < S; ++t) dk_acc[t] = dv_acc[t] = T(0);
    for (int64_t i = G.first_query(j); i < G.Tq; ++i) {
      if (!G.same_document(b, i, j)) continue;
      for (int64_t hh = 0; hh < G.group; ++hh) {
        const int64_t h = g * G.group + hh;
        const T* qr = q + G.q_index(b, i, h);
        const T* dor = dout + G.q_index(b, i, h);
        const int64_t r = G.lse_index(b, h, i);
        const T p = dev_exp(scale * warp_dot(kr, qr, G.hd, lane) - lse[r]);
        const T ds = p * (warp_dot(vr, dor, G.hd, lane) - D[r]) * scale;
        add_scaled_row(dk_acc, ds, qr, G.hd, lane);
        add_scaled_row(dv_acc, p, dor, G.hd, lane);
      }
    }
    add_into_row(dk + at, dk_acc, G.hd, lane);
    add_into_row(dv + at, dv_acc, G.hd, lane);
  }
}

// One warp per row (b, i, h) of out [B, Tq, nh, hd] (row index (b * Tq + i) * nh + h); its lse
// sits at (b * nh + h) * Tq + i. core/ops.h's formulas; a side with lse = -inf adds nothing and
// the other side's row is kept or copied bit for bit.
template <class T>
__global__ void merge_kernel(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq,
                             int64_t nh, int64_t hd) {
  const int lane = lane_index();
  const int64_t rows = B * Tq * nh;
  for (int64_t row = warp_index(); row < rows; row += warp_count()) {
    const int64_t h = row % nh, i = (row / nh) % Tq, b = row / (nh * Tq);
    const int64_t l = (b * nh + h) * Tq + i;
    const T mine = lse[l], theirs = part_lse[l];
    __syncwarp();  // every lane has read lse[l] before lane 0 overwrites it below
    T* o = out + row * hd;
    const T* part = part_out + row * hd;
    if (theirs == neg_inf<T>()) continue;  // the part saw no key: the row stays as it is
    if (mine == neg_inf<T>()) {            // only the part saw keys: its row, bit for bit
      for (int64_t d = lane; d < hd; d += kWarp) o[d] = part[d];
      if (lane == 0) lse[l] = theirs;
      continue;
    }
    const T hi = mine < theirs ? theirs : mine, lo = mine < theirs ? mine : theirs;
    const T merged = hi + dev_log1p(dev_exp(lo - hi));  // lo - hi <= 0: exp never overflows
    const T a = dev_exp(mine - merged), c = dev_exp(theirs - merged);
    for (int64_t d = lane; d < hd; d += kWarp) o[d] = o[d] * a + part[d] * c;
    if (lane == 0) lse[l] = merged;
  }
}

// Document ids [n] on the device: core/ops.h lets them be host memory, so they are copied
// (cudaMemcpyDefault takes host, device or managed memory). Null stays null. A copy from host
// memory is waited for, even when the op's kernels are only queued (QueuedOps): the caller may
// reuse its ids as soon as the op returns.
class DeviceIds {
 public:
  DeviceIds(const int32_t* ids, int64_t n, const char* what) : buf_(ids != nullptr ? n : 0, what) {
    if (buf_.get() == nullptr) return;
    check(cudaMemcpyAsync(buf_.get(), ids, size_t(n) * sizeof(int32_t), cudaMemcpyDefault, stream()), what);
    if (is_host_memory(ids)) check(cudaStreamSynchronize(stream()), what);
  }
  const int32_t* get() const { return buf_.get(); }

 private:
  StreamScratch<int32_t> buf_;
};

// The one limit of these kernels (the CPU has none): a row vector must fit kMaxSlots registers
// per lane.
void check_head_dim(int64_t hd, const char* op) {
  if (hd > kMaxHeadDim)
    throw InputError(std::string(op) + " on cuda: head_dim " + std::to_string(hd) + " is above the " +
                     std::to_string(kMaxHeadDim) + " its kernels hold in registers");
}

Geometry geometry(const AttentionShape& s, const DeviceIds& q_doc, const DeviceIds& k_doc) {
  const int64_t kv_stride = s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd;
  return {s.B, s.Tq, s.Tk, s.nh, s.nkv, s.hd, s.q_start, s.k_start, kv_stride, s.nh / s.nkv,
          q_doc.get(), k_doc.get()};
}

// The CPU's scale, computed the same way on the host: 1 / sqrt(hd) in T.
template <class T>
T softmax_scale(int64_t hd) {
  return T(1) / std::sqrt(static_cast<T>(hd));
}

// Calls launch(std::integral_constant<int, S>) with the fewest slots per lane that hold hd.
template <class F>
void with_slots(int64_t hd, F&& launch) {
  if (hd <= 1 * kWarp) {
    launch(std::integral_constant<int, 1>{});
  } else if (hd <= 2 * kWarp) {
    launch(std::integral_constant<int, 2>{});
  } else if (hd <= 4 * kWarp) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, kMaxSlots>{});
  }
}

}  // namespace

UnitCalls attention_unit_calls() {
  return {attention_calls.tensor_cores.load(), attention_calls.cuda_cores.load(), attention_calls.library.load()};
}

// The shape was checked by the forwarder (core/ops.h check_attention_shape).
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s) {
  check_head_dim(s.hd, "attention_forward");
  const int64_t rows = s.B * s.nh * s.Tq;
  if (rows == 0) return;
  const DeviceIds q_doc(s.q_doc, s.B * s.Tq, "attention_forward: q_doc");
  const DeviceIds k_doc(s.k_doc, s.B * s.Tk, "attention_forward: k_doc");
  const Geometry G = geometry(s, q_doc, k_doc);
  const T scale = softmax_scale<T>(s.hd);
  if constexpr (std::is_same_v<T, float>) {
    if (kernel_mode() == ops::KernelMode::fast && sdpa_refusal(s).empty()) {  // cuDNN (cudnn_attention.cu)
      ++attention_calls.library;
      cudnn_attention_forward(out, lse, q, k, v, s);
      return;
    }
    if (s.operands == GemmOperands::bf16 && attention_bf16_fits(s.hd)) {  // tensor cores (attention_bf16.cu)
      ++attention_calls.tensor_cores;
      launch_attention_forward_bf16(out, lse, q, k, v, G, scale);
      finish_op("attention_forward");
      return;
    }
  }
  ++attention_calls.cuda_cores;
  with_slots(s.hd, [&](auto slots) {
    constexpr int S = decltype(slots)::value;
    forward_kernel<T, S><<<warp_grid(rows), kBlockThreads, 0, stream()>>>(out, lse, q, k, v, G, scale);
  });
  finish_op("attention_forward");
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionShape& s) {
  check_head_dim(s.hd, "attention_backward");
  const int64_t rows = s.B * s.nh * s.Tq, key_rows = s.B * s.nkv * s.Tk;
  if (rows == 0 || key_rows == 0) return;  // no (query, key) pair: nothing to add
  const DeviceIds q_doc(s.q_doc, s.B * s.Tq, "attention_backward: q_doc");
  const DeviceIds k_doc(s.k_doc, s.B * s.Tk, "attention_backward: k_doc");
  const Geometry G = geometry(s, q_doc, k_doc);
  const T scale = softmax_scale<T>(s.hd);
  if constexpr (std::is_same_v<T, float>) {
    if (kernel_mode() == ops::KernelMode::fast && sdpa_refusal(s).empty()) {  // cuDNN (cudnn_attention.cu)
      ++attention_calls.library;
      cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
      return;
    }
  }
  const StreamScratch<T> D(rows, "attention_backward: D");  // [B, nh, Tq]
  if constexpr (std::is_same_v<T, float>) {
    if (s.operands == GemmOperands::bf16 && attention_bf16_fits(s.hd)) {  // tensor cores (attention_bf16.cu)
      ++attention_calls.tensor_cores;
      launch_attention_backward_bf16(dq, dk, dv, D.get(), dout, q, k, v, out, lse, G, scale);
      finish_op("attention_backward");
      return;
    }
  }
  ++attention_calls.cuda_cores;
  with_slots(s.hd, [&](auto slots) {
    constexpr int S = decltype(slots)::value;
    backward_query_kernel<T, S><<<warp_grid(rows), kBlockThreads, 0, stream()>>>(dq, D.get(), dout, q, k, v, out,
                                                                                  lse, G, scale);
    backward_key_kernel<T, S><<<warp_grid(key_rows), kBlockThreads, 0, stream()>>>(dk, dv, D.get(), dout, q, k, v,
                                                                                    lse, G, scale);
  });
  finish_op("attention_backward");
}

template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq, int64_t nh,
                     int64_t hd) {
  const int64_t rows = B * Tq * nh;
  if (rows == 0) return;
  merge_kernel<T><<<warp_grid(rows), kBlockThreads, 0, stream()>>>(out, lse, part_out, part_lse, B, Tq, nh, hd);
  finish_op("attention_merge");
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const AttentionShape&);
template void attention_merge<float>(float*, float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_merge<double>(double*, double*, const double*, const double*, int64_t, int64_t, int64_t,
                                      int64_t);

}  // namespace llama4d::cuda
