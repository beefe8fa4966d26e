// cuDNN fused attention for --kernels fast (see cudnn_attention.cuh): the fp32 <-> bf16 copies
// around cudnn_graphs.cpp's graphs.
#include "backends/cuda/cudnn_attention.cuh"

#include <cuda_bf16.h>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cudnn_graphs.h"
#include "backends/cuda/cudnn_sdpa_plan.h"

namespace llama4d::cuda {

namespace {

__global__ void narrow_kernel(__nv_bfloat16* out, const float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = __float2bfloat16_rn(x[i]);
}
__global__ void widen_kernel(float* out, const __nv_bfloat16* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = __bfloat162float(x[i]);
}
__global__ void add_widened_kernel(float* out, const __nv_bfloat16* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] += __bfloat162float(x[i]);
}

// A bf16 copy of n fp32 values that hold bf16 values (so exact), in stream-ordered scratch.
struct Bf16Copy {
  StreamScratch<__nv_bfloat16> data;
  Bf16Copy(const float* x, int64_t n, const char* what) : data(n, what) {
    if (n > 0) narrow_kernel<<<grid_for(n), kThreads, 0, stream()>>>(data.get(), x, n);
  }
  const void* get() const { return data.get(); }
};

// k, v, dk, dv: B batch items kv_batch_stride apart.
int64_t kv_elements(const ops::AttentionShape& s) {
  return s.B * (s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd);
}

}  // namespace

void cudnn_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const ops::AttentionShape& s) {
  const int64_t nq = s.B * s.Tq * s.nh * s.hd, nkv = kv_elements(s);
  const Bf16Copy q16(q, nq, "cuDNN attention: q"), k16(k, nkv, "cuDNN attention: k"), v16(v, nkv, "cuDNN attention: v");
  const StreamScratch<__nv_bfloat16> o16(nq, "cuDNN attention: out");
  sdpa_forward(plan_sdpa(s), q16.get(), k16.get(), v16.get(), o16.get(), lse);
  widen_kernel<<<grid_for(nq), kThreads, 0, stream()>>>(out, o16.get(), nq);
  finish_op("attention_forward");
}

void cudnn_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* out, const float* lse, const ops::AttentionShape& s) {
  const int64_t nq = s.B * s.Tq * s.nh * s.hd, nkv = kv_elements(s);
  const Bf16Copy q16(q, nq, "cuDNN attention: q"), k16(k, nkv, "cuDNN attention: k"), v16(v, nkv, "cuDNN attention: v");
  const Bf16Copy o16(out, nq, "cuDNN attention: out"), do16(dout, nq, "cuDNN attention: dout");
  const StreamScratch<__nv_bfloat16> dq16(nq, "cuDNN attention: dq"), dk16(nkv, "cuDNN attention: dk"),
      dv16(nkv, "cuDNN attention: dv");
  // A cache's elements past the Tk rows of each batch item are no key's: zero, so adding them
  // changes nothing.
  check(cudaMemsetAsync(dk16.get(), 0, size_t(nkv) * sizeof(__nv_bfloat16), stream()), "cuDNN attention: dk");
  check(cudaMemsetAsync(dv16.get(), 0, size_t(nkv) * sizeof(__nv_bfloat16), stream()), "cuDNN attention: dv");
  sdpa_backward(plan_sdpa(s), q16.get(), k16.get(), v16.get(), o16.get(), do16.get(), lse, dq16.get(), dk16.get(),
                dv16.get());
  add_widened_kernel<<<grid_for(nq), kThreads, 0, stream()>>>(dq, dq16.get(), nq);
  add_widened_kernel<<<grid_for(nkv), kThreads, 0, stream()>>>(dk, dk16.get(), nkv);
  add_widened_kernel<<<grid_for(nkv), kThreads, 0, stream()>>>(dv, dv16.get(), nkv);
  finish_op("attention_backward");
}

}  // namespace llama4d::cuda
