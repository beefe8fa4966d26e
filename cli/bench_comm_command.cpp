// `llama4d bench comm`: an nccl-tests-style table (size, count, time, algbw, busbw) for every
// collective on the virtual, MPI or NCCL backend, next to this machine's memcpy bandwidth and the
// cluster model's simulated time. The engine is bench/comm_bench.h.
//
//   llama4d bench comm --ranks 8 --op all_reduce --min-bytes 64M --max-bytes 64M
//   mpirun -np 4 llama4d bench comm --backend mpi --json
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>

#include "bench/comm_bench.h"
#include "cli/commands.h"
#include "core/error.h"

namespace llama4d::cli {

namespace {

struct BenchCommArgs {
  CommBenchOptions opt;
  std::string op = "all", dtype = "f32", algo = "ring";
  bool json = false;
};

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto a = std::make_shared<BenchCommArgs>();
  CLI::App* cmd = bench.add_subcommand("comm", "nccl-tests-style table of every collective on the virtual, MPI or NCCL backend");
  cmd->add_option("--backend", a->opt.backend,
                  "virtual (threads), mpi (run under mpirun) or nccl (one process per GPU: mpirun, torchrun-style "
                  "variables, or alone; buffers in GPU memory)")
      ->check(CLI::IsMember({"virtual", "mpi", "nccl"}))
      ->capture_default_str();
  add_number(*cmd, "--ranks", a->opt.ranks, "virtual GPUs (virtual backend; MPI and NCCL use the job's processes)")
      ->capture_default_str();
  add_number(*cmd, "--gpus-per-node", a->opt.gpus_per_node, "GPUs per node in the cluster model")
      ->capture_default_str();
  cmd->add_option("--op", a->op, "all, or one of all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, sendrecv")
      ->capture_default_str();
  add_size(*cmd, "--min-bytes", a->opt.min_bytes, "smallest message (suffixes K, M, G = 2^10, 2^20, 2^30)")
      ->capture_default_str();
  add_size(*cmd, "--max-bytes", a->opt.max_bytes, "largest message; sizes double from min to max")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32, f64, bf16, f16 (moves only), i32, i64, u8")->capture_default_str();
  cmd->add_option("--algo", a->algo, "reduction algorithm: ordered (rank order) or ring (NCCL's)")
      ->check(CLI::IsMember({"ordered", "ring"}))
      ->capture_default_str();
  add_number(*cmd, "--iters", a->opt.iters, "timed calls per size (0 = about 0.2 s worth, 2..100)")
      ->capture_default_str();
  add_number(*cmd, "--warmup", a->opt.warmup, "untimed calls per size first")->capture_default_str();
  cmd->add_flag("--symmetric", a->opt.symmetric,
                "allocate the buffers in symmetric memory, which peers on one node address directly (MPI: no "
                "staging copy; like nccl-tests -R)");
  cmd->add_option("--trace", a->opt.trace_path,
                  "write a Chrome trace / Perfetto JSON of the run (per rank, wall and simulated time)");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a, cmd] {
    // Processes are the ranks there: the count would be taken and ignored.
    if (cmd->count("--ranks") > 0 && a->opt.backend != "virtual")
      throw InputError("--ranks counts virtual GPUs; with --backend " + a->opt.backend +
                       " the ranks are the job's processes (mpirun -np N)");
    CommBenchOptions o = a->opt;
    if (a->op != "all") o.ops = {a->op};
    std::string upper = a->dtype;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    o.dtype = dtype_from_name(upper);
    o.algo = parse_reduce_algo(a->algo);
    std::fprintf(stderr, "bench comm: %s backend, algo %s, %s, %lld..%lld bytes\n", o.backend.c_str(), a->algo.c_str(),
                 upper.c_str(), (long long)o.min_bytes, (long long)o.max_bytes);
    const CommBenchReport report = run_comm_bench(o);
    if (report.rank != 0) return;  // MPI: one table, from rank 0
    if (a->json)
      std::printf("%s\n", report.to_json().dump(2).c_str());
    else
      std::printf("%s", report.table().c_str());
    std::fflush(stdout);
  });
}

}  // namespace llama4d::cli
