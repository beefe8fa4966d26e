// predict_step_traffic (formulas, core/plan/traffic.cpp) against what the virtual cluster's
// traffic log records during training steps of ParallelTrainer: per group, the bytes sent by
// all ranks and the calls, exactly. Each plan trains two steps; the log is cleared before each,
// so construction (and nothing else) stays out, and both steps must match the prediction.
#include <gtest/gtest.h>

#include <mutex>
#include <regex>
#include <sstream>

#include "core/plan/traffic.h"
#include "tests/parallel/parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

struct Case {
  std::string name;
  std::string mesh;
  ZeroStage zero = ZeroStage::none;
  int64_t batch = 8, micro = 0, seq = 16;
  std::string preset = "tiny";
  int layers = 0;  // 0: the preset's
  bool tied = false, sp = true, keep_params = false, doc_mask = false;
  std::string ac = "none", schedule = "1f1b", cp_algo = "allgather";
  int chunks = 1;
  std::vector<int> pp_layers;  // empty: balanced
  ReduceAlgo algo = ReduceAlgo::ordered;
  bool bf16_grad_reduce = false;  // bf16 mixed precision with gradients reduced in bf16
  bool reduce_once = false;       // ZeRO-2/3: one reduce-scatter per step
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

LlamaConfig model_of(const Case& c) {
  LlamaConfig cfg = LlamaConfig::preset(c.preset);
  if (c.layers) cfg.num_hidden_layers = c.layers;
  cfg.tie_word_embeddings = c.tied;
  return cfg;
}

ParallelPlan plan_of(const Case& c, const LlamaConfig& cfg) {
  ParallelPlan p = ParallelPlan::parse(c.mesh);
  p.zero = c.zero;
  p.reshard_after_forward = !c.keep_params;
  p.reduce_once = c.reduce_once;
  p.sequence_parallel = c.sp;
  p.ac = Checkpointing::parse(c.ac, int(cfg.num_hidden_layers));
  p.schedule = parse_pipeline_schedule(c.schedule);
  p.pp_chunks = c.chunks;
  p.pp_layers = c.pp_layers;
  p.cp_algo = parse_context_algo(c.cp_algo);
  p.algo = c.algo;
  p.bf16_grad_reduce = c.bf16_grad_reduce;
  return p;
}

TrainOptions options_of(const Case& c) {
  TrainOptions o = test::options(2, c.micro);
  o.batch_size = c.batch;
  o.seq_len = c.seq;
  o.doc_mask = c.doc_mask;
  o.bf16_compute = c.bf16_grad_reduce;
  return o;
}

using Traffic = std::map<std::string, GroupTraffic>;

// Per group, as traffic_log.cpp's summary counts: every rank's bytes; a collective's call once
// (group rank 0), a send's once. Groups of one rank are left out (they move nothing).
Traffic measured(const std::vector<TrafficRecord>& records) {
  Traffic out;
  for (const TrafficRecord& r : records) {
    if (r.group_size <= 1 || r.op == "barrier") continue;
    GroupTraffic& g = out[r.group];
    g.bytes_sent += r.bytes_sent;
    if (r.op == "send" || (r.op != "recv" && r.group_rank == 0)) g.calls += 1;
  }
  return out;
}

std::string describe(const Traffic& t) {
  std::ostringstream os;
  for (const auto& [group, g] : t) os << "  " << group << ": " << g.bytes_sent << " B, " << g.calls << " calls\n";
  return os.str();
}

// Per (group, op, label with its numbers as #): bytes and calls, to find the collective a
// formula misses.
std::string breakdown(const std::vector<TrafficRecord>& records) {
  std::map<std::string, GroupTraffic> by;
  const std::regex digits("[0-9]+");
  for (const TrafficRecord& r : records) {
    if (r.group_size <= 1 || r.op == "barrier") continue;
    GroupTraffic& g = by[r.group + " | " + r.op + " | " + std::regex_replace(r.label, digits, "#")];
    g.bytes_sent += r.bytes_sent;
    if (r.op == "send" || (r.op != "recv" && r.group_rank == 0)) g.calls += 1;
  }
  return describe(by);
}

bool same(const Traffic& a, const Traffic& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [group, g] : a) {
    const auto it = b.find(group);
    if (it == b.end() || it->second.bytes_sent != g.bytes_sent || it->second.calls != g.calls) return false;
  }
  return true;
}

class StepTraffic : public ::testing::TestWithParam<Case> {};

TEST_P(StepTraffic, PredictionEqualsTheLogPerGroup) {
  const Case& c = GetParam();
  const LlamaConfig cfg = model_of(c);
  const ParallelPlan plan = plan_of(c, cfg);
  const TrainOptions opt = options_of(c);
  const TextDataset& data = c.doc_mask ? test::document_corpus() : test::corpus();

  StepShape shape;
  shape.model = cfg;
  shape.plan = plan;
  shape.seq_len = c.seq;
  shape.batch_size = c.batch;
  shape.micro_batch_size = c.micro;
  const Traffic predicted = predict_step_traffic(shape);

  VirtualClusterOptions vo;
  vo.ranks = plan.world_size();
  vo.algo = c.algo;
  vo.timeout = std::chrono::milliseconds(120000);
  VirtualCluster cluster(vo);
  std::mutex mu;
  std::vector<TrafficRecord> first_step;
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, data, opt, plan);
    // Each rank's log is its own: clear it once this rank's earlier work is done.
    world.traffic().clear();
    trainer.step();
    world.barrier()->wait();  // every op of step 1 recorded on this rank
    {
      std::vector<TrafficRecord> mine = world.traffic().records();
      std::lock_guard<std::mutex> lock(mu);
      first_step.insert(first_step.end(), mine.begin(), mine.end());
    }
    world.traffic().clear();
    trainer.step();
  });
  const std::vector<TrafficRecord> second_step = cluster.traffic();
  const std::vector<const std::vector<TrafficRecord>*> steps = {&first_step, &second_step};
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::vector<TrafficRecord>* records = steps[i];
    const Traffic got = measured(*records);
    EXPECT_TRUE(same(got, predicted)) << "step " << i + 1 << " of " << c.name
                                  << "\npredicted:\n" << describe(predicted) << "measured:\n" << describe(got)
                                  << "measured per label:\n" << breakdown(*records);
  }
}

Case make(std::string name, std::string mesh, ZeroStage zero) {
  Case c;
  c.name = std::move(name);
  c.mesh = std::move(mesh);
  c.zero = zero;
  return c;
}

std::vector<Case> cases() {
  using Z = ZeroStage;
  std::vector<Case> v;
  // Data parallelism: buckets, ZeRO stages with uneven pieces (dp=3, 4), keep-params, HSDP.
  v.push_back(make("dp2_ddp_two_micro_batches", "dp=2", Z::none));
  v.back().micro = 2;
  v.push_back(make("dp4_zero1", "dp=4", Z::zero1));
  v.back().micro = 1;
  v.push_back(make("dp3_zero2_ring", "dp=3", Z::zero2));
  v.back().batch = 12, v.back().micro = 2, v.back().algo = ReduceAlgo::ring;
  v.push_back(make("dp4_zero3", "dp=4", Z::zero3));
  v.back().micro = 1;
  v.push_back(make("dp2_zero3_keep_params", "dp=2", Z::zero3));
  v.back().micro = 2, v.back().keep_params = true;
  v.push_back(make("dp2_zero3_tied", "dp=2", Z::zero3));
  v.back().micro = 2, v.back().tied = true;
  v.push_back(make("hsdp_2x2_zero2", "dp_shard=2,dp_replicate=2", Z::zero2));
  v.back().micro = 1;
  v.push_back(make("hsdp_4x2_zero3", "dp_shard=4,dp_replicate=2", Z::zero3));
  v.push_back(make("hsdp_2x2_zero2_tied_empty_pieces", "dp_shard=2,dp_replicate=2", Z::zero2));
  v.back().tied = true;  // the head's segment is the final norm alone: one piece, one empty
  v.push_back(make("cp2_hsdp_2x2_zero3", "cp=2,dp_shard=2,dp_replicate=2", Z::zero3));
  // Gradients reduced in bf16: every gradient reduction moves half the bytes, nothing else changes.
  v.push_back(make("dp2_ddp_bf16_grad_reduce_two_micro_batches", "dp=2", Z::none));
  v.back().micro = 2, v.back().bf16_grad_reduce = true;
  v.push_back(make("hsdp_2x2_zero2_bf16_grad_reduce", "dp_shard=2,dp_replicate=2", Z::zero2));
  v.back().micro = 1, v.back().bf16_grad_reduce = true;
  // Tensor parallelism, with and without SP; tp=4 replicates `tiny`'s 2 key/value heads.
  v.push_back(make("tp2_no_sp_dp2_ddp", "tp=2,dp=2", Z::none));
  v.back().sp = false;
  v.push_back(make("tp2_sp_dp2_zero2", "tp=2,dp=2", Z::zero2));
  v.back().micro = 2;
  v.push_back(make("tp4_sp_dp2_zero1_replicated_kv", "tp=4,dp=2", Z::zero1));
  // bf16 gradient reductions halve the data group's bytes, not the tp group's norm-gain sums.
  v.push_back(make("tp2_sp_dp2_zero2_bf16_grad_reduce", "tp=2,dp=2", Z::zero2));
  v.back().micro = 2, v.back().bf16_grad_reduce = true;
  // Pipeline parallelism: every schedule, tied embeddings, keep-params.
  v.push_back(make("pp2_1f1b_dp2_zero1", "pp=2,dp=2", Z::zero1));
  v.back().micro = 1;
  v.push_back(make("pp2_gpipe_dp2_zero3", "pp=2,dp=2", Z::zero3));
  v.back().micro = 2, v.back().schedule = "gpipe";
  v.push_back(make("pp2_interleaved_4_layers_dp2_zero2", "pp=2,dp=2", Z::zero2));
  v.back().micro = 1, v.back().schedule = "interleaved", v.back().chunks = 2, v.back().layers = 4;
  v.push_back(make("tp2_pp2_zbh1_ddp", "tp=2,pp=2", Z::none));
  v.back().micro = 2, v.back().schedule = "zb-h1";
  v.push_back(make("pp2_1f1b_dp2_zero3_four_micro_batches", "pp=2,dp=2", Z::zero3));
  v.back().batch = 16, v.back().micro = 2;
  v.push_back(make("pp2_interleaved_4_layers_dp2_zero3", "pp=2,dp=2", Z::zero3));
  v.back().batch = 16, v.back().micro = 2, v.back().schedule = "interleaved", v.back().chunks = 2, v.back().layers = 4;
  v.push_back(make("tp2_sp_pp2_odd_rows", "tp=2,pp=2", Z::none));
  v.back().seq = 15, v.back().batch = 2, v.back().micro = 1;  // 15 rows: SP ranks hold 7 and 8
  v.push_back(make("pp2_tied_dp2_ddp", "pp=2,dp=2", Z::none));
  v.back().micro = 2, v.back().tied = true;
  v.push_back(make("pp2_tied_dp2_zero3_keep_params", "pp=2,dp=2", Z::zero3));
  v.back().micro = 1, v.back().tied = true, v.back().keep_params = true;
  v.push_back(make("pp2_tied_dp2_zero1_bf16_grad_reduce", "pp=2,dp=2", Z::zero1));  // the tied sum in bf16 too
  v.back().micro = 1, v.back().tied = true, v.back().bf16_grad_reduce = true;
  // --reduce-once: one reduce-scatter per unit and step, however many micro-batches.
  v.push_back(make("dp2_zero2_reduce_once_two_micro_batches", "dp=2", Z::zero2));
  v.back().micro = 2, v.back().reduce_once = true;
  v.push_back(make("hsdp_2x2_zero3_reduce_once", "dp_shard=2,dp_replicate=2", Z::zero3));
  v.back().micro = 1, v.back().reduce_once = true;
  v.push_back(make("pp2_1f1b_dp2_zero3_keep_reduce_once", "pp=2,dp=2", Z::zero3));
  v.back().batch = 16, v.back().micro = 2, v.back().keep_params = true, v.back().reduce_once = true;
  // Context parallelism: both algorithms, document masks, activation checkpointing.
  v.push_back(make("cp2_allgather_dp2_zero3", "cp=2,dp=2", Z::zero3));
  v.push_back(make("cp2_ring_doc_mask", "cp=2", Z::none));
  v.back().cp_algo = "ring", v.back().doc_mask = true, v.back().micro = 4;
  v.push_back(make("cp4_ring_zero2", "cp=4", Z::zero2));
  v.back().cp_algo = "ring";
  v.push_back(make("tp2_cp2_dp2_selective_zero2", "tp=2,cp=2,dp=2", Z::zero2));
  v.back().ac = "selective";
  v.push_back(make("tp2_cp2_ring_full_zero3", "tp=2,cp=2", Z::zero3));
  v.back().ac = "full", v.back().cp_algo = "ring", v.back().micro = 4;
  v.push_back(make("tp2_no_sp_full_ddp", "tp=2", Z::none));
  v.back().ac = "full", v.back().sp = false;
  v.push_back(make("tp2_pp2_every2_6_layers_zero3", "tp=2,pp=2", Z::zero3));
  v.back().ac = "every:2", v.back().layers = 6, v.back().micro = 4;
  v.push_back(make("tp2_pp2_layers_1_2_every2_dp2_zero3", "tp=2,pp=2,dp=2", Z::zero3));
  v.back().layers = 3, v.back().pp_layers = {1, 2}, v.back().ac = "every:2", v.back().micro = 2;
  // 4D.
  v.push_back(make("tp2_cp2_pp2_dp2_zero3_ring", "tp=2,cp=2,pp=2,dp=2", Z::zero3));
  v.back().micro = 2, v.back().algo = ReduceAlgo::ring;
  v.push_back(make("tp2_cp2_pp2_dp2_interleaved_selective_zero1", "tp=2,cp=2,pp=2,dp=2", Z::zero1));
  v.back().micro = 1, v.back().schedule = "interleaved", v.back().chunks = 2, v.back().layers = 4,
  v.back().ac = "selective";
  v.push_back(make("mesh_order_dp_cp_tp_zero2", "dp=2,cp=2,tp=2", Z::zero2));  // the data group is "dp+cp"
  v.push_back(make("small_tp2_cp2_dp2_zero3", "tp=2,cp=2,dp=2", Z::zero3));
  v.back().preset = "small", v.back().seq = 32, v.back().batch = 4;
  // tp = 3 on small's 6 heads / 2 key/value heads: rank 1 holds both key/value heads.
  v.push_back(make("small_tp3_cp2_zero2", "tp=3,cp=2", Z::zero2));
  v.back().preset = "small", v.back().seq = 32, v.back().batch = 2, v.back().layers = 2;
  return v;
}

// Tiers: the sanitizer presets run a case per group kind (the traffic log's records come from the
// same collectives in every plan); the release preset runs every case.
LLAMA4D_INSTANTIATE(Plans, StepTraffic, cases(), full,
                    {{"dp2_ddp_bf16_grad_reduce_two_micro_batches", test::Tier::quick},
                     {"pp2_1f1b_dp2_zero3_keep_reduce_once", test::Tier::quick},
                     {"dp3_zero2_ring", test::Tier::quick},
                     {"hsdp_2x2_zero2_bf16_grad_reduce", test::Tier::quick},
                     {"pp2_tied_dp2_zero1_bf16_grad_reduce", test::Tier::quick},
                     {"tp2_cp2_pp2_dp2_zero3_ring", test::Tier::quick},
                     {"tp2_sp_dp2_zero2_bf16_grad_reduce", test::Tier::quick}});

}  // namespace
}  // namespace llama4d
