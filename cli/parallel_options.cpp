#include "cli/parallel_options.h"

#include "cli/common.h"
#include "core/error.h"
#include "core/parallel/parallel_trainer.h"

namespace llama4d::cli {

void ParallelChoice::add_options(CLI::App& cmd, const std::string& default_mesh, bool with_grad_reduce) {
  mesh = default_mesh;
  cmd.add_option("--mesh", mesh, "ranks by dim, innermost first: dp=4, tp=2,dp=2, cp=2,dp=2, or dp_shard=2,dp_replicate=2 (HSDP)")
      ->capture_default_str();
  add_number(cmd, "--zero", zero, "ZeRO stage: 0 plain DP, 1 optimizer, 2 + gradients, 3 + parameters (FSDP)", 0, 3)
      ->capture_default_str();
  cmd.add_flag("--keep-params", keep_params,
               "ZeRO-3: keep a layer's gathered parameters from forward to backward (Llama 3's choice)");
  cmd.add_flag("--reduce-once", reduce_once,
               "ZeRO-2/3: accumulate the micro-batches' gradients whole and reduce-scatter them once per step "
               "(Llama 3's choice; default: a reduce-scatter per micro-batch, least memory)");
  cmd.add_option("--ac", ac, "activation checkpointing: none, selective, full, every:K or every:sqrt")
      ->capture_default_str();
  cmd.add_option("--sp", sp, "sequence parallelism with tp > 1: shard the residual stream and norms (on, off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--schedule", schedule, "pipeline schedule with pp > 1: gpipe, 1f1b, interleaved, zb-h1")
      ->capture_default_str();
  add_number(cmd, "--pp-chunks", pp_chunks, "model chunks per pipeline rank (the interleaved schedule, >= 2)")
      ->capture_default_str();
  cmd.add_option("--pp-layers", pp_layers, "layers of each pipeline stage, e.g. 1,2,2,1 (default: balanced)");
  cmd.add_option("--cp-algo", cp_algo, "context parallelism with cp > 1: allgather (Llama 3's) or ring")
      ->capture_default_str();
  if (with_grad_reduce)
    cmd.add_flag("--grad-reduce-in-bf16", bf16_grad_reduce,
                 "with --dtype bf16: reduce gradients in bf16 (half the bytes; sums and accumulation stay f32) "
                 "instead of f32 as Llama 3 did");
}

std::vector<RankSetting> ParallelChoice::rank_settings(const ParallelPlan& plan) const {
  const auto flag = [](bool on) { return std::string(on ? "given" : "not given"); };
  return {{"--mesh", plan.describe_mesh()}, {"--zero", std::to_string(zero)},   {"--keep-params", flag(keep_params)},
          {"--reduce-once", flag(reduce_once)},
          {"--ac", ac},                     {"--sp", sp},                       {"--schedule", schedule},
          {"--pp-chunks", std::to_string(pp_chunks)}, {"--pp-layers", pp_layers}, {"--cp-algo", cp_algo},
          {"--grad-reduce-in-bf16", flag(bf16_grad_reduce)}};
}

ParallelPlan ParallelChoice::plan(const LlamaConfig& model, const std::string& algo) const {
  ParallelPlan p = ParallelPlan::parse(mesh);
  p.zero = ZeroStage(zero);
  p.reshard_after_forward = !keep_params;
  p.reduce_once = reduce_once;
  p.ac = Checkpointing::parse(ac, int(model.num_hidden_layers));
  p.algo = parse_reduce_algo(algo);
  p.sequence_parallel = sp == "on";
  p.schedule = parse_pipeline_schedule(schedule);
  p.pp_chunks = pp_chunks;
  if (!pp_layers.empty()) p.pp_layers = parse_pipeline_layers(pp_layers);
  p.cp_algo = parse_context_algo(cp_algo);
  p.bf16_grad_reduce = bf16_grad_reduce;
  if (p.single_device() && (zero != 0 || keep_params || reduce_once))
    throw InputError("--zero, --keep-params and --reduce-once need a data-parallel --mesh (e.g. --mesh dp=4)");
  p.validate();
  p.check_model(model);
  return p;
}

void add_micro_batches_option(CLI::App& cmd, int& micro_batches) {
  add_number(cmd, "--micro-batches", micro_batches,
                 "micro-batches per step on each data rank (instead of --micro-batch-size; 0: not set)")
      ->capture_default_str();
}

void apply_micro_batches(int micro_batches, TrainOptions& opt, const ParallelPlan& plan, const LlamaConfig& model) {
  if (micro_batches < 0) throw InputError("--micro-batches must be >= 1, got " + std::to_string(micro_batches));
  if (micro_batches > 0) {
    const int dp = plan.single_device() ? 1 : plan.dp();
    const int64_t rows = opt.batch_size / dp;
    if (opt.batch_size % dp != 0 || rows % micro_batches != 0)
      throw InputError("--micro-batches " + std::to_string(micro_batches) + ": each data-parallel rank gets " +
                       std::to_string(rows) + " rows of --batch-size " + std::to_string(opt.batch_size) +
                       ", not divisible into that many micro-batches");
    opt.micro_batch_size = rows / micro_batches;
  }
  check_moe_micro_batches(model, opt, plan);
  if (!plan.single_device()) plan.check_model(model, int(rank_micro_batch_count(opt, plan.dp())));
}

void check_moe_micro_batches(const LlamaConfig& model, const TrainOptions& opt, const ParallelPlan& plan) {
  if (model.moe() && !plan.single_device() && plan.dp() > 1 && opt.micro_batch_size == 0)
    throw InputError("--micro-batch-size: an MoE model's load-balancing loss is computed per micro-batch, and --mesh " +
                     plan.describe_mesh() + " would make a micro-batch of each rank's " +
                     std::to_string(opt.batch_size / plan.dp()) +
                     " rows; give --micro-batch-size N (one device with the same N computes the same loss)");
}

void check_step_fits_in_memory(const LlamaConfig& model, const TrainOptions& opt, const ParallelPlan& plan,
                               const std::string& backend, double bytes, bool force) {
  const int dp = plan.single_device() ? 1 : plan.dp();
  const int64_t rows = plan.single_device() ? opt.micro() : rank_micro_batch_rows(opt, dp);
  const double share = plan.single_device() ? 1.0
                       : backend == "virtual" ? double(dp)
                                              : double(dp) / double(plan.world_size());
  check_batch_fits_in_memory(model, rows, opt.seq_len, bytes, share, force,
                             "--batch-size " + std::to_string(opt.batch_size) + " x --seq-len " +
                                 std::to_string(opt.seq_len));
}

}  // namespace llama4d::cli
