#pragma once
// One element of core/comm/reduce_kernels.h's reduce_sequence on the GPU, for the kernels that
// reduce a collective's contributions: the virtual process group's (collective_reduce.cu) and
// NCCL's (backends/nccl/device_reduce.cu). One thread walks an element's contributions in
// order, so the sum's order is the host's and so are its bits: float adds are IEEE adds on both
// sides (no multiply to fuse), avg is one correctly rounded division, bf16 accumulates in fp32
// and rounds to nearest even exactly as core/tensor/dtype.h's float_to_bf16, and integers wrap.
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "core/comm/comm_types.h"
#include "core/tensor/dtype.h"

namespace llama4d::cuda {

// The type partial results live in (reduce_kernels.cpp's AccOf).
template <class T> struct ReduceAcc { using type = T; };
template <> struct ReduceAcc<bf16> { using type = float; };

template <class T> __device__ typename ReduceAcc<T>::type reduce_load(T v) { return v; }
template <> __device__ inline float reduce_load<bf16>(bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }

template <class T> __device__ T reduce_store(typename ReduceAcc<T>::type a) { return a; }
template <> __device__ inline bf16 reduce_store<bf16>(float a) {
  return bf16{uint16_t(bf16_rounded_bits(__float_as_uint(a)) >> 16)};
}

template <class A> __device__ A reduce_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return A(U(a) + U(b));
  } else {
    return a + b;
  }
}

// ((x(0) op x(1)) op x(2)) ... op x(n-1) for one element, where x(j) reads contribution j.
// step_rounding: bf16 partial results are rounded after every step (a ring's partial sums travel
// as bf16; other types keep theirs). avg divides the sum by group_size at the end.
template <class T, class Contribution>
__device__ T reduce_element(const Contribution& x, int n, ReduceOp op, int group_size, bool step_rounding) {
  using A = typename ReduceAcc<T>::type;
  const bool round_steps = step_rounding && std::is_same_v<T, bf16>;
  A acc = reduce_load(x(0));
  for (int j = 1; j < n; ++j) {
    const A v = reduce_load(x(j));
    if (op == ReduceOp::max)
      acc = v > acc ? v : acc;
    else if (op == ReduceOp::min)
      acc = v < acc ? v : acc;
    else
      acc = reduce_add(acc, v);
    if (round_steps) acc = reduce_load(reduce_store<T>(acc));
  }
  if (op == ReduceOp::avg) acc = acc / A(group_size);
  return reduce_store<T>(acc);
}

// Calls f(T{}) with T the element type of `dtype` (the types reductions support); InputError
// for f16, which only moves.
template <class F>
void dispatch_reduce_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::u8: return f(uint8_t{});
    case DType::f16: break;
  }
  throw InputError("reductions are not supported for dtype " + std::string(dtype_name(dtype)));
}

}  // namespace llama4d::cuda
