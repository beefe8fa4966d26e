#pragma once
// The model as units, and the hooks a parallel strategy uses to act between them.
//
// Units, in forward order (L = num_hidden_layers):
//   unit 0          embedding                      tokens      -> x_0   [B, T, C]
//   unit 1 + l      transformer block l            x_l         -> x_l+1 [B, T, C]
//   unit L + 1      final RMSNorm + LM head + loss  x_L         -> loss
// Each unit owns one contiguous segment of the flat parameter buffer (core/model/params.h), so
// "segment u" and "unit u" are the same index everywhere: DP buckets, ZeRO shards and pipeline
// stages all slice the model at unit boundaries. With tied embeddings the head also reads (and
// accumulates gradients into) unit 0's segment.
#include <string>

namespace llama4d {

inline int num_units(int num_layers) { return num_layers + 2; }
inline int embedding_unit() { return 0; }
inline int block_unit(int layer) { return layer + 1; }
inline int head_unit(int num_layers) { return num_layers + 1; }
// "embedding", "layer 3", "head" (for traces and messages).
std::string unit_name(int unit, int num_layers);

// [begin, end) of units, in forward order.
struct UnitRange {
  int begin = 0, end = 0;
  bool contains(int u) const { return u >= begin && u < end; }
  int size() const { return end - begin; }
};

// Called around every unit so a strategy can act at unit granularity without forking the
// model: FSDP gathers a unit's parameters before it runs and frees them after; data
// parallelism starts reducing a unit's gradients the moment its backward is done.
// Recompute brackets a unit's forward run again inside backward (activation checkpointing);
// it may come several units before that unit's own backward (every:k policies).
//
// A backward split in two (Llama's BackwardPass, for zero-bubble pipeline schedules) brackets
// each unit twice: its input pass with before_backward / after_backward_input (the unit's
// input gradient is ready; no gradient of its own written yet), then, later, its weight pass with
// before_backward_weight / after_backward. A whole backward brackets each unit once, with
// before_backward / after_backward. So, per unit, the calls are
//   whole:  before_backward  [recompute...]  after_backward
//   split:  before_backward  [recompute...]  after_backward_input ... before_backward_weight  after_backward
// and after_backward keeps its meaning. The input pass reads the unit's parameters (and may
// recompute); the weight pass reads none.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) {}
  virtual void after_forward(int unit) {}
  virtual void before_recompute(int unit) {}
  virtual void after_recompute(int unit) {}
  virtual void before_backward(int unit) {}
  virtual void after_backward_input(int unit) {}    // split backward: the input pass is done
  virtual void before_backward_weight(int unit) {}  // split backward: the weight pass starts
  virtual void after_backward(int unit) {}  // every gradient this unit writes is now final
};

}  // namespace llama4d
