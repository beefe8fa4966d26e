#pragma once
// Shared set-up for the data-parallel tests: the tiny model, a corpus, options whose global
// batch splits over 2, 3, 4 and 8 ranks, and a launcher on the virtual backend.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/virtual/virtual_cluster.h"
#include "core/data/dataset.h"
#include "core/ops.h"
#include "core/parallel/parallel_trainer.h"
#include "core/verify/equivalence.h"

namespace llama4d::test {

// The mixture-of-experts preset the MoE tests train (4 experts, top-2).
inline LlamaConfig tiny_moe() { return LlamaConfig::preset("tiny-moe"); }

inline const TextDataset& corpus() {
  static const TextDataset data = [] {
    std::string text;
    for (int i = 0; i < 300; ++i) text += "Rank " + std::to_string(i % 7) + " sends its shard of layer " + std::to_string(i) + ". ";
    return make_dataset(text, 16);
  }();
  return data;
}

// Short documents (7 to 19 bytes) packed with <|end_of_text|> between them, so a row of 24
// tokens holds two to four: for document masks.
inline const TextDataset& document_corpus() {
  static const TextDataset data = [] {
    std::vector<std::string> documents;
    for (int i = 0; i < 400; ++i) documents.push_back("Shard " + std::to_string(i) + std::string(size_t(i % 7), '.'));
    return make_dataset(documents, 16);
  }();
  return data;
}

inline TrainOptions options(int64_t steps, int64_t micro_batch_size) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 24;  // divisible by 2, 3, 4 and 8 ranks
  o.micro_batch_size = micro_batch_size;
  o.seq_len = 16;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup_steps = 1;
  o.grad_clip = 1.0;  // active: the gradient norm of an untrained model is above 1
  o.seed = 11;
  return o;
}

// A data-parallel plan: dp=N, or dp_shard x dp_replicate when replicate > 1.
inline ParallelPlan dp_plan(int shard, int replicate, ZeroStage stage, bool reshard_after_forward = true) {
  ParallelPlan p = ParallelPlan::parse(replicate > 1 ? "dp_shard=" + std::to_string(shard) +
                                                           ",dp_replicate=" + std::to_string(replicate)
                                                     : "dp=" + std::to_string(shard));
  p.zero = stage;
  p.reshard_after_forward = reshard_after_forward;
  return p;
}

// `steps` training steps of `plan` on `cluster` (one compute thread per virtual GPU), each rank
// holding its tensor-parallel slice; the cluster keeps every rank's traffic and trace.
inline void train_steps(VirtualCluster& cluster, const LlamaConfig& cfg, const TrainOptions& opt,
                        const ParallelPlan& plan, int steps, const TextDataset& data = corpus()) {
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, data, opt, plan);
    for (int i = 0; i < steps; ++i) trainer.step();
  });
}

// fp64 against one device, as the context-parallel and 4D tests hold it: the plan's verdict,
// every tensor within 1e-12 of the plain single-device trainer (and of the replay), every rank
// reported, and a loss that moved over the steps (so the comparison was not of frozen weights).
inline void expect_fp64_within_one_in_a_trillion(const EquivalenceReport& r, int world_size) {
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.plain_checked);
  EXPECT_LE(r.plain_max_rel_err, 1e-12) << r.table();
  EXPECT_LE(r.max_errors.grad_tensor, 1e-12) << r.table();
  EXPECT_LE(r.max_errors.param_tensor, 1e-12) << r.table();
  ASSERT_EQ(int(r.per_rank.size()), world_size);
  ASSERT_GE(r.losses_single.size(), 3u);
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

inline RankLauncher virtual_launcher(int ranks, ReduceAlgo algo = ReduceAlgo::ordered) {
  return [ranks, algo](const std::function<void(ProcessGroup&)>& fn) {
    VirtualClusterOptions vo;
    vo.ranks = ranks;
    vo.algo = algo;
    vo.timeout = std::chrono::milliseconds(120000);
    VirtualCluster cluster(vo);
    // One compute thread per virtual GPU: N ranks must not each start a full OpenMP team.
    cluster.run([&](ProcessGroup& world) {
      ops::set_backend_threads(1);
      fn(world);
    });
  };
}

}  // namespace llama4d::test
