// The CUDA backend's two kernel modes (core/ops.h's KernelMode, --kernels). Without a GPU: how
// cuBLASLt and cuDNN are opened for the fast one (backends/cuda/cublaslt_library.h,
// cudnn_library.h), which needs no device, and their refusals when a library is missing,
// incomplete or too old. With a GPU: the fast mode's products (cuBLASLt, backends/cuda/lt_gemm.cu) against the CPU backend within the
// backend's fp32 and fp64 tolerances, on cuBLASLt (the call tally says so), repeating their bits
// run to run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backends/cuda/cublaslt_library.h"
#include "backends/cuda/cudnn_library.h"
#include "backends/cuda/lt_gemm.cuh"
#include "backends/nvidia/shared_library.h"
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
  EXPECT_EQ(nvidia::version_text(130100), "13.1.0");
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

std::string cudnn_refusal(const std::vector<std::string>& candidates) {
  try {
    cuda::open_cudnn(candidates);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CudnnLibrary, AMissingLibraryIsRefusedByName) {
  const std::string why = cudnn_refusal({"libllama4d-no-such-cudnn.so.99"});
  EXPECT_NE(why.find("--kernels fast needs NVIDIA's cuDNN"), std::string::npos) << why;
  EXPECT_NE(why.find("libllama4d-no-such-cudnn.so.99"), std::string::npos) << why;
  EXPECT_NE(why.find("--kernels exact"), std::string::npos) << why;
}

// A file that loads but is not cuDNN (the C math library): refused naming the calls it lacks.
TEST(CudnnLibrary, ALibraryWithoutItsCallsIsRefused) {
  const std::string why = cudnn_refusal({"libm.so.6"});
  EXPECT_NE(why.find("lacks cudnnGetVersion, cudnnCreate, cudnnSetStream, cudnnBackendCreateDescriptor"),
            std::string::npos)
      << why;
}

TEST(CudnnLibrary, AnOlderVersionIsRefusedNamingBoth) {
  try {
    cuda::check_cudnn_version(90502, "/opt/old/libcudnn.so.9");
    ADD_FAILURE() << "cuDNN 9.5.2 was accepted";
  } catch (const InputError& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("needs cuDNN 9.6.0 or newer; /opt/old/libcudnn.so.9 is cuDNN 9.5.2"), std::string::npos)
        << why;
  }
  EXPECT_NO_THROW(cuda::check_cudnn_version(cuda::kMinCudnnVersion, "x"));
  EXPECT_EQ(nvidia::version_text(91900), "9.19.0");
}

// Where cuDNN 9 is on the loader's path (the CUDA images this project builds in), it opens
// without a GPU and reports a version at least the minimum.
TEST(CudnnLibrary, TheInstalledOneOpens) {
  cuda::CudnnLibrary dnn;
  try {
    dnn = cuda::open_cudnn(cuda::kCudnnCandidates);
  } catch (const InputError& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_GE(dnn.version, cuda::kMinCudnnVersion) << dnn.path;
  EXPECT_NE(dnn.path.find("libcudnn"), std::string::npos) << dnn.path;
  EXPECT_NE(dnn.handle, nullptr);
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

// Largest |got - want| over the largest |want|: one bound for a whole tensor.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return diff / scale;
}

// Attention's forward and backward on the active backend, gradients added to `grad0`.
std::vector<std::vector<float>> attention(const ops::AttentionShape& s, const std::vector<float>& q,
                                          const std::vector<float>& k, const std::vector<float>& v,
                                          const std::vector<float>& dout, const std::vector<float>& grad0) {
  DeviceBuffer<float> dev_q(q), dev_k(k), dev_v(v), dev_dout(dout), out(q.size()), lse(s.B * s.nh * s.Tq);
  DeviceBuffer<float> dq(std::vector<float>(grad0.begin(), grad0.begin() + q.size())),
      dk(std::vector<float>(grad0.begin(), grad0.begin() + k.size())),
      dv(std::vector<float>(grad0.begin(), grad0.begin() + v.size()));
  ops::attention_forward(out.data(), lse.data(), dev_q.data(), dev_k.data(), dev_v.data(), s);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dev_dout.data(), dev_q.data(), dev_k.data(), dev_v.data(),
                          out.data(), lse.data(), s);
  return {out.host(), lse.host(), dq.host(), dk.host(), dv.host()};
}

// --kernels fast sends training's causal attention (bf16 values, grouped heads, 70 rows: not a
// multiple of cuDNN's 64-row tiles) to cuDNN: the call tally says so, the results repeat bit for
// bit, and they are the CPU backend's within the bounds of bf16 outputs (out, dq, dk, dv are
// written by cuDNN in bf16: 2^-8 relative each, so 1e-2 of the tensor's largest element; lse
// is fp32 from exact bf16 products: 1e-3). These bounds have not yet been measured on a GPU:
// scripts/gpu_session.sh kernels runs this test first.
TEST(CudaFastKernels, AttentionRunsOnCudnnWithinBounds) {
  LLAMA4D_REQUIRE_GPU();
  ops::AttentionShape s;
  s.B = 2, s.Tq = s.Tk = 70, s.nh = 4, s.nkv = 2, s.hd = 64;
  s.operands = ops::GemmOperands::bf16;
  const size_t nq = size_t(s.B * s.Tq * s.nh * s.hd), nkv = size_t(s.B * s.Tk * s.nkv * s.hd);
  const std::vector<float> q = test::bf16_values(nq, 1, -2, 2), k = test::bf16_values(nkv, 2, -2, 2),
                           v = test::bf16_values(nkv, 3), dout = test::bf16_values(nq, 4),
                           grad0 = test::random_values<float>(nq, 5);
  const auto want = attention(s, q, k, v, dout, grad0);  // the CPU backend
  const OnGpu gpu;
  const FastKernels fast;
  const cuda::UnitCalls before = cuda::attention_unit_calls();
  const auto got = attention(s, q, k, v, dout, grad0), again = attention(s, q, k, v, dout, grad0);
  EXPECT_EQ(cuda::attention_unit_calls().library - before.library, 4);
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  const double bounds[] = {1e-2, 1e-3, 1e-2, 1e-2, 1e-2};
  for (int i = 0; i < 5; ++i) {
    EXPECT_LE(relative_error(got[i], want[i]), bounds[i]) << names[i];
    test::expect_bitwise(again[i], got[i], std::string(names[i]) + " run to run");
  }
  // A document mask is no causal SDPA: the exact kernels run it, and cuDNN's tally stays.
  std::vector<int32_t> ids(size_t(s.B * s.Tq), 0);
  for (size_t i = ids.size() / 4; i < ids.size(); ++i) ids[i] = 1;
  ops::AttentionShape docs = s;
  docs.q_doc = docs.k_doc = ids.data();  // host ids: the backend copies them (attention.cu's DeviceIds)
  const cuda::UnitCalls mid = cuda::attention_unit_calls();
  attention(docs, q, k, v, dout, grad0);
  EXPECT_EQ(cuda::attention_unit_calls().library, mid.library);
}

}  // namespace kernel_modes
}  // namespace
}  // namespace llama4d
