// The planner's time model (core/plan/planner.cpp) against hand arithmetic: the FLOPs per token
// from the shapes, the step as its parts (compute + bubble + exposed communication) with the
// bubble its schedule's share of compute + bubble, MFU against HFU under activation
// checkpointing, which link each group's traffic crosses where the mesh meets a node boundary,
// and the bytes per parameter of Llama 3's bf16 mixed precision. Every expected value is
// computed here from the formulas written out beside it, never by the planner's own helpers.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "core/plan/planner.h"
#include "core/plan/traffic.h"

namespace llama4d {
namespace {

// tiny with `layers` layers: C 64, I 176, 4 query heads and 2 key/value heads of hd 16, V 264.
LlamaConfig tiny(int layers) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = layers;
  return c;
}

// Weights that take part in matmuls (PaLM's N): per layer q, o [C, nh hd], k, v [C, nkv hd] and
// the SwiGLU's three [C, I]; plus the LM head [V, C] (the embedding is a lookup).
double block_matmul_weights(const LlamaConfig& c) {
  const double C = double(c.hidden_size), q = double(c.num_attention_heads * c.head_dim),
               kv = double(c.num_key_value_heads * c.head_dim), I = double(c.intermediate_size);
  return double(c.num_hidden_layers) * (2 * C * q + 2 * C * kv + 3 * C * I);
}
// Model FLOPs per training token: 6 N + 12 L (nh hd) T (Chowdhery et al. 2022, App. B).
double model_flops(const LlamaConfig& c, int64_t T) {
  const double N = block_matmul_weights(c) + double(c.vocab_size * c.hidden_size);
  return 6 * N + 12 * double(c.num_hidden_layers) * double(c.num_attention_heads * c.head_dim) * double(T);
}

StepShape shape_of(const LlamaConfig& cfg, const std::string& mesh, int64_t seq, int64_t batch, int64_t micro) {
  StepShape s;
  s.model = cfg;
  s.plan = mesh.empty() ? ParallelPlan{} : ParallelPlan::parse(mesh);
  s.seq_len = seq;
  s.batch_size = batch;
  s.micro_batch_size = micro;
  return s;
}

const DimensionTraffic& traffic_of(const PlanReport& r, const std::string& group) {
  for (const DimensionTraffic& d : r.traffic)
    if (d.group == group) return d;
  ADD_FAILURE() << "no traffic row for group " << group;
  static const DimensionTraffic none;
  return none;
}

TEST(PlannerTimeModel, ModelFlopsPerTokenByHand) {
  // tiny at 8 layers, T = 32: per layer 2·64·64 + 2·64·32 + 3·64·176 = 46,080 matmul weights,
  // 8 layers 368,640, + the head 264·64 = 16,896: N = 385,536; 6 N = 2,313,216 and
  // 12 · 8 · 64 · 32 = 196,608: 2,509,824 FLOPs per token.
  const StepShape s = shape_of(tiny(8), "", 32, 4, 0);
  EXPECT_EQ(model_flops(s.model, 32), 2'509'824.0);
  const PlanReport r = plan_step(s, ClusterModel{});
  EXPECT_EQ(r.flops_per_token, 2'509'824.0);
  EXPECT_EQ(r.recompute_flops_per_token, 0.0);
}

// A pipeline's step is compute + bubble + exposed communication, and the bubble is the idle
// share b of compute + bubble, so bubble = compute · b / (1 - b): for 1F1B and GPipe
// b = (p-1)/(m+p-1), i.e. bubble = compute · (p-1)/m; interleaved b = (p-1)/(v m + p-1),
// bubble = compute · (p-1)/(v m). Compute = FLOPs · tokens / (GPUs · peak · efficiency).
TEST(PlannerTimeModel, BubbleSecondsAreTheScheduleShareOfTheStep) {
  const struct {
    const char* mesh;
    PipelineScheduleKind kind;
    int chunks;
    int64_t micro_batches;
    double bubble_over_compute;  // (p-1)/m, or (p-1)/(v m)
  } cases[] = {{"pp=4", PipelineScheduleKind::one_f_one_b, 1, 8, 3.0 / 8},
               {"pp=4", PipelineScheduleKind::gpipe, 1, 4, 3.0 / 4},
               {"pp=2,dp=2", PipelineScheduleKind::one_f_one_b, 1, 2, 1.0 / 2},
               {"pp=2", PipelineScheduleKind::interleaved, 2, 4, 1.0 / 8}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mesh) + " " + std::string(pipeline_schedule_name(c.kind)));
    StepShape s = shape_of(tiny(8), c.mesh, 32, 0, 1);
    s.batch_size = c.micro_batches * s.plan.dp();
    s.plan.schedule = c.kind;
    s.plan.pp_chunks = c.chunks;
    ClusterModel m;
    m.compute_efficiency = 0.5;
    const PlanReport r = plan_step(s, m);
    const double W = s.plan.world_size(), tokens = double(s.batch_size * s.seq_len);
    const double compute = model_flops(s.model, 32) * tokens / (W * m.cluster.gpu_tflops * 1e12 * 0.5);
    EXPECT_DOUBLE_EQ(r.compute_seconds, compute);
    EXPECT_DOUBLE_EQ(r.bubble_seconds, compute * c.bubble_over_compute);
    EXPECT_DOUBLE_EQ(r.bubble_fraction, r.bubble_seconds / (r.compute_seconds + r.bubble_seconds));
    double exposed = 0;
    for (const DimensionTraffic& d : r.traffic) exposed += d.exposed_seconds;
    ASSERT_GT(exposed, 0);  // the pipeline's sends
    EXPECT_DOUBLE_EQ(r.comm_exposed_seconds, exposed);
    EXPECT_DOUBLE_EQ(r.step_seconds, compute * (1 + c.bubble_over_compute) + exposed);
    EXPECT_DOUBLE_EQ(r.tokens_per_second, tokens / r.step_seconds);
  }
}

// MFU counts the model's FLOPs only; activation checkpointing's recompute takes time (it is in
// compute, the numerator of HFU) but is not useful work. On one GPU (no bubble, no traffic) the
// step is compute alone, so MFU = efficiency · F / (F + R), with R per token:
//   full        every block's forward again but the last product (down_proj) of each block:
//               2 N_blocks + 4 L nh hd T - 2 C I L
//   every:k     the same with one down_proj left out per segment of k blocks: - 2 C I ceil(L/k)
//   selective   the attention core's forward: 4 L nh hd T
TEST(PlannerTimeModel, MfuCountsModelFlopsAndHfuAddsTheRecompute) {
  const LlamaConfig cfg = tiny(8);
  const int64_t T = 32;
  const double C = 64, I = 176, L = 8, q = 64, attention_forward = 4 * L * q * double(T);
  const struct {
    const char* ac;
    double recompute;
  } cases[] = {{"none", 0},
               {"selective", attention_forward},
               {"full", 2 * block_matmul_weights(cfg) + attention_forward - 2 * C * I * L},
               {"every:3", 2 * block_matmul_weights(cfg) + attention_forward - 2 * C * I * 3}};  // ceil(8/3) = 3
  // By hand, full: 2 · 368,640 + 65,536 - 180,224 = 622,592.
  EXPECT_EQ(cases[2].recompute, 622'592.0);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.ac);
    StepShape s = shape_of(cfg, "", T, 4, 0);
    s.plan.ac = Checkpointing::parse(c.ac, 8);
    ClusterModel m;
    m.compute_efficiency = 0.6;
    const PlanReport r = plan_step(s, m);
    const double F = model_flops(cfg, T), tokens = 4.0 * double(T), peak = m.cluster.gpu_tflops * 1e12;
    EXPECT_DOUBLE_EQ(r.recompute_flops_per_token, c.recompute);
    EXPECT_TRUE(r.traffic.empty());
    EXPECT_EQ(r.bubble_seconds, 0.0);
    EXPECT_DOUBLE_EQ(r.step_seconds, (F + c.recompute) * tokens / (peak * 0.6));
    EXPECT_DOUBLE_EQ(r.mfu, 0.6 * F / (F + c.recompute));
    const double hfu = (F + c.recompute) * tokens / (r.step_seconds * peak);  // what MFU is not
    EXPECT_DOUBLE_EQ(hfu, 0.6);
    if (c.recompute > 0) {
      EXPECT_LT(r.mfu, hfu);
    }
  }
}

// World ranks fill nodes in order and the first mesh dimension is innermost (rank = c0 + s0 (c1
// + s1 (...))), so world rank 0's group along a set of dimensions reaches rank
// sum over them of (size - 1) · stride: InfiniBand when that rank is on another node, else NVLink.
// Each group's seconds are then its bytes over that link's bandwidth plus its calls times that
// link's latency; data-parallel traffic is exposed for (1 - overlap) of it, the rest in full.
TEST(PlannerTimeModel, EachGroupCrossesTheLinkItsRanksSpan) {
  const struct {
    const char* mesh;
    int gpus_per_node;
    std::map<std::string, std::string> links;
  } cases[] = {
      // tp reaches rank 3, cp rank 4, the cp+dp group 4 + 8 = 12: only the last leaves the node of 8.
      {"tp=4,cp=2,dp=2", 8, {{"tp", "nvlink"}, {"cp", "nvlink"}, {"cp+dp", "ib"}}},
      // The same mesh on nodes of 4: cp's rank 4 is exactly the next node's first GPU.
      {"tp=4,cp=2,dp=2", 4, {{"tp", "nvlink"}, {"cp", "ib"}, {"cp+dp", "ib"}}},
      // Data parallelism innermost: dp reaches rank 1, tp (stride 2) rank 6, past a node of 4.
      {"dp=2,tp=4", 4, {{"dp", "nvlink"}, {"tp", "ib"}}},
      // A pipeline over two nodes of 2: pp (stride 2) reaches rank 2; tp stays inside.
      {"tp=2,pp=2", 2, {{"tp", "nvlink"}, {"pp", "ib"}}},
      // Everything on one node of 8.
      {"tp=2,pp=2,dp=2", 8, {{"tp", "nvlink"}, {"pp", "nvlink"}, {"dp", "nvlink"}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mesh) + " on nodes of " + std::to_string(c.gpus_per_node));
    StepShape s = shape_of(tiny(4), c.mesh, 32, 8, 0);
    ClusterModel m;
    m.cluster.gpus_per_node = c.gpus_per_node;
    m.cluster.nvlink = {2.0, 400.0};
    m.cluster.infiniband = {7.0, 40.0};
    m.dp_overlap = 0.75;
    const PlanReport r = plan_step(s, m);
    EXPECT_EQ(r.model.cluster.nodes, (s.plan.world_size() + c.gpus_per_node - 1) / c.gpus_per_node);
    const std::map<std::string, GroupTraffic> bytes = predict_step_traffic(s);
    EXPECT_EQ(r.traffic.size(), c.links.size());
    for (const auto& [group, link] : c.links) {
      SCOPED_TRACE(group);
      const DimensionTraffic& d = traffic_of(r, group);
      EXPECT_EQ(d.link, link);
      const LinkParams& p = link == "ib" ? m.cluster.infiniband : m.cluster.nvlink;
      ASSERT_TRUE(bytes.count(group));
      EXPECT_EQ(d.bytes_per_rank, bytes.at(group).bytes_sent / s.plan.world_size());
      const double seconds = double(d.bytes_per_rank) / (p.bandwidth_gbps * 1e9) + double(d.calls_per_rank) * p.alpha_us * 1e-6;
      EXPECT_DOUBLE_EQ(d.seconds, seconds);
      EXPECT_DOUBLE_EQ(d.exposed_seconds, d.dim == "dp" ? 0.25 * seconds : seconds);
    }
  }
}

// Llama 3's bf16 mixed precision (Dubey et al. 2024, section 3.3.4) per parameter: bf16 weights
// (2 bytes), fp32 gradients (4) and, beside the two fp32 AdamW moments, an fp32 master copy of
// the weights: optimizer 4 + 4 + 4 = 12 bytes. fp32: 4, 4 and 8. Activations: 2 bytes under
// bf16, 4 under fp32, the RoPE tables 4 under both. The engine trains fp32 containers (its bf16
// mode keeps the fp32 masters as its parameters), so the allocator cannot hold this row; the
// formula does: one GPU, no sharding, every byte per parameter times N.
TEST(PlannerTimeModel, Bf16HoldsMasterWeightsBesideTheMoments) {
  const LlamaConfig cfg = tiny(2);
  // N = 264·64 (embedding) + 2 · (2·64 + 2·64·64 + 2·64·32 + 3·64·176) + 64 + 264·64 (norm, head).
  const int64_t N = 264 * 64 + 2 * (2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176) + 64 + 264 * 64;
  ASSERT_EQ(N, 126'272);
  StepShape fp32 = shape_of(cfg, "", 32, 2, 0), bf16 = fp32;
  bf16.precision = Precision::parse("bf16");
  const MemoryPrediction a = predict_memory(fp32).at(0), b = predict_memory(bf16).at(0);
  EXPECT_EQ(a.params, 4 * N);
  EXPECT_EQ(a.grads, 4 * N);
  EXPECT_EQ(a.optimizer, 8 * N);
  EXPECT_EQ(b.params, 2 * N);
  EXPECT_EQ(b.grads, 4 * N);
  EXPECT_EQ(b.optimizer, 12 * N);
  EXPECT_EQ(b.weight_states(), 18 * N);
  EXPECT_LT(b.activations, a.activations);  // at half the width (the token ids stay int32)
  EXPECT_EQ(b.other, a.other);                  // the RoPE tables stay fp32: 2 · 32 · 8 · 4 bytes
  EXPECT_EQ(a.other, 2 * 32 * 8 * 4);
}

}  // namespace
}  // namespace llama4d
