#include "backends/nccl/nccl_session.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <thread>

#include "backends/cuda/no_gpu_reason.h"
#include "backends/nccl/device_reduce.h"
#include "backends/nccl/nccl_internal.h"
#include "backends/store/rendezvous.h"
#include "core/error.h"

namespace llama4d {

using nccl_detail::check_cuda;
using nccl_detail::Clock;
using nccl_detail::GroupComms;
using nccl_detail::nccl;
using nccl_detail::nccl_error_text;

namespace nccl_detail {

DeviceBytes& DeviceBytes::operator=(DeviceBytes&& o) noexcept {
  if (this != &o) {
    release();
    p_ = o.p_, bytes_ = o.bytes_, stream_ = o.stream_;
    o.p_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void DeviceBytes::release_after(cudaStream_t stream) {
  if (p_) cudaFreeAsync(p_, stream);
  p_ = nullptr, bytes_ = 0;
}

namespace {
cudaMemPool_t g_pool = nullptr;
}

cudaMemPool_t comm_pool() { return g_pool; }

void make_comm_pool(int device) {
  if (g_pool) return;  // one per process, kept for its life (a later session reuses it)
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  check_cuda(cudaMemPoolCreate(&g_pool, &props), "cudaMemPoolCreate");
  int no = 0;
  check_cuda(cudaMemPoolSetAttribute(g_pool, cudaMemPoolReuseAllowInternalDependencies, &no), "cudaMemPoolSetAttribute");
  // Keep freed memory for reuse instead of returning it at every synchronisation.
  uint64_t keep = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(g_pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
}

char* DeviceBytes::reserve(int64_t bytes) {
  if (bytes <= bytes_) return p_;
  release();
  void* p = nullptr;
  const cudaError_t e = cudaMallocFromPoolAsync(&p, size_t(bytes), comm_pool(), stream_);
  if (e == cudaErrorMemoryAllocation)
    throw OutOfMemoryError("nccl: no GPU memory for a " + std::to_string(bytes) + "-byte communication buffer");
  check_cuda(e, "cudaMallocFromPoolAsync");
  p_ = static_cast<char*>(p), bytes_ = bytes;
  return p_;
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw CommError("nccl: " + what + ": " + cudaGetErrorString(e));
}

bool device_accessible(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace nccl_detail

std::vector<uint8_t> make_nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = nccl().GetUniqueId(&id);
  if (r != ncclSuccess) throw CommError("nccl: " + nccl_error_text(r, "ncclGetUniqueId"));
  std::vector<uint8_t> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

std::string nccl_unusable_reason() {
  try {
    nccl();
  } catch (const Error& e) {
    return e.what();
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return "nccl: " + cuda::no_gpu_reason(e);
  }
  if (n == 0) return "nccl: no CUDA GPU here";
  return "";
}

NcclBootstrap bootstrap_from_store(store::Rendezvous& rdzv, std::optional<int> local_rank) {
  NcclBootstrap b;
  b.rank = rdzv.rank();
  b.size = rdzv.world_size();
  b.local_rank = local_rank.value_or(-1);
  b.broadcast = [&rdzv](const std::vector<uint8_t>& bytes) { return rdzv.broadcast("nccl/world_ids", bytes, 0); };
  return b;
}

NcclBootstrap bootstrap_from_group(ProcessGroup& host_group, std::optional<int> local_rank) {
  NcclBootstrap b;
  b.rank = host_group.rank();
  b.size = host_group.size();
  b.local_rank = local_rank.value_or(-1);
  b.broadcast = [&host_group](const std::vector<uint8_t>& bytes) {
    // Fixed size: the ids of the world's three communicators.
    std::vector<uint8_t> buf(nccl_detail::kGroupIdBytes);
    if (host_group.rank() == 0) {
      if (bytes.size() != buf.size()) throw Error("nccl bootstrap: rank 0 passed " + std::to_string(bytes.size()) + " bytes");
      buf = bytes;
    }
    BroadcastOptions o{.root = 0, .label = "nccl unique ids"};
    host_group.broadcast(buf.data(), int64_t(buf.size()), DType::u8, o)->wait();
    return buf;
  };
  return b;
}

// ---- the session's waits and failure ----

void NcclSession::Impl::fail(const std::string& message) {
  if (!broken.exchange(true))
    for (ncclComm_t c : comms) nccl().CommAbort(c);  // peers waiting on this rank now fail too
  comms.clear();
  throw CommError(message);
}

void NcclSession::Impl::settle(ncclComm_t comm, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = nccl().CommGetAsyncError(comm, &state);
    if (r != ncclSuccess) fail("nccl: " + nccl_error_text(r, "ncclCommGetAsyncError") + " in " + what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail("nccl: " + nccl_error_text(state, what.c_str()));
    if (Clock::now() > deadline)
      fail("nccl: " + what + " timed out: a peer did not join it (NCCL cannot say which)");
    std::this_thread::yield();
  }
}

void NcclSession::Impl::check(ncclResult_t r, ncclComm_t comm, Clock::time_point deadline, const std::string& what) {
  if (r == ncclInProgress) return settle(comm, deadline, what);
  if (r != ncclSuccess) fail("nccl: " + nccl_error_text(r, what.c_str()));
}

void NcclSession::Impl::wait_event(cudaEvent_t event, const std::vector<ncclComm_t>& on, Clock::time_point deadline,
                                   const std::string& what) {
  for (int polls = 0;; ++polls) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) fail("nccl: " + what + ": " + cudaGetErrorString(e));
    for (ncclComm_t c : on) {
      ncclResult_t state = ncclSuccess;
      nccl().CommGetAsyncError(c, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail("nccl: " + nccl_error_text(state, what.c_str()));
    }
    if (Clock::now() > deadline)
      fail("nccl: " + what + " timed out: a peer did not take part (NCCL cannot say which)");
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclSession::Impl::progress_sends() {
  for (auto it = pending_sends.begin(); it != pending_sends.end();) {
    if (cudaEventQuery(it->delivered) != cudaSuccess) {
      ++it;
      continue;
    }
    cudaEventDestroy(it->delivered);
    it = pending_sends.erase(it);  // frees the buffer: nothing uses it any more
  }
}

GroupComms NcclSession::Impl::make_comms(const std::vector<uint8_t>& ids, int n, int member, Clock::time_point deadline,
                                         const std::string& what) {
  if (ids.size() != nccl_detail::kGroupIdBytes)
    fail("nccl: " + what + ": got " + std::to_string(ids.size()) + " bytes of unique ids, expected " +
         std::to_string(nccl_detail::kGroupIdBytes));
  GroupComms g;
  ncclComm_t* slots[3] = {&g.coll, &g.to_even, &g.to_odd};
  cudaStream_t* stream_slots[3] = {&g.coll_stream, &g.to_even_stream, &g.to_odd_stream};
  for (int k = 0; k < 3; ++k) {
    ncclUniqueId id;
    std::memcpy(&id, ids.data() + size_t(k) * nccl_detail::kIdBytes, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; settle() bounds the wait
    ncclComm_t comm = nullptr;
    const ncclResult_t r = nccl().CommInitRankConfig(&comm, n, id, member, &config);
    if (comm) comms.push_back(comm);
    if (r != ncclSuccess && r != ncclInProgress)
      fail("nccl: " + nccl_error_text(r, ("ncclCommInitRankConfig for " + what).c_str()));
    settle(comm, deadline, "creating the communicators of " + what);
    *slots[k] = comm;
    check_cuda(cudaStreamCreateWithFlags(stream_slots[k], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  // NCCL connects a pair on its first message, and on a non-blocking communicator that first
  // ncclSend does not return until the peer takes part: an eager send would wait for its
  // receiver. So every pair is connected now, all at once (in one group per communicator,
  // which every member enters): a byte to each peer whose parity the communicator serves, and a
  // byte from each peer when it serves this member's.
  nccl_detail::DeviceBytes bytes(2 * int64_t(n), g.coll_stream);
  check_cuda(cudaStreamSynchronize(g.coll_stream), "cudaStreamSynchronize");
  for (int parity = 0; parity < 2; ++parity) {
    ncclComm_t comm = parity == 0 ? g.to_even : g.to_odd;
    cudaStream_t st = parity == 0 ? g.to_even_stream : g.to_odd_stream;
    const std::string context = "connecting the pairs of " + what;
    check(nccl().GroupStart(), comm, deadline, context);
    for (int p = 0; p < n; ++p) {
      if (p == member) continue;
      if (p % 2 == parity) check(nccl().Send(bytes.get() + p, 1, ncclUint8, p, comm, st), comm, deadline, context);
      if (member % 2 == parity) check(nccl().Recv(bytes.get() + n + p, 1, ncclUint8, p, comm, st), comm, deadline, context);
    }
    check(nccl().GroupEnd(), comm, deadline, context);
    cudaEvent_t done;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done, st), "cudaEventRecord");
    wait_event(done, {comm}, deadline, context);
    cudaEventDestroy(done);
  }
  bytes.release_after(g.to_odd_stream);
  return g;
}

// ---- construction ----

namespace {

std::atomic<bool> g_session_alive{false};

}  // namespace

NcclSession::NcclSession(NcclOptions options, NcclBootstrap boot) {
  if (options.timeout.count() <= 0) throw InputError("nccl: timeout must be positive");
  if (boot.size < 1 || boot.rank < 0 || boot.rank >= boot.size || !boot.broadcast)
    throw InputError("nccl: inconsistent bootstrap (rank " + std::to_string(boot.rank) + " of " +
                     std::to_string(boot.size) + ")");
  if (g_session_alive.exchange(true)) throw InputError("nccl: only one NcclSession per process (one process per GPU)");
  try {
    const std::string why = nccl_unusable_reason();
    if (!why.empty()) throw CommError(why);
    impl_ = std::make_unique<Impl>();
    Impl& s = *impl_;
    s.options = std::move(options);
    s.rank = boot.rank, s.size = boot.size;
    int visible = 0;
    check_cuda(cudaGetDeviceCount(&visible), "cudaGetDeviceCount");
    s.device = boot.local_rank >= 0 ? boot.local_rank : boot.rank % visible;
    if (s.device >= visible)
      throw InputError("nccl: LOCAL_RANK " + std::to_string(s.device) + " but this process sees " +
                       std::to_string(visible) + " GPU(s) (CUDA_VISIBLE_DEVICES?)");
    // The constructing thread computes too (the CLI runs the rank there): its kernels and
    // buffers belong on the same GPU as the communicators.
    check_cuda(cudaSetDevice(s.device), "cudaSetDevice");
    // Rank 0 makes the world's ids; every rank gets them from the launcher's channel.
    std::vector<uint8_t> ids;
    if (s.rank == 0)
      for (int k = 0; k < 3; ++k) {
        const std::vector<uint8_t> id = make_nccl_unique_id();
        ids.insert(ids.end(), id.begin(), id.end());
      }
    ids = boot.broadcast(ids);
    ClusterSpec& c = s.options.cluster;
    if (c.gpus_per_node < 1) throw InputError("nccl: cluster needs at least one GPU per node");
    c.nodes = (s.size + c.gpus_per_node - 1) / c.gpus_per_node;
    c.validate(s.size);
    s.accounting = std::make_unique<RankAccounting>(s.rank, c, RankTrace::Clock::now());
    s.stream
        .submit("nccl init",
                [&s, ids] {
                  check_cuda(cudaSetDevice(s.device), "cudaSetDevice");
                  nccl_detail::make_comm_pool(s.device);
                  nccl_detail::load_reduce_kernels();
                  check_cuda(cudaStreamCreateWithFlags(&s.copy_stream, cudaStreamNonBlocking), "cudaStreamCreate");
                  GroupComms g;
                  try {
                    g = s.make_comms(ids, s.size, s.rank, Clock::now() + s.options.timeout, "the world");
                  } catch (...) {
                    // Not all failures went through fail(): whatever was created is aborted.
                    if (!s.broken.exchange(true))
                      for (ncclComm_t c : s.comms) nccl().CommAbort(c);
                    s.comms.clear();
                    throw;
                  }
                  ProcessGroup::Info info;
                  info.name = "world";
                  info.rank = s.rank;
                  for (int r = 0; r < s.size; ++r) info.world_ranks.push_back(r);
                  info.algo = s.options.algo;
                  info.timeout = s.options.timeout;
                  info.cluster = s.options.cluster;
                  info.accounting = s.accounting.get();
                  s.world = std::make_shared<nccl_detail::NcclProcessGroup>(std::move(info), s, g);
                })
        ->wait();
  } catch (...) {
    if (impl_) impl_->stream.stop();
    impl_.reset();
    g_session_alive = false;
    throw;
  }
}

NcclSession::~NcclSession() {
  Impl& s = *impl_;
  const bool clean = !s.broken && std::uncaught_exceptions() == 0;
  try {
    s.stream
        .submit("nccl finish",
                [&s, clean] {
                  const auto deadline = Clock::now() + s.options.timeout;
                  while (clean && !s.pending_sends.empty() && Clock::now() < deadline) {
                    s.progress_sends();
                    std::this_thread::yield();
                  }
                  // A send nobody received, or an error: destroying would wait for the peers.
                  const bool abort = !clean || !s.pending_sends.empty();
                  for (ncclComm_t c : s.comms) {
                    if (abort) {
                      nccl().CommAbort(c);
                      continue;
                    }
                    nccl().CommFinalize(c);
                    ncclResult_t state = ncclInProgress;
                    while (state == ncclInProgress && Clock::now() < deadline) nccl().CommGetAsyncError(c, &state);
                    if (state == ncclSuccess)
                      nccl().CommDestroy(c);
                    else
                      nccl().CommAbort(c);
                  }
                  s.comms.clear();
                  for (auto& p : s.pending_sends) cudaEventDestroy(p.delivered);
                  s.pending_sends.clear();
                  // The streams stay (a few per group, reclaimed with the process's CUDA context):
                  // groups the caller still holds free their buffers in stream order on them.
                })
        ->wait();
  } catch (...) {
  }
  s.stream.stop();
  impl_.reset();
  g_session_alive = false;
}

int NcclSession::rank() const { return impl_->rank; }
int NcclSession::size() const { return impl_->size; }
int NcclSession::device() const { return impl_->device; }
ProcessGroup& NcclSession::world() { return *impl_->world; }
RankAccounting& NcclSession::accounting() { return *impl_->accounting; }

}  // namespace llama4d
