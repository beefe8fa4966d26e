#pragma once
// --mesh and --zero: how the data-parallel family is chosen on the command line.
#include <string>

#include "cli/commands.h"
#include "core/parallel/data_parallel_trainer.h"

namespace llama4d::cli {

struct ParallelChoice {
  std::string mesh;  // "dp=4", "dp_shard=2,dp_replicate=2"; empty: one rank, no ProcessGroup
  int zero = 0;
  bool keep_params = false;  // ZeRO-3: keep gathered parameters from forward to backward

  void add_options(CLI::App& cmd, const std::string& default_mesh);
  bool parallel() const { return !mesh.empty(); }
  DataParallelMesh data_mesh() const { return DataParallelMesh::parse(mesh); }
  DataParallelConfig config() const;  // InputError for inconsistent flags
};

}  // namespace llama4d::cli
