#pragma once
// What each rank of a plan allocates, by category, from formulas (see memory.cpp), to set
// beside what the virtual cluster's allocator measures (RankMemory peaks).
#include <cstdint>
#include <vector>

#include "core/plan/step_shape.h"

namespace llama4d {

// Peak bytes per category over a training step on one rank, exact for every plan. Three depend on
// thread timing and come as the least and the most: gradients under ZeRO-2/3, by how many
// reductions are still in flight when the next unit's gradient is allocated (grads_min: the
// largest unit's full gradient beside the shard; grads: three units'); a pipeline stage's
// scratch, by when its sent input gradients are freed (scratch_min .. scratch); and comm buffers
// under pipeline or ring attention, by when a peer receives the virtual cluster's eager copy of
// what was sent (comm_buffers_min .. comm_buffers; NCCL makes no such copy). Everywhere else
// min == max.
struct MemoryPrediction {
  int world_rank = 0;
  int64_t params = 0, grads = 0, grads_min = 0, optimizer = 0, comm_buffers = 0, comm_buffers_min = 0;
  int64_t activations = 0, scratch = 0, scratch_min = 0;
  int64_t other = 0;  // the RoPE tables: cos and sin [seq_len, hd/2], on a rank that holds a block
  int64_t weight_states() const { return params + grads + optimizer + comm_buffers; }
  // Upper bound of the rank's peak: every category at its own peak at once.
  int64_t total() const { return weight_states() + activations + scratch + other; }
};

// Elements of each unit (embedding, block 0..L-1, norm + head) that tensor-parallel rank t of
// tp holds, by the layout rules of core/model/tp_layout.h re-derived from its comment.
std::vector<int64_t> unit_elements(const LlamaConfig& cfg, int tp, int t);

// Elements rank r of n owns of a segment of `len` (ZeRO's pieces, core/parallel/shard_layout.h):
// pieces of ceil(len / n) rounded up to 512 elements, rank r's piece [r S, (r+1) S) clipped.
int64_t owned_elements(int64_t len, int n, int r);

std::vector<MemoryPrediction> predict_memory(const StepShape& s);

}  // namespace llama4d
