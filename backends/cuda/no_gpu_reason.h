#pragma once
// Why the CUDA runtime found no GPU to use, in words a learner can act on. On a machine with no
// NVIDIA driver at all, cudaGetDeviceCount reports cudaErrorInsufficientDriver ("CUDA driver
// version is insufficient for CUDA runtime version"), which reads as "upgrade the driver" to
// someone who has none; the code name stays in the message for whoever does have one.
#include <cuda_runtime_api.h>

#include <string>

namespace llama4d::cuda {

inline std::string no_gpu_reason(cudaError_t e) {
  const std::string code = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e);
  if (e == cudaErrorInsufficientDriver)
    return "no usable CUDA GPU here: no NVIDIA driver is loaded, or it is older than this build's CUDA runtime (" +
           code + "); without a GPU the CPU runs everything";
  if (e == cudaErrorNoDevice) return "no CUDA GPU here (" + code + ")";
  return "no usable CUDA GPU here (" + code + ": " + cudaGetErrorString(e) + ")";
}

}  // namespace llama4d::cuda
