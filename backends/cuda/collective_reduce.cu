// The virtual process group's reductions on the GPU (ComputeBackend::collective_reduce,
// core/ops.h). Virtual GPUs over one real GPU are threads of one process whose buffers all lie
// in this GPU's memory, so each member reduces its share of a collective here, device to
// device, instead of pulling the pages to the host. One thread per element reduces that
// element's contributions in order (reduce_sequence.cuh, the host's bits) and writes the result
// to every output, so an all-reduce's reduce-scatter and all-gather are one pass.
#include <utility>
#include <vector>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/reduce_sequence.cuh"

namespace llama4d::cuda {

namespace {

// outs[o][i] = reduction of inputs[0..n)[i], for every o < n_outs. Thread i reads all of element
// i's contributions before it writes any output, so an output may be an input.
template <class T>
__global__ void collective_reduce_kernel(T* const* outs, int n_outs, const T* const* inputs, int n, int64_t count,
                                         ReduceOp op, int group_size, bool step_rounding) {
  for (int64_t i = first_index(); i < count; i += index_stride()) {
    const T r = reduce_element<T>([&](int j) { return inputs[j][i]; }, n, op, group_size, step_rounding);
    for (int o = 0; o < n_outs; ++o) outs[o][i] = r;
  }
}

// The address a kernel reads p at: p itself for device and managed memory, the mapped address
// for pinned host memory; null for pageable host memory (a std::vector of the host's, such as a
// loss summed over ranks), which a kernel may not read.
void* kernel_address(const void* p) {
  const cudaPointerAttributes a = pointer_attributes(p, "collective_reduce (cudaPointerGetAttributes)");
  return a.type == cudaMemoryTypeUnregistered ? nullptr : a.devicePointer;
}

// The call's device scratch (staged host buffers, the pointer tables), returned to the cache
// once the stream is idle, on every path.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    cudaStreamSynchronize(stream());  // an error here is the launch's, reported by finish_op_for_host
    for (void* p : blocks_) device_free(p);
  }
  void* take(int64_t bytes) {
    blocks_.push_back(device_alloc(bytes));
    return blocks_.back();
  }

 private:
  std::vector<void*> blocks_;
};

template <class T>
void reduce_on_device(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, ReduceOp op,
                      int group_size, bool step_rounding) {
  const int64_t bytes = count * int64_t(sizeof(T));
  Scratch scratch;
  // [inputs..., outputs...] as the kernel reads them; pageable host buffers are staged.
  std::vector<void*> table(size_t(n + n_outs));
  std::vector<std::pair<void*, const void*>> copy_back;  // (pageable output, its staging)
  for (int j = 0; j < n; ++j) {
    table[size_t(j)] = kernel_address(inputs[j]);
    if (table[size_t(j)]) continue;
    void* staged = scratch.take(bytes);
    check(cudaMemcpyAsync(staged, inputs[j], size_t(bytes), cudaMemcpyHostToDevice, stream()), "collective_reduce");
    table[size_t(j)] = staged;
  }
  for (int o = 0; o < n_outs; ++o) {
    table[size_t(n + o)] = kernel_address(outs[o]);
    if (table[size_t(n + o)]) continue;
    void* staged = scratch.take(bytes);
    copy_back.emplace_back(outs[o], staged);
    table[size_t(n + o)] = staged;
  }
  auto* device_table = static_cast<void**>(scratch.take(int64_t(table.size() * sizeof(void*))));
  check(cudaMemcpyAsync(device_table, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice, stream()),
        "collective_reduce");
  collective_reduce_kernel<T><<<grid_for(count), kThreads, 0, stream()>>>(
      reinterpret_cast<T* const*>(device_table + n), n_outs, reinterpret_cast<const T* const*>(device_table), n,
      count, op, group_size, step_rounding);
  check(cudaGetLastError(), "collective_reduce");
  for (const auto& [host, staged] : copy_back)
    check(cudaMemcpyAsync(host, staged, size_t(bytes), cudaMemcpyDeviceToHost, stream()), "collective_reduce");
  finish_op_for_host("collective_reduce");  // other ranks read the outputs once it returns
}

}  // namespace

void collective_reduce(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, DType dtype,
                       ReduceOp op, int group_size, bool step_rounding) {
  if (count < 0 || n < 1 || n_outs < 1)
    throw InputError("collective_reduce: needs count >= 0 and at least one input and one output (count " +
                     std::to_string(count) + ", " + std::to_string(n) + " inputs, " + std::to_string(n_outs) +
                     " outputs)");
  if (count == 0) return;
  dispatch_reduce_dtype(dtype, [&](auto tag) {
    reduce_on_device<decltype(tag)>(outs, n_outs, inputs, n, count, op, group_size, step_rounding);
  });
}

}  // namespace llama4d::cuda
