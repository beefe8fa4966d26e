#pragma once
// cuDNN's scaled-dot-product attention graphs (cudnn_graphs.cpp, the only file that sees the cuDNN
// frontend), on bf16 device buffers laid out as the plan (cudnn_sdpa_plan.h) says. No CUDA or cuDNN
// header here; cudnn_attention.cu does the fp32 <-> bf16 copies around them.
//
// Repeatable run to run on one GPU and library version: one cuDNN handle per calling thread (one
// virtual GPU, stream cudaStreamPerThread), one graph per plan (sdpa_plan_key) built once and
// cached per thread, its execution plan the heuristic's first (HeurMode_t::A), and the backward
// built with set_deterministic_algorithm(true), which on sm_90 takes the dP-workspace engine, whose
// dQ sums are not floating-point atomics (cuDNN frontend, scaled_dot_product_flash_attention.h).
#include "backends/cuda/cudnn_sdpa_plan.h"

namespace llama4d::cuda {

// Opens cuDNN (cudnn_library.h) for the frontend, once. InputError naming cuDNN when it cannot be
// used here, or naming LLAMA4D_CUDNN when this build has no cuDNN attention.
void open_cudnn_attention();

// Queued on this thread's stream. q, o, dout, dq: bf16 [B, Tq, nh, hd]; k, v, dk, dv: bf16 with the
// plan's strides; stats: fp32 [B, nh, Tq], written by the forward and read by the backward; dq,
// dk, dv are written (not added to).
void sdpa_forward(const SdpaPlan& p, const void* q, const void* k, const void* v, void* o, float* stats);
void sdpa_backward(const SdpaPlan& p, const void* q, const void* k, const void* v, const void* o, const void* dout,
                   const float* stats, void* dq, void* dk, void* dv);

}  // namespace llama4d::cuda
