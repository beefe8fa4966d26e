#pragma once
// --mesh, --zero, --keep-params, --reduce-once, --ac, --sp, --schedule, --pp-chunks, --pp-layers, --cp-algo and
// --grad-reduce-in-bf16: how the parallel plan is chosen on the command line.
// Parsed once into a ParallelPlan, which every command passes on unchanged.
#include <string>

#include "cli/commands.h"
#include "core/comm/rank_agreement.h"
#include "core/model/config.h"
#include "core/parallel/plan.h"
#include "core/train/train_options.h"

namespace llama4d::cli {

struct ParallelChoice {
  std::string mesh;  // "dp=4", "dp_shard=2,dp_replicate=2"; empty: one rank, no ProcessGroup
  int zero = 0;
  bool keep_params = false;  // ZeRO-3: keep gathered parameters from forward to backward
  bool reduce_once = false;  // ZeRO-2/3: accumulate micro-batches locally, reduce-scatter once per step
  std::string ac = "none";   // activation checkpointing policy
  std::string sp = "on";     // sequence parallelism with tp > 1: on | off
  std::string schedule = "1f1b";  // pipeline schedule with pp > 1
  int pp_chunks = 1;              // model chunks per pipeline rank (interleaved)
  std::string pp_layers;          // "1,2,2,1": layers per virtual stage; empty: balanced
  std::string cp_algo = "allgather";  // context parallelism with cp > 1: allgather | ring
  bool bf16_grad_reduce = false;   // gradients reduced in bf16 (with --dtype bf16)

  // with_grad_reduce: whether the command offers --grad-reduce-in-bf16 (commands that train do;
  // the planner's memory model does not cover its bf16 copies).
  void add_options(CLI::App& cmd, const std::string& default_mesh, bool with_grad_reduce);
  bool parallel() const { return !mesh.empty(); }
  // The plan (validated: InputError for anything this build cannot run). algo: ordered | ring.
  ParallelPlan plan(const LlamaConfig& model, const std::string& algo) const;
  // These flags as every rank of an MPI job must agree on them (core/comm/rank_agreement.h);
  // --mesh as `plan` reads it.
  std::vector<RankSetting> rank_settings(const ParallelPlan& plan) const;
};

// --micro-batches N: micro-batches per step on each data rank, an alternative to
// --micro-batch-size (what pipeline schedules are described in). apply_micro_batches sets
// opt.micro_batch_size to the rank's rows / N (N = 0: leaves it) and checks that the plan's
// schedule runs that many; InputError naming the problem.
void add_micro_batches_option(CLI::App& cmd, int& micro_batches);
void apply_micro_batches(int micro_batches, TrainOptions& opt, const ParallelPlan& plan, const LlamaConfig& model);
// An MoE model's load-balancing loss is computed per micro-batch, over its own rows
// (core/model/moe.h). By default a micro-batch is all of a rank's rows, which follow the mesh,
// and so would the math: a data-parallel run of one must give --micro-batch-size (InputError).
void check_moe_micro_batches(const LlamaConfig& model, const TrainOptions& opt, const ParallelPlan& plan);

// check_batch_fits_in_memory for a training step of `opt` under `plan` (its rows per forward on a
// data rank; on the virtual backend every rank is in this process). bytes: of one value.
void check_step_fits_in_memory(const LlamaConfig& model, const TrainOptions& opt, const ParallelPlan& plan,
                               const std::string& backend, double bytes, bool force);

}  // namespace llama4d::cli
