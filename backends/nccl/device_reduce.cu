// reduce_sequence on the GPU for NCCL's collectives: the contributions lie one after another in
// one buffer, and each element is reduced as backends/cuda/reduce_sequence.cuh says, so the
// bits are the host's.
#include "backends/nccl/device_reduce.h"

#include "backends/cuda/reduce_sequence.cuh"

namespace llama4d::nccl_detail {

using namespace llama4d::cuda;  // check, launch sizes, grid-stride indices, reduce_element

namespace {

template <class T>
__global__ void reduce_sequence_kernel(T* out, const T* inputs, int64_t stride, int n, int64_t count, ReduceOp op,
                                       int group_size, bool step_rounding) {
  for (int64_t i = first_index(); i < count; i += index_stride())
    out[i] = reduce_element<T>([&](int j) { return inputs[int64_t(j) * stride + i]; }, n, op, group_size,
                               step_rounding);
}

template <class T>
void load_kernel() {
  cudaFuncAttributes a;
  check(cudaFuncGetAttributes(&a, reduce_sequence_kernel<T>), "load_reduce_kernels");
}

}  // namespace

void load_reduce_kernels() {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::u8})
    dispatch_reduce_dtype(t, [](auto tag) { load_kernel<decltype(tag)>(); });
}

void reduce_sequence_on_device(void* out, const void* inputs, int64_t stride, int n, int64_t count, DType dtype,
                               ReduceOp op, int group_size, bool step_rounding, cudaStream_t stream) {
  if (count <= 0 || n <= 0) return;
  dispatch_reduce_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_sequence_kernel<T><<<grid_for(count), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(inputs), stride, n, count, op, group_size, step_rounding);
    check(cudaGetLastError(), "reduce_sequence_on_device");
  });
}

}  // namespace llama4d::nccl_detail
