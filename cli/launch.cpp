#include "cli/launch.h"

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "backends/virtual/virtual_cluster.h"
#include "cli/common.h"
#include "core/comm/traffic_log.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/parse_number.h"
#ifdef LLAMA4D_HAVE_MPI
#include "backends/mpi/mpi_session.h"
#endif
#ifdef LLAMA4D_HAVE_NCCL
#include "backends/nccl/nccl_job.h"
#endif

namespace llama4d::cli {

void LaunchOptions::add_options(CLI::App& cmd) {
  cmd.add_option("--backend", backend,
                 "virtual: ranks are threads (virtual GPUs); mpi: ranks are processes (mpirun); nccl: one process per "
                 "GPU (--device cuda; mpirun or torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)")
      ->check(CLI::IsMember({"virtual", "mpi", "nccl"}))
      ->capture_default_str();
  cmd.add_option("--algo", algo, "reduction order: ordered (bitwise reproducible) or ring (NCCL's)")
      ->check(CLI::IsMember({"ordered", "ring"}))
      ->capture_default_str();
  add_number(cmd, "--gpus-per-node", gpus_per_node, "virtual GPUs per node: NVLink inside, InfiniBand across")
      ->capture_default_str();
  add_number(cmd, "--hbm-gib", hbm_gib, "memory capacity of each virtual GPU in GiB (0: unlimited)")->capture_default_str();
  add_number(cmd, "--gpu-tflops", gpu_tflops,
                 "modelled compute rate of each virtual GPU in TFLOP/s for the simulated clock (default: H100 SXM dense BF16)")
      ->capture_default_str();
  cmd.add_option("--trace", trace, "write a Chrome trace / Perfetto JSON of every rank's timeline here");
  add_number(cmd, "--timeout", timeout_s, "seconds a rank waits for its peers before failing")->capture_default_str();
  cmd_ = &cmd;
}

void LaunchOptions::validate(bool parallel) const {
  // These shape the ranks of a mesh; a single-device run would ignore them without a word.
  if (!parallel && cmd_)
    for (const std::string flag : {"--backend", "--algo", "--gpus-per-node", "--gpu-tflops", "--hbm-gib", "--trace", "--timeout"})
      if (cmd_->count(flag) > 0)
        throw InputError(flag + " applies to the ranks of a parallel --mesh, and none was given (e.g. --mesh dp=4" +
                         (flag == "--backend" ? "; under mpirun -np N: --mesh dp=N)" : ")"));
  if (gpus_per_node < 1) throw InputError("--gpus-per-node must be >= 1");
  if (!(hbm_gib >= 0) || !std::isfinite(hbm_gib)) throw InputError("--hbm-gib must be a finite number >= 0 (0: unlimited)");
  if (timeout_s < 1) throw InputError("--timeout must be >= 1 second");
  if (!(gpu_tflops > 0) || !std::isfinite(gpu_tflops)) throw InputError("--gpu-tflops must be a positive number");
#ifndef LLAMA4D_HAVE_MPI
  if (backend == "mpi") throw InputError("--backend mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
#ifndef LLAMA4D_HAVE_NCCL
  if (backend == "nccl") throw InputError("--backend nccl: this build has no NCCL backend (it needs CUDA's nvcc and nccl.h)");
#endif
  if (backend == "nccl" && std::string_view(ops::backend_name()) != "cuda") {
    if (cmd_ && !cmd_->get_option_no_throw("--device"))
      throw InputError("--backend nccl: '" + cmd_->get_name() + "' computes on the CPU only; use --backend virtual or mpi");
    throw InputError("--backend nccl moves GPU memory: add --device cuda");
  }
  // Found now, not after the whole run has been computed.
  if (!trace.empty()) check_writable_file(trace, "--trace");
}

bool LaunchOptions::threads_chosen() const {
  if (std::getenv("OMP_NUM_THREADS")) return true;
  const CLI::Option* t = cmd_ ? cmd_->get_option_no_throw("--threads") : nullptr;
  return t && t->count() > 0;
}

namespace {

// Cores this process may run on: its affinity mask (mpirun may bind it to a core or a socket),
// and the node's online cores.
int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

}  // namespace

int mpi_default_threads(int node_cores, int allowed_cores, int processes_on_node) {
  const int share = std::max(1, node_cores) / std::max(1, processes_on_node);
  return std::max(1, std::min(share, allowed_cores > 0 ? allowed_cores : share));
}

void prefer_passive_waits_under_mpirun(char** argv) {
  // Open MPI (OMPI_*), PMIx and Hydra (PMI_*) launchers set these in every process they start.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
  if (!under_mpirun || std::getenv("OMP_WAIT_POLICY")) return;  // a policy the user chose stands
  // libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main runs: setting it now would
  // be ignored, so the process starts itself again, once, with it set (MPI is not initialised
  // yet, so the launcher sees the same process). If exec fails the run goes on spinning: slower,
  // the same results.
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
}

bool prints_before_ranks_are_known(const LaunchOptions& opt) {
  if (opt.backend == "virtual") return true;
  // Open MPI, PMIx and Hydra launchers name each process's rank in one of these.
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return parse_number<int>(v, name, 0) == 0;
  return true;
}

EncodeProgress tokenize_progress(const LaunchOptions& opt, const std::string& what) {
  return prints_before_ranks_are_known(opt) ? progress_printer(stderr, what) : EncodeProgress{};
}

struct RankLaunch::Impl {
  LaunchOptions opt;
  std::vector<RankSetting> settings;  // agree_on's, checked once per job
  bool agreed = false;
  std::function<void(int, CommOp, int64_t)> fault_hook;
  std::unique_ptr<VirtualCluster> cluster;
#ifdef LLAMA4D_HAVE_MPI
  std::unique_ptr<MpiSession> mpi;
#endif
#ifdef LLAMA4D_HAVE_NCCL
  std::unique_ptr<NcclJob> nccl;
#endif
  // This process's accounting when its ranks are processes (MPI, NCCL); null for virtual GPUs.
  RankAccounting* process_accounting() const {
#ifdef LLAMA4D_HAVE_NCCL
    if (nccl) return &nccl->session().accounting();
#endif
#ifdef LLAMA4D_HAVE_MPI
    if (mpi) return &mpi->accounting();
#endif
    return nullptr;
  }
};

RankLaunch::RankLaunch(const LaunchOptions& opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = opt;
  opt.validate(true);
}

RankLaunch::~RankLaunch() = default;

void RankLaunch::agree_on(std::vector<RankSetting> settings) { impl_->settings = std::move(settings); }

namespace {

// The command's settings, then the launch's own: what the flags of LaunchOptions set for every
// rank, and the ranks the command's mesh needs (bench and schedule check only these).
std::vector<RankSetting> job_settings(std::vector<RankSetting> settings, const LaunchOptions& o, int ranks) {
  const auto number = [](double v) { return nlohmann::json(v).dump(); };
  settings.insert(settings.end(), {{"the ranks of the mesh", std::to_string(ranks)},
                                   {"--backend", o.backend},
                                   {"--algo", o.algo},
                                   {"--gpus-per-node", std::to_string(o.gpus_per_node)},
                                   {"--hbm-gib", number(o.hbm_gib)},
                                   {"--gpu-tflops", number(o.gpu_tflops)},
                                   {"--timeout", std::to_string(o.timeout_s)},
                                   {"--device", ops::backend_name()},
                                   {"--kernels", ops::kernel_mode_name(ops::kernel_mode())}});
  return settings;
}

}  // namespace

void RankLaunch::run(int ranks, const std::function<void(ProcessGroup& world)>& fn) {
  const LaunchOptions& o = impl_->opt;
  ClusterSpec spec = ClusterSpec::for_ranks(ranks, o.gpus_per_node);
  spec.hbm_bytes = int64_t(o.hbm_gib * double(int64_t(1) << 30));
  spec.gpu_tflops = o.gpu_tflops;
  const ReduceAlgo algo = parse_reduce_algo(o.algo);
  if (o.backend == "virtual") {
    VirtualClusterOptions vo;
    vo.ranks = ranks;
    vo.cluster = spec;
    vo.algo = algo;
    vo.timeout = std::chrono::seconds(o.timeout_s);
    vo.fault_hook = impl_->fault_hook;
    impl_->cluster = std::make_unique<VirtualCluster>(vo);
    // Each virtual GPU gets its share of the cores, so N ranks do not start N full thread teams.
    const int cores = std::max(1, ops::backend_threads());
    const int share = std::max(1, cores / ranks);
    impl_->cluster->run([&](ProcessGroup& world) {
      ops::set_backend_threads(share);
      fn(world);
    });
    if (!o.trace.empty()) impl_->cluster->write_trace(o.trace);
    return;
  }
#ifdef LLAMA4D_HAVE_NCCL
  if (o.backend == "nccl") {
    if (!impl_->nccl) {
      NcclOptions no;
      no.algo = algo;
      no.timeout = std::chrono::seconds(o.timeout_s);
      no.cluster = spec;
      impl_->nccl = std::make_unique<NcclJob>(no, ranks, job_settings(impl_->settings, o, ranks));
    }
    NcclSession& nccl = impl_->nccl->session();
    if (nccl.size() != ranks)
      throw InputError("the mesh needs " + std::to_string(ranks) + " ranks but the job has " +
                       std::to_string(nccl.size()) + " processes (one per GPU)");
    ops::ScopedFlopSink flops(&nccl.accounting().trace);
    fn(nccl.world());
    return;
  }
#endif
#ifdef LLAMA4D_HAVE_MPI
  if (!impl_->mpi) {
    MpiOptions mo;
    mo.algo = algo;
    mo.timeout = std::chrono::seconds(o.timeout_s);
    mo.cluster = spec;
    impl_->mpi = std::make_unique<MpiSession>(mo);
    // Left alone, every process starts an OpenMP team on every core of the node: dp=4 on 2
    // cores ran at 1,435 tokens/s against 7,037 for the same plan on virtual GPUs (issue 14).
    // Each process takes its share of the node, as a virtual GPU takes its share of the process.
    if (!o.threads_chosen())
      ops::set_backend_threads(mpi_default_threads(int(sysconf(_SC_NPROCESSORS_ONLN)), affinity_cores(),
                                                   impl_->mpi->node_size()));
  }
  // Before the size check and the mesh's groups: a process launched with another --mesh would
  // otherwise wait forever in MPI_Comm_create_group for ranks that build other groups.
  if (!impl_->agreed) {
    check_ranks_agree(impl_->mpi->world(), job_settings(impl_->settings, o, ranks));
    impl_->agreed = true;
  }
  if (impl_->mpi->size() != ranks)
    throw InputError("the mesh needs " + std::to_string(ranks) + " ranks but mpirun started " +
                     std::to_string(impl_->mpi->size()) + " (use mpirun -np " + std::to_string(ranks) + ")");
  ops::ScopedFlopSink flops(&impl_->mpi->accounting().trace);  // this process's ops feed its simulated clock
  fn(impl_->mpi->world());
#endif
}

void RankLaunch::set_fault_hook(std::function<void(int, CommOp, int64_t)> hook) {
  if (impl_->opt.backend != "virtual")
    throw InputError("collective faults are injected on virtual GPUs only (--backend virtual), not --backend " +
                     impl_->opt.backend);
  impl_->fault_hook = std::move(hook);
}

std::vector<std::vector<FlightEntry>> RankLaunch::flight_records() const {
  std::vector<std::vector<FlightEntry>> out;
  if (impl_->cluster) {
    for (int r = 0; r < impl_->cluster->size(); ++r) out.push_back(impl_->cluster->accounting(r).flight.entries());
  } else if (const RankAccounting* acc = impl_->process_accounting()) {
    out.resize(size_t(acc->memory.rank() + 1));
    out.back() = acc->flight.entries();
  }
  return out;
}

bool RankLaunch::reporting() const {
  const RankAccounting* acc = impl_->process_accounting();
  return !acc || acc->trace.rank() == 0;
}

nlohmann::json RankLaunch::traffic_totals() const {
  std::vector<TrafficRecord> records;
  if (impl_->cluster) records = impl_->cluster->traffic();
  if (const RankAccounting* acc = impl_->process_accounting()) records = acc->traffic.records();
  std::map<int, std::pair<int64_t, int64_t>> per_rank;
  std::map<std::string, int64_t> per_op;
  int64_t total = 0;
  for (const TrafficRecord& r : records) {
    per_rank[r.world_rank].first += r.bytes_sent;
    per_rank[r.world_rank].second += r.bytes_recv;
    per_op[r.op] += r.bytes_sent;
    total += r.bytes_sent;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& [rank, io] : per_rank) ranks.push_back({{"rank", rank}, {"bytes_sent", io.first}, {"bytes_recv", io.second}});
  return {{"total_bytes_sent", total}, {"per_rank", ranks}, {"bytes_sent_by_op", per_op}};
}

std::vector<const RankTrace*> RankLaunch::traces() const {
  std::vector<const RankTrace*> traces;
  if (impl_->cluster) traces = impl_->cluster->traces();
  if (const RankAccounting* acc = impl_->process_accounting()) traces = {&acc->trace};
  return traces;
}

nlohmann::json RankLaunch::simulated_per_step(int64_t steps) const {
  const std::vector<const RankTrace*> traces = this->traces();
  const double n = double(std::max<int64_t>(steps, 1));
  nlohmann::json ranks = nlohmann::json::array();
  double slowest = 0;
  for (const RankTrace* t : traces) {
    const TimelineTotals s = t->totals();
    slowest = std::max(slowest, s.clock_us / n);
    ranks.push_back({{"rank", t->rank()}, {"step_us", s.clock_us / n}, {"compute_us", s.compute_us / n},
                     {"exposed_comm_us", s.wait_us / n}, {"comm_busy_us", s.comm_us / n}, {"flops", s.flops / n}});
  }
  return {{"gpu_tflops", traces.empty() ? 0.0 : traces[0]->gpu_tflops()}, {"step_us", slowest}, {"per_rank", ranks}};
}

std::string RankLaunch::summary() const {
  if (impl_->cluster) return impl_->cluster->traffic_summary() + "\n" + impl_->cluster->rank_summary();
  if (const RankAccounting* acc = impl_->process_accounting()) return format_traffic_summary(acc->traffic.records());
  return "";
}

}  // namespace llama4d::cli
