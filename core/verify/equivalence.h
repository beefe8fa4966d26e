#pragma once
// The equivalence harness: proof that a parallel strategy computes what one device computes.
//
// It trains K steps with the strategy on N ranks, gathers the full (unsharded) gradients of the
// last step and the final parameters, then replays the same K steps on ONE device over the same
// micro-batches and compares every tensor by name: max abs error, max rel error, bitwise or not,
// and every step's loss on both sides.
//
// "The same computation" includes the order of additions, because fp32 addition is not
// associative: (a + b) + c and a + (b + c) may differ in the last bit. With `ordered`
// reductions a strategy sums ranks 0, 1, ..., N-1 in turn, and the single device here performs
// exactly the additions the strategy's reduction tree performs:
//   DP, ZeRO-1  each rank accumulates its micro-batches, then ranks are summed in order;
//   ZeRO-2/3    each micro-batch is summed over ranks first, then micro-batches accumulate;
//   HSDP        as ZeRO-2/3, summing inside each shard group, then across replicas.
// Then the bits match exactly. With `ring` reductions every chunk is summed starting at a
// different rank, so results differ by rounding (~1e-7 relative in fp32) and the harness
// checks tolerances instead (first-step gradients 1e-6 in fp32, 1e-12 in fp64; parameters after
// AdamW 1e-3 / 1e-9): that difference is why NCCL training is not bitwise reproducible.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "core/comm/comm_types.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/plan.h"

namespace llama4d {

struct EquivalenceOptions {
  LlamaConfig model;
  TrainOptions train;  // train.steps = steps to verify
  ParallelPlan plan;   // the parallel side; the single device never checkpoints activations
};

struct TensorComparison {
  std::string name;
  double grad_max_abs = 0, grad_max_rel = 0, param_max_abs = 0, param_max_rel = 0;
  bool grad_bitwise = true, param_bitwise = true;
};

struct EquivalenceReport {
  std::string strategy, dtype, algo;
  nlohmann::json plan;  // ParallelPlan::to_json() of the parallel side
  int ranks = 0, steps = 0;
  std::vector<double> losses_single, losses_parallel;
  std::vector<double> grad_norms_single, grad_norms_parallel;  // pre-clip global norms per step
  std::vector<TensorComparison> tensors;
  bool losses_bitwise = true, bitwise = true, ok = false;
  double max_abs_err = 0, max_rel_err = 0;
  // Ring reductions only: bounds on the relative error of gradients and of parameters (0 with
  // ordered reductions, where bitwise equality is required). Parameters get a looser bound:
  // AdamW divides every gradient entry by its own running RMS, so where contributions of the
  // ranks nearly cancel, a last-bit difference in the gradient is a visible one in the update.
  // The gradient bound applies to the FIRST step, where both sides start from the same weights,
  // so any difference is the order of additions alone; later steps also carry the drift of the
  // weights, which AdamW amplifies, and are covered by the parameter bound.
  double tolerance = 0, param_tolerance = 0;
  double max_grad_rel_err = 0, max_param_rel_err = 0, first_step_grad_rel_err = 0;
  std::string worst_tensor;
  std::vector<RankMemory> memory;  // per rank peaks of the parallel run

  nlohmann::json to_json() const;
  std::string table() const;  // the per-tensor table and a verdict line
};

// The single device's side: replays steps [first_step, options.train.steps) over the
// micro-batches every data rank of options.plan would see, adding gradients in the order that
// strategy's reduction adds them. Starts from init_weights(seed), or from a training checkpoint.
template <class T>
struct ReplayResult {
  std::vector<double> losses, grad_norms;
  std::vector<T> grads, params;  // last step's clipped gradient; final parameters
  std::vector<T> first_grads;    // the first replayed step's clipped gradient
};
template <class T>
ReplayResult<T> replay_on_one_device(const EquivalenceOptions& options, const TextDataset& data,
                                     const std::string& resume_from = "");

// Runs `fn(world)` on every rank of the parallel setup (a VirtualCluster::run, or the MPI world
// of this process).
using RankLauncher = std::function<void(const std::function<void(ProcessGroup&)>& fn)>;

// Collective over the launched world. The report is complete on world rank 0 (which computes the
// single-device replay after the parallel run); other ranks get the parallel side only.
template <class T>
EquivalenceReport verify_plan(const EquivalenceOptions& options, const TextDataset& data, const RankLauncher& launch);

}  // namespace llama4d
