#pragma once
// The bytes each member moves in a virtual collective, once every member has published its
// buffers. Member `me` only ever writes memory no other member writes during the same
// collective, and every member works at once, so there is no per-element locking:
//   all_reduce      me owns chunk me of the balanced split: it reduces that chunk of every
//                   input (in the algorithm's order) and writes the result into that chunk of
//                   every output: reduce-scatter and all-gather fused into one pass.
//   reduce_scatter  me reduces block me of every input into its own output.
//   all_gather      me copies every member's input into its own output.
//   broadcast       every non-root copies the root's buffer.
//   all_to_all      me copies its block of every member's input into its own output.
// The bytes move through the compute backend the ranks run on (World::device): device_memcpy
// for copies, collective_reduce for reductions, so virtual GPUs over one real GPU move device
// memory on the device. A backend that computes in host memory (the CPU) leaves
// collective_reduce null, and all_reduce then reduces tile by tile on the host, each tile read
// from memory once and reduced in cache; a program that links no backend moves host memory.
#include "backends/virtual/virtual_world.h"

namespace llama4d::virt {

void move_data(const Slot& slot, int me, ReduceAlgo algo, const ops::ComputeBackend* device);

// dst[bytes] = src[bytes] in the memory of `device` (memcpy when null).
void copy_bytes(const ops::ComputeBackend* device, void* dst, const void* src, int64_t bytes);

// Empty when member a's and member b's calls can form one collective; otherwise why not.
std::string incompatibility(const CommCall& a, const CommCall& b);

}  // namespace llama4d::virt
