// One rank's handle on one NCCL group: collectives as grouped ncclSend/ncclRecv plus the
// ordered reduction on the GPU; eager sends; new_group from ids the first member hands out.
#include <algorithm>
#include <cstring>

#include "backends/nccl/device_reduce.h"
#include "backends/nccl/nccl_internal.h"
#include "core/comm/reduce_kernels.h"
#include "core/error.h"

namespace llama4d::nccl_detail {

namespace {

char* at(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }
const char* at(const void* p, int64_t bytes) { return static_cast<const char*>(p) + bytes; }

// A copy that the caller needs finished before it goes on, queued on `stream` (a plain
// cudaMemcpy would also wait for the compute threads' streams).
void copy_now(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(Info info, NcclSession::Impl& session, GroupComms comms)
    : ProcessGroup(std::move(info)),
      s_(session),
      comms_(comms),
      scratch_(comms.coll_stream),
      in_staging_(comms.coll_stream),
      out_staging_(comms.coll_stream) {}

std::shared_ptr<Work> NcclProcessGroup::submit(CommCall call) {
  auto self = shared_from_this();
  return submit_on(s_.stream, std::move(call), [self](const CommCall& c, int64_t seq, double issue_us) {
    if (self->s_.broken) throw CommError("nccl: session unusable after an earlier communication failure");
    self->s_.progress_sends();
    if (c.op == CommOp::send) return self->run_send(c, issue_us);
    if (c.op == CommOp::recv) return self->run_recv(c, issue_us);
    return self->run_collective(c, seq, issue_us);
  });
}

char* NcclProcessGroup::on_device(const void* p, int64_t bytes, DeviceBytes& staging, bool copy_in) {
  if (bytes <= 0 || device_accessible(p)) return const_cast<char*>(static_cast<const char*>(p));
  char* d = staging.reserve(bytes);
  if (copy_in) check_cuda(cudaMemcpyAsync(d, p, size_t(bytes), cudaMemcpyHostToDevice, comms_.coll_stream), "cudaMemcpyAsync");
  return d;
}

void NcclProcessGroup::exchange(const std::vector<Transfer>& transfers, Clock::time_point deadline,
                                const std::string& context) {
  const NcclLibrary& lib = nccl();
  s_.check(lib.GroupStart(), comms_.coll, deadline, context);
  for (const Transfer& t : transfers) {
    // NCCL moves bytes; a zero-length message would not synchronise, so empty blocks skip.
    if (t.bytes <= 0) continue;
    const ncclResult_t r = t.send ? lib.Send(t.send, size_t(t.bytes), ncclUint8, t.peer, comms_.coll, comms_.coll_stream)
                                  : lib.Recv(t.recv, size_t(t.bytes), ncclUint8, t.peer, comms_.coll, comms_.coll_stream);
    if (r != ncclSuccess && r != ncclInProgress) {
      lib.GroupEnd();
      s_.fail("nccl: " + nccl_error_text(r, t.send ? "ncclSend" : "ncclRecv") + " in " + context);
    }
  }
  s_.check(lib.GroupEnd(), comms_.coll, deadline, context);
  cudaEvent_t done;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(done, comms_.coll_stream), "cudaEventRecord");
  try {
    s_.wait_event(done, {comms_.coll}, deadline, context);
  } catch (...) {
    cudaEventDestroy(done);
    throw;
  }
  cudaEventDestroy(done);
}

void NcclProcessGroup::reduce_scatter(void* out, const void* in, const std::vector<int64_t>& counts, DType dtype,
                                      ReduceOp op, Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(dtype)), mine = counts[size_t(me)] * elem;
  const std::vector<int64_t> off = prefix_offsets(counts);
  // incoming[k]: the contribution added k-th (the algorithm's order), mine among them.
  const std::vector<int> order = reduction_order(n, me, algo());
  char* incoming = scratch_.reserve(std::max<int64_t>(1, n * mine));
  std::vector<Transfer> t;
  for (int k = 0; k < n; ++k) {
    const int j = order[size_t(k)];
    if (j == me) {
      if (mine > 0)
        check_cuda(cudaMemcpyAsync(incoming + k * mine, at(in, off[size_t(me)] * elem), size_t(mine),
                                   cudaMemcpyDeviceToDevice, comms_.coll_stream),
                   "cudaMemcpyAsync");
      continue;
    }
    t.push_back({at(in, off[size_t(j)] * elem), nullptr, counts[size_t(j)] * elem, j});
    t.push_back({nullptr, incoming + k * mine, mine, j});
  }
  exchange(t, deadline, context);
  reduce_sequence_on_device(out, incoming, counts[size_t(me)], n, counts[size_t(me)], dtype, op, n,
                                  algo() == ReduceAlgo::ring, comms_.coll_stream);
  check_cuda(cudaStreamSynchronize(comms_.coll_stream), "reduction of " + context);
}

void NcclProcessGroup::all_gather(void* out, const std::vector<int64_t>& counts, int64_t elem,
                                  Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const std::vector<int64_t> off = prefix_offsets(counts);
  std::vector<Transfer> t;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    t.push_back({at(out, off[size_t(me)] * elem), nullptr, counts[size_t(me)] * elem, j});
    t.push_back({nullptr, at(out, off[size_t(j)] * elem), counts[size_t(j)] * elem, j});
  }
  exchange(t, deadline, context);
}

void NcclProcessGroup::broadcast(void* buf, int64_t bytes, int root, Clock::time_point deadline,
                                 const std::string& context) {
  std::vector<Transfer> t;
  if (rank() == root) {
    for (int j = 0; j < size(); ++j)
      if (j != root) t.push_back({buf, nullptr, bytes, j});
  } else {
    t.push_back({nullptr, buf, bytes, root});
  }
  exchange(t, deadline, context);
}

void NcclProcessGroup::barrier(Clock::time_point deadline, const std::string& context) {
  // One byte each way with every member: nobody leaves before everyone arrived.
  const int n = size();
  char* flags = scratch_.reserve(2 * n);
  std::vector<Transfer> t;
  for (int j = 0; j < n; ++j) {
    if (j == rank()) continue;
    t.push_back({flags + j, nullptr, 1, j});
    t.push_back({nullptr, flags + n + j, 1, j});
  }
  exchange(t, deadline, context);
}

std::vector<std::vector<int64_t>> NcclProcessGroup::all_to_all(const CommCall& call, Clock::time_point deadline,
                                                               const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  // Every member's send counts first, for the traffic plan and to check this rank's recv counts.
  std::vector<int64_t> mine(call.counts.begin(), call.counts.end());
  char* table = scratch_.reserve(int64_t(n) * n * 8);
  check_cuda(cudaMemcpyAsync(table + int64_t(me) * n * 8, mine.data(), size_t(n) * 8, cudaMemcpyHostToDevice,
                             comms_.coll_stream),
             "cudaMemcpyAsync");
  std::vector<Transfer> t;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    t.push_back({table + int64_t(me) * n * 8, nullptr, int64_t(n) * 8, j});
    t.push_back({nullptr, table + int64_t(j) * n * 8, int64_t(n) * 8, j});
  }
  exchange(t, deadline, context);
  std::vector<int64_t> flat(size_t(n) * size_t(n));
  copy_now(flat.data(), table, int64_t(flat.size()) * 8, comms_.coll_stream);
  std::vector<std::vector<int64_t>> bytes(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(n)));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) bytes[size_t(i)][size_t(j)] = flat[size_t(i) * size_t(n) + size_t(j)] * elem;
  for (int i = 0; i < n; ++i)
    if (flat[size_t(i) * size_t(n) + size_t(me)] != call.recv_counts[size_t(i)])
      s_.fail("all_to_all mismatch on group '" + name() + "': " + rank_label(i) + " sends " +
              std::to_string(flat[size_t(i) * size_t(n) + size_t(me)]) + " elements to " + rank_label(me) +
              ", which expects " + std::to_string(call.recv_counts[size_t(i)]) + " (" + context + ")");

  // The data. Receives land in scratch when out overlaps in (all_to_all may run in place).
  const std::vector<int64_t> soff = prefix_offsets(call.counts), roff = prefix_offsets(call.recv_counts);
  const int64_t recv_total = (roff.back() + call.recv_counts.back()) * elem;
  const int64_t send_total = (soff.back() + call.counts.back()) * elem;
  const char* in = static_cast<const char*>(call.in);
  char* out = static_cast<char*>(call.out);
  const bool overlap = out < in + send_total && in < out + recv_total;
  char* dst = overlap ? scratch_.reserve(std::max<int64_t>(1, recv_total)) : out;
  t.clear();
  for (int j = 0; j < n; ++j) {
    if (j == me) {
      if (call.counts[size_t(me)] > 0)
        check_cuda(cudaMemcpyAsync(dst + roff[size_t(me)] * elem, in + soff[size_t(me)] * elem,
                                   size_t(call.counts[size_t(me)] * elem), cudaMemcpyDeviceToDevice, comms_.coll_stream),
                   "cudaMemcpyAsync");
      continue;
    }
    t.push_back({in + soff[size_t(j)] * elem, nullptr, call.counts[size_t(j)] * elem, j});
    t.push_back({nullptr, dst + roff[size_t(j)] * elem, call.recv_counts[size_t(j)] * elem, j});
  }
  exchange(t, deadline, context);
  if (overlap && recv_total > 0) {
    check_cuda(cudaMemcpyAsync(out, dst, size_t(recv_total), cudaMemcpyDeviceToDevice, comms_.coll_stream),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(comms_.coll_stream), "cudaStreamSynchronize");
  }
  return bytes;
}

double NcclProcessGroup::run_collective(const CommCall& call, int64_t seq, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const auto deadline = Clock::now() + call.timeout;
  const std::string context = where(call, seq);
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));

  // Byte extents of the caller's buffers, to stage host memory through the GPU.
  int64_t in_bytes = 0, out_bytes = 0;
  switch (call.op) {
    case CommOp::all_reduce:
    case CommOp::broadcast: in_bytes = out_bytes = call.count * elem; break;
    case CommOp::reduce_scatter:
      in_bytes = (prefix_offsets(call.counts).back() + call.counts.back()) * elem;
      out_bytes = call.counts[size_t(me)] * elem;
      break;
    case CommOp::all_gather:
      in_bytes = call.counts[size_t(me)] * elem;
      out_bytes = (prefix_offsets(call.counts).back() + call.counts.back()) * elem;
      break;
    case CommOp::all_to_all:
      in_bytes = (prefix_offsets(call.counts).back() + call.counts.back()) * elem;
      out_bytes = (prefix_offsets(call.recv_counts).back() + call.recv_counts.back()) * elem;
      break;
    default: break;
  }
  // In place (in == out): one staged copy, as large as the larger side (an in-place
  // reduce_scatter on rank 0 reads the whole input through the start of its output).
  const bool same = call.in == call.out;
  char* out = on_device(call.out, same ? std::max(in_bytes, out_bytes) : out_bytes, out_staging_,
                        same || call.op == CommOp::broadcast);
  const char* in = same ? out : on_device(call.in, in_bytes, in_staging_, true);

  CommPlan plan;
  switch (call.op) {
    case CommOp::all_reduce: {
      plan = plan_all_reduce(cluster(), world_ranks(), call.count, elem, algo());
      const std::vector<int64_t> counts = split_counts(call.count, n);
      // Reduce into a scratch-free spot: this rank's chunk of out (it may be this rank's chunk
      // of in, when in place; the reduction reads its copy of it first).
      reduce_scatter(out + prefix_offsets(counts)[size_t(me)] * elem, in, counts, call.dtype, call.reduce, deadline,
                     context);
      all_gather(out, counts, elem, deadline, context);
      break;
    }
    case CommOp::reduce_scatter:
      plan = plan_reduce_scatter(cluster(), world_ranks(), call.counts, elem, algo());
      reduce_scatter(out, in, call.counts, call.dtype, call.reduce, deadline, context);
      break;
    case CommOp::all_gather: {
      plan = plan_all_gather(cluster(), world_ranks(), call.counts, elem, algo());
      char* my_block = out + prefix_offsets(call.counts)[size_t(me)] * elem;
      const int64_t mine = call.counts[size_t(me)] * elem;
      if (mine > 0 && my_block != in)
        check_cuda(cudaMemcpyAsync(my_block, in, size_t(mine), cudaMemcpyDefault, comms_.coll_stream), "cudaMemcpyAsync");
      all_gather(out, call.counts, elem, deadline, context);
      break;
    }
    case CommOp::broadcast:
      plan = plan_broadcast(cluster(), world_ranks(), call.count * elem, call.root);
      broadcast(out, call.count * elem, call.root, deadline, context);
      break;
    case CommOp::all_to_all: {
      CommCall staged = call;
      staged.in = in, staged.out = out;
      plan = plan_all_to_all(cluster(), world_ranks(), all_to_all(staged, deadline, context));
      break;
    }
    default:
      plan = plan_barrier(cluster(), world_ranks());
      barrier(deadline, context);
  }
  if (out != call.out) copy_now(call.out, out, out_bytes, comms_.coll_stream);
  const double sim1 = ready + plan.sim_us;
  record_comm(call, plan, seq, wall0, ready, ready, sim1);
  return sim1;
}

std::pair<ncclComm_t, cudaStream_t> NcclProcessGroup::link_to(int peer, bool sending) const {
  const int receiver = sending ? peer : rank();
  return receiver % 2 == 0 ? std::pair{comms_.to_even, comms_.to_even_stream}
                           : std::pair{comms_.to_odd, comms_.to_odd_stream};
}

double NcclProcessGroup::run_send(const CommCall& call, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const auto deadline = Clock::now() + call.timeout;
  const std::string context = where(call, -1);
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  // Header and payload get a buffer of their own, filled on the copy stream so that the copy
  // never waits behind a transfer; the send completes when the copy did (the caller's buffer is
  // free again) and the transfer runs behind it.
  const Header header{call.tag, bytes};
  DeviceBytes buffer(int64_t(sizeof header) + bytes, s_.copy_stream);
  check_cuda(cudaMemcpyAsync(buffer.get(), &header, sizeof header, cudaMemcpyHostToDevice, s_.copy_stream),
             "cudaMemcpyAsync");
  if (bytes > 0)
    check_cuda(cudaMemcpyAsync(buffer.get() + sizeof header, call.in, size_t(bytes), cudaMemcpyDefault, s_.copy_stream),
               "cudaMemcpyAsync");
  cudaEvent_t copied;
  check_cuda(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(copied, s_.copy_stream), "cudaEventRecord");
  const auto [comm, stream] = link_to(call.peer, true);
  check_cuda(cudaStreamWaitEvent(stream, copied, 0), "cudaStreamWaitEvent");
  s_.check(nccl().Send(buffer.get(), sizeof header, ncclUint8, call.peer, comm, stream), comm, deadline, context);
  if (bytes > 0)
    s_.check(nccl().Send(buffer.get() + sizeof header, size_t(bytes), ncclUint8, call.peer, comm, stream), comm,
             deadline, context);
  NcclSession::Impl::PendingSend pending{nullptr, std::move(buffer)};  // freed once delivered
  check_cuda(cudaEventCreateWithFlags(&pending.delivered, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(pending.delivered, stream), "cudaEventRecord");
  s_.pending_sends.push_back(std::move(pending));
  try {
    s_.wait_event(copied, {}, deadline, context);
  } catch (...) {
    cudaEventDestroy(copied);
    throw;
  }
  cudaEventDestroy(copied);
  const CommPlan plan = plan_p2p(cluster(), world_ranks(), rank(), call.peer, bytes);
  record_comm(call, plan, next_message_index(call), wall0, ready, ready, ready + plan.sim_us);
  return ready + plan.sim_us;
}

NcclProcessGroup::Header NcclProcessGroup::receive_next(int peer, int want_tag, int64_t want_bytes, void* into,
                                                        Message& other, Clock::time_point deadline,
                                                        const std::string& context) {
  const auto [comm, stream] = link_to(peer, false);
  auto wait = [&] {
    cudaEvent_t done;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done, stream), "cudaEventRecord");
    try {
      s_.wait_event(done, {comm}, deadline, context);
    } catch (...) {
      cudaEventDestroy(done);
      throw;
    }
    cudaEventDestroy(done);
  };
  DeviceBytes header_buffer(int64_t(sizeof(Header)), stream);
  s_.check(nccl().Recv(header_buffer.get(), sizeof(Header), ncclUint8, peer, comm, stream), comm, deadline, context);
  wait();
  Header h;
  copy_now(&h, header_buffer.get(), int64_t(sizeof h), stream);
  if (h.bytes < 0) s_.fail("nccl: corrupt message header from " + rank_label(peer) + " in " + context);
  if (h.tag == want_tag && h.bytes != want_bytes)
    s_.fail("send/recv mismatch on group '" + name() + "': " + rank_label(peer) + " sent " + std::to_string(h.bytes) +
            " bytes with tag " + std::to_string(h.tag) + " but " + rank_label(rank()) + " called " + context);
  if (h.bytes == 0) return h;
  char* dst = static_cast<char*>(into);
  if (h.tag != want_tag || !dst || !device_accessible(dst)) {
    other = Message{h.bytes, DeviceBytes(h.bytes, stream)};
    dst = other.payload.get();
  }
  s_.check(nccl().Recv(dst, size_t(h.bytes), ncclUint8, peer, comm, stream), comm, deadline, context);
  wait();
  return h;
}

double NcclProcessGroup::run_recv(const CommCall& call, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const auto deadline = Clock::now() + call.timeout;
  const std::string context = where(call, -1);
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  auto deliver = [&](const Message& m) {
    if (m.bytes != bytes)
      s_.fail("send/recv mismatch on group '" + name() + "': " + rank_label(call.peer) + " sent " +
              std::to_string(m.bytes) + " bytes with tag " + std::to_string(call.tag) + " but " + rank_label(rank()) +
              " called " + context);
    copy_now(call.out, m.payload.get(), bytes, comms_.coll_stream);
  };
  auto queued = inbox_.find({call.peer, call.tag});
  if (queued != inbox_.end() && !queued->second.empty()) {
    deliver(queued->second.front());
    queued->second.pop_front();
  } else {
    for (;;) {
      Message other;
      const Header h = receive_next(call.peer, call.tag, bytes, call.out, other, deadline, context);
      if (h.tag != call.tag) {
        inbox_[{call.peer, h.tag}].push_back(std::move(other));
        continue;
      }
      if (other.payload.get()) deliver(other);  // the caller's buffer was host memory
      break;
    }
  }
  const CommPlan plan = plan_p2p(cluster(), world_ranks(), call.peer, rank(), bytes);
  record_comm(call, plan, next_message_index(call), wall0, ready, ready, ready + plan.sim_us);
  return ready + plan.sim_us;
}

std::shared_ptr<void> NcclProcessGroup::make_symmetric(int64_t bytes) {
  void* p = nullptr;
  const int device = s_.device;
  // On the comm thread, whose current device is the session's.
  s_.stream
      .submit("allocate_symmetric",
              [&] {
                const cudaError_t e = cudaMallocManaged(&p, size_t(std::max<int64_t>(bytes, 1)));
                if (e == cudaErrorMemoryAllocation)
                  throw OutOfMemoryError("nccl: no GPU memory for " + std::to_string(bytes) + " bytes of symmetric memory");
                check_cuda(e, "cudaMallocManaged");
              })
      ->wait();
  return std::shared_ptr<void>(p, [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::make_group(const std::vector<int>& members, const std::string& name) {
  auto result = std::make_shared<std::shared_ptr<ProcessGroup>>();
  auto self = shared_from_this();
  s_.stream
      .submit("new_group " + name,
              [self, members, name, result] {
                NcclProcessGroup& pg = *self;
                if (pg.s_.broken) throw CommError("nccl: session unusable after an earlier communication failure");
                const auto deadline = Clock::now() + pg.timeout();
                const std::string context = "new_group '" + name + "'";
                const std::vector<int> group_ranks = pg.group_ranks_of(members);  // members as ranks of this group
                const int me = int(std::find(group_ranks.begin(), group_ranks.end(), pg.rank()) - group_ranks.begin());
                // The first member makes the new communicators' ids and sends them to the others
                // over this group (only the members take part, which point-to-point allows).
                std::vector<uint8_t> ids(kGroupIdBytes);
                char* buf = pg.scratch_.reserve(int64_t(kGroupIdBytes));
                std::vector<Transfer> t;
                if (me == 0) {
                  ids.clear();
                  for (int k = 0; k < 3; ++k) {
                    const std::vector<uint8_t> id = make_nccl_unique_id();
                    ids.insert(ids.end(), id.begin(), id.end());
                  }
                  copy_now(buf, ids.data(), int64_t(ids.size()), pg.comms_.coll_stream);
                  for (size_t k = 1; k < group_ranks.size(); ++k)
                    t.push_back({buf, nullptr, int64_t(kGroupIdBytes), group_ranks[k]});
                } else {
                  t.push_back({nullptr, buf, int64_t(kGroupIdBytes), group_ranks[0]});
                }
                pg.exchange(t, deadline, context);
                if (me != 0) copy_now(ids.data(), buf, int64_t(ids.size()), pg.comms_.coll_stream);
                const GroupComms g = pg.s_.make_comms(ids, int(members.size()), me, deadline, context);
                Info info = pg.info();
                info.name = name;
                info.world_ranks = members;
                info.rank = me;
                *result = std::make_shared<NcclProcessGroup>(std::move(info), pg.s_, g);
              })
      ->wait();
  return *result;
}

}  // namespace llama4d::nccl_detail
