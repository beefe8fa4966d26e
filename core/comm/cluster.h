#pragma once
// The cluster the virtual GPUs pretend to be: nodes x GPUs per node, NVLink inside a node,
// InfiniBand across nodes, each link an alpha-beta model: moving b bytes over one hop costs
//   t = alpha + b / bandwidth.
// Defaults are H100 SXM figures. NVLink 4: 450 GB/s per direction (NVIDIA's H100 datasheet quotes
// 900 GB/s, which counts both directions of 18 links of 25 GB/s each way; one of the source
// documents this course is built on, the "Case Study: LLaMA 3" write-up, uses 900 per direction,
// which is off: twice too fast), alpha 1 us.
// InfiniBand: one 400 Gb/s ConnectX-7 NIC per GPU (the Llama 3 paper's RoCE/IB fabric), 50 GB/s
// per direction, alpha 5 us. 80 GB of HBM3. Compute: 989 TFLOP/s, the H100 SXM's dense BF16
// tensor-core peak (NVIDIA's datasheet quotes 1,979 with 2:4 sparsity), the precision Llama 3
// trained in; the simulated clock charges every op's FLOPs at this rate (core/comm/trace.h).
// Rank r lives on node r / gpus_per_node, so the innermost mesh dims (tp, then cp) stay on a
// node and ride NVLink, as in Llama 3's [tp, cp, pp, dp] order.
#include <cstdint>
#include <string>

#include "core/comm/comm_types.h"

namespace llama4d {

struct LinkParams {
  double alpha_us = 0;        // per-message latency
  double bandwidth_gbps = 0;  // GB/s = 1e9 bytes per second, per GPU and direction
};

struct ClusterSpec {
  int nodes = 1;
  int gpus_per_node = 8;
  LinkParams nvlink{1.0, 450.0};
  LinkParams infiniband{5.0, 50.0};
  int64_t hbm_bytes = 0;  // per-GPU memory capacity; 0 = unlimited
  double gpu_tflops = 989.0;  // modelled compute rate per GPU, 1e12 FLOP/s

  // The smallest cluster of `gpus_per_node`-GPU nodes holding `world_size` ranks.
  static ClusterSpec for_ranks(int world_size, int gpus_per_node = 8);

  int slots() const { return nodes * gpus_per_node; }
  int node_of(int world_rank) const { return world_rank / gpus_per_node; }
  LinkClass link_between(int world_a, int world_b) const;
  const LinkParams& params(LinkClass link) const;
  // alpha + bytes / bandwidth in microseconds; 0 for an empty message or for LinkClass::self.
  double transfer_us(LinkClass link, int64_t bytes) const;

  // InputError when a size is non-positive or the cluster holds fewer than world_size ranks.
  void validate(int world_size) const;
  std::string describe() const;  // "2 nodes x 8 GPUs, 989 TFLOP/s, NVLink 450 GB/s 1 us, IB 50 GB/s 5 us"
};

constexpr int64_t kH100HbmBytes = 80'000'000'000;
constexpr int64_t kLlama3_8bParams = 8'030'261'248;

// A virtual GPU's HBM "scaled to the model": an H100's 80 GB shrunk by the ratio of the model's
// parameter count to Llama 3 8B's, so a small model meets the same pressure 8B meets on a real
// H100 (its full fp32 AdamW training state does not fit on one GPU; sharding is needed).
int64_t scaled_hbm_bytes(int64_t num_parameters);

}  // namespace llama4d
