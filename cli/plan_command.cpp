// `llama4d plan`: the analytical planner (core/plan/planner.h) from the command line.
//
//   llama4d plan --preset small --mesh tp=2,cp=2,pp=2,dp=2 --zero 3 --micro-batches 2
//   llama4d plan --preset llama3-405b --mesh tp=8,cp=1,pp=16,dp=64    the paper's batch, sequence and
//                              precision unless flags say otherwise
//   llama4d plan --llama3      the Llama 3 405B plans of the paper beside its reported MFU, and
//                              plans of ours for 8B and 70B (the paper gives none)
//
// Memory per GPU by category (with a verdict against --hbm-gb naming the largest category when
// the plan does not fit), bytes per step per mesh dimension and the link each group crosses, the
// pipeline bubble, step time, MFU, tokens/s and the days a --tokens budget takes. Every
// assumption of the time model is a flag; nothing runs, so any size of cluster can be planned.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/parallel_options.h"
#include "core/error.h"
#include "core/plan/failure_model.h"
#include "core/plan/llama3.h"

namespace llama4d::cli {

namespace {

struct PlanArgs {
  std::string preset = "small", config, precision = "fp32";
  ParallelChoice parallel;
  int64_t seq_len = 256, batch_size = 8, micro_batch_size = 0;
  int micro_batches = 0;
  int gpus_per_node = 8;
  double gpu_tflops = 989, hbm_gb = 80, nvlink_gbps = 450, nvlink_us = 1, ib_gbps = 50, ib_us = 5;
  double efficiency = 0.6, dp_overlap = 0.9, tokens = 0;
  double failure_gpus = 0, mtbf_hours = 0, checkpoint_s = 0, restart_s = 0;  // the failure model (flags given)
  bool llama3 = false, json = false, doc_mask = false;
};

void print_failure_model(const nlohmann::json& f) {
  std::printf("\nfailures: %.0f GPUs, job MTBF %.2f h (%.1f interruptions a day); checkpoint %.0f s, restart %.0f s\n",
              f.at("gpus").get<double>(), f.at("job_mtbf_hours").get<double>(),
              f.at("expected_interruptions_per_day").get<double>(), f.at("checkpoint_s").get<double>(),
              f.at("restart_s").get<double>());
  std::printf("  checkpoint every %.0f s (Young: %.0f s): goodput %.1f%%\n", f.at("daly_interval_s").get<double>(),
              f.at("young_interval_s").get<double>(), 100 * f.at("goodput_at_daly").get<double>());
  std::printf("  %12s  %8s\n", "interval s", "goodput");
  for (const auto& p : f.at("sweep"))
    std::printf("  %12.0f  %7.1f%%\n", p.at("interval_s").get<double>(), 100 * p.at("goodput").get<double>());
}

ClusterModel cluster_model(const PlanArgs& a) {
  if (a.gpus_per_node < 1 || a.hbm_gb < 0 || a.nvlink_gbps <= 0 || a.ib_gbps <= 0 || a.nvlink_us < 0 || a.ib_us < 0)
    throw InputError("plan: --gpus-per-node must be >= 1, bandwidths positive, latencies and --hbm-gb >= 0");
  ClusterModel m;
  m.cluster.gpus_per_node = a.gpus_per_node;
  m.cluster.gpu_tflops = a.gpu_tflops;
  m.cluster.hbm_bytes = int64_t(a.hbm_gb * 1e9);
  m.cluster.nvlink = {a.nvlink_us, a.nvlink_gbps};
  m.cluster.infiniband = {a.ib_us, a.ib_gbps};
  m.compute_efficiency = a.efficiency;
  m.dp_overlap = a.dp_overlap;
  return m;
}

StepShape shape_of(const LlamaConfig& model, const ParallelPlan& plan, const PlanArgs& a) {
  StepShape s;
  s.model = model;
  s.plan = plan;
  s.seq_len = a.seq_len;
  s.batch_size = a.batch_size;
  s.micro_batch_size = a.micro_batch_size;
  if (a.micro_batches < 0) throw InputError("--micro-batches must be >= 1, got " + std::to_string(a.micro_batches));
  if (a.micro_batches > 0 && a.micro_batch_size > 0)
    throw InputError("plan: give --micro-batches or --micro-batch-size, not both");
  if (a.micro_batches > 0) {
    if (s.batch_size % plan.dp() != 0 || s.rows_per_data_rank() % a.micro_batches != 0)
      throw InputError("--micro-batches " + std::to_string(a.micro_batches) + ": each data-parallel rank gets " +
                       std::to_string(s.batch_size / plan.dp()) + " rows of --batch-size " +
                       std::to_string(s.batch_size) + ", not divisible into that many micro-batches");
    s.micro_batch_size = s.rows_per_data_rank() / a.micro_batches;
  }
  s.precision = Precision::parse(a.precision);
  s.doc_mask = a.doc_mask;
  if (s.seq_len < 1 || s.batch_size < 1 || s.micro_batch_size < 0)
    throw InputError("plan: --seq-len and --batch-size must be >= 1 and --micro-batch-size >= 0");
  return s;
}

// A Llama 3 preset planned with the flags it was not given set as the paper trained it: 8K
// sequences, 16M tokens per step (rounded up to whole sequences per data rank), bf16 mixed
// precision and micro-batches of one sequence. The defaults of the other presets (8 x 256,
// fp32, one micro-batch) would plan a step of a few thousand tokens on thousands of GPUs.
void paper_defaults(PlanArgs& a, const CLI::App& cmd, int dp) {
  if (!a.config.empty() || a.preset.rfind("llama3-", 0) != 0) return;
  if (cmd.count("--seq-len") == 0) a.seq_len = 8192;
  if (cmd.count("--batch-size") == 0) {
    const int64_t sequences = (int64_t(16) << 20) / a.seq_len;
    a.batch_size = std::max<int64_t>(1, (sequences + dp - 1) / dp) * dp;
  }
  if (cmd.count("--precision") == 0) a.precision = "bf16";
  if (cmd.count("--micro-batches") == 0 && cmd.count("--micro-batch-size") == 0) a.micro_batch_size = 1;
}

// What a bubble means when a step has fewer micro-batches than pipeline stages: "" otherwise.
std::string few_micro_batches_note(const PlanReport& r) {
  const int p = r.shape.plan.size("pp");
  const int64_t m = r.shape.micro_batches();
  if (p <= 1 || m >= p) return "";
  return "m = " + std::to_string(m) + " micro-batches for p = " + std::to_string(p) +
         " stages: the pipeline never fills, so at every moment at least " + std::to_string(p - m) +
         " stages idle and the bubble is mostly that wait, not the fill and drain of the formulas; give "
         "--micro-batches of at least p (or more rows per data rank)";
}

nlohmann::json llama3_table(const PlanArgs& a) {
  // The token budget: 15.6T tokens (the paper's pre-training) unless --tokens says otherwise.
  const double tokens = a.tokens > 0 ? a.tokens : 15.6e12;
  nlohmann::json rows = nlohmann::json::array(), own = nlohmann::json::array();
  for (const Llama3Layout& layout : llama3_405b_layouts()) {
    nlohmann::json j = plan_step(llama3_405b_shape(layout), cluster_model(a), tokens).to_json();
    j["reported_mfu"] = layout.reported_mfu;
    rows.push_back(j);
  }
  for (const Llama3OwnPlan& p : llama3_own_plans()) {
    nlohmann::json j = plan_step(p.shape, cluster_model(a), tokens).to_json();
    j["model"] = p.model;
    own.push_back(j);
  }
  return {{"model", "llama3-405b"},
          {"source", "Dubey et al. 2024, The Llama 3 Herd of Models, Table 4"},
          {"plans", rows},
          {"own_plans", own},
          {"own_plans_note", "8B and 70B: the paper gives no layout; these plans are llama4d's (core/plan/llama3.h)"}};
}

// One row of the table: mesh, sequence, GPUs, weight states and activations per GPU, dp bytes,
// bubble, step, MFU, and the paper's MFU where it reports one.
void print_llama3_row(const nlohmann::json& r, const std::string& label, const std::string& paper) {
  const nlohmann::json& m = r.at("memory_per_gpu");
  int64_t dp_bytes = 0;
  for (const nlohmann::json& d : r.at("traffic"))
    if (d.at("dim") == "dp") dp_bytes += d.at("bytes_per_rank").get<int64_t>();
  std::printf("%-35s %7lld %6d %10s %10s %10s %7.1f%% %8.2f %8.1f%% %6s%s\n", label.c_str(),
              static_cast<long long>(r.at("seq_len").get<int64_t>()), r.at("plan").at("world_size").get<int>(),
              format_bytes(m.at("params").get<int64_t>() + m.at("grads").get<int64_t>() +
                           m.at("optimizer").get<int64_t>() + m.at("comm_buffers").get<int64_t>())
                  .c_str(),
              format_bytes(m.at("activations").get<int64_t>()).c_str(), format_bytes(dp_bytes).c_str(),
              r.at("bubble_fraction").get<double>() * 100, r.at("step_seconds").get<double>(),
              r.at("mfu").get<double>() * 100, paper.c_str(), r.at("fits").get<bool>() ? "" : "  (does not fit)");
}

void print_llama3(const nlohmann::json& t) {
  std::printf("Llama 3 405B, the paper's plans (bf16, ZeRO-3 with parameters kept and gradients reduced once\n"
              "per step, interleaved 1F1B v=4, selective checkpointing assumed; 15.6T tokens):\n");
  std::printf("%-35s %7s %6s %10s %10s %10s %8s %8s %9s %7s\n", "mesh", "seq", "GPUs", "weights", "activ.",
              "dp bytes", "bubble", "step s", "MFU", "paper");
  for (const nlohmann::json& r : t.at("plans"))
    print_llama3_row(r, r.at("plan").at("mesh_spec").get<std::string>(),
                     std::to_string(int(std::lround(r.at("reported_mfu").get<double>() * 100))) + "%");
  std::printf("\n8B and 70B: the paper gives no layout for them; two of ours, same 16M-token steps:\n");
  for (const nlohmann::json& r : t.at("own_plans"))
    print_llama3_row(r, r.at("model").get<std::string>() + " " + r.at("plan").at("mesh_spec").get<std::string>(), "-");
  std::printf("\nThe MFU column is fitted, not a check: kernels at --efficiency of peak and --dp-overlap of the\n"
              "data-parallel traffic hidden were chosen so the 405B rows land near the paper's.\n");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "predict memory, traffic, bubble, step time and MFU of a plan (no run)");
  cmd->add_option("--preset", a->preset, "model shape (tiny, small, medium, llama3-8b, llama3-70b, llama3-405b)")
      ->capture_default_str();
  cmd->add_option("--config", a->config, "Hugging Face config.json (overrides --preset)");
  a->parallel.add_options(*cmd, "tp=2,cp=2,pp=2,dp=2", false);
  add_micro_batches_option(*cmd, a->micro_batches);
  add_number(*cmd, "--seq-len", a->seq_len, "tokens per sequence (llama3-* presets: 8192)")->capture_default_str();
  add_number(*cmd, "--batch-size", a->batch_size, "global batch in sequences (llama3-* presets: 16M tokens)")
      ->capture_default_str();
  add_number(*cmd, "--micro-batch-size", a->micro_batch_size,
             "sequences per micro-batch on a data rank (0: all; llama3-* presets: 1)")
      ->capture_default_str();
  cmd->add_option("--precision", a->precision,
                  "fp32 (this engine), fp64, or bf16 (Llama 3's mixed precision; llama3-* presets: bf16)")
      ->capture_default_str();
  add_number(*cmd, "--gpus-per-node", a->gpus_per_node, "GPUs per node (NVLink inside, InfiniBand across)")
      ->capture_default_str();
  add_number(*cmd, "--gpu-tflops", a->gpu_tflops, "peak per GPU, TFLOP/s (H100 SXM dense BF16: 989)")->capture_default_str();
  add_number(*cmd, "--hbm-gb", a->hbm_gb, "memory per GPU in GB (0: unlimited)")->capture_default_str();
  add_number(*cmd, "--nvlink-gbps", a->nvlink_gbps, "NVLink GB/s per GPU and direction")->capture_default_str();
  add_number(*cmd, "--nvlink-us", a->nvlink_us, "NVLink latency per message, us")->capture_default_str();
  add_number(*cmd, "--ib-gbps", a->ib_gbps, "InfiniBand GB/s per GPU and direction")->capture_default_str();
  add_number(*cmd, "--ib-us", a->ib_us, "InfiniBand latency per message, us")->capture_default_str();
  add_number(*cmd, "--efficiency", a->efficiency, "fraction of peak the kernels reach")->capture_default_str();
  add_number(*cmd, "--dp-overlap", a->dp_overlap, "fraction of data-parallel traffic hidden behind compute")
      ->capture_default_str();
  add_number(*cmd, "--tokens", a->tokens, "token budget to time (e.g. 15.6e12)");
  cmd->add_flag("--doc-mask", a->doc_mask, "document masking: count each micro-batch's document ids");
  cmd->add_flag("--llama3", a->llama3,
                "Llama 3 405B's plans from the paper beside its reported MFU, and plans of ours for 8B and 70B");
  add_number(*cmd, "--checkpoint-s", a->checkpoint_s,
             "seconds one checkpoint stalls training: adds the failure model (Young's and Daly's intervals, goodput)");
  add_number(*cmd, "--restart-s", a->restart_s, "failure model: seconds from an interruption to training again");
  add_number(*cmd, "--failure-gpus", a->failure_gpus, "failure model: GPUs of the job (default: the plan's)");
  add_number(*cmd, "--mtbf-hours", a->mtbf_hours,
             "failure model: the job's mean time between interruptions (default: Llama 3's 419 in 54 days on 16,384 GPUs, scaled)");
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a, cmd] {
    if (a->llama3) {
      // The layouts, model, batch and precision are the paper's: refuse flags that would be ignored.
      for (const char* flag : {"--preset", "--config", "--mesh", "--zero", "--keep-params", "--reduce-once", "--ac", "--sp", "--schedule",
                               "--pp-chunks", "--pp-layers", "--cp-algo", "--micro-batches", "--seq-len",
                               "--batch-size", "--micro-batch-size", "--precision", "--doc-mask"})
        if (cmd->count(flag) > 0)
          throw InputError(std::string("plan --llama3 sets ") + flag +
                           " itself (the paper's layouts); only the cluster flags apply");
      for (const char* flag : {"--checkpoint-s", "--restart-s", "--failure-gpus", "--mtbf-hours"})
        if (cmd->count(flag) > 0)
          throw InputError(std::string(flag) + ": the failure model is for one plan (--mesh), not plan --llama3's table");
      const nlohmann::json t = llama3_table(*a);
      if (a->json)
        std::printf("%s\n", t.dump().c_str());
      else
        print_llama3(t);
      return;
    }
    const LlamaConfig model = a->config.empty() ? LlamaConfig::preset(a->preset) : LlamaConfig::from_file(a->config);
    refuse_moe(model, "plan");  // its memory, traffic and FLOP formulas are the dense layers'
    if (a->parallel.mesh.empty()) throw InputError("plan: --mesh is required (e.g. --mesh dp=1 for one GPU)");
    const ParallelPlan plan = a->parallel.plan(model, "ordered");
    paper_defaults(*a, *cmd, plan.dp());
    const PlanReport r = plan_step(shape_of(model, plan, *a), cluster_model(*a), a->tokens);
    const std::string note = few_micro_batches_note(r);
    nlohmann::json failures;
    if (cmd->count("--checkpoint-s") > 0) {
      FailureModel f{cmd->count("--failure-gpus") > 0 ? a->failure_gpus : double(plan.world_size()),
                     a->mtbf_hours * 3600, a->checkpoint_s, a->restart_s};
      if (cmd->count("--mtbf-hours") > 0 && !(a->mtbf_hours > 0))
        throw InputError("--mtbf-hours must be > 0 (leave it out for Llama 3's rate)");
      f.validate();
      failures = f.to_json();
    } else {
      for (const char* flag : {"--restart-s", "--failure-gpus", "--mtbf-hours"})
        if (cmd->count(flag) > 0) throw InputError(std::string(flag) + " belongs to the failure model: add --checkpoint-s");
    }
    if (a->json) {
      nlohmann::json j = r.to_json();
      if (!failures.is_null()) j["failure_model"] = failures;
      j["notes"] = note.empty() ? nlohmann::json::array() : nlohmann::json::array({note});
      j["parameters"] = model.num_parameters();
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s", r.table().c_str());
      if (!note.empty()) std::printf("\nnote: %s.\n", note.c_str());
      if (!failures.is_null()) print_failure_model(failures);
    }
  });
}

}  // namespace llama4d::cli
