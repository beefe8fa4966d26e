#pragma once
// The training loop of one data-parallel rank. The global batch of a step is the same B rows
// as on one device (TrainOptions.batch_size, whatever the mesh); data rank d owns rows
// [d*B/dp, (d+1)*B/dp) and runs them in micro-batches of micro_batch_size rows.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/dataset.h"
#include "core/dist/device_mesh.h"
#include "core/parallel/data_parallel.h"
#include "core/train/train_options.h"
#include "core/train/trainer.h"

namespace llama4d {

// The data-parallel part of a mesh: dp ranks, or dp_shard x dp_replicate for HSDP.
struct DataParallelMesh {
  int dp_shard = 1;      // ranks that split the model state
  int dp_replicate = 1;  // HSDP: replicas of the sharded group
  int size() const { return dp_shard * dp_replicate; }
  bool hsdp() const { return dp_replicate > 1; }
  // "dp=4" or "dp_shard=2,dp_replicate=2" (tp, cp, pp of size 1 are accepted and ignored).
  static DataParallelMesh parse(std::string_view spec);
  std::string describe() const;
};

// Micro-batches of data rank d for optimizer step `step` (pure function of its arguments).
std::vector<Batch> data_rank_micro_batches(TokenSpan train, const TrainOptions& opt, int64_t step, int data_rank,
                                           int dp);
// Rows per micro-batch on a data rank: micro_batch_size, or all of the rank's rows when 0.
int64_t rank_micro_batch_rows(const TrainOptions& opt, int dp);

template <class T>
class DataParallelTrainer {
 public:
  // Collective over `world`, whose size must equal mesh.size().
  DataParallelTrainer(ProcessGroup& world, Llama<T>& model, const TextDataset& data, const TrainOptions& options,
                      const DataParallelMesh& mesh, const DataParallelConfig& config);

  StepStats step();
  int64_t steps_done() const { return steps_done_; }
  int data_rank() const { return world_.rank(); }
  DataParallelStrategy<T>& strategy() { return *strategy_; }
  const DeviceMesh& mesh() const { return *mesh_; }

  // Collective. Validation windows are split across ranks and their losses summed.
  LossSum validate(int64_t max_windows);
  // Collective: the state is gathered unsharded and world rank 0 writes it, so any mesh can
  // resume it. Every rank returns once the checkpoint is complete.
  void save_checkpoint(const std::string& dir);
  // Collective: every rank reads the (unsharded) checkpoint and keeps its shard.
  void load_checkpoint(const std::string& dir);

 private:
  ProcessGroup& world_;
  Llama<T>& model_;
  const TextDataset& data_;
  TrainOptions opt_;
  LrSchedule schedule_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::unique_ptr<DataParallelStrategy<T>> strategy_;
  int64_t steps_done_ = 0;
};

extern template class DataParallelTrainer<float>;
extern template class DataParallelTrainer<double>;

}  // namespace llama4d
