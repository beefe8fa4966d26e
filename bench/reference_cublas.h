#pragma once
// A reference GEMM on the GPU for `llama4d bench --device cuda`'s honest peak: cuBLAS, opened at
// run time with dlopen, so a CUDA build neither links it nor needs it installed, and training
// never calls it. It times the three products of a linear layer on the same n^3 shape as
// ops::measure_peak_gemm_flops: with bf16 inputs, fp32 accumulation and fp32 output (the products
// of bf16 mixed precision), or all in fp32 (CUDA cores, no TF32), so bench can say how far the
// engine's own GEMM is from NVIDIA's. Built only with the CUDA backend (LLAMA4D_HAVE_CUDA).
#include <cstdint>
#include <memory>
#include <string>

namespace llama4d::bench {

class ReferenceCublas {
 public:
  // The first of kDefaultCandidates that loads and exports what the timing calls, with a cuBLAS
  // handle on the current GPU; null if none loads. Error naming the call when cuBLAS fails.
  static std::unique_ptr<ReferenceCublas> open();
  ~ReferenceCublas();
  ReferenceCublas(const ReferenceCublas&) = delete;
  ReferenceCublas& operator=(const ReferenceCublas&) = delete;

  // The file dlopen resolved, and cuBLAS's version ("cuBLAS 13.0.2").
  const std::string& path() const { return path_; }
  const std::string& config() const { return config_; }
  // Best FLOP/s over the three products of a linear layer at n^3 (row-major out = a b^T,
  // out += a b, out += a^T b) on the current GPU, each timed with CUDA events for a third of
  // `seconds` after a warm-up; operands are random values (bf16 ones when `bf16`), not zeros.
  // Error naming the call when cuBLAS or CUDA fails.
  double measure_gemm_flops(int64_t n, bool bf16, double seconds) const;

  static constexpr const char* kDefaultCandidates[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};

 private:
  ReferenceCublas() = default;
  void* library_ = nullptr;  // dlopen's handle
  void* cublas_ = nullptr;   // cublasHandle_t
  void* destroy_ = nullptr;  // cublasDestroy_v2
  void* gemm_ = nullptr;     // cublasGemmEx
  std::string path_, config_;
};

}  // namespace llama4d::bench
