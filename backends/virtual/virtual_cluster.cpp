#include "backends/virtual/virtual_cluster.h"

#include <thread>

#include "backends/virtual/virtual_process_group.h"
#include "backends/virtual/virtual_world.h"
#include "core/comm/comm_stream.h"
#include "core/comm/text_table.h"
#include "core/error.h"

namespace llama4d {

VirtualCluster::VirtualCluster(VirtualClusterOptions options)
    : options_(std::move(options)), origin_(RankTrace::Clock::now()) {
  if (options_.ranks < 1) throw InputError("virtual cluster needs at least 1 rank, got " + std::to_string(options_.ranks));
  if (options_.ranks > kMaxVirtualRanks)
    throw InputError("virtual cluster supports at most " + std::to_string(kMaxVirtualRanks) + " ranks");
  if (options_.timeout.count() <= 0) throw InputError("virtual cluster timeout must be positive");
  if (options_.cluster.gpus_per_node < 1) throw InputError("virtual cluster needs at least 1 GPU per node");
  options_.cluster.nodes = (options_.ranks + options_.cluster.gpus_per_node - 1) / options_.cluster.gpus_per_node;
  options_.cluster.validate(options_.ranks);
  for (int r = 0; r < options_.ranks; ++r)
    accounting_.push_back(std::make_unique<RankAccounting>(r, options_.cluster, origin_));
}

VirtualCluster::~VirtualCluster() = default;

void VirtualCluster::run(const std::function<void(ProcessGroup& world)>& fn) {
  std::vector<RankAccounting*> acc;
  for (auto& a : accounting_) acc.push_back(a.get());
  auto world = std::make_shared<virt::World>(options_, acc);

  std::vector<std::thread> threads;
  threads.reserve(size_t(options_.ranks));
  for (int r = 0; r < options_.ranks; ++r) {
    threads.emplace_back([this, &fn, world, r] {
      CommStream stream("rank " + std::to_string(r));
      // The ops this thread runs charge their FLOPs to this rank's simulated clock.
      ops::ScopedFlopSink flops(&accounting_[size_t(r)]->trace);
      try {
        ProcessGroup::Info info;
        info.name = "world";
        info.rank = r;
        info.world_ranks = world->world_group->world_ranks;
        info.algo = options_.algo;
        info.timeout = options_.timeout;
        info.cluster = options_.cluster;
        info.accounting = accounting_[size_t(r)].get();
        auto pg = std::make_shared<virt::VirtualProcessGroup>(std::move(info), world, world->world_group, stream);
        fn(*pg);
        stream.drain();  // async operations the function never waited for still complete
      } catch (...) {
        world->rank_failed(r, std::current_exception());
      }
      stream.stop();
      world->rank_exited(r);
    });
  }
  for (std::thread& t : threads) t.join();

  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(world->mu);
    failures_ = world->failures;
    error = world->first_error;
  }
  if (error) std::rethrow_exception(error);
}

RankAccounting& VirtualCluster::accounting(int rank) {
  if (rank < 0 || rank >= size()) throw InputError("virtual cluster has no rank " + std::to_string(rank));
  return *accounting_[size_t(rank)];
}

const RankAccounting& VirtualCluster::accounting(int rank) const {
  if (rank < 0 || rank >= size()) throw InputError("virtual cluster has no rank " + std::to_string(rank));
  return *accounting_[size_t(rank)];
}

std::vector<TrafficRecord> VirtualCluster::traffic() const {
  std::vector<TrafficRecord> all;
  for (const auto& a : accounting_) {
    std::vector<TrafficRecord> r = a->traffic.records();
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

std::vector<const RankTrace*> VirtualCluster::traces() const {
  std::vector<const RankTrace*> t;
  for (const auto& a : accounting_) t.push_back(&a->trace);
  return t;
}

std::string VirtualCluster::traffic_summary() const { return format_traffic_summary(traffic()); }

std::string VirtualCluster::rank_summary() const {
  std::vector<std::vector<std::string>> rows = {
      {"rank", "node", "sent", "received", "over nvlink", "over ib", "peak memory", "capacity"}};
  for (int r = 0; r < size(); ++r) {
    const RankAccounting& a = *accounting_[size_t(r)];
    int64_t nvl = 0, ib = 0;
    for (const TrafficRecord& t : a.traffic.records()) {
      nvl += t.sent_nvlink;
      ib += t.sent_ib;
    }
    rows.push_back({std::to_string(r), std::to_string(options_.cluster.node_of(r)), format_bytes(a.traffic.total_sent()),
                    format_bytes(a.traffic.total_recv()), format_bytes(nvl), format_bytes(ib),
                    format_bytes(a.memory.peak_total()),
                    a.memory.capacity() > 0 ? format_bytes(a.memory.capacity()) : "unlimited"});
  }
  return format_table(rows);
}

void VirtualCluster::write_trace(const std::string& path) const { write_chrome_trace(path, traces()); }

void VirtualCluster::reset_accounting() {
  for (auto& a : accounting_) {
    a->traffic.clear();
    a->trace.clear();
    a->memory.reset_peaks();
  }
}

}  // namespace llama4d
