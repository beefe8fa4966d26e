// The planner's step-time model, every assumption an input (ClusterModel):
//
//   compute  = (model FLOPs + recomputed FLOPs) per token x tokens per step
//              / (GPUs x peak x compute_efficiency)            every GPU does 1/W of the work
//   bubble   = compute x b / (1 - b)                            b: the schedule's idle share
//              (1F1B, GPipe (p-1)/(m+p-1); interleaved (p-1)/(v m+p-1); ZB-H1 from F, B, W)
//   comm     = per mesh dimension, one rank's bytes / the bandwidth of the slowest link its
//              group crosses + its calls x that link's latency; tensor, context and pipeline
//              traffic counted in full (on every layer's critical path), data-parallel traffic
//              times (1 - dp_overlap)
//   step     = compute + bubble + exposed comm
//   MFU      = model FLOPs per token x tokens per step / (step x GPUs x peak)
// The FLOPs are core/model/flops.h's (6 N_matmul + 12 L nh hd T per token, the PaLM
// convention), the bytes traffic.cpp's, the memory memory.cpp's.
//
// Where a source document is off. One of the source documents this course is built on, the
// "Case Study: LLaMA 3" analyzer (LLaMA3Analyzer), gets these wrong; this model does otherwise:
//   - peak 1,979 TFLOP/s is the H100's sparse figure; dense BF16 is 989 (core/comm/cluster.h);
//   - NVLink 600 GB/s is an A100's; an H100's NVLink 4 moves 450 GB/s per direction;
//   - optimizer 8 bytes per parameter forgets the fp32 master weights of mixed precision (12);
//     gradients were reduce-scattered in fp32 by Llama 3 (4 bytes), not bf16;
//   - sharded memory divided the optimizer and gradients by dp alone and the parameters by dp x tp,
//     ignoring pipeline stages: a GPU holds 1/(tp pp) of the model before FSDP divides by dp;
//   - layers per stage 126 // 16 = 7 leaves 14 layers unplaced; Llama 3 put one layer fewer on
//     the first and the last stage (7 + 14 x 8 + 7 = 126);
//   - bubble (p-1)/m is the bubble's ratio to the useful time, not the share of the step,
//     (p-1)/(m+p-1), which it was read as;
//   - TP traffic was computed for the whole global batch on one tensor group instead of a
//     micro-batch, and FSDP's traffic as one all-gather + reduce-scatter per layer: with
//     parameters resharded after forward it is two all-gathers (forward and backward) per
//     micro-batch, with them kept (Llama 3) one;
//   - MFU: its 6 N ignores the attention FLOPs (12 L nh hd T per token, 8% of 405B's at 8K
//     tokens and most of them at 131K), and its example divides by a 30 s step where the text
//     uses 0.3 s (0.25% vs 25%); Llama 3 reports 38-43%, not 25-30%.
#include "core/plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/model/flops.h"
#include "core/parallel/pipeline_schedule.h"
#include "core/tensor/memory_tracker.h"
#include "core/plan/traffic.h"

namespace llama4d {

Precision Precision::parse(const std::string& name) {
  if (name == "fp32") return Precision{"fp32", 4, 4, 8, 4, 4};
  if (name == "fp64") return Precision{"fp64", 8, 8, 16, 8, 8};
  if (name == "bf16") return Precision{"bf16", 2, 4, 12, 2, 4};
  throw InputError("--precision '" + name + "': expected fp32, fp64 or bf16 (Llama 3's mixed precision)");
}

namespace {

// The mesh dimensions a traffic-log group name stands for: "cp+dp" -> {cp, dp}; "world" -> all.
std::vector<std::string> group_dims(const std::string& group, const ParallelPlan& plan) {
  if (group.rfind("tied embedding", 0) == 0) return {"pp"};  // the first and last stage of a pipeline
  std::vector<std::string> dims;
  if (group == "world") {
    for (const MeshDim& d : plan.mesh) dims.push_back(d.name);
    return dims;
  }
  std::stringstream in(group);
  for (std::string d; std::getline(in, d, '+');) dims.push_back(d);
  return dims;
}

// Whether world rank 0's group along `dims` reaches past the first node (ranks fill nodes in
// order, rank = c0 + size0 (c1 + size1 (...)), so every instance of the group looks the same).
bool crosses_nodes(const std::vector<std::string>& dims, const ParallelPlan& plan, int gpus_per_node) {
  int64_t stride = 1, farthest = 0;
  for (const MeshDim& d : plan.mesh) {
    if (std::find(dims.begin(), dims.end(), d.name) != dims.end()) farthest += (d.size - 1) * stride;
    stride *= d.size;
  }
  return farthest >= gpus_per_node;
}

std::string dimension_of(const std::string& group) {
  if (group == "tp" || group == "cp" || group == "pp") return group;
  if (group.rfind("tied embedding", 0) == 0) return "pp";
  return "dp";  // the data group: dp, cp+dp, dp_shard, dp_replicate, the world
}

const char* largest_category(const MemoryPrediction& m) {
  const std::pair<const char*, int64_t> c[] = {{"params", m.params},           {"grads", m.grads},
                                               {"optimizer", m.optimizer},     {"comm_buffers", m.comm_buffers},
                                               {"activations", m.activations}, {"scratch", m.scratch},
                                               {"other", m.other}};
  return std::max_element(std::begin(c), std::end(c), [](auto& a, auto& b) { return a.second < b.second; })->first;
}

}  // namespace

PlanReport plan_step(const StepShape& shape, const ClusterModel& model, double token_budget) {
  const ParallelPlan& plan = shape.plan;
  plan.validate();
  const int dp = plan.dp(), W = plan.world_size();
  if (shape.batch_size % dp != 0)
    throw InputError("--batch-size " + std::to_string(shape.batch_size) + " is not divisible by the " +
                     std::to_string(dp) + " data-parallel ranks");
  if (shape.rows_per_data_rank() % shape.micro_rows() != 0)
    throw InputError("each data-parallel rank gets " + std::to_string(shape.rows_per_data_rank()) +
                     " rows, not divisible by --micro-batch-size " + std::to_string(shape.micro_rows()));
  plan.check_model(shape.model, int(shape.micro_batches()));
  plan.check_sequence(shape.seq_len);
  if (model.cluster.gpus_per_node < 1) throw InputError("planner: --gpus-per-node must be >= 1");
  const ClusterSpec& cl = model.cluster;
  if (cl.gpu_tflops <= 0 || model.compute_efficiency <= 0 || model.compute_efficiency > 1 || model.dp_overlap < 0 ||
      model.dp_overlap > 1)
    throw InputError("planner: --gpu-tflops must be positive, --efficiency in (0, 1] and --dp-overlap in [0, 1]");

  PlanReport r;
  r.shape = shape;
  r.model = model;
  r.model.cluster.nodes = (W + model.cluster.gpus_per_node - 1) / model.cluster.gpus_per_node;
  const std::vector<MemoryPrediction> memory = predict_memory(shape);
  r.worst = *std::max_element(memory.begin(), memory.end(),
                              [](const MemoryPrediction& a, const MemoryPrediction& b) { return a.total() < b.total(); });
  r.fits = cl.hbm_bytes == 0 || r.worst.total() <= cl.hbm_bytes;
  if (!r.fits) r.overflow = largest_category(r.worst);

  for (const auto& [group, t] : predict_step_traffic(shape)) {
    DimensionTraffic d;
    d.dim = dimension_of(group);
    d.group = group;
    const std::vector<std::string> dims = group_dims(group, plan);
    int n = 1;  // ranks per instance of the group: each takes part in every call of its instance
    for (const std::string& dim : dims) n *= plan.size(dim);
    if (group.rfind("tied embedding", 0) == 0) n = 2;
    d.bytes_per_rank = t.bytes_sent / W;
    d.calls_per_rank = t.calls * n / W;
    const bool ib = crosses_nodes(dims, plan, cl.gpus_per_node);
    const LinkParams& link = ib ? cl.infiniband : cl.nvlink;
    d.link = ib ? "ib" : "nvlink";
    d.seconds = double(d.bytes_per_rank) / (link.bandwidth_gbps * 1e9) + double(d.calls_per_rank) * link.alpha_us * 1e-6;
    d.exposed_seconds = d.dim == "dp" ? d.seconds * (1 - model.dp_overlap) : d.seconds;
    r.comm_exposed_seconds += d.exposed_seconds;
    r.traffic.push_back(d);
  }

  const double tokens = double(shape.batch_size * shape.seq_len), peak = cl.gpu_tflops * 1e12;
  r.flops_per_token = training_flops_per_token(shape.model, shape.seq_len);
  r.recompute_flops_per_token = recompute_flops_per_token(shape.model, shape.seq_len, plan.ac);
  r.compute_seconds = (r.flops_per_token + r.recompute_flops_per_token) * tokens / (W * peak * model.compute_efficiency);
  if (plan.size("pp") > 1)
    r.bubble_fraction =
        pipeline_bubble_formula(plan.schedule, plan.size("pp"), int(shape.micro_batches()), plan.pp_chunks);
  r.bubble_seconds = r.compute_seconds * r.bubble_fraction / (1 - r.bubble_fraction);
  r.step_seconds = r.compute_seconds + r.bubble_seconds + r.comm_exposed_seconds;
  r.mfu = r.flops_per_token * tokens / (r.step_seconds * W * peak);
  r.tokens_per_second = tokens / r.step_seconds;
  r.token_budget = token_budget;
  r.days_for_budget = token_budget > 0 ? token_budget / r.tokens_per_second / 86400 : 0;
  return r;
}

nlohmann::json PlanReport::to_json() const {
  const MemoryPrediction& m = worst;
  nlohmann::json traffic_json = nlohmann::json::array();
  for (const DimensionTraffic& d : traffic)
    traffic_json.push_back({{"dim", d.dim}, {"group", d.group}, {"bytes_per_rank", d.bytes_per_rank},
                            {"calls_per_rank", d.calls_per_rank}, {"link", d.link}, {"seconds", d.seconds},
                            {"exposed_seconds", d.exposed_seconds}});
  return {{"plan", shape.plan.to_json()},
          {"seq_len", shape.seq_len},
          {"batch_size", shape.batch_size},
          {"micro_batch_size", shape.micro_rows()},
          {"micro_batches", shape.micro_batches()},
          {"precision", shape.precision.name},
          {"cluster", {{"describe", model.cluster.describe()}, {"gpus_per_node", model.cluster.gpus_per_node},
                       {"gpu_tflops", model.cluster.gpu_tflops}, {"hbm_bytes", model.cluster.hbm_bytes},
                       {"nvlink_gbps", model.cluster.nvlink.bandwidth_gbps}, {"nvlink_alpha_us", model.cluster.nvlink.alpha_us},
                       {"ib_gbps", model.cluster.infiniband.bandwidth_gbps}, {"ib_alpha_us", model.cluster.infiniband.alpha_us},
                       {"compute_efficiency", model.compute_efficiency}, {"dp_overlap", model.dp_overlap}}},
          {"memory_per_gpu", {{"world_rank", m.world_rank}, {"params", m.params}, {"grads", m.grads},
                              {"grads_min", m.grads_min}, {"optimizer", m.optimizer}, {"comm_buffers", m.comm_buffers},
                              {"activations", m.activations}, {"scratch", m.scratch},
                              {"scratch_min", m.scratch_min}, {"comm_buffers_min", m.comm_buffers_min},
                              {"other", m.other},             {"total", m.total()}}},
          {"fits", fits},
          {"overflow", fits ? nlohmann::json(nullptr) : nlohmann::json(overflow)},
          {"traffic", traffic_json},
          {"flops_per_token", flops_per_token},
          {"recompute_flops_per_token", recompute_flops_per_token},
          {"compute_seconds", compute_seconds},
          {"bubble_fraction", bubble_fraction},
          {"bubble_seconds", bubble_seconds},
          {"comm_exposed_seconds", comm_exposed_seconds},
          {"step_seconds", step_seconds},
          {"mfu", mfu},
          {"tokens_per_second", tokens_per_second},
          {"token_budget", token_budget},
          {"days_for_budget", days_for_budget}};
}

std::string PlanReport::table() const {
  const MemoryPrediction& m = worst;
  const int64_t hbm = model.cluster.hbm_bytes;
  std::ostringstream o;
  char line[256];
  o << "plan: " << shape.plan.describe() << "; " << shape.batch_size << " x " << shape.seq_len << " tokens, "
    << shape.micro_batches() << " micro-batches of " << shape.micro_rows() << " per data rank, " << shape.precision.name
    << "\ncluster: " << model.cluster.describe() << "; kernels at " << model.compute_efficiency * 100
    << "% of peak, data-parallel traffic " << model.dp_overlap * 100 << "% hidden\n\n";
  o << "memory per GPU (rank " << m.world_rank << ", the fullest):\n";
  const std::pair<const char*, int64_t> rows[] = {{"params", m.params},           {"grads", m.grads},
                                                  {"optimizer", m.optimizer},     {"comm buffers", m.comm_buffers},
                                                  {"activations", m.activations}, {"scratch", m.scratch},
                                                  {"other (RoPE)", m.other},      {"total", m.total()}};
  for (const auto& [name, bytes] : rows) o << "  " << name << std::string(14 - std::string(name).size(), ' ') << format_bytes(bytes) << "\n";
  if (hbm > 0)
    o << (fits ? "  fits in " : "  DOES NOT FIT in ") << format_bytes(hbm) << (fits ? "" : " (largest: " + overflow + ")")
      << "\n";
  o << "\ntraffic per GPU per step:\n";
  for (const DimensionTraffic& d : traffic) {
    std::snprintf(line, sizeof line, "  %-4s %-14s %12s %8lld calls  %-6s %10.3g s exposed of %.3g s\n", d.dim.c_str(),
                  d.group.c_str(), format_bytes(d.bytes_per_rank).c_str(), static_cast<long long>(d.calls_per_rank),
                  d.link.c_str(), d.exposed_seconds, d.seconds);
    o << line;
  }
  std::snprintf(line, sizeof line,
                "\nstep: compute %.3g s + bubble %.3g s (%.1f%%) + exposed comm %.3g s = %.3g s\n"
                "MFU %.1f%%, %.4g tokens/s",
                compute_seconds, bubble_seconds, bubble_fraction * 100, comm_exposed_seconds, step_seconds, mfu * 100,
                tokens_per_second);
  o << line;
  if (token_budget > 0) {
    std::snprintf(line, sizeof line, "; %.3g tokens in %.1f days", token_budget, days_for_budget);
    o << line;
  }
  o << "\n";
  return o.str();
}

}  // namespace llama4d
