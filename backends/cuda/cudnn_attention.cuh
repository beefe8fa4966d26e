#pragma once
// The CUDA backend's fast attention (--kernels fast): cuDNN's fused scaled-dot-product attention,
// forward and backward, through NVIDIA's cuDNN frontend, from the plan cudnn_sdpa_plan.h makes
// (tested on the CPU). attention.cu sends it every call sdpa_refusal accepts (bf16 values, no
// document mask, query and key rows from the same position: training's causal attention) and runs
// its exact kernels on the rest; attention_unit_calls' `library` counts the calls cuDNN ran.
//
// Operands live in fp32 containers holding bf16 values, so they are copied to bf16 without
// rounding; cuDNN computes in fp32 and writes out (bf16, widened into the fp32 out), the
// log-sum-exp statistics straight into lse (fp32, [B, nh, Tq]), and dq, dk, dv (bf16, added into
// the fp32 gradients, which core/ops.h accumulates).
//
// Repeatable run to run: see cudnn_graphs.h.
#include "backends/cuda/cudnn_graphs.h"  // open_cudnn_attention, which set_kernel_mode(fast) calls
#include "core/ops.h"

namespace llama4d::cuda {

// Queue core/ops.h's attention_forward / attention_backward for a shape sdpa_refusal accepts.
void cudnn_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const ops::AttentionShape& s);
void cudnn_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const ops::AttentionShape& s);

}  // namespace llama4d::cuda
