#pragma once
// The bytes each member moves in a virtual collective, once every member has published its
// buffers. Member `me` only ever writes memory no other member writes during the same
// collective, and every member works at once, so there is no per-element locking:
//   all_reduce      me owns chunk me of the balanced split: it reduces that chunk of every
//                   input (tile by tile, in the algorithm's order) and writes the result into
//                   that chunk of every output — reduce-scatter and all-gather fused so each
//                   tile is read from memory once and reduced in cache.
//   reduce_scatter  me reduces block me of every input into its own output.
//   all_gather      me copies every member's input into its own output.
//   broadcast       every non-root copies the root's buffer.
//   all_to_all      me copies its block of every member's input into its own output.
#include "backends/virtual/virtual_world.h"

namespace llama4d::virt {

void move_data(const Slot& slot, int me, ReduceAlgo algo);

// Empty when member a's and member b's calls can form one collective; otherwise why not.
std::string incompatibility(const CommCall& a, const CommCall& b);

}  // namespace llama4d::virt
