#pragma once
// What the planner is asked about: one model, one parallel plan and one training step's batch.
// Everything it predicts (core/plan/traffic.h, memory.h, planner.h) is computed from these numbers
// by formulas written out in those files, never by running the strategies: the tests hold the
// predictions against what the virtual cluster measures (its allocator and its traffic log).
#include <cstdint>
#include <string>

#include "core/model/config.h"
#include "core/parallel/plan.h"

namespace llama4d {

// Bytes per element of each kind of state. fp32 is what this engine trains in (the tests'
// plans); bf16 is Llama 3's mixed precision (Dubey et al. 2024, section 3.3.4): bf16 weights
// and activations for compute, fp32 gradients (accumulated and reduce-scattered in fp32) and an
// fp32 master copy beside the two fp32 AdamW moments (optimizer 4 + 4 + 4 bytes). The RoPE
// tables stay fp32 under bf16, as torchtitan's complex64 freqs_cis and this engine's fp32 containers.
struct Precision {
  std::string name = "fp32";
  int64_t param = 4, grad = 4, optimizer = 8, activation = 4, table = 4;
  static Precision parse(const std::string& name);  // "fp32", "fp64" or "bf16"; InputError otherwise
};

struct StepShape {
  LlamaConfig model;
  ParallelPlan plan;
  int64_t seq_len = 256;           // tokens per sequence (a context-parallel rank holds seq_len / cp)
  int64_t batch_size = 8;          // global batch in sequences
  int64_t micro_batch_size = 0;    // sequences per micro-batch on a data rank (0: all of its rows)
  Precision precision;             // bytes per element of each kind of state (fp32 by default)
  bool doc_mask = false;           // document masking: each micro-batch keeps its rows' document ids

  int64_t rows_per_data_rank() const { return batch_size / plan.dp(); }
  int64_t micro_rows() const { return micro_batch_size > 0 ? micro_batch_size : rows_per_data_rank(); }
  int64_t micro_batches() const { return rows_per_data_rank() / micro_rows(); }
};

// Key/value heads tensor-parallel rank t of tp holds, by core/model/tp_layout.h's rule re-derived:
// the heads its nh/tp consecutive query heads read (group nh/nkv). nkv/tp when tp divides nkv;
// otherwise one, or two where its query heads straddle a group boundary (nh 6, nkv 2, tp 3: rank 1).
inline int64_t kv_heads_of_tp_rank(const LlamaConfig& cfg, int64_t tp, int64_t t) {
  const int64_t h = cfg.num_attention_heads / tp, g = cfg.num_attention_heads / cfg.num_key_value_heads;
  return (t * h + h - 1) / g - t * h / g + 1;
}

}  // namespace llama4d
