#include "core/parallel/plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel/tensor_parallel.h"

namespace llama4d {

const std::vector<std::string>& ParallelPlan::known_dims() {
  static const std::vector<std::string> dims = {"tp", "cp", "pp", "dp", "dp_shard", "dp_replicate", "ep"};
  return dims;
}

ParallelPlan ParallelPlan::parse(std::string_view spec) {
  ParallelPlan p;
  if (spec.empty()) return p;
  p.mesh = DeviceMesh::parse(spec);
  const auto& known = known_dims();
  for (size_t i = 0; i < p.mesh.size(); ++i) {
    const MeshDim& d = p.mesh[i];
    if (std::find(known.begin(), known.end(), d.name) == known.end())
      throw InputError("--mesh " + std::string(spec) + ": unknown dim '" + d.name +
                       "' (expected tp, cp, pp, dp, dp_shard, dp_replicate or ep)");
    if (d.size < 1) throw InputError("--mesh " + std::string(spec) + ": " + d.name + " must be >= 1");
    for (size_t j = 0; j < i; ++j)
      if (p.mesh[j].name == d.name) throw InputError("--mesh " + std::string(spec) + ": " + d.name + " appears twice");
  }
  return p;
}

int ParallelPlan::world_size() const {
  int n = 1;
  for (const MeshDim& d : mesh) n *= d.size;
  return n;
}

int ParallelPlan::size(std::string_view dim) const {
  for (const MeshDim& d : mesh)
    if (d.name == dim) return d.size;
  return 1;
}

void ParallelPlan::validate() const {
  if (size("ep") > 1 && zero != ZeroStage::none)
    throw InputError("--mesh " + describe_mesh() + " with --zero " + std::to_string(int(zero)) +
                     ": expert parallelism (ep=" + std::to_string(size("ep")) +
                     ") runs with plain data parallelism only so far (--zero 0)");
  if (size("cp") == 1 && cp_algo != ContextAlgo::allgather)
    throw InputError("--cp-algo needs context parallelism (cp > 1 in --mesh)");
  if (size("tp") == 1 && !sequence_parallel)
    throw InputError("--sp off needs tensor parallelism (tp > 1 in --mesh): without it there is no sequence "
                     "parallelism to turn off");
  bool plain = false, split = false;
  for (const MeshDim& d : mesh) {
    plain = plain || d.name == "dp";
    split = split || d.name == "dp_shard" || d.name == "dp_replicate";
  }
  if (plain && split) throw InputError("--mesh " + describe_mesh() + ": use either dp or dp_shard x dp_replicate");
  if (!reshard_after_forward && zero != ZeroStage::zero3) throw InputError("--keep-params applies to --zero 3 only");
  if (reduce_once && zero < ZeroStage::zero2)
    throw InputError("--reduce-once applies to --zero 2 and 3: plain DP and ZeRO-1 already reduce gradients once per step");
  if (hsdp() && zero < ZeroStage::zero2)
    throw InputError("HSDP (dp_shard x dp_replicate) shards gradients: use --zero 2 or 3");
  if (bf16_grad_reduce && dp() * size("cp") == 1)
    throw InputError("--grad-reduce-in-bf16: --mesh " + describe_mesh() +
                     " reduces no gradients (one data-parallel rank, cp = 1); it needs dp x cp > 1");
  if (pp_chunks < 1) throw InputError("--pp-chunks must be >= 1, got " + std::to_string(pp_chunks));
  if (size("pp") == 1 && (pp_chunks > 1 || !pp_layers.empty() || schedule != PipelineScheduleKind::one_f_one_b))
    throw InputError("--schedule, --pp-chunks and --pp-layers need pipeline parallelism (pp > 1 in --mesh)");
  if ((pp_chunks > 1) != (schedule == PipelineScheduleKind::interleaved) && size("pp") > 1)
    throw InputError(schedule == PipelineScheduleKind::interleaved
                         ? "the interleaved schedule needs --pp-chunks >= 2"
                         : "--pp-chunks " + std::to_string(pp_chunks) + " needs --schedule interleaved");
}

int ParallelPlan::coordinate(std::string_view dim, int world_rank) const {
  // Coordinates run innermost first: rank = c[0] + size[0] * (c[1] + size[1] * ...).
  int stride = 1;
  for (const MeshDim& d : mesh) {
    if (d.name == dim) return (world_rank / stride) % d.size;
    stride *= d.size;
  }
  return 0;
}

PipelineLayout ParallelPlan::pipeline_layout(const LlamaConfig& cfg) const {
  return make_pipeline_layout(cfg, size("pp"), pp_chunks, pp_layers);
}

std::vector<UnitRange> ParallelPlan::held_units(const LlamaConfig& cfg, int world_rank) const {
  if (size("pp") == 1) return {};
  return pipeline_layout(cfg).rank_units(coordinate("pp", world_rank), int(cfg.num_hidden_layers));
}

DataParallelConfig ParallelPlan::data_parallel() const {
  DataParallelConfig c;
  c.stage = zero;
  c.reshard_after_forward = reshard_after_forward;
  c.prefetch = prefetch;
  c.reduce_once = reduce_once;
  c.bf16_grad_reduce = bf16_grad_reduce;
  return c;
}

TpLayout ParallelPlan::tp_layout(const LlamaConfig& cfg, int world_rank) const {
  const int tp = size("tp");
  return tp > 1 ? llama4d::tp_layout(cfg, tp, coordinate("tp", world_rank), sequence_parallel) : TpLayout{};
}

ExpertShard ParallelPlan::expert_shard(const LlamaConfig& cfg, int world_rank) const {
  const int ep = size("ep");
  if (ep == 1 || !cfg.moe()) return {};
  return ExpertShard::of({.E = cfg.num_local_experts}, ep, coordinate("ep", world_rank));
}

void ParallelPlan::check_model(const LlamaConfig& cfg, int micro_batches) const {
  // A mixture-of-experts model's expert weights are ordinary parameters to the data-parallel
  // strategies (replicated, or sharded by ZeRO like any other), so the data dims run it, and ep
  // shards its experts (core/parallel/expert_parallel.h); no tensor, context or pipeline
  // strategy splits its layers yet, so those are refused rather than run with math nobody has
  // checked.
  const int ep = size("ep");
  if (ep > 1 && !cfg.moe())
    throw InputError("--mesh " + describe_mesh() + ": expert parallelism (ep=" + std::to_string(ep) +
                     ") needs a mixture-of-experts model (num_local_experts > 0): a dense model has no experts to split");
  if (ep > cfg.num_local_experts && cfg.moe())
    throw InputError("--mesh " + describe_mesh() + ": ep=" + std::to_string(ep) + " is more than num_local_experts=" +
                     std::to_string(cfg.num_local_experts) + ": the expert-parallel group does not fit the experts "
                     "(each of its ranks holds E/ep >= 1 of them)");
  if (ep > 1 && cfg.num_local_experts % ep != 0)
    throw InputError("--mesh " + describe_mesh() + ": ep=" + std::to_string(ep) + " does not divide num_local_experts=" +
                     std::to_string(cfg.num_local_experts) + " (each expert-parallel rank holds E/ep experts)");
  if (cfg.moe())
    for (const MeshDim& d : mesh)
      if (d.size > 1 && d.name != "dp" && d.name != "dp_shard" && d.name != "dp_replicate" && d.name != "ep")
        throw InputError("MoE models run under data and expert parallelism only so far (dp, dp_shard, dp_replicate, "
                         "ep); --mesh " + describe_mesh() + " has " + d.name + "=" + std::to_string(d.size) +
                         " (num_local_experts = " + std::to_string(cfg.num_local_experts) + ")");
  for (int r = 0; r < size("tp"); ++r) llama4d::tp_layout(cfg, size("tp"), r);
  const int pp = size("pp");
  if (pp == 1) return;
  pipeline_layout(cfg);
  if (micro_batches <= 0) return;
  simulate_pipeline_schedule(make_pipeline_schedule(schedule, pp, micro_batches, pp_chunks));
  // Every message of a step has its own tag, 2 (m S + boundary) + direction, and MPI guarantees
  // tags only up to 32767.
  if (int64_t(micro_batches) * pp * pp_chunks >= 16384)
    throw InputError("pipeline: " + std::to_string(micro_batches) + " micro-batches x " + std::to_string(pp * pp_chunks) +
                     " stages is more messages per step than tags (at most 16383)");
}

std::vector<std::string> ParallelPlan::data_dims() const {
  std::vector<std::string> dims;
  for (const MeshDim& d : mesh)
    if (d.name == "dp" || d.name == "dp_shard" || d.name == "dp_replicate" || d.name == "ep") dims.push_back(d.name);
  return dims;
}

void ParallelPlan::check_sequence(int64_t seq_len) const {
  const int cp = size("cp");
  if (cp > 1 && seq_len % (2 * cp) != 0)
    throw InputError("context parallelism: --seq-len " + std::to_string(seq_len) + " is not a multiple of 2*cp = " +
                     std::to_string(2 * cp) + " (each sequence is cut into 2*cp equal chunks)");
}

void ParallelPlan::check_precision(bool bf16_compute) const {
  if (bf16_grad_reduce && !bf16_compute)
    throw InputError("--grad-reduce-in-bf16 is part of bf16 mixed precision: use it with --dtype bf16");
}

std::string ParallelPlan::describe_mesh() const {
  if (mesh.empty()) return "1 device";
  std::string s;
  for (const MeshDim& d : mesh) s += (s.empty() ? "" : ",") + d.name + "=" + std::to_string(d.size);
  return s;
}

std::string ParallelPlan::describe() const {
  std::string s = describe_mesh();
  // Plain DP over no second rank (tp=2,cp=1,pp=2 and the like) does nothing worth naming.
  if (!mesh.empty() && (zero != ZeroStage::none || dp() * size("cp") > 1)) {
    const DataParallelConfig d = data_parallel();
    s += ", " + d.describe() + d.reduce_note();
  }
  if (size("tp") > 1) s += sequence_parallel ? ", TP + SP" : ", TP";
  if (size("cp") > 1) s += ", CP " + std::string(context_algo_name(cp_algo));
  if (size("pp") > 1)
    s += ", PP " + std::string(pipeline_schedule_name(schedule)) + (pp_chunks > 1 ? " v=" + std::to_string(pp_chunks) : "");
  if (ac.kind != Checkpointing::Kind::none) s += ", AC " + ac.describe();
  return s;
}

nlohmann::json ParallelPlan::to_json() const {
  nlohmann::json dims = nlohmann::json::array();
  for (const MeshDim& d : mesh) dims.push_back({{"name", d.name}, {"size", d.size}});
  return {{"mesh", dims},
          {"mesh_spec", describe_mesh()},
          {"world_size", world_size()},
          {"zero", int(zero)},
          {"reshard_after_forward", reshard_after_forward},
          {"prefetch", prefetch},
          {"reduce_once", reduce_once},
          {"ac", ac.describe()},
          {"sequence_parallel", size("tp") > 1 && sequence_parallel},
          {"cp_algo", size("cp") > 1 ? nlohmann::json(std::string(context_algo_name(cp_algo))) : nlohmann::json(nullptr)},
          {"pipeline", size("pp") > 1 ? nlohmann::json{{"schedule", std::string(pipeline_schedule_name(schedule))},
                                                       {"chunks", pp_chunks},
                                                       {"layers", pp_layers}}
                                      : nlohmann::json(nullptr)},
          {"algo", std::string(reduce_algo_name(algo))},
          {"bf16_grad_reduce", bf16_grad_reduce}};
}

}  // namespace llama4d
