#include "core/parallel/dp_common.h"

#include <algorithm>
#include <limits>

namespace llama4d {

LossSum all_reduce_loss(ProcessGroup& group, const LossSum& local) {
  // Token counts are exact in a double (< 2^53), so one fp64 all-reduce carries both.
  double v[2] = {local.loss_sum, double(local.tokens)};
  AllReduceOptions o;
  o.label = "loss";
  group.all_reduce(v, 2, DType::f64, ReduceOp::sum, o)->wait();
  return {v[0], int64_t(v[1])};
}

double tensor_parallel_sum_squares(ProcessGroup* tensor, double slice_sum_sq, double replicas) {
  if (!tensor) return slice_sum_sq;
  double v = slice_sum_sq - replicas;
  AllReduceOptions o;
  o.label = "grad-norm (tensor-parallel slices)";
  tensor->all_reduce(&v, 1, DType::f64, ReduceOp::sum, o)->wait();
  return v;
}

}  // namespace llama4d

namespace llama4d {

std::string DataParallelConfig::describe() const {
  switch (stage) {
    case ZeroStage::none: return "DP";
    case ZeroStage::zero1: return "ZeRO-1";
    case ZeroStage::zero2: return "ZeRO-2";
    case ZeroStage::zero3:
      return reshard_after_forward ? "ZeRO-3 (reshard after forward)" : "ZeRO-3 (keep params until backward)";
  }
  return "?";
}

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                             const DataParallelConfig& config, const AdamWConfig& adamw) {
  if (config.stage == ZeroStage::none) {
    if (groups.replicate && groups.replicate->size() > 1)
      throw InputError("HSDP (dp_shard x dp_replicate) shards the model: use --zero 2 or 3");
    return make_distributed_data_parallel(model, *groups.data, groups.tensor, adamw);
  }
  return make_zero_data_parallel(model, groups, config, adamw);
}

template std::unique_ptr<DataParallelStrategy<float>> make_data_parallel<float>(Llama<float>&, const DataParallelGroups&,
                                                                               const DataParallelConfig&,
                                                                               const AdamWConfig&);
template std::unique_ptr<DataParallelStrategy<double>> make_data_parallel<double>(Llama<double>&,
                                                                                 const DataParallelGroups&,
                                                                                 const DataParallelConfig&,
                                                                                 const AdamWConfig&);

}  // namespace llama4d
