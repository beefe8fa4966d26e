#include "cli/parallel_options.h"

#include "core/error.h"

namespace llama4d::cli {

void ParallelChoice::add_options(CLI::App& cmd, const std::string& default_mesh) {
  mesh = default_mesh;
  cmd.add_option("--mesh", mesh, "ranks by dim, innermost first: dp=4, tp=2,dp=2, or dp_shard=2,dp_replicate=2 (HSDP)")
      ->capture_default_str();
  cmd.add_option("--zero", zero, "ZeRO stage: 0 plain DP, 1 optimizer, 2 + gradients, 3 + parameters (FSDP)")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  cmd.add_flag("--keep-params", keep_params,
               "ZeRO-3: keep a layer's gathered parameters from forward to backward (Llama 3's choice)");
  cmd.add_option("--ac", ac, "activation checkpointing: none, selective, full, every:K or every:sqrt")
      ->capture_default_str();
  cmd.add_option("--sp", sp, "sequence parallelism with tp > 1: shard the residual stream and norms (on, off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

ParallelPlan ParallelChoice::plan(const LlamaConfig& model, const std::string& algo) const {
  ParallelPlan p = ParallelPlan::parse(mesh);
  p.zero = ZeroStage(zero);
  p.reshard_after_forward = !keep_params;
  p.ac = Checkpointing::parse(ac, int(model.num_hidden_layers));
  p.algo = parse_reduce_algo(algo);
  p.sequence_parallel = sp == "on";
  if (p.single_device() && (zero != 0 || keep_params))
    throw InputError("--zero and --keep-params need a data-parallel --mesh (e.g. --mesh dp=4)");
  p.validate();
  p.check_model(model);
  return p;
}

}  // namespace llama4d::cli
