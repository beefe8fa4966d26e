#pragma once
// The training loop of one rank of a parallel plan. The global batch of a step is the same B
// rows as on one device (TrainOptions.batch_size, whatever the mesh); data rank d owns rows
// [d*B/dp, (d+1)*B/dp) and runs them in micro-batches of micro_batch_size rows. The ranks of a
// tensor-parallel group share a data rank and run the same rows on their slices of the model;
// the ranks of a context-parallel group share it too and run their chunks of those rows.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/data_mix.h"
#include "core/data/dataset.h"
#include "core/comm/device_mesh.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/expert_parallel.h"
#include "core/parallel/pipeline_parallel.h"
#include "core/parallel/plan.h"
#include "core/parallel/tensor_context_comm.h"
#include "core/parallel/tensor_parallel.h"
#include "core/train/train_options.h"
#include "core/train/trainer.h"

namespace llama4d {

// Micro-batches of data rank d for optimizer step `step` (pure function of its arguments).
std::vector<Batch> data_rank_micro_batches(TokenSpan train, const TrainOptions& opt, int64_t step, int data_rank,
                                           int dp);
// The same rows drawn from a data mix (DataMix::sample_rows) instead of one split.
std::vector<Batch> data_rank_micro_batches(const DataMix& mix, const TrainOptions& opt, int64_t step, int data_rank,
                                           int dp);
// Rows per micro-batch on a data rank: micro_batch_size, or all of the rank's rows when 0.
int64_t rank_micro_batch_rows(const TrainOptions& opt, int dp);
// Micro-batches per step on a data rank.
int64_t rank_micro_batch_count(const TrainOptions& opt, int dp);

template <class T>
class ParallelTrainer {
 public:
  // Collective over `world`, whose size must equal mesh.size(). `model` holds no weights yet
  // (constructed on the rank's tracker); the strategy initialises it from options.seed the way
  // its residency needs, with the values one device would have.
  // Throws InputError for a plan this build cannot train (ParallelPlan::validate).
  ParallelTrainer(ProcessGroup& world, Llama<T>& model, const TextDataset& data, const TrainOptions& options,
                  const ParallelPlan& plan);

  StepStats step();
  // Training rows from `mix` (not owned; its seq_len must be the options') instead of the data's
  // train split, from the next step on; validation stays on the data's held-out split. A recipe
  // stage's data mix (core/train/recipe.h). Null: the train split again.
  void set_data_mix(const DataMix* mix);
  // The next stage of a training recipe on this same plan (core/train/recipe.h): from the next
  // step on, `next`'s global batch, sequence length, length and LR segment, with the state every
  // rank holds kept where it is: nothing moves between ranks, and the result is, byte for byte,
  // saving here and resuming on this plan with `next` (load_checkpoint reads back exactly what
  // each rank keeps). Not collective. InputError, naming the option, when `next` cannot resume
  // this run (check_resumable), or when the plan cannot split its batch or sequence; the data mix
  // is reset to the train split (set it again for the new stage).
  void continue_with(const TrainOptions& next);
  int64_t steps_done() const { return steps_done_; }
  int data_rank() const { return dp_group_->rank(); }
  const ParallelPlan& plan() const { return plan_; }
  DataParallelStrategy<T>& strategy() { return *strategy_; }
  // "TP over 2 ranks with SP, ZeRO-3 over 2 ranks", "DP over 4 ranks".
  std::string describe() const;
  const DeviceMesh& mesh() const { return *mesh_; }
  // Pipeline parallelism: this rank's runner (null without pp).
  PipelineRunner<T>* pipeline() { return pipeline_.get(); }
  // The ranks that hold this rank's weights bit for bit after every step (the dp_cp group; under
  // expert parallelism the data ranks holding the same experts).
  ProcessGroup& replica_group() { return *replica_group_; }

  // Collective. Validation windows are split across ranks and their losses summed.
  LossSum validation_loss(int64_t max_windows);
  // Collective: every rank writes its share of the weights and AdamW moments straight into one
  // unsharded (HF-layout) checkpoint, so no rank holds the whole state and any mesh can resume
  // it. All-or-nothing; every rank returns once it is complete, or throws if any rank failed.
  void save_checkpoint(const std::string& dir);
  // Every rank reads just the flat ranges it keeps from the (unsharded) checkpoint.
  void load_checkpoint(const std::string& dir);
  // The same two through memory (core/train/state_image.h): every rank writes its share into
  // `image` (shared by the ranks of this process) or reads what it keeps from it, by the strategy
  // code that writes and reads files. An image saved on one plan loads on any other plan of the
  // same model, like a checkpoint; see reshard_in_memory.h.
  // `written`, if given, runs on each rank once its share is in the image, before the closing
  // collective (an asynchronous checkpoint's writer starts when the last share is in).
  void save_state(TrainingStateImage<T>& image, const std::function<void()>& written = {});
  void load_state(const TrainingStateImage<T>& image);

 private:
  // This rank's tokens of a batch of its rows: all of them, or its chunks under context parallelism.
  Batch local_tokens(const Batch& b) const;
  // Mixture of experts: the step's aux loss and expert token counts over every data rank into
  // `into`, from this rank's `local` counts and `terms` ((share, aux) per micro-batch, in order).
  // Collective over the dp_cp group.
  void sum_routing(StepStats& into, const StepStats& local, const std::vector<double>& terms);
  // The one path of saving and loading, to files or an image: this rank's share.
  void write_share(TrainingCheckpointWriter<T>& writer);
  void read_share(const TrainingCheckpointReader<T>& ckpt);

  ProcessGroup& world_;
  Llama<T>& model_;
  const TextDataset& data_;
  const DataMix* mix_ = nullptr;
  TrainOptions opt_;
  ParallelPlan plan_;
  LrSchedule schedule_;
  std::unique_ptr<DeviceMesh> mesh_;
  ProcessGroup* dp_group_ = nullptr;     // the data-parallel ranks: who runs which rows
  ProcessGroup* dp_cp_group_ = nullptr;  // who sums gradients: those and the context-parallel ranks
  ProcessGroup* replica_group_ = nullptr;  // replica_group()
  std::unique_ptr<ExpertParallelComm<T>> expert_comm_;  // expert parallelism only
  std::unique_ptr<TensorParallelComm<T>> tensor_comm_;  // tensor parallelism only
  std::unique_ptr<ContextParallelComm<T>> context_comm_;  // context parallelism only
  std::unique_ptr<TensorContextComm<T>> tensor_context_comm_;  // both: the model's block points
  std::unique_ptr<PipelineRunner<T>> pipeline_;         // pipeline parallelism only
  std::shared_ptr<ProcessGroup> tied_group_;            // pp with tied embeddings: first + last stage
  std::unique_ptr<DataParallelStrategy<T>> strategy_;
  int64_t steps_done_ = 0;
};

extern template class ParallelTrainer<float>;
extern template class ParallelTrainer<double>;

}  // namespace llama4d
