#pragma once
// How the CLI runs a function on N ranks: as N virtual GPUs (threads of this process) or as the
// ranks of an MPI or NCCL job (this process is one of them; one process per rank, or per GPU).
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/comm/rank_agreement.h"
#include "core/comm/trace.h"
#include "core/data/encode_corpus.h"

namespace llama4d::cli {

struct LaunchOptions {
  std::string backend = "virtual";  // virtual | mpi | nccl
  std::string algo = "ordered";     // ordered | ring
  int gpus_per_node = 8;
  double hbm_gib = 0;               // per-rank capacity of the virtual GPUs; 0 = unlimited
  double gpu_tflops = ClusterSpec{}.gpu_tflops;  // the simulated clock's compute rate
  std::string trace;                // Chrome trace path (virtual backend)
  int timeout_s = 600;

  void add_options(CLI::App& cmd);
  // InputError for a bad value, an unwritable --trace, or (parallel false) any of these flags
  // given for a run without a mesh.
  void validate(bool parallel) const;
  // True if the user fixed this process's compute threads (--threads or OMP_NUM_THREADS).
  bool threads_chosen() const;

 private:
  const CLI::App* cmd_ = nullptr;  // where the flags were parsed, to tell given from default
};

// Compute threads of one MPI process when the user chose none: the node's cores divided by the
// job's processes on the node, at least 1, at most the cores its affinity allows (0: unknown).
int mpi_default_threads(int node_cores, int allowed_cores, int processes_on_node);

// Under mpirun, OpenMP threads that wait spin on their core, stealing it from the node's other
// processes; unless OMP_WAIT_POLICY is set, this re-executes the program with it set to passive.
// Call first thing in main. Returns (doing nothing) when not under a launcher or if exec fails.
void prefer_passive_waits_under_mpirun(char** argv);

// Whether this process prints what every process of the job would print alike before MPI has
// told it its rank (the tokenize progress lines of a BPE corpus): always with the virtual
// backend (one process); with mpi or nccl, only the process its launcher started as rank 0
// (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK; none set: a single process, which prints).
bool prints_before_ranks_are_known(const LaunchOptions& opt);
// progress_printer(stderr, what) in that process, no progress lines in the others.
EncodeProgress tokenize_progress(const LaunchOptions& opt, const std::string& what);

class RankLaunch {
 public:
  explicit RankLaunch(const LaunchOptions& opt);
  ~RankLaunch();
  // Runs fn(world) on every rank of a world of `ranks`. Virtual: one thread per rank, each with
  // an even share of the cores for compute. MPI: this process's rank (world size must match).
  // Under MPI and NCCL (over MPI or the rendezvous store), the first run() first checks that every process was launched with these settings
  // (the command's options, model config, data fingerprint) and the launch flags, before any
  // other collective: InputError naming the first that differs (core/comm/rank_agreement.h).
  // Virtual GPUs share this process's one command line: nothing to check.
  void agree_on(std::vector<RankSetting> settings);
  void run(int ranks, const std::function<void(ProcessGroup& world)>& fn);
  // Virtual backend: runs on a rank's communication thread in the middle of every collective
  // (VirtualClusterOptions::fault_hook); InputError on another backend.
  void set_fault_hook(std::function<void(int world_rank, CommOp op, int64_t seq)> hook);
  // True in the process that should print results (always for virtual; world rank 0 for MPI).
  bool reporting() const;
  // Bytes each rank sent and received in the last run, and by operation (virtual backend: all
  // ranks; MPI: this rank's own).
  nlohmann::json traffic_totals() const;
  // The simulated clock of the last run per step of `steps` (core/comm/trace.h): for each rank
  // (virtual: all; MPI: this rank's own) its step time, FLOP time, exposed communication (the
  // compute lane blocked on a result) and comm-lane busy time, in microseconds, and the slowest
  // of those ranks' step time (under MPI: this rank's). The modelled GPU rate comes with them.
  nlohmann::json simulated_per_step(int64_t steps) const;
  // The ranks' timelines of the last run (virtual: every rank's; MPI: this rank's own).
  std::vector<const RankTrace*> traces() const;
  // The ranks' flight recorders after the last run (virtual: every rank's, index = world rank;
  // MPI and NCCL: this process's own rank only, at its index).
  std::vector<std::vector<FlightEntry>> flight_records() const;
  std::string summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llama4d::cli
