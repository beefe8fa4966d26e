#include "backends/mpi/mpi_session.h"

#include <atomic>
#include <thread>

#include "backends/mpi/mpi_internal.h"
#include "core/error.h"

namespace llama4d {

using mpi_detail::check_mpi;
using mpi_detail::Clock;
using mpi_detail::MpiProcessGroup;

namespace {

std::atomic<bool> g_session_alive{false};
std::atomic<bool> g_mpi_finalized{false};

}  // namespace

void MpiSession::Impl::progress_sends() {
  for (auto it = pending_sends.begin(); it != pending_sends.end();) {
    int done = 0;
    MPI_Testall(int(it->requests.size()), it->requests.data(), &done, MPI_STATUSES_IGNORE);
    it = done ? pending_sends.erase(it) : std::next(it);
  }
}

void MpiSession::Impl::adopt(MPI_Comm comm) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  comms.push_back(comm);
}

std::shared_ptr<ProcessGroup> MpiSession::Impl::make_world(ReduceAlgo algo) {
  std::shared_ptr<ProcessGroup> group;
  stream
      .submit("new world",
              [&] {
                MPI_Comm coll, p2p;
                check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &coll), "MPI_Comm_dup");
                check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &p2p), "MPI_Comm_dup");
                adopt(coll);
                adopt(p2p);
                ProcessGroup::Info info;
                info.name = "world";
                info.rank = rank;
                for (int r = 0; r < size; ++r) info.world_ranks.push_back(r);
                info.algo = algo;
                info.timeout = options.timeout;
                info.cluster = options.cluster;
                info.accounting = accounting.get();
                group = std::make_shared<MpiProcessGroup>(std::move(info), *this, coll, p2p);
              })
      ->wait();
  return group;
}

MpiSession::MpiSession(MpiOptions options) {
  if (options.timeout.count() <= 0) throw InputError("mpi: timeout must be positive");
  if (g_mpi_finalized) throw InputError("mpi: MPI was already finalised in this process; use one MpiSession per process");
  if (g_session_alive.exchange(true)) throw InputError("mpi: only one MpiSession per process");
  try {
    impl_ = std::make_unique<Impl>();
    impl_->options = options;
    Impl& s = *impl_;
    // MPI is initialised, used and finalised by the comm thread only (MPI_THREAD_FUNNELED).
    s.stream
        .submit("MPI_Init",
                [&s] {
                  int initialized = 0;
                  MPI_Initialized(&initialized);
                  if (initialized) throw InputError("mpi: MPI is already initialised by someone else in this process");
                  int provided = 0;
                  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
                  if (provided < MPI_THREAD_FUNNELED) throw CommError("mpi: MPI_THREAD_FUNNELED is not supported");
                  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
                  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
                  MPI_Comm_size(MPI_COMM_WORLD, &s.size);
                  MPI_Comm node;
                  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                            "MPI_Comm_split_type");
                  MPI_Comm_size(node, &s.node_size);
                  MPI_Comm_free(&node);
                })
        ->wait();
    ClusterSpec& c = s.options.cluster;
    if (c.gpus_per_node < 1) throw InputError("mpi: cluster needs at least one GPU per node");
    c.nodes = (s.size + c.gpus_per_node - 1) / c.gpus_per_node;
    c.validate(s.size);
    s.accounting = std::make_unique<RankAccounting>(s.rank, c, RankTrace::Clock::now());
    s.world = s.make_world(s.options.algo);
  } catch (...) {
    impl_.reset();
    g_session_alive = false;
    throw;
  }
}

MpiSession::~MpiSession() {
  Impl& s = *impl_;
  // Finalising waits for every other rank; after a failure (or while an exception unwinds this
  // rank) that could hang, so the process leaves without it and mpirun stops the others.
  const bool finalize = !s.broken && std::uncaught_exceptions() == 0;
  try {
    s.stream
        .submit("MPI_Finalize",
                [&s, finalize] {
                  if (!finalize) return;
                  const auto deadline = Clock::now() + s.options.timeout;
                  while (!s.pending_sends.empty() && Clock::now() < deadline) {
                    s.progress_sends();
                    std::this_thread::yield();
                  }
                  for (auto& w : s.windows) w->free();
                  for (MPI_Comm& c : s.comms) MPI_Comm_free(&c);
                  MPI_Finalize();
                  g_mpi_finalized = true;
                })
        ->wait();
  } catch (...) {
  }
  s.stream.stop();
  impl_.reset();
  g_session_alive = false;
}

int MpiSession::rank() const { return impl_->rank; }
int MpiSession::size() const { return impl_->size; }
int MpiSession::node_size() const { return impl_->node_size; }
ProcessGroup& MpiSession::world() { return *impl_->world; }
std::shared_ptr<ProcessGroup> MpiSession::new_world(ReduceAlgo algo) { return impl_->make_world(algo); }
RankAccounting& MpiSession::accounting() { return *impl_->accounting; }

}  // namespace llama4d
