#pragma once
// Activations and scratch of one micro-batch on one pipeline chunk, pass by pass, from the
// shapes and the engine's rules of what a unit allocates, keeps and frees (activations.cpp
// writes those rules out). core/plan/memory.cpp plays these levels along a rank's schedule.
#include <cstdint>

#include "core/plan/step_shape.h"

namespace llama4d {

// The micro-batch's own bytes in one category over one pass: before it, the most during it, after.
struct PassLevel {
  int64_t start = 0, peak = 0, end = 0;
};

struct ChunkMemory {
  // Activations (tokens, targets, the residual stream, the blocks' kept tensors, the head's):
  // forward 0 -> resident; backward (both halves) resident -> 0; the zero-bubble input pass
  // resident -> what the weight pass reads; the weight pass that -> 0.
  PassLevel forward, backward, input, weight;
  // Scratch: the most each pass allocates at once (it frees all of it by its end, except the
  // input gradient of a chunk without the embedding, which waits for its send).
  int64_t scratch_forward = 0, scratch_backward = 0, scratch_input = 0, scratch_weight = 0;
  int64_t input_grad = 0;  // bytes of that gradient [rows, C] (0 on the embedding's chunk)
  int64_t boundary = 0;    // bytes of a received activation or gradient [rows, C]
  // Comm buffers of ring attention's eager sends not yet received by the next rank: none at the
  // least, at most cp messages (a rank cannot run more than cp - 1 hops ahead of the rank it
  // sends to: every hop it receives was sent after its sender's own receive) of the largest, a
  // block's K, V, dK and dV.
  int64_t ring_sends = 0;
};

// Units [begin, end) (0 the embedding, 1..L the blocks, L + 1 the norm and head) on tensor rank
// t, for one micro-batch of s.micro_rows() rows of s.seq_len / cp tokens.
ChunkMemory chunk_memory(const StepShape& s, int t, int begin, int end);

}  // namespace llama4d
