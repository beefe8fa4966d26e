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

namespace {

template <class Read>
DataParallelMemory by_category(Read read, int64_t total) {
  DataParallelMemory m;
  m.params = read(MemoryCategory::params);
  m.grads = read(MemoryCategory::grads);
  m.optimizer = read(MemoryCategory::optimizer);
  m.activations = read(MemoryCategory::activations);
  m.comm_buffers = read(MemoryCategory::comm_buffers);
  m.total = total;
  return m;
}

}  // namespace

DataParallelMemory memory_peaks(const MemoryTracker& t) {
  return by_category([&](MemoryCategory c) { return t.peak(c); }, t.peak_total());
}

DataParallelMemory memory_live(const MemoryTracker& t) {
  return by_category([&](MemoryCategory c) { return t.live(c); }, t.live_total());
}

nlohmann::json memory_json(const std::vector<DataParallelMemory>& per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const DataParallelMemory& m = per_rank[r];
    out.push_back({{"rank", r}, {"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                   {"activations", m.activations}, {"comm_buffers", m.comm_buffers}, {"total", m.total}});
  }
  return out;
}

void StageTracer::end(const char* phase, int layer) {
  const std::string name = std::string(phase) + (layer == kRootStage ? " embed/head" : " layer " + std::to_string(layer));
  trace_.add_compute(name, start_us_, trace_.wall_now_us());
}

template <class T>
void poison(T* data, int64_t begin, int64_t end) {
  std::fill(data + begin, data + end, std::numeric_limits<T>::quiet_NaN());
}

template void poison<float>(float*, int64_t, int64_t);
template void poison<double>(double*, int64_t, int64_t);

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
    return make_distributed_data_parallel(model, *groups.data, adamw);
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
