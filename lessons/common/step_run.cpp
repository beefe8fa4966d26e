#include "lessons/common/step_run.h"

#include <mutex>

#include "backends/virtual/virtual_cluster.h"
#include "core/ops.h"
#include "core/parallel/parallel_trainer.h"

namespace llama4d::lesson {

StepRun measure_one_step(const LlamaConfig& cfg, const ParallelPlan& plan, const TrainOptions& train,
                         const LessonOptions& o, const TextDataset& data, const StepRunOptions& options) {
  plan.validate();
  plan.check_model(cfg, int(rank_micro_batch_count(train, plan.dp())));
  plan.check_sequence(train.seq_len);
  const int W = plan.world_size();
  VirtualClusterOptions vo;
  vo.ranks = W;
  vo.cluster = ClusterSpec::for_ranks(W, o.gpus_per_node);
  if (options.gpu_tflops > 0) vo.cluster.gpu_tflops = options.gpu_tflops;
  vo.algo = o.reduce_algo();
  ParallelPlan p = plan;
  p.algo = vo.algo;
  TrainOptions t = train;
  t.steps = 1;
  StepRun run;
  run.rest.resize(size_t(W));
  run.peak.resize(size_t(W));
  run.traffic.resize(size_t(W));
  run.time.resize(size_t(W));
  run.in_flight.resize(size_t(W));
  run.units_held.resize(size_t(W));
  VirtualCluster cluster(vo);
  std::mutex mu;
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model(cfg, &world.memory(), p.tp_layout(cfg, world.rank()), p.held_units(cfg, world.rank()));
    ParallelTrainer<float> trainer(world, model, data, t, p);
    const RankMemory rest = memory_live(world.memory());
    BarrierOptions b;
    b.label = "set-up done";
    world.barrier(b)->wait();
    world.trace().clear();
    const size_t mark = world.traffic().records().size();
    trainer.step();
    const std::vector<TrafficRecord> all = world.traffic().records();
    int held = 0;
    for (int u = 0; u < model.num_units(); ++u) held += model.holds_unit(u) ? 1 : 0;
    std::lock_guard<std::mutex> lock(mu);
    const size_t r = size_t(world.rank());
    run.rest[r] = rest;
    run.peak[r] = trainer.strategy().peak_memory();
    run.traffic[r].assign(all.begin() + std::ptrdiff_t(mark), all.end());
    run.time[r] = world.trace().totals();
    run.in_flight[r] = trainer.pipeline() ? trainer.pipeline()->peak_in_flight() : 0;
    run.units_held[r] = held;
  });
  if (!options.picture_title.empty() && plan.size("pp") == W) run.picture = pipeline_picture(cluster.traces(), options.picture_title);
  return run;
}

}  // namespace llama4d::lesson
