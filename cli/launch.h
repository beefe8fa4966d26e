#pragma once
// How the CLI runs a function on N ranks: as N virtual GPUs (threads of this process) or as the
// ranks of an MPI job (this process is one of them; start it with mpirun -np N).
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/comm/process_group.h"

namespace llama4d::cli {

struct LaunchOptions {
  std::string backend = "virtual";  // virtual | mpi
  std::string algo = "ordered";     // ordered | ring
  int gpus_per_node = 8;
  double hbm_gib = 0;               // per-rank capacity of the virtual GPUs; 0 = unlimited
  std::string trace;                // Chrome trace path (virtual backend)
  int timeout_s = 600;

  void add_options(CLI::App& cmd);
};

class RankLaunch {
 public:
  explicit RankLaunch(const LaunchOptions& opt);
  ~RankLaunch();
  // Runs fn(world) on every rank of a world of `ranks`. Virtual: one thread per rank, each with
  // an even share of the cores for compute. MPI: this process's rank (world size must match).
  void run(int ranks, const std::function<void(ProcessGroup& world)>& fn);
  // True in the process that should print results (always for virtual; world rank 0 for MPI).
  bool reporting() const;
  // Bytes each rank sent and received in the last run, and by operation (virtual backend: all
  // ranks; MPI: this rank's own).
  nlohmann::json traffic_totals() const;
  std::string summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llama4d::cli
