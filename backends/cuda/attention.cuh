#pragma once
// What the CUDA backend's attention kernels share: the geometry of one call (attention.cu runs
// every call on CUDA cores; attention_bf16.cu runs calls with bf16 operands on tensor cores).
#include <cstdint>

namespace llama4d::cuda {

// Geometry of one call (core/ops.h): q/out/dout/dq [B, Tq, nh, hd]; k/v/dk/dv [B, Tk, nkv, hd]
// with batch items kv_stride elements apart; lse and D [B, nh, Tq]; document ids [B, Tq] and
// [B, Tk] in device memory, or both null.
struct Geometry {
  int64_t B, Tq, Tk, nh, nkv, hd, q_start, k_start, kv_stride, group;
  const int32_t* q_doc;
  const int32_t* k_doc;

  __device__ int64_t q_index(int64_t b, int64_t i, int64_t h) const { return ((b * Tq + i) * nh + h) * hd; }
  __device__ int64_t kv_index(int64_t b, int64_t j, int64_t g) const { return b * kv_stride + (j * nkv + g) * hd; }
  __device__ int64_t lse_index(int64_t b, int64_t h, int64_t i) const { return (b * nh + h) * Tq + i; }
  // Keys [0, n) are causally visible to query row i (k_start + j <= q_start + i), as the CPU's
  // visible_keys.
  __device__ int64_t visible_keys(int64_t i) const {
    const int64_t n = q_start + i - k_start + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
  }
  // Query rows [first, Tq) see key j causally: q_start + i >= k_start + j.
  __device__ int64_t first_query(int64_t j) const {
    const int64_t first = k_start + j - q_start;
    return first < 0 ? 0 : (first > Tq ? Tq : first);
  }
  __device__ bool same_document(int64_t b, int64_t i, int64_t j) const {
    return q_doc == nullptr || q_doc[b * Tq + i] == k_doc[b * Tk + j];
  }
};

// Whether the tensor-core kernels take this head_dim (a multiple of 16, at most 128).
bool attention_bf16_fits(int64_t hd);
// Queue a call whose q, k, v (dout, out) hold bf16 values on the tensor cores (attention_bf16.cu),
// with the outputs attention.cu's kernels define: out [B, Tq, nh, hd] and lse [B, nh, Tq]; dq,
// dk, dv accumulated, D [B, nh, Tq] scratch.
void launch_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const Geometry& G, float scale);
void launch_attention_backward_bf16(float* dq, float* dk, float* dv, float* D, const float* dout, const float* q,
                                    const float* k, const float* v, const float* out, const float* lse,
                                    const Geometry& G, float scale);

}  // namespace llama4d::cuda
