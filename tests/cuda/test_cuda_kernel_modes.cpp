// The CUDA backend's two kernel modes (core/ops.h's KernelMode, --kernels). Without a GPU: how
// cuBLASLt is opened for the fast one (backends/cuda/cublaslt_library.h), which needs no device,
// and its refusals when the library is missing, incomplete or too old. With a GPU: the fast
// mode's products (cuBLASLt, backends/cuda/lt_gemm.cu) against the CPU backend within the
// backend's fp32 and fp64 tolerances, on cuBLASLt (the call tally says so), repeating their bits
// run to run.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backends/cuda/cublaslt_library.h"
#include "backends/cuda/lt_gemm.cuh"
#include "core/error.h"
#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {
namespace kernel_modes {

using test::DeviceBuffer;
using test::OnGpu;

std::string refusal(const std::vector<std::string>& candidates) {
  try {
    cuda::open_cublaslt(candidates);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CublasLtLibrary, AMissingLibraryIsRefusedByName) {
  const std::string why = refusal({"libllama4d-no-such-cublaslt.so.99"});
  EXPECT_NE(why.find("--kernels fast needs NVIDIA's cuBLASLt"), std::string::npos) << why;
  EXPECT_NE(why.find("libllama4d-no-such-cublaslt.so.99"), std::string::npos) << why;
  EXPECT_NE(why.find("--kernels exact"), std::string::npos) << why;  // what to do instead
}

// A file that loads but is not cuBLASLt (the C math library): refused naming the calls it lacks.
TEST(CublasLtLibrary, ALibraryWithoutItsCallsIsRefused) {
  const std::string why = refusal({"libm.so.6"});
  EXPECT_NE(why.find("lacks cublasLtGetVersion, cublasLtCreate"), std::string::npos) << why;
}

TEST(CublasLtLibrary, AnOlderVersionIsRefusedNamingBoth) {
  try {
    cuda::check_cublaslt_version(110802, "/opt/old/libcublasLt.so.11");
    ADD_FAILURE() << "cuBLASLt 11.8.2 was accepted";
  } catch (const InputError& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("needs cuBLASLt 12.0.0 or newer; /opt/old/libcublasLt.so.11 is cuBLASLt 11.8.2"),
              std::string::npos)
        << why;
  }
  EXPECT_NO_THROW(cuda::check_cublaslt_version(cuda::kMinCublasLtVersion, "x"));
  EXPECT_EQ(cuda::cublaslt_version_text(130100), "13.1.0");
}

// Where the toolkit's cuBLASLt is on the loader's path (the CUDA images this project builds in),
// it opens without a GPU and reports a version at least the minimum.
TEST(CublasLtLibrary, TheInstalledOneOpens) {
  cuda::CublasLtLibrary lt;
  try {
    lt = cuda::open_cublaslt(cuda::kCublasLtCandidates);
  } catch (const InputError& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_GE(lt.version, cuda::kMinCublasLtVersion) << lt.path;
  EXPECT_NE(lt.path.find("libcublasLt"), std::string::npos) << lt.path;
}

// Fast kernels for the guard's lifetime (inside an OnGpu scope), exact after.
struct FastKernels {
  FastKernels() { ops::compute_backend().set_kernel_mode(ops::KernelMode::fast); }
  ~FastKernels() { ops::compute_backend().set_kernel_mode(ops::KernelMode::exact); }
};

struct Product {
  std::vector<float> y, dx, dw;
};

template <class T>
struct Inputs {
  int64_t BT, C, OC;
  std::vector<T> x, w, dy, dw0;
};

// The three products on the active backend: y = x w^T, dx = dy w, dw = dw0 + dy^T x.
template <class T>
std::vector<std::vector<T>> products(const Inputs<T>& in, ops::GemmOperands operands) {
  DeviceBuffer<T> x(in.x), w(in.w), dy(in.dy), y(in.BT * in.OC), dx(in.BT * in.C), dw(in.dw0);
  ops::matmul_forward(y.data(), x.data(), w.data(), in.BT, in.C, in.OC, operands);
  ops::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), in.BT, in.C, in.OC, operands);
  return {y.host(), dx.host(), dw.host()};
}

template <class T>
void check_fast_products(ops::GemmOperands operands) {
  // Odd sizes, none equal: a swapped dimension or operand cannot pass.
  for (const auto& [BT, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{7, 33, 65}, {130, 257, 63}, {1000, 96, 513}}) {
    Inputs<T> in{BT, C, OC, {}, {}, {}, {}};
    const bool bf16 = operands == ops::GemmOperands::bf16;
    auto values = [&](size_t n, uint64_t seed) {
      if constexpr (std::is_same_v<T, float>)
        if (bf16) return test::bf16_values(n, seed);
      return test::random_values<T>(n, seed);
    };
    in.x = values(size_t(BT * C), 1);
    in.w = values(size_t(OC * C), 2);
    in.dy = values(size_t(BT * OC), 3);
    in.dw0 = test::random_values<T>(size_t(OC * C), 4);
    const auto want = products(in, operands);  // the CPU backend
    const OnGpu gpu;
    const FastKernels fast;
    const cuda::UnitCalls before = cuda::gemm_unit_calls();
    const auto got = products(in, operands), again = products(in, operands);
    EXPECT_EQ(cuda::gemm_unit_calls().library - before.library, 6);
    const std::string shape = std::to_string(BT) + "x" + std::to_string(C) + "x" + std::to_string(OC);
    const char* names[] = {"y", "dx", "dw"};
    for (int i = 0; i < 3; ++i) {
      test::expect_close(got[i], want[i], shape + " " + names[i]);
      test::expect_bitwise(again[i], got[i], shape + " " + names[i] + " run to run");
    }
  }
}

TEST(CudaFastKernels, Fp32ProductsMatchTheCpu) {
  LLAMA4D_REQUIRE_GPU();
  check_fast_products<float>(ops::GemmOperands::as_stored);
}
TEST(CudaFastKernels, Bf16ValuedProductsMatchTheCpu) {
  LLAMA4D_REQUIRE_GPU();
  check_fast_products<float>(ops::GemmOperands::bf16);
}
TEST(CudaFastKernels, Fp64ProductsMatchTheCpu) {
  LLAMA4D_REQUIRE_GPU();
  check_fast_products<double>(ops::GemmOperands::as_stored);
}

}  // namespace kernel_modes
}  // namespace
}  // namespace llama4d
