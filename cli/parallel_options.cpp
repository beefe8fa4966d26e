#include "cli/parallel_options.h"

#include "core/error.h"

namespace llama4d::cli {

void ParallelChoice::add_options(CLI::App& cmd, const std::string& default_mesh) {
  mesh = default_mesh;
  cmd.add_option("--mesh", mesh, "ranks by dim, innermost first: dp=4, or dp_shard=2,dp_replicate=2 (HSDP)")
      ->capture_default_str();
  cmd.add_option("--zero", zero, "ZeRO stage: 0 plain DP, 1 optimizer, 2 + gradients, 3 + parameters (FSDP)")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  cmd.add_flag("--keep-params", keep_params,
               "ZeRO-3: keep a layer's gathered parameters from forward to backward (Llama 3's choice)");
}

DataParallelConfig ParallelChoice::config() const {
  DataParallelConfig c;
  c.stage = ZeroStage(zero);
  if (keep_params && c.stage != ZeroStage::zero3) throw InputError("--keep-params applies to --zero 3 only");
  c.reshard_after_forward = !keep_params;
  return c;
}

}  // namespace llama4d::cli
