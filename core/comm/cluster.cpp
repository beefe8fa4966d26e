#include "core/comm/cluster.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace llama4d {

ClusterSpec ClusterSpec::for_ranks(int world_size, int gpus_per_node) {
  if (world_size < 1 || gpus_per_node < 1)
    throw InputError("cluster needs at least one rank and one GPU per node (got " + std::to_string(world_size) +
                     " ranks, " + std::to_string(gpus_per_node) + " GPUs per node)");
  ClusterSpec spec;
  spec.gpus_per_node = gpus_per_node;
  spec.nodes = (world_size + gpus_per_node - 1) / gpus_per_node;
  return spec;
}

LinkClass ClusterSpec::link_between(int world_a, int world_b) const {
  if (world_a == world_b) return LinkClass::self;
  return node_of(world_a) == node_of(world_b) ? LinkClass::nvlink : LinkClass::infiniband;
}

const LinkParams& ClusterSpec::params(LinkClass link) const {
  return link == LinkClass::infiniband ? infiniband : nvlink;
}

double ClusterSpec::transfer_us(LinkClass link, int64_t bytes) const {
  if (bytes <= 0 || link == LinkClass::self) return 0.0;
  const LinkParams& p = params(link);
  return p.alpha_us + double(bytes) / (p.bandwidth_gbps * 1e3);  // GB/s = 1e3 bytes per us
}

void ClusterSpec::validate(int world_size) const {
  if (nodes < 1 || gpus_per_node < 1) throw InputError("cluster needs at least one node and one GPU per node");
  if (slots() < world_size)
    throw InputError("cluster of " + std::to_string(nodes) + " x " + std::to_string(gpus_per_node) +
                     " GPUs cannot hold " + std::to_string(world_size) + " ranks");
  for (const LinkParams* p : {&nvlink, &infiniband})
    if (!(p->bandwidth_gbps > 0) || !(p->alpha_us >= 0))
      throw InputError("link bandwidth must be positive and latency non-negative");
  if (hbm_bytes < 0) throw InputError("HBM capacity must be >= 0 (0 = unlimited)");
  if (!(gpu_tflops > 0) || !std::isfinite(gpu_tflops)) throw InputError("the GPU's TFLOP/s must be a positive number");
}

std::string ClusterSpec::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d node%s x %d GPUs, %g TFLOP/s, NVLink %g GB/s %g us, IB %g GB/s %g us", nodes,
                nodes == 1 ? "" : "s", gpus_per_node, gpu_tflops, nvlink.bandwidth_gbps, nvlink.alpha_us,
                infiniband.bandwidth_gbps, infiniband.alpha_us);
  return buf;
}

int64_t scaled_hbm_bytes(int64_t num_parameters) {
  if (num_parameters <= 0) throw InputError("scaled_hbm_bytes needs a positive parameter count");
  return int64_t(double(kH100HbmBytes) * double(num_parameters) / double(kLlama3_8bParams));
}

}  // namespace llama4d
