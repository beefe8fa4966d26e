#pragma once
// The data-parallel family: every rank holds the same model (or a shard of it), trains on its
// own rows of the global batch, and the ranks combine gradients so every optimizer step equals
// the single-device step. One interface, two implementations:
//   DistributedDataParallel   (data_parallel.cpp)  replicate everything, all-reduce gradients
//   ZeroDataParallel          (zero.cpp)           ZeRO-1/2 and HSDP: gradients reduce-scattered,
//                                                  AdamW on each rank's pieces, weights all-gathered
//   FullyShardedDataParallel  (fsdp.cpp)           ZeRO-3: the weights sharded too, gathered per unit
// A strategy plugs into the single-rank model through UnitHooks; it never copies the model.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/comm/process_group.h"
#include "core/model/llama.h"
#include "core/optim/adamw.h"
#include "core/parallel/passes.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"

namespace llama4d {

// ZeRO stage: what is sharded across the data-parallel ranks.
//   none:  nothing (plain DP)          zero1: optimizer states
//   zero2: + gradients                 zero3: + parameters (FSDP)
enum class ZeroStage : int { none = 0, zero1 = 1, zero2 = 2, zero3 = 3 };

struct DataParallelConfig {
  ZeroStage stage = ZeroStage::none;
  // ZeRO-3 only. true: free a layer's gathered parameters after its forward and gather them
  // again for its backward (FSDP's default, least memory). false: keep them from forward to
  // backward, which costs memory and saves one all-gather per layer: what the Llama 3 paper
  // describes doing ("we do not reshard after forward"), a ZeRO-2/3 hybrid.
  bool reshard_after_forward = true;
  // ZeRO-3: issue the all-gather of the next unit before computing this one.
  bool prefetch = true;
  // ZeRO-2/3 only. false: each micro-batch's gradients are reduce-scattered as soon as they are
  // final and the unit's full gradient freed (least memory, M reductions per step). true: every
  // rank accumulates its micro-batches' full gradients locally and reduce-scatters them once, at
  // the step's last micro-batch (PyTorch FSDP's no_sync): 1/M of the gradient traffic for a full
  // gradient of the rank's units held through the step, as ZeRO-1 holds it. Llama 3 accumulated
  // gradients in FP32 over micro-batches and reduce-scattered them in FP32 (its paper, section
  // 3.3.2), which under pipelining with many micro-batches per step is this mode.
  bool reduce_once = false;
  // Gradients travel as bf16 (--grad-reduce-in-bf16; bf16 mixed precision only): each rank's
  // contribution is rounded to bf16, the reduction adds in f32 and rounds the sum to bf16 (NCCL
  // rounds after every ring step), and the result is widened back into the f32 gradient, where
  // micro-batches keep accumulating in f32. Half the bytes of f32, the precision of PyTorch
  // FSDP's MixedPrecision(reduce_dtype=bfloat16). false: gradients are reduced in the model's
  // type, as Llama 3 did (fp32 reduce-scatter).
  bool bf16_grad_reduce = false;

  std::string describe() const;  // "DP", "ZeRO-3 (reshard after forward)", ...
  // How gradients are reduced when it is not the default, for the end of a description:
  // ", one reduction per step" (ZeRO-2/3 --reduce-once), ", bf16 gradients", or nothing.
  std::string reduce_note() const {
    return std::string(reduce_once ? ", one reduction per step" : "") + (bf16_grad_reduce ? ", bf16 gradients" : "");
  }
};

// Groups a data-parallel rank talks in. For DP and ZeRO `shard == dp_cp` and no replicate group;
// for HSDP `shard` is the dp_shard group, `replicate` the dp_replicate group and `dp_cp` both.
struct DataParallelGroups {
  // Every rank that holds this rank's weights and sums gradients with it: the data-parallel ranks
  // and, under context parallelism, the context-parallel ones (torchtitan's dp_cp mesh); losses
  // are summed here too.
  ProcessGroup* dp_cp = nullptr;
  ProcessGroup* shard = nullptr;      // ranks that split parameters / grads / optimizer states
  ProcessGroup* replicate = nullptr;  // HSDP: ranks holding the same shard (nullptr otherwise)
  // Tensor parallelism: the ranks holding the other slices of this rank's model
  // (core/model/tp_layout.h). Data parallelism works on this rank's slice as if it were a whole
  // model; only the global gradient norm adds up across this group. nullptr without TP.
  ProcessGroup* tensor = nullptr;
  // Pipeline parallelism: the ranks holding the other stages of the model. A stage's data
  // parallelism covers only its own units; the loss (computed on the last stage) and the
  // global gradient norm add up across this group. nullptr without PP.
  ProcessGroup* pipeline = nullptr;
  // Pipeline parallelism with tied embeddings, on the first and the last stage only: those two
  // ranks, which hold the embedding (the last as its tied head's weights). After its own
  // reduction each sums its part of the embedding's gradient with the other's (first + last),
  // so both copies take the same optimizer step. nullptr otherwise.
  ProcessGroup* tied = nullptr;
  // Expert parallelism (core/parallel/expert_parallel.h): the ranks holding the other experts of
  // this rank's MoE layers (ep), and the data ranks holding the same experts (dp without ep),
  // over which the experts' gradients are summed while the dense weights' are summed over dp_cp.
  // nullptr without ep.
  ProcessGroup* expert_parallel = nullptr;
  ProcessGroup* experts = nullptr;
};

template <class T>
class DataParallelStrategy : public UnitHooks, public PassEvents {
 public:
  ~DataParallelStrategy() override = default;

  // How the forward and backward passes run (core/parallel/passes.h): the whole model one
  // micro-batch after another unless a pipeline runner is set. Not owned.
  void set_passes(Passes<T>* passes) { passes_ = passes ? passes : &sequential_; }
  Passes<T>& passes() { return *passes_; }

  // One optimizer step from this rank's micro-batches. loss_scale = 1 / tokens of the GLOBAL
  // batch, so gradients are summed (never averaged) and equal the single-device gradient of
  // the global mean loss. Returns the global mean loss and the pre-clip global gradient norm.
  virtual StepStats step(const std::vector<Batch>& micro_batches, double lr, T loss_scale, double grad_clip) = 0;

  // Collective. The weights init_weights(seed) gives one device, each rank allocating only what
  // it keeps (ZeRO-3 computes just its pieces).
  virtual void init_weights(uint64_t seed) = 0;
  // Collective. Forward only (validation): the local loss sum of one batch with the full
  // weights; nothing stays gathered afterwards.
  virtual LossSum evaluate(const Batch& batch) = 0;

  // Collective over the shard group: full flat buffers on every rank (for verification).
  virtual void gather_params(std::vector<T>& out) = 0;
  virtual void gather_grads(std::vector<T>& out) = 0;  // as the optimizer consumed them (after clipping)
  // For checkpoints, no communication: this rank writes its share of the parameters and AdamW
  // moments straight into the checkpoint's files, so that the data group's ranks together
  // write every element once and no rank holds more than it keeps. Checkpoints are unsharded
  // (HF layout): a run saved on one mesh resumes on any other.
  virtual void save_state(TrainingCheckpointWriter<T>& checkpoint) = 0;
  virtual int64_t optimizer_steps() const = 0;  // AdamW steps taken, for trainer_state.json
  // The weights this rank keeps (all of them, or its shard) hold no NaN or infinity: checked
  // before a checkpoint is written, so a diverged run never saves its weights.
  virtual bool weights_finite() const = 0;
  // Each rank reads only the flat ranges it keeps.
  virtual void load_state(const TrainingCheckpointReader<T>& checkpoint) = 0;

  virtual RankMemory peak_memory() const = 0;
  virtual std::string describe() const = 0;

 private:
  SequentialPasses<T> sequential_;
  Passes<T>* passes_ = &sequential_;
};

// The implementations (data_parallel.cpp; zero.cpp, which makes fsdp.cpp's at stage 3);
// make_data_parallel picks one.
template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_distributed_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                                         const DataParallelConfig& config,
                                                                         const AdamWConfig& adamw);
template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_zero_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                                  const DataParallelConfig& config,
                                                                  const AdamWConfig& adamw);

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                             const DataParallelConfig& config,
                                                             const AdamWConfig& adamw);

}  // namespace llama4d
