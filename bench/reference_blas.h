#pragma once
// A reference BLAS for `llama4d bench`'s honest peak: a library exporting cblas_sgemm (Debian's
// OpenBLAS by default, MKL if pointed at), opened at run time with dlopen. Training never links
// or calls it; it only times the products the model's linear layers run, on the same shape
// and thread count, so bench can say how far the engine's own GEMM is from it.
#include <cstdint>
#include <memory>
#include <string>

namespace llama4d::bench {

class ReferenceBlas {
 public:
  // Opens `path` (a file name or path for dlopen), or with an empty path the first of
  // kDefaultCandidates that loads. Returns null when nothing loads and `path` was empty; throws
  // InputError naming the problem when `path` was given but does not load or lacks cblas_sgemm
  // or a way to set its thread count.
  static std::unique_ptr<ReferenceBlas> open(const std::string& path);
  ~ReferenceBlas();
  ReferenceBlas(const ReferenceBlas&) = delete;
  ReferenceBlas& operator=(const ReferenceBlas&) = delete;

  // The file dlopen resolved, and the library's own description (openblas_get_config) if any.
  const std::string& path() const { return path_; }
  const std::string& config() const { return config_; }
  // Best FLOP/s on `threads` threads over the three products of a linear layer at n^3 (row-major
  // out = a b^T, out += a b, out += a^T b), each timed for a third of `seconds` after a warm-up.
  double measure_sgemm_flops(int64_t n, int threads, double seconds) const;

  static constexpr const char* kDefaultCandidates[] = {
      "libopenblas.so.0", "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
      "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0"};

 private:
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);
  using SetThreads = void (*)(int);
  ReferenceBlas() = default;
  void* handle_ = nullptr;
  Sgemm sgemm_ = nullptr;
  SetThreads set_threads_ = nullptr;
  std::string path_, config_;
};

}  // namespace llama4d::bench
