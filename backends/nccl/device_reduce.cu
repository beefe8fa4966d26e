// reduce_sequence on the GPU. One thread per element walks the contributions in order, so the
// sum's order is the host kernel's and so are its bits: float adds are IEEE adds on both sides
// (no multiply to fuse), avg is one correctly rounded division, bf16 rounds to nearest even
// exactly as core/tensor/dtype.h's float_to_bf16, and integers wrap.
#include "backends/nccl/device_reduce.h"

#include <string>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "core/error.h"

namespace llama4d::nccl_detail {

using namespace llama4d::cuda;  // check, launch sizes, grid-stride indices (cuda_common.cuh)

namespace {

// The type partial results live in (reduce_kernels.cpp's AccOf).
template <class T> struct Acc { using type = T; };
template <> struct Acc<bf16> { using type = float; };

template <class T> __device__ typename Acc<T>::type load(T v) { return v; }
template <> __device__ float load<bf16>(bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }

template <class T> __device__ T store(typename Acc<T>::type a) { return a; }
template <> __device__ bf16 store<bf16>(float a) { return bf16{uint16_t(bf16_rounded_bits(__float_as_uint(a)) >> 16)}; }

template <class A> __device__ A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return A(U(a) + U(b));
  } else {
    return a + b;
  }
}

template <class T>
__global__ void reduce_sequence_kernel(T* out, const T* inputs, int64_t stride, int n, int64_t count, ReduceOp op,
                                       int group_size, bool round_steps) {
  using A = typename Acc<T>::type;
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    A acc = load(inputs[i]);
    for (int j = 1; j < n; ++j) {
      const A x = load(inputs[int64_t(j) * stride + i]);
      if (op == ReduceOp::max)
        acc = x > acc ? x : acc;
      else if (op == ReduceOp::min)
        acc = x < acc ? x : acc;
      else
        acc = add(acc, x);
      if (round_steps) acc = load(store<T>(acc));
    }
    if (op == ReduceOp::avg) acc = acc / A(group_size);
    out[i] = store<T>(acc);
  }
}

template <class T>
void launch(void* out, const void* inputs, int64_t stride, int n, int64_t count, ReduceOp op, int group_size,
            bool step_rounding, cudaStream_t stream) {
  const bool round_steps = step_rounding && std::is_same_v<T, bf16>;
  reduce_sequence_kernel<T><<<grid_for(count), kThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(inputs), stride, n, count, op, group_size, round_steps);
  check(cudaGetLastError(), "reduce_sequence_on_device");
}

}  // namespace

void load_reduce_kernels() {
  cudaFuncAttributes a;
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<float>), "load_reduce_kernels");
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<double>), "load_reduce_kernels");
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<bf16>), "load_reduce_kernels");
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<int32_t>), "load_reduce_kernels");
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<int64_t>), "load_reduce_kernels");
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<uint8_t>), "load_reduce_kernels");
}

void reduce_sequence_on_device(void* out, const void* inputs, int64_t stride, int n, int64_t count, DType dtype,
                               ReduceOp op, int group_size, bool step_rounding, cudaStream_t stream) {
  if (count <= 0 || n <= 0) return;
  switch (dtype) {
    case DType::f32: return launch<float>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::f64: return launch<double>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::bf16: return launch<bf16>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::i32: return launch<int32_t>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::i64: return launch<int64_t>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::u8: return launch<uint8_t>(out, inputs, stride, n, count, op, group_size, step_rounding, stream);
    case DType::f16: break;
  }
  throw InputError("reductions are not supported for dtype " + std::string(dtype_name(dtype)));
}

}  // namespace llama4d::nccl_detail
