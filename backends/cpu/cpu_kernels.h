#pragma once
// The CPU backend's kernels, one per op of core/ops.h with the same signature and contract (see
// there); cpu_backend.cpp puts them in the table core/ops.h dispatches through. Each kernel file
// instantiates float and double.
#include <cstdint>

#include "core/ops.h"

namespace llama4d::cpu {

using ops::AdamWStep;
using ops::AttentionShape;

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC);
template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC);
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t BT, int64_t C);
template <class T>
void rope_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t nh, int64_t hd, int64_t pos_start);
template <class T>
void rope_backward(T* dx, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t nh, int64_t hd, int64_t pos_start);
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s);
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, const AttentionShape& s);
template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq, int64_t nh, int64_t hd);
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N);
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N);
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C);
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C);
template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t N);
template <class T>
void accumulate(T* y, const T* x, int64_t N);
template <class T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t BT, int64_t V);
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T scale, int64_t BT, int64_t V);
template <class T>
void vocab_slice_max_and_target(T* row_max, T* target_logit, const T* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t vocab_begin);
template <class T>
void vocab_slice_sum_exp(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V);
template <class T>
void cross_entropy_from_stats(T* losses, T* lse, const T* row_max, const T* sum_exp, const T* target_logit, const int32_t* targets, int64_t BT);
template <class T>
void cross_entropy_backward_slice(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T scale, int64_t BT, int64_t V, int64_t vocab_begin);
template <class T>
void scale(T* x, T a, int64_t N);
template <class T>
void fill(T* x, T value, int64_t N);
template <class T>
void copy(T* dst, const T* src, int64_t N);
template <class T>
void add_scaled(T* y, const T* x, T a, int64_t N);
template <class T>
void adamw_update(T* w, T* m, T* v, const T* g, int64_t N, const AdamWStep<T>& s);
template <class T>
void sum_squares_chunks(double* partials, const T* x, int64_t N, int64_t chunk);
template <class T>
void sum_losses(double* loss_sum, int64_t* count, const T* losses, const int32_t* targets, int64_t BT);
template <class T>
void embedding_forward_rows(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C, int64_t row_begin, int64_t rows);
template <class T>
void embedding_backward_rows(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, int64_t row_begin, int64_t rows);
template <class T>
bool all_finite(const T* x, int64_t N);

// Memory and the peak GEMM rate (device_memory.cpp, gemm_peak.cpp).
void* device_alloc(int64_t bytes);
void device_free(void* p);
void device_release_cached();
void device_memcpy(void* dst, const void* src, int64_t bytes);
double measure_peak_gemm_flops(int64_t n, double seconds);

}  // namespace llama4d::cpu
