#pragma once
// ZeRO-1 and ZeRO-2 (zero.cpp), and the class ZeRO-3 (fsdp.cpp) extends with the parameters'
// life cycle. Made by make_data_parallel (data_parallel.h); this header is for fsdp.cpp.
#include <memory>
#include <string>
#include <vector>

#include "core/parallel/data_parallel.h"
#include "core/parallel/dp_common.h"
#include "core/parallel/shard_layout.h"
#include "core/parallel/zero_optimizer.h"
#include "core/parallel/zero_reduce.h"

namespace llama4d {

template <class T>
class ZeroDataParallel : public DataParallelStrategy<T> {
 public:
  ZeroDataParallel(Llama<T>& model, const DataParallelGroups& groups, const DataParallelConfig& cfg,
                   const AdamWConfig& adamw);

  void init_weights(uint64_t seed) override;
  StepStats step(const std::vector<Batch>& micro_batches, double lr, T loss_scale, double grad_clip) override;
  LossSum evaluate(const Batch& b) override;

  // PassEvents: which backward passes reduce.
  void begin_backward_pass(int micro_batch, int count) override;
  void end_backward_pass(int micro_batch, int count) override;

  // UnitHooks: the trace spans, the reductions, and (fsdp.cpp) the parameters' gathers.
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_recompute(int unit) override;
  void after_recompute(int unit) override;
  void before_backward(int unit) override;
  void after_backward_input(int unit) override;
  void before_backward_weight(int unit) override;
  void after_backward(int unit) override;

  void gather_params(std::vector<T>& out) override;
  void gather_grads(std::vector<T>& out) override;
  void save_state(TrainingCheckpointWriter<T>& checkpoint) override;
  int64_t optimizer_steps() const override { return optimizer_.steps(); }
  bool weights_finite() const override;
  void load_state(const TrainingCheckpointReader<T>& checkpoint) override;
  RankMemory peak_memory() const override { return memory_peaks(model_.memory()); }
  std::string describe() const override;

 protected:
  int stage() const { return int(cfg_.stage); }
  // Full flat buffer from every rank's shard buffer, segment by segment (uneven pieces).
  void gather_shards(T* full, const T* shard, const char* label);

  // What ZeRO-3 adds (fsdp.cpp); nothing below it, where every rank holds the whole weights.
  // The unit is about to run (forward, recompute or backward): its weights must be here; `next`
  // is the unit to prefetch behind it (-1: none).
  virtual void params_needed(int unit, int next) {}
  virtual void params_done_forward(int unit) {}   // after a unit's forward
  virtual void params_done_backward(int unit) {}  // after its backward (or its input pass)
  virtual void params_done_passes(bool training) {}  // after the step's passes, or an evaluate
  // Where this rank's piece of segment s of the weights lives (what AdamW updates).
  virtual T* piece_weights(size_t s);
  // After AdamW: ZeRO-1/2 all-gather every rank's updated pieces into the whole weights.
  virtual void after_update();

  Llama<T>& model_;
  ProcessGroup& shard_;
  ProcessGroup* replicate_;  // HSDP's replica group, or null
  DataParallelGroups groups_;
  DataParallelConfig cfg_;
  ShardLayout layout_;
  int rank_;
  UnitTracer tracer_;
  ShardedAdamW<T> optimizer_;
  ShardedGradReducer<T> reducer_;
  bool sync_ = false;  // this backward pass reduces
};

extern template class ZeroDataParallel<float>;
extern template class ZeroDataParallel<double>;

// ZeRO-3 (fsdp.cpp).
template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_fully_sharded_data_parallel(Llama<T>& model,
                                                                           const DataParallelGroups& groups,
                                                                           const DataParallelConfig& config,
                                                                           const AdamWConfig& adamw);

}  // namespace llama4d
