// dlopen'd reference sgemm for bench (see reference_blas.h).
#include "bench/reference_blas.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/gemm_timing.h"

namespace llama4d::bench {

namespace {

// CBLAS enum values (cblas.h: CblasRowMajor, CblasNoTrans, CblasTrans).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

std::string loaded_file(void* handle, const std::string& fallback) {
  const link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0])
    return map->l_name;
  return fallback;
}

}  // namespace

std::unique_ptr<ReferenceBlas> ReferenceBlas::open(const std::string& path) {
  std::vector<std::string> candidates;
  if (path.empty()) {
    candidates.assign(std::begin(kDefaultCandidates), std::end(kDefaultCandidates));
  } else {
    candidates.push_back(path);
  }
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      if (path.empty()) continue;
      throw InputError("--reference-blas '" + path + "': cannot load it (" + dlerror() + ")");
    }
    std::unique_ptr<ReferenceBlas> blas(new ReferenceBlas());
    blas->handle_ = handle;
    blas->path_ = loaded_file(handle, name);
    blas->sgemm_ = reinterpret_cast<Sgemm>(dlsym(handle, "cblas_sgemm"));
    // OpenBLAS and MKL each have their own call; a library whose thread count cannot be set
    // would be timed on a count we do not know, so it is refused.
    for (const char* setter : {"openblas_set_num_threads", "mkl_set_num_threads"})
      if (blas->set_threads_ == nullptr) blas->set_threads_ = reinterpret_cast<SetThreads>(dlsym(handle, setter));
    if (blas->sgemm_ == nullptr || blas->set_threads_ == nullptr) {
      if (path.empty()) continue;
      throw InputError("--reference-blas '" + path + "': " +
                       (blas->sgemm_ == nullptr ? "no cblas_sgemm in it"
                                                : "no openblas_set_num_threads or mkl_set_num_threads in it"));
    }
    using GetConfig = const char* (*)();
    if (auto get_config = reinterpret_cast<GetConfig>(dlsym(handle, "openblas_get_config")))
      blas->config_ = get_config();
    return blas;
  }
  return nullptr;
}

ReferenceBlas::~ReferenceBlas() {
  if (handle_ != nullptr) dlclose(handle_);
}

double ReferenceBlas::measure_sgemm_flops(int64_t n, int threads, double seconds) const {
  GemmTimingOperands g(n);
  set_threads_(threads);
  const int ni = static_cast<int>(n);
  const float *a = g.a.data(), *b = g.b.data();
  float* c = g.c.data();
  // The three products of a linear layer, as ops::measure_peak_gemm_flops times them.
  auto rate = [&](int trans_a, int trans_b, float beta) {
    return best_gemm_rate(g, seconds / 3, [&] { sgemm_(kRowMajor, trans_a, trans_b, ni, ni, ni, 1.0f, a, ni, b, ni, beta, c, ni); });
  };
  return std::max({rate(kNoTrans, kTrans, 0.0f), rate(kNoTrans, kNoTrans, 1.0f), rate(kTrans, kNoTrans, 1.0f)});
}

}  // namespace llama4d::bench
