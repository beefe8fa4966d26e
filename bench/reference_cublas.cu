// dlopen'd cuBLAS GEMM for bench's peak on a GPU (see reference_cublas.h).
#include "bench/reference_cublas.h"

#include <cublas_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/gemm_timing.h"
#include "core/tensor/dtype.h"

namespace llama4d::bench {

namespace {

using Create = cublasStatus_t (*)(cublasHandle_t*);
using Destroy = cublasStatus_t (*)(cublasHandle_t);
using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using GetVersion = cublasStatus_t (*)(cublasHandle_t, int*);
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                  cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuBLAS reference: ") + what + ": " + cudaGetErrorString(e));
}
void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLAS reference: ") + what + " returned status " + std::to_string(int(s)));
}

std::string loaded_file(void* handle, const std::string& fallback) {
  const link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0])
    return map->l_name;
  return fallback;
}

// Device memory freed when the scope ends, whatever throws.
struct DeviceArrays {
  std::vector<void*> p;
  void* alloc(size_t bytes) {
    void* q = nullptr;
    check_cuda(cudaMalloc(&q, bytes), "cudaMalloc");
    p.push_back(q);
    return q;
  }
  ~DeviceArrays() {
    for (void* q : p) cudaFree(q);
  }
};

}  // namespace

std::unique_ptr<ReferenceCublas> ReferenceCublas::open() {
  for (const char* name : kDefaultCandidates) {
    void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) continue;
    std::unique_ptr<ReferenceCublas> r(new ReferenceCublas());
    r->library_ = library;
    r->path_ = loaded_file(library, name);
    const auto create = reinterpret_cast<Create>(dlsym(library, "cublasCreate_v2"));
    const auto set_stream = reinterpret_cast<SetStream>(dlsym(library, "cublasSetStream_v2"));
    const auto get_version = reinterpret_cast<GetVersion>(dlsym(library, "cublasGetVersion_v2"));
    r->destroy_ = dlsym(library, "cublasDestroy_v2");
    r->gemm_ = dlsym(library, "cublasGemmEx");
    if (!create || !set_stream || !get_version || !r->destroy_ || !r->gemm_) continue;
    cublasHandle_t h = nullptr;
    check_cublas(create(&h), "cublasCreate");
    r->cublas_ = h;
    check_cublas(set_stream(h, cudaStreamPerThread), "cublasSetStream");
    int version = 0;
    check_cublas(get_version(h, &version), "cublasGetVersion");
    r->config_ = "cuBLAS " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                 std::to_string(version % 100);
    return r;
  }
  return nullptr;
}

ReferenceCublas::~ReferenceCublas() {
  if (cublas_ != nullptr) reinterpret_cast<Destroy>(destroy_)(static_cast<cublasHandle_t>(cublas_));
  if (library_ != nullptr) dlclose(library_);
}

double ReferenceCublas::measure_gemm_flops(int64_t n, bool bf16, double seconds) const {
  if (n < 1 || n > 46340) throw InputError("cuBLAS reference: GEMM size must be in [1, 46340], got " + std::to_string(n));
  if (!(seconds >= 0)) throw InputError("cuBLAS reference: the budget must be >= 0 seconds");
  const auto gemm = reinterpret_cast<GemmEx>(gemm_);
  const auto h = static_cast<cublasHandle_t>(cublas_);

  // The CPU's timing operands (core/gemm_timing.h), as bf16 bits or floats: not zeros, which a
  // tensor core multiplies drawing less power and perhaps clocking higher than on a model's numbers.
  const size_t count = size_t(n) * size_t(n), in_bytes = count * (bf16 ? 2 : 4);
  const GemmTimingOperands g(n);
  std::vector<unsigned char> host(in_bytes);
  DeviceArrays mem;
  void* in[2];
  for (int o = 0; o < 2; ++o) {
    const std::vector<float>& values = o == 0 ? g.a : g.b;
    for (size_t i = 0; i < count; ++i) {
      if (bf16) {
        const uint16_t bits = float_to_bf16(values[i]).bits;  // rounded to the nearest bf16
        std::memcpy(&host[2 * i], &bits, 2);
      } else {
        std::memcpy(&host[4 * i], &values[i], 4);
      }
    }
    in[o] = mem.alloc(in_bytes);
    check_cuda(cudaMemcpy(in[o], host.data(), in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void* out = mem.alloc(count * 4);
  check_cuda(cudaMemset(out, 0, count * 4), "cudaMemset");
  const cudaDataType in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const int ni = int(n);
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } events;
  check_cuda(cudaEventCreate(&events.start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&events.stop), "cudaEventCreate");
  const cudaEvent_t start = events.start, stop = events.stop;

  // Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T: cuBLAS gets the
  // operands swapped with the same transposes.
  auto rate = [&](cublasOperation_t op_a, cublasOperation_t op_b, float beta) {
    const float alpha = 1.0f;
    auto product = [&] {
      check_cublas(gemm(h, op_b, op_a, ni, ni, ni, &alpha, in[1], in_type, ni, in[0], in_type, ni, &beta, out, CUDA_R_32F,
                        ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    };
    product();  // warm-up: cuBLAS picks and loads its kernel
    double best = 0;
    const auto begin = std::chrono::steady_clock::now();
    do {
      check_cuda(cudaEventRecord(start, cudaStreamPerThread), "cudaEventRecord");
      product();
      check_cuda(cudaEventRecord(stop, cudaStreamPerThread), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (ms > 0) best = std::max(best, 2.0 * double(n) * double(n) * double(n) / (double(ms) * 1e-3));
    } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() < seconds / 3);
    return best;
  };
  return std::max({rate(CUBLAS_OP_N, CUBLAS_OP_T, 0.0f), rate(CUBLAS_OP_N, CUBLAS_OP_N, 1.0f),
                   rate(CUBLAS_OP_T, CUBLAS_OP_N, 1.0f)});
}

}  // namespace llama4d::bench
