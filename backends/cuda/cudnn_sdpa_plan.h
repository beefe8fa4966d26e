#pragma once
// How one attention call of the CUDA backend becomes a cuDNN scaled-dot-product-attention graph
// (the fast kernels, --kernels fast; cudnn_attention.cu): plain C++ with no CUDA or cuDNN
// header, so the CPU tests check it (tests/ops/test_cudnn_sdpa_plan.cpp runs a plan through a
// stand-in that reads every tensor by the plan's dims and strides and holds it to the CPU
// backend's attention), and cudnn_attention.cu copies its fields into the frontend's tensor
// attributes one for one.
//
// cuDNN's SDPA (cuDNN frontend documentation, "Scaled Dot Product Attention") names each tensor by
// four logical dims in the fixed order [b, h, s, d] (batch, head, sequence, head dim) with one
// stride per dim, so any interleaving of the four in memory is described without a copy. Ours
// (core/ops.h): q/out/dq/dout [B, Tq, nh, hd], k/v/dk/dv [B, Tk, nkv, hd] with batch items
// kv_batch_stride apart (a KV cache), lse [B, nh, Tq]; cuDNN's softmax statistics ("Stats",
// the natural-log log-sum-exp of each scaled score row, fp32) are [b, h, s_q, 1].
// Grouped-query attention is cuDNN's h_q a multiple of h_k: query head h reads key head
// h / (h_q / h_k), the rule core/ops.h states.
#include <cmath>
#include <cstdint>
#include <string>

#include "core/ops.h"

namespace llama4d::cuda {

// One tensor as the frontend's Tensor_attributes describes it: set_dim and set_stride, [b, h, s, d].
struct SdpaTensor {
  int64_t dim[4];
  int64_t stride[4];
};

struct SdpaPlan {
  SdpaTensor q, k, v, o, stats;  // dq, dk, dv, dout take q, k, v, o's descriptors
  float scale;                   // attn_scale: 1 / sqrt(hd), the CPU backend's
  bool causal_top_left;          // key j visible to query i iff j <= i (set_causal_mask)
};

// Why cuDNN cannot run this call, or "" when it can. The cases it refuses run the exact kernel,
// and bench --profile counts which ran (attention_unit_calls' `library`):
//   - values not bf16 (GemmOperands::as_stored): cuDNN's SDPA takes fp16/bf16 operands, and an fp32
//     value rounded to bf16 would change the math;
//   - document ids: a per-row mask cuDNN's causal SDPA does not take;
//   - q_start != k_start (KV-cache decoding, context-parallel chunks and the ring's blocks): the
//     causal diagonal is then offset, which this plan does not describe;
//   - head_dim not a multiple of 8 or above 128: the range cuDNN's fused flash-attention kernels
//     cover on sm_90 (cuDNN frontend documentation, SDPA support matrix).
inline std::string sdpa_refusal(const ops::AttentionShape& s) {
  if (s.operands != ops::GemmOperands::bf16) return "operands are not bf16 values";
  if (s.q_doc != nullptr || s.k_doc != nullptr) return "document mask";
  if (s.q_start != s.k_start) return "query and key rows start at different positions";
  if (s.hd % 8 != 0 || s.hd > 128) return "head_dim " + std::to_string(s.hd) + " is not a multiple of 8 up to 128";
  return "";
}

// The plan of a call sdpa_refusal accepts (core/ops.h check_attention_shape has checked the shape).
inline SdpaPlan plan_sdpa(const ops::AttentionShape& s) {
  const int64_t kv_batch = s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd;
  SdpaPlan p{};
  // q[B, Tq, nh, hd]: element (b, h, i, d) at ((b Tq + i) nh + h) hd + d.
  p.q = {{s.B, s.nh, s.Tq, s.hd}, {s.Tq * s.nh * s.hd, s.hd, s.nh * s.hd, 1}};
  // k, v [B, Tk, nkv, hd], batch items kv_batch apart: (b, g, j, d) at b kv_batch + (j nkv + g) hd + d.
  p.k = {{s.B, s.nkv, s.Tk, s.hd}, {kv_batch, s.hd, s.nkv * s.hd, 1}};
  p.v = p.k;
  p.o = p.q;
  // lse[B, nh, Tq]: (b, h, i, 0) at (b nh + h) Tq + i.
  p.stats = {{s.B, s.nh, s.Tq, 1}, {s.nh * s.Tq, s.Tq, 1, 1}};
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  p.causal_top_left = true;
  return p;
}

// The key of cudnn_attention.cu's graph cache: everything a graph is built from (the pointers
// are given at execution), and which of forward or backward.
inline std::string sdpa_plan_key(const SdpaPlan& p, bool backward) {
  std::string key = backward ? "bwd" : "fwd";
  for (const SdpaTensor* t : {&p.q, &p.k, &p.v, &p.o, &p.stats}) {
    key += ":";
    for (int i = 0; i < 4; ++i) key += std::to_string(t->dim[i]) + ",";
    key += "/";
    for (int i = 0; i < 4; ++i) key += std::to_string(t->stride[i]) + ",";
  }
  return key + (p.causal_top_left ? "causal" : "full");
}

}  // namespace llama4d::cuda
