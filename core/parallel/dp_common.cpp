#include "core/parallel/dp_common.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/optim/grad_clip.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

LossSum all_reduce_loss(ProcessGroup& group, const LossSum& local) {
  // Token counts are exact in a double (< 2^53), so one fp64 all-reduce carries both.
  double v[2] = {local.loss_sum, double(local.tokens)};
  AllReduceOptions o{.label = "loss"};
  group.all_reduce(v, 2, DType::f64, ReduceOp::sum, o)->wait();
  return {v[0], int64_t(v[1])};
}

LossSum global_loss(const DataParallelGroups& groups, const LossSum& local) {
  return all_reduce_loss(groups.pipeline && groups.pipeline->size() > 1 ? groups.pipeline : nullptr,
                         all_reduce_loss(*groups.dp_cp, local));
}

LossSum all_reduce_loss(ProcessGroup* pipeline, const LossSum& local) {
  return pipeline && pipeline->size() > 1 ? all_reduce_loss(*pipeline, local) : local;
}

double tensor_parallel_sum_squares(ProcessGroup* tensor, double slice_sum_sq, double replicas) {
  if (!tensor) return slice_sum_sq;
  double v = slice_sum_sq - replicas;
  AllReduceOptions o{.label = std::string(label::kGradNormTensorSlices)};
  tensor->all_reduce(&v, 1, DType::f64, ReduceOp::sum, o)->wait();
  return v;
}

double pipeline_sum_squares(ProcessGroup* pipeline, const std::vector<int64_t>& partials_per_unit,
                            const std::vector<uint8_t>& held, const std::vector<double>& partials) {
  if (!pipeline || pipeline->size() == 1) return combine_chunk_sums(partials.data(), int64_t(partials.size()));
  int64_t total = 0;
  for (int64_t c : partials_per_unit) total += c;
  std::vector<double> all(size_t(total), 0.0);
  size_t at = 0, mine = 0;
  for (size_t u = 0; u < partials_per_unit.size(); ++u) {
    const size_t n = size_t(partials_per_unit[u]);
    if (held[u]) {
      if (mine + n > partials.size()) throw Error("pipeline_sum_squares: fewer partials than the held segments need");
      std::copy_n(partials.begin() + std::ptrdiff_t(mine), n, all.begin() + std::ptrdiff_t(at));
      mine += n;
    }
    at += n;
  }
  if (mine != partials.size()) throw Error("pipeline_sum_squares: more partials than the held segments have");
  AllReduceOptions o{.label = "grad-norm partials (pipeline stages)"};
  pipeline->all_reduce(all.data(), total, DType::f64, ReduceOp::sum, o)->wait();
  return combine_chunk_sums(all.data(), total);
}

double expert_parallel_sum_squares(ProcessGroup* ep, const std::vector<double>& expert_partials) {
  if (!ep) return 0.0;
  double v = combine_chunk_sums(expert_partials.data(), int64_t(expert_partials.size()));
  AllReduceOptions o{.label = "grad-norm experts (expert-parallel ranks)"};
  ep->all_reduce(&v, 1, DType::f64, ReduceOp::sum, o)->wait();
  return v;
}

double pipeline_sum(ProcessGroup* pipeline, double v, const char* label) {
  if (!pipeline || pipeline->size() == 1) return v;
  AllReduceOptions o{.label = label};
  pipeline->all_reduce(&v, 1, DType::f64, ReduceOp::sum, o)->wait();
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
  if (groups.experts && config.stage != ZeroStage::none)
    throw InputError("expert parallelism runs with plain data parallelism only so far (--zero 0)");
  if (config.stage == ZeroStage::none) {
    if (groups.replicate && groups.replicate->size() > 1)
      throw InputError("HSDP (dp_shard x dp_replicate) shards the model: use --zero 2 or 3");
    return make_distributed_data_parallel(model, groups, config, adamw);
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
