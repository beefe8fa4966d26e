#pragma once
// The parallel plan: how a run is cut across ranks, parsed once from the command line and
// carried unchanged to the trainer, the equivalence harness, the lessons and the JSON output.
//
//   mesh    named dimensions, innermost first (Llama 3's order is [tp, cp, pp, dp]): consecutive
//           ranks differ in the first one, so it lands on the fastest links.
//   per-dimension options: the ZeRO stage and reshard mode of the data-parallel dims, the
//           activation checkpointing policy of every rank's model, and the reduction algorithm
//           of every collective (the pipeline schedule joins them with pipeline parallelism).
// A dimension this build cannot train yet is a clear InputError (exit 2), never a silent
// fallback to a plan that computes something else.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/comm/comm_types.h"
#include "core/comm/device_mesh.h"
#include "core/model/checkpointing.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/model/tp_layout.h"
#include "core/parallel/context_algo.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/pipeline_layout.h"
#include "core/parallel/pipeline_schedule.h"

namespace llama4d {

struct ParallelPlan {
  std::vector<MeshDim> mesh;  // innermost first; empty: one device, no process group
  ZeroStage zero = ZeroStage::none;
  bool reshard_after_forward = true;  // ZeRO-3: free gathered weights after forward
  bool prefetch = true;               // ZeRO-3: gather the next unit while this one computes
  bool reduce_once = false;           // ZeRO-2/3: one gradient reduce-scatter per step (DataParallelConfig)
  Checkpointing ac;
  ReduceAlgo algo = ReduceAlgo::ordered;
  // Tensor parallelism: shard the residual stream and the RMSNorms along the sequence between
  // the tensor-parallel regions (Korthikanti et al. 2022). On by default; no effect at tp=1.
  bool sequence_parallel = true;
  // Pipeline parallelism over the pp dim: the schedule, model chunks per rank (interleaved)
  // and the layers of each virtual stage (empty: balanced; core/parallel/pipeline_layout.h).
  PipelineScheduleKind schedule = PipelineScheduleKind::one_f_one_b;
  int pp_chunks = 1;
  std::vector<int> pp_layers;
  // Context parallelism over the cp dim: how keys and values reach the other ranks' queries.
  ContextAlgo cp_algo = ContextAlgo::allgather;
  // Gradients reduced in bf16 with f32 accumulation (DataParallelConfig::bf16_grad_reduce).
  bool bf16_grad_reduce = false;

  // The dims a mesh may name. ep: expert parallelism of a mixture-of-experts model
  // (core/parallel/expert_parallel.h), inside the data-parallel ranks.
  static const std::vector<std::string>& known_dims();
  // "dp=4", "dp_shard=2,dp_replicate=2", "tp=1,cp=1,pp=1,dp=4" (innermost first). Empty: one
  // device. InputError on malformed text, unknown or repeated dims, or sizes < 1.
  static ParallelPlan parse(std::string_view mesh_spec);

  bool single_device() const { return mesh.empty(); }
  int world_size() const;
  int size(std::string_view dim) const;  // 1 when the mesh does not name it
  // The data-parallel ranks: dp, or dp_shard x dp_replicate (HSDP). Expert-parallel ranks are data
  // ranks too (each routes its own rows, as Megatron-LM and torchtitan place ep inside the data
  // ranks), so ep multiplies them: dp=2,ep=2 has 4 data ranks, the dense weights replicated over
  // all 4 and each expert over the 2 with the same ep coordinate (expert_data()).
  int dp_shard() const { return size("dp") * size("dp_shard") * size("ep"); }
  int dp_replicate() const { return size("dp_replicate"); }
  int dp() const { return dp_shard() * dp_replicate(); }
  // The data ranks holding the same experts: dp without ep.
  int expert_data() const { return dp() / size("ep"); }
  // This rank's experts of a mixture-of-experts model (all of them without ep).
  ExpertShard expert_shard(const LlamaConfig& cfg, int world_rank) const;
  bool hsdp() const { return dp_replicate() > 1; }

  // InputError naming the first problem: a dim of size > 1 that this build does not implement
  // yet, dp mixed with dp_shard/dp_replicate, --keep-params without ZeRO-3, --reduce-once
  // below ZeRO-2, HSDP without gradient sharding, bf16 gradient reductions without ranks to reduce over.
  void validate() const;
  // What the data-parallel strategy needs of the plan.
  DataParallelConfig data_parallel() const;
  // The tensor-parallel slice world rank `world_rank` holds (the whole model without tp).
  // InputError naming the constraint when tp cannot cut this model.
  TpLayout tp_layout(const LlamaConfig& cfg, int world_rank) const;
  // This rank's coordinate along `dim` (0 when the mesh does not name it).
  int coordinate(std::string_view dim, int world_rank) const;
  // Pipeline parallelism: the stages of `cfg`, and the units world rank `world_rank` holds
  // (empty without pp: all of them).
  PipelineLayout pipeline_layout(const LlamaConfig& cfg) const;
  std::vector<UnitRange> held_units(const LlamaConfig& cfg, int world_rank) const;
  // World rank `world_rank`'s model: its tensor-parallel slice of its pipeline stages' units, its
  // storage charged to `memory` (the rank's). Allocates nothing yet.
  template <class T>
  Llama<T> make_model(const LlamaConfig& cfg, MemoryTracker& memory, int world_rank) const {
    return Llama<T>(cfg, &memory, tp_layout(cfg, world_rank), held_units(cfg, world_rank), expert_shard(cfg, world_rank));
  }
  // InputError naming the constraint when some rank's slice or stage of `cfg` cannot be cut,
  // or the schedule cannot run `micro_batches` per step (0: not checked), before any rank starts.
  void check_model(const LlamaConfig& cfg, int micro_batches = 0) const;
  // The data-parallel dims the mesh names ({"dp"} or {"dp_shard", "dp_replicate"}), and ep when
  // it names it (expert-parallel ranks run their own rows); empty when it names none (a pure
  // tensor-parallel mesh has one data-parallel rank).
  std::vector<std::string> data_dims() const;
  // InputError when sequences of seq_len tokens cannot be cut into 2·cp chunks.
  void check_sequence(int64_t seq_len) const;
  // InputError when bf16 gradient reductions are asked of a run that does not compute in bf16:
  // an f32 or f64 run keeps its gradients exact to its own type.
  void check_precision(bool bf16_compute) const;

  std::string describe_mesh() const;  // "dp=4", "dp_shard=2,dp_replicate=2", "1 device"
  std::string describe() const;       // mesh + ZeRO + AC, one line (the algo is reported apart)
  nlohmann::json to_json() const;
};

}  // namespace llama4d
