// Virtual GPUs over one real GPU: the virtual process group hands its reductions to the CUDA
// backend (ComputeBackend::collective_reduce, backends/cuda/collective_reduce.cu) and its copies
// to device_memcpy, so ranks that are threads of one process move device memory on the device.
// The reduction gives the host's bits (core/comm/reduce_kernels.h), and every collective passes
// the checks the communication layer's tests run on host memory.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/reduce_kernels.h"
#include "cuda_test_util.h"
#include "tests/comm/collective_checks.h"

namespace llama4d {
namespace {

// Contribution j's element i as the bytes of `dtype`: floats of mixed magnitudes (so the order
// of the additions shows in the bits), integers that wrap when summed.
std::vector<unsigned char> contribution(DType dtype, int j, int64_t count) {
  const int64_t elem = int64_t(dtype_size(dtype));
  std::vector<unsigned char> bytes(size_t(count * elem));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t m = (int64_t(j) * 7919 + i * 104729) % 2000003 - 1000001;
    const double f = std::ldexp(double(m), int((i * 5 + j * 3) % 41) - 20);
    unsigned char* p = bytes.data() + i * elem;
    switch (dtype) {
      case DType::f32: { const float x = float(f); std::memcpy(p, &x, 4); break; }
      case DType::f64: std::memcpy(p, &f, 8); break;
      case DType::bf16: { const bf16 x = float_to_bf16(float(f)); std::memcpy(p, &x.bits, 2); break; }
      case DType::i32: { const int32_t x = int32_t(uint32_t(INT32_MAX) - uint32_t(m)); std::memcpy(p, &x, 4); break; }
      case DType::i64: { const int64_t x = int64_t(uint64_t(INT64_MAX) - uint64_t(m)); std::memcpy(p, &x, 8); break; }
      case DType::u8: *p = uint8_t(m & 0xff); break;
      case DType::f16: break;
    }
  }
  return bytes;
}

// collective_reduce against reduce_sequence, bit for bit: every dtype and operator, with and
// without the ring's bf16 rounding at every step, with outputs that are inputs and with pageable
// host buffers among the device ones (a host sum reduced beside device tensors).
TEST(CudaCollectives, ReduceGivesTheHostBits) {
  LLAMA4D_REQUIRE_GPU();
  test::OnGpu gpu;
  const ops::ComputeBackend& backend = ops::compute_backend();
  ASSERT_NE(backend.collective_reduce, nullptr);
  const int n = 5;
  const int64_t count = 4099;  // not a multiple of any block
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::u8})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
      for (bool step_rounding : {false, true})
        for (const char* layout : {"device", "in place", "host among device"}) {
          const std::string what = std::string(dtype_name(dtype)) + " " + std::string(reduce_op_name(op)) +
                                   (step_rounding ? " step-rounded " : " ") + layout;
          const int64_t bytes = count * int64_t(dtype_size(dtype));
          std::vector<std::vector<unsigned char>> host_inputs;
          for (int j = 0; j < n; ++j) host_inputs.push_back(contribution(dtype, j, count));
          std::vector<const void*> reference_inputs;
          for (const auto& h : host_inputs) reference_inputs.push_back(h.data());
          std::vector<unsigned char> want(static_cast<size_t>(bytes));
          reduce_sequence(want.data(), reference_inputs.data(), n, count, dtype, op, n, step_rounding);

          std::vector<std::unique_ptr<test::DeviceBuffer<unsigned char>>> device;
          for (const auto& h : host_inputs) device.push_back(std::make_unique<test::DeviceBuffer<unsigned char>>(h));
          for (int o = 0; o < 3; ++o) device.push_back(std::make_unique<test::DeviceBuffer<unsigned char>>(bytes));
          std::vector<unsigned char> host_input = host_inputs[1], host_output(static_cast<size_t>(bytes));
          std::vector<const void*> inputs;
          for (int j = 0; j < n; ++j) inputs.push_back(device[size_t(j)]->data());
          std::vector<void*> outs = {device[size_t(n)]->data(), device[size_t(n + 1)]->data(),
                                     device[size_t(n + 2)]->data()};
          if (std::string(layout) == "in place") outs[0] = device[0]->data(), outs[2] = device[3]->data();
          if (std::string(layout) == "host among device") inputs[1] = host_input.data(), outs[1] = host_output.data();
          backend.collective_reduce(outs.data(), int(outs.size()), inputs.data(), n, count, dtype, op, n,
                                    step_rounding);
          for (size_t o = 0; o < outs.size(); ++o) {
            std::vector<unsigned char> got(static_cast<size_t>(bytes));
            ops::device_memcpy(got.data(), outs[o], bytes);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(bytes)), 0) << what << ": output " << o;
          }
        }
}

// Every collective of the communication layer's checks (tests/comm/collective_checks.h: exact
// values, bits in the algorithm's order, traffic) with every buffer in the GPU's memory, on
// virtual GPUs that are threads of this process.
TEST(CudaCollectives, VirtualGpusOverOneGpuPassEveryCheck) {
  LLAMA4D_REQUIRE_GPU();
  int concurrent = 0;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
  if (!concurrent) GTEST_SKIP() << "the checks read managed memory on the host while other ranks' kernels run";
  test::OnGpu gpu;
  for (ReduceAlgo algo : {ReduceAlgo::ordered, ReduceAlgo::ring})
    for (int ranks : {1, 3, 4}) {
      SCOPED_TRACE(std::string(reduce_algo_name(algo)) + " over " + std::to_string(ranks) + " ranks");
      VirtualClusterOptions o;
      o.ranks = ranks;
      o.algo = algo;
      VirtualCluster cluster(o);
      cluster.run([](ProcessGroup& pg) { test::with_backend_buffers(pg, test::check_everything); });
    }
}

}  // namespace
}  // namespace llama4d
