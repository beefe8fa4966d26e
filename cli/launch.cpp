#include "cli/launch.h"

#include <map>
#include <thread>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/traffic_log.h"
#include "core/error.h"
#include "core/ops.h"
#ifdef LLAMA4D_HAVE_MPI
#include "backends/mpi/mpi_session.h"
#endif

namespace llama4d::cli {

void LaunchOptions::add_options(CLI::App& cmd) {
  cmd.add_option("--backend", backend, "virtual: ranks are threads (virtual GPUs); mpi: ranks are processes (mpirun)")
      ->check(CLI::IsMember({"virtual", "mpi"}))
      ->capture_default_str();
  cmd.add_option("--algo", algo, "reduction order: ordered (bitwise reproducible) or ring (NCCL's)")
      ->check(CLI::IsMember({"ordered", "ring"}))
      ->capture_default_str();
  cmd.add_option("--gpus-per-node", gpus_per_node, "virtual GPUs per node: NVLink inside, InfiniBand across")
      ->capture_default_str();
  cmd.add_option("--hbm-gib", hbm_gib, "memory capacity of each virtual GPU in GiB (0: unlimited)")->capture_default_str();
  cmd.add_option("--trace", trace, "write a Chrome trace / Perfetto JSON of every rank's timeline here");
  cmd.add_option("--timeout", timeout_s, "seconds a rank waits for its peers before failing")->capture_default_str();
}

struct RankLaunch::Impl {
  LaunchOptions opt;
  std::unique_ptr<VirtualCluster> cluster;
#ifdef LLAMA4D_HAVE_MPI
  std::unique_ptr<MpiSession> mpi;
#endif
};

RankLaunch::RankLaunch(const LaunchOptions& opt) : impl_(std::make_unique<Impl>()) {
  impl_->opt = opt;
  if (opt.gpus_per_node < 1) throw InputError("--gpus-per-node must be >= 1");
  if (opt.hbm_gib < 0) throw InputError("--hbm-gib must be >= 0");
  if (opt.timeout_s < 1) throw InputError("--timeout must be >= 1 second");
#ifndef LLAMA4D_HAVE_MPI
  if (opt.backend == "mpi") throw InputError("--backend mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
}

RankLaunch::~RankLaunch() = default;

void RankLaunch::run(int ranks, const std::function<void(ProcessGroup& world)>& fn) {
  const LaunchOptions& o = impl_->opt;
  ClusterSpec spec = ClusterSpec::for_ranks(ranks, o.gpus_per_node);
  spec.hbm_bytes = int64_t(o.hbm_gib * double(int64_t(1) << 30));
  const ReduceAlgo algo = parse_reduce_algo(o.algo);
  if (o.backend == "virtual") {
    VirtualClusterOptions vo;
    vo.ranks = ranks;
    vo.cluster = spec;
    vo.algo = algo;
    vo.timeout = std::chrono::seconds(o.timeout_s);
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
#ifdef LLAMA4D_HAVE_MPI
  if (!impl_->mpi) {
    MpiOptions mo;
    mo.algo = algo;
    mo.timeout = std::chrono::seconds(o.timeout_s);
    mo.cluster = spec;
    impl_->mpi = std::make_unique<MpiSession>(mo);
  }
  if (impl_->mpi->size() != ranks)
    throw InputError("the mesh needs " + std::to_string(ranks) + " ranks but mpirun started " +
                     std::to_string(impl_->mpi->size()) + " (use mpirun -np " + std::to_string(ranks) + ")");
  fn(impl_->mpi->world());
#endif
}

bool RankLaunch::reporting() const {
#ifdef LLAMA4D_HAVE_MPI
  if (impl_->mpi) return impl_->mpi->rank() == 0;
#endif
  return true;
}

nlohmann::json RankLaunch::traffic_totals() const {
  std::vector<TrafficRecord> records;
  if (impl_->cluster) records = impl_->cluster->traffic();
#ifdef LLAMA4D_HAVE_MPI
  if (impl_->mpi) records = impl_->mpi->accounting().traffic.records();
#endif
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

std::string RankLaunch::summary() const {
  if (impl_->cluster) return impl_->cluster->traffic_summary() + "\n" + impl_->cluster->rank_summary();
#ifdef LLAMA4D_HAVE_MPI
  if (impl_->mpi) return format_traffic_summary(impl_->mpi->accounting().traffic.records());
#endif
  return "";
}

}  // namespace llama4d::cli
