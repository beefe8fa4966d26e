#pragma once
// The engine of `llama4d bench comm`: an nccl-tests-style sweep of every collective over
// message sizes, on any backend. Conventions follow nccl-tests (doc/PERFORMANCE.md there):
//   size   bytes of the full buffer (all_gather: the gathered output; reduce_scatter: the input)
//   algbw  size / time
//   busbw  algbw * factor, the per-rank link bandwidth a ring would need:
//          all_reduce 2(N-1)/N; reduce_scatter, all_gather, all_to_all (N-1)/N; broadcast,
//          sendrecv 1.
// time is the mean per call over the timed iterations, the slowest rank's. Each row also
// shows the cluster model's simulated time (H100 NVLink/IB) for the same call.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/comm/comm_types.h"
#include "core/comm/process_group.h"

namespace llama4d {

struct CommBenchOptions {
  std::string backend = "virtual";  // "virtual", "mpi" (run under mpirun) or "nccl" (one process per GPU)
  int ranks = 8;                    // virtual backend only; MPI and NCCL use the world size
  int gpus_per_node = 8;            // cluster model
  std::vector<std::string> ops;     // empty = all of comm_bench_ops()
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  DType dtype = DType::f32;
  ReduceAlgo algo = ReduceAlgo::ring;
  int iters = 0;                    // timed calls per size; 0 = as many as fit ~0.2 s (2..100)
  int warmup = 1;
  // Buffers in the group's symmetric memory (ProcessGroup::allocate_symmetric), as nccl-tests
  // registers them with -R; otherwise each rank's private heap. Always on for NCCL (GPU memory).
  bool symmetric = false;
  std::string trace_path;           // write the run's Chrome trace here (MPI: one file per rank)
};

struct CommBenchRow {
  std::string op;
  int64_t bytes = 0;      // nccl-tests "size"
  int64_t count = 0;      // elements of that buffer
  int iters = 0;
  double time_us = 0;     // mean per call, slowest rank
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  double sim_us = 0;      // the cluster model's time for the same call
  double sim_busbw_gbps = 0;
};

struct CommBenchReport {
  CommBenchOptions options;
  int ranks = 0;
  int rank = 0;               // this process's rank (MPI); only rank 0 should print
  double memcpy_gbps = 0;     // single-thread memcpy bandwidth of this machine
  std::vector<CommBenchRow> rows;

  nlohmann::json to_json() const;
  std::string table() const;  // header lines + nccl-tests-style table
};

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "sendrecv".
std::vector<std::string> comm_bench_ops();
// Best of several single-thread memcpy runs of `bytes`, in GB/s (1e9 bytes copied per second).
double measure_memcpy_gbps(int64_t bytes);
// Runs the sweep on every rank of `pg` (collective); every rank gets the same rows.
std::vector<CommBenchRow> run_comm_bench_on(ProcessGroup& pg, const CommBenchOptions& options);
// Checks the options (InputError), starts the backend, measures memcpy and runs the sweep.
CommBenchReport run_comm_bench(const CommBenchOptions& options);

}  // namespace llama4d
