#pragma once
// --mesh, --zero, --keep-params, --ac and --sp: how the parallel plan is chosen on the command line.
// Parsed once into a ParallelPlan, which every command passes on unchanged.
#include <string>

#include "cli/commands.h"
#include "core/model/config.h"
#include "core/parallel/plan.h"

namespace llama4d::cli {

struct ParallelChoice {
  std::string mesh;  // "dp=4", "dp_shard=2,dp_replicate=2"; empty: one rank, no ProcessGroup
  int zero = 0;
  bool keep_params = false;  // ZeRO-3: keep gathered parameters from forward to backward
  std::string ac = "none";   // activation checkpointing policy
  std::string sp = "on";     // sequence parallelism with tp > 1: on | off

  void add_options(CLI::App& cmd, const std::string& default_mesh);
  bool parallel() const { return !mesh.empty(); }
  // The plan (validated: InputError for anything this build cannot run). algo: ordered | ring.
  ParallelPlan plan(const LlamaConfig& model, const std::string& algo) const;
};

}  // namespace llama4d::cli
