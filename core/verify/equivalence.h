#pragma once
// The equivalence harness: proof that a parallel strategy computes what one device computes.
//
// Two references, both computed on one device BEFORE the parallel run and without any code the
// strategies use to split work:
//   replay  the global batch of each step drawn through the single-device data path (rows in
//           order) and cut into the data ranks' micro-batches here, by row arithmetic; the
//           gradients are added in exactly the order the strategy's reduction adds them:
//             DP, ZeRO-1  each rank accumulates its micro-batches, then ranks are summed in order;
//             ZeRO-2/3    each micro-batch is summed over ranks first, then micro-batches accumulate;
//             HSDP        as ZeRO-2/3, summing inside each shard group, then across replicas.
//   plain   (fp64 runs) the ordinary single-device Trainer, with its own micro-batching and order
//           of additions. No shared code path, so it also catches a bug that a replay written
//           with the same misunderstanding would share; it is compared at 1e-12 relative.
//
// Then every rank of the parallel run (all replicas, all HSDP groups) compares, at EVERY step:
// its loss, its pre-clip gradient norm, its token count and the full gathered gradient as the
// optimizer consumed it, and after the last step the full gathered parameters. Errors are
// relative per element, |a - b| / max(|a|, floor) with floor = kErrorFloor x the RMS of the
// reference tensor, so a wrong small element is not hidden behind a large one.
//
// With `ordered` reductions (ranks summed 0, 1, ..., N-1) everything must be bitwise equal to the
// replay. With `ring` (NCCL's order) every chunk is summed starting at a different rank, so
// results differ by rounding, and each step gets bounds 10x the worst errors measured there
// (ring_tolerance in equivalence.cpp): the first step's gradients differ by the order of
// additions alone, later steps also by the drift of the weights, which AdamW amplifies in the
// few entries whose gradient is near zero. Those entries make element errors heavy-tailed, so
// each quantity is bounded twice: the element error (catches one wrong entry) and the tensor
// error ||a - b|| / ||a|| (steady, so its bound is tight enough to catch a small systematic
// bug). That difference is why NCCL training is not bitwise reproducible.
//
// Tensor parallelism: each rank compares its slices with the same slices of the references.
// Row-parallel layers, the vocabulary-parallel loss and the other sums TP splits add partial
// sums that one device does not form, so the replay for tp > 1 is tensor_parallel_replay.h: the
// whole weights on one device, every split sum evaluated per rank slice and added in rank order.
// With `ordered` reductions TP is then bitwise too; in fp64 the plain trainer's tensors are held
// to 1e-12 in ||a - b|| / ||a||. Context parallelism (cp > 1) merges attention's partial results
// in an order no replay here follows: it is held to measured bounds (tensor_parallel_tolerance).
// So is expert parallelism (ep > 1): its ranks are data ranks here (ParallelPlan::dp), and each
// expert's gradient is one product per micro-batch over every ep rank's rows for it, where the
// replay adds data rank after data rank; in fp64 the plain trainer is held element by element.
//
// bf16 mixed precision (train.bf16_compute) runs the replay with the same roundings to bf16
// (Llama::set_bf16_compute; the TP replay rounds at the same points), so with `ordered`
// reductions and no context parallelism it is bitwise too. Under ring reductions or context
// parallelism a last-bit difference can move a rounding by a whole bf16 step: the first step's
// tensors are bounded, and from then on only the loss (see the bounds in equivalence.cpp).
// Gradients reduced in bf16 (ParallelPlan::bf16_grad_reduce): the replay rounds each data rank's
// contribution and each reduction's sum where the run does (inside the shard group, across
// replicas, the tied embedding's two parts and their sum), so ordered reductions stay bitwise.
// It does not split a data rank's gradient over context-parallel ranks, which the run rounds
// each: context parallelism is held to bounds anyway.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/data/dataset.h"
#include "core/comm/comm_types.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/plan.h"

namespace llama4d {

// The element error's floor, as a multiple of the reference tensor's RMS: an entry far below the
// tensor's typical size is judged against that size (its own last bits are cancellation noise).
inline constexpr double kErrorFloor = 1.0;

struct EquivalenceOptions {
  LlamaConfig model;
  TrainOptions train;  // train.steps = steps to verify
  ParallelPlan plan;   // the parallel side; the single device never checkpoints activations
  // A training checkpoint of step 0 every side starts from (verify --init: a model directory's
  // weights, cli/init_checkpoint.h); empty: init_weights(train.seed).
  std::string start_from;
};

// Worst errors of one quantity against its reference. For tensors, max_rel is the element error
// (see above) and norm_rel the tensor error ||a - b|| / ||a||; for a scalar both are |a - b| / |a|.
struct ErrorStats {
  double max_abs = 0, max_rel = 0, norm_rel = 0;  // NaN anywhere makes them infinite
  bool bitwise = true;
  void merge(const ErrorStats& o);
};

// The errors of one step (worst over tensors), or the bounds on them.
struct StepErrors {
  double loss = 0;                            // the loss and the pre-clip gradient norm
  double grad_element = 0, grad_tensor = 0;   // the gradient the optimizer consumed
  double param_element = 0, param_tensor = 0; // the parameters after the step
  void merge(const StepErrors& o);
  bool within(const StepErrors& bound) const;
};

struct TensorComparison {
  std::string name;
  ErrorStats grad, param;  // worst over every rank; grad over every step
};

// One rank's agreement with the replay over the whole run.
struct RankComparison {
  int rank = 0;
  ErrorStats loss, grad_norm, grads, params;
  bool tokens_equal = true;
  std::vector<StepErrors> per_step;
};

struct EquivalenceReport {
  std::string strategy, dtype, algo;
  ParallelPlan plan;  // the parallel side
  int ranks = 0, steps = 0;
  int64_t micro_batches_per_rank = 0;
  std::vector<double> losses_single, losses_parallel;          // world rank 0's view
  std::vector<double> grad_norms_single, grad_norms_parallel;  // pre-clip global norms per step
  std::vector<int64_t> tokens_single, tokens_parallel;
  std::vector<TensorComparison> tensors;
  std::vector<RankComparison> per_rank;  // complete on every rank of a virtual run; MPI: own rank
  bool bitwise = true, ok = false;
  double max_abs_err = 0, max_rel_err = 0;
  std::string worst_tensor;
  // The worst errors over all ranks at each step, and (ring reductions or tensor parallelism;
  // empty where bitwise equality is required) the bound of each step.
  std::vector<StepErrors> errors_per_step, bounds_per_step;
  StepErrors max_errors;  // over all steps
  // The plain single-device Trainer (fp64 runs only).
  bool plain_checked = false, plain_ok = true;
  bool plain_per_tensor = false;  // tensor parallelism: the tensor error ||a - b|| / ||a|| is checked
  double plain_tolerance = 0, plain_max_rel_err = 0;
  std::vector<RankMemory> memory;  // per rank peaks of the parallel run

  nlohmann::json to_json() const;
  std::string table() const;  // per-step losses, per-tensor errors, per-rank summary, verdict
};

// A single device's record of a run, step by step.
template <class T>
struct ReplayResult {
  std::vector<double> losses, grad_norms;
  std::vector<int64_t> tokens;
  std::vector<std::vector<T>> grads;   // per step: the gradient the optimizer consumed (clipped)
  std::vector<std::vector<T>> params;  // per step: the parameters after it
};

// The replay reference: steps [first_step, options.train.steps) over the micro-batches every data
// rank of options.plan sees, cut from the global batch here, adding gradients in the order that
// strategy's reduction adds them. Starts from init_weights(seed), or from a training checkpoint.
template <class T>
ReplayResult<T> replay_on_one_device(const EquivalenceOptions& options, const TextDataset& data,
                                     const std::string& resume_from = "");

// The plain reference: the single-device Trainer as a user would run it (no plan).
template <class T>
ReplayResult<T> train_on_one_device(const EquivalenceOptions& options, const TextDataset& data);

// Runs `fn(world)` on every rank of the parallel setup (a VirtualCluster::run, or the MPI world
// of this process).
using RankLauncher = std::function<void(const std::function<void(ProcessGroup&)>& fn)>;

// Collective over the launched world. Every process computes the references first, so every
// rank checks itself; the report holds every rank this process ran.
template <class T>
EquivalenceReport verify_plan(const EquivalenceOptions& options, const TextDataset& data, const RankLauncher& launch);

}  // namespace llama4d
