// The MPI backend's process group: message-passing algorithms over MPI point-to-point, the
// same orders of addition as the virtual backend. Runs on the session's comm thread.
#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "backends/mpi/mpi_internal.h"
#include "core/comm/reduce_kernels.h"
#include "core/error.h"

namespace llama4d::mpi_detail {

namespace {

// What every member of a collective says it is doing, exchanged before any data moves.
struct Signature {
  int32_t op = 0, dtype = 0, reduce = 0, root = 0;
  int64_t count = 0;         // buffer count (0 for ops described by counts vectors)
  uint64_t counts_hash = 0;  // reduce_scatter / all_gather: the counts vector
  double ready_us = 0;       // simulated time this member was ready (the latest one starts it)
  char text[128] = {};       // describe(call), for the error message
};

}  // namespace

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, size_t(len));
}

void check_mpi(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) throw CommError("mpi: " + what + " failed: " + mpi_error_text(rc));
}

uint64_t hash_counts(const std::vector<int64_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int64_t c : counts) h = (h ^ uint64_t(c)) * 1099511628211ull;
  return h;
}

MpiProcessGroup::MpiProcessGroup(Info info, MpiSession::Impl& session, MPI_Comm coll, MPI_Comm p2p)
    : ProcessGroup(std::move(info)), s_(session), coll_(coll), p2p_(p2p) {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(coll_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  probe_single_copy(node_size == size());  // same node: true on every member or on none
}

void MpiProcessGroup::fail(const std::string& message) {
  s_.broken = true;
  throw CommError(message);
}

std::shared_ptr<Work> MpiProcessGroup::submit(CommCall call) {
  if (call.op == CommOp::send || call.op == CommOp::recv) {
    if (call.tag < 0 || call.tag > 32767) throw InputError("mpi: tags must be in [0, 32767], got " + std::to_string(call.tag));
  }
  auto self = shared_from_this();
  return submit_on(s_.stream, std::move(call), [self](const CommCall& c, int64_t seq, double issue_us) {
    if (self->s_.broken) throw CommError("mpi: session unusable after an earlier communication failure");
    if (c.op == CommOp::send) return self->run_send(c, issue_us);
    if (c.op == CommOp::recv) return self->run_recv(c, issue_us);
    return self->run_collective(c, seq, issue_us);
  });
}

void MpiProcessGroup::isend(std::vector<Request>& reqs, const void* buf, int64_t bytes, int peer, int tag,
                            MPI_Comm comm) {
  const char* p = static_cast<const char*>(buf);
  int64_t off = 0;
  do {
    const int64_t len = std::min(kMaxPiece, bytes - off);
    MPI_Request r;
    check_mpi(MPI_Isend(p + off, int(len), MPI_BYTE, peer, tag, comm, &r), "MPI_Isend");
    reqs.push_back({r, peer});
    off += len;
  } while (off < bytes);
}

void MpiProcessGroup::irecv(std::vector<Request>& reqs, void* buf, int64_t bytes, int peer, int tag, MPI_Comm comm) {
  char* p = static_cast<char*>(buf);
  int64_t off = 0;
  do {
    const int64_t len = std::min(kMaxPiece, bytes - off);
    MPI_Request r;
    check_mpi(MPI_Irecv(p + off, int(len), MPI_BYTE, peer, tag, comm, &r), "MPI_Irecv");
    reqs.push_back({r, peer});
    off += len;
  } while (off < bytes);
}

// Polls until every request completed. Past the deadline, names the peers still outstanding.
std::vector<MPI_Status> MpiProcessGroup::wait(std::vector<Request>& reqs, Clock::time_point deadline,
                                              const std::string& context) {
  std::vector<MPI_Request> r;
  for (const Request& q : reqs) r.push_back(q.request);
  std::vector<MPI_Status> statuses(r.size());
  const auto started = Clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    const int rc = MPI_Testall(int(r.size()), r.data(), &done, statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (size_t i = 0; i < statuses.size(); ++i)
        if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING)
          fail("mpi: " + context + ": message from/to " + rank_label(reqs[i].peer) + " failed: " +
               mpi_error_text(statuses[i].MPI_ERROR));
    }
    if (rc != MPI_SUCCESS) fail("mpi: " + context + ": " + mpi_error_text(rc));
    if (done) {
      reqs.clear();
      return statuses;
    }
    s_.progress_sends();
    if (Clock::now() > deadline) {
      std::set<int> peers;
      for (size_t i = 0; i < r.size(); ++i) {
        int one = 0;
        if (r[i] != MPI_REQUEST_NULL) MPI_Test(&r[i], &one, MPI_STATUS_IGNORE);
        if (!one && r[i] != MPI_REQUEST_NULL) peers.insert(reqs[i].peer);
      }
      if (peers.empty()) continue;  // everything arrived just now: the next test returns
      // A collective's request does not say whom it waits for: ask the members instead.
      if (peers.erase(-1) > 0)
        for (int p : absent_members()) peers.insert(p);
      std::string names;
      for (int p : peers) names += (names.empty() ? "" : ", ") + rank_label(p);
      fail(rank_label(rank()) + ": timeout in " + context + ": no answer from " +
           (names.empty() ? "a member that has not reached it" : names));
    }
    // Spin briefly (small messages complete in microseconds), then yield: ranks may share cores
    // (mpirun --oversubscribe) and a waiting rank must let its peers run. After a few ms of
    // waiting, sleep in short naps so a long wait costs no CPU.
    if (spins < 64) continue;
    if (Clock::now() - started < std::chrono::milliseconds(3))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Which members never reached the collective this rank timed out in? Every member that times
// out tells every other one on a tag of its own and listens for the same, for a short grace
// (the healthy members time out within moments of each other: they all wait for the same
// absent one). Those not heard from are stopped, stalled or still busy elsewhere.
std::vector<int> MpiProcessGroup::absent_members() {
  static const int32_t kHere = 1;  // outlives the sends, which are never waited for
  const int n = size(), me = rank();
  std::vector<int32_t> notes(size_t(n), 0);
  std::vector<MPI_Request> heard(size_t(n), MPI_REQUEST_NULL);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    MPI_Request send;
    MPI_Isend(&kHere, 1, MPI_INT32_T, j, kTagPresent, coll_, &send);
    MPI_Request_free(&send);
    MPI_Irecv(&notes[size_t(j)], 1, MPI_INT32_T, j, kTagPresent, coll_, &heard[size_t(j)]);
  }
  const auto until = Clock::now() + std::chrono::seconds(2);
  for (int done = 0; !done && Clock::now() < until; std::this_thread::sleep_for(std::chrono::milliseconds(1)))
    MPI_Testall(n, heard.data(), &done, MPI_STATUSES_IGNORE);
  std::vector<int> absent;
  for (int j = 0; j < n; ++j) {
    int arrived = 1;
    if (heard[size_t(j)] != MPI_REQUEST_NULL) MPI_Test(&heard[size_t(j)], &arrived, MPI_STATUS_IGNORE);
    if (arrived) continue;
    absent.push_back(j);
    MPI_Cancel(&heard[size_t(j)]);
    MPI_Wait(&heard[size_t(j)], MPI_STATUS_IGNORE);
  }
  return absent;
}

double MpiProcessGroup::exchange_signatures(const CommCall& call, int64_t seq, double ready,
                                            Clock::time_point deadline, const std::string& context,
                                            std::vector<std::vector<int64_t>>* a2a_counts) {
  const int n = size();
  Signature mine;
  mine.op = int32_t(call.op);
  mine.dtype = int32_t(call.dtype);
  const bool reduces = call.op == CommOp::all_reduce || call.op == CommOp::reduce_scatter;
  mine.reduce = reduces ? int32_t(call.reduce) : 0;
  mine.root = call.op == CommOp::broadcast ? call.root : 0;
  mine.count = call.count;
  if (call.op == CommOp::reduce_scatter || call.op == CommOp::all_gather) {
    mine.count = 0;
    mine.counts_hash = hash_counts(call.counts);
  }
  if (call.op == CommOp::all_to_all || call.op == CommOp::barrier) mine.count = 0;
  mine.ready_us = ready;
  const std::string text = describe(call);
  std::strncpy(mine.text, text.c_str(), sizeof mine.text - 1);

  std::vector<Signature> all(static_cast<size_t>(n));
  MPI_Request req;
  check_mpi(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, coll_, &req),
            "MPI_Iallgather");
  std::vector<Request> reqs = {{req, -1}};
  wait(reqs, deadline, context + " (exchanging call signatures)");
  double start = ready;
  for (int j = 0; j < n; ++j) {
    const Signature& a = all[0];
    const Signature& b = all[size_t(j)];
    start = std::max(start, b.ready_us);
    if (a.op != b.op || a.dtype != b.dtype || a.reduce != b.reduce || a.root != b.root || a.count != b.count ||
        a.counts_hash != b.counts_hash)
      fail("collective mismatch on group '" + name() + "' (call #" + std::to_string(seq) + "): " + rank_label(0) +
           " called " + a.text + " but " + rank_label(j) + " called " + b.text);
  }
  if (call.op == CommOp::all_to_all) {
    // Every member learns every member's send and receive counts: validates the pairs and
    // gives the cost model the whole traffic matrix.
    std::vector<int64_t> row(call.counts);
    row.insert(row.end(), call.recv_counts.begin(), call.recv_counts.end());
    std::vector<int64_t> rows(size_t(2 * n * n));
    check_mpi(MPI_Iallgather(row.data(), 2 * n, MPI_INT64_T, rows.data(), 2 * n, MPI_INT64_T, coll_, &req),
              "MPI_Iallgather");
    reqs = {{req, -1}};
    wait(reqs, deadline, context + " (exchanging all_to_all counts)");
    a2a_counts->assign(size_t(n), std::vector<int64_t>(size_t(n)));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const int64_t sends = rows[size_t(i * 2 * n + j)], expects = rows[size_t(j * 2 * n + n + i)];
        if (sends != expects)
          fail("all_to_all mismatch on group '" + name() + "' (call #" + std::to_string(seq) + "): " + rank_label(i) +
               " sends " + std::to_string(sends) + " elements to " + rank_label(j) + ", which expects " +
               std::to_string(expects) + ": " + rank_label(i) + " called " + all[size_t(i)].text + ", " +
               rank_label(j) + " called " + all[size_t(j)].text);
        (*a2a_counts)[size_t(i)][size_t(j)] = sends;
      }
  }
  return start;
}

// Chunk k's partial sum starts at rank k+1 and travels right; at step s rank r sends chunk
// r-1-s and adds its own contribution to chunk r-2-s arriving from the left. After N-1 steps
// rank r holds chunk r, summed in the order k+1, k+2, ..., k (the virtual backend's ring order).
void MpiProcessGroup::ring_reduce_scatter(char* work, const std::vector<int64_t>& counts, DType dtype, ReduceOp op,
                                          Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  if (n == 1) return;
  const int64_t elem = int64_t(dtype_size(dtype));
  const std::vector<int64_t> off = prefix_offsets(counts);
  std::vector<unsigned char> incoming(size_t(*std::max_element(counts.begin(), counts.end()) * elem) + 1);
  const int right = mod(me + 1, n), left = mod(me - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(me - 1 - s, n), rc = mod(me - 2 - s, n);
    std::vector<Request> reqs;
    isend(reqs, work + off[size_t(sc)] * elem, counts[size_t(sc)] * elem, right, kTagReduceScatter, coll_);
    irecv(reqs, incoming.data(), counts[size_t(rc)] * elem, left, kTagReduceScatter, coll_);
    wait(reqs, deadline, context);
    reduce_step(work + off[size_t(rc)] * elem, incoming.data(), counts[size_t(rc)], dtype, op);
  }
  if (op == ReduceOp::avg) finish_average(work + off[size_t(me)] * elem, counts[size_t(me)], dtype, n);
}

// At step s rank r forwards chunk r-s to the right and receives chunk r-1-s from the left.
void MpiProcessGroup::ring_all_gather(char* work, const std::vector<int64_t>& counts, int64_t elem,
                                      Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const std::vector<int64_t> off = prefix_offsets(counts);
  const int right = mod(me + 1, n), left = mod(me - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    const int sc = mod(me - s, n), rc = mod(me - 1 - s, n);
    std::vector<Request> reqs;
    isend(reqs, work + off[size_t(sc)] * elem, counts[size_t(sc)] * elem, right, kTagAllGather, coll_);
    irecv(reqs, work + off[size_t(rc)] * elem, counts[size_t(rc)] * elem, left, kTagAllGather, coll_);
    wait(reqs, deadline, context);
  }
}

// Every rank sends chunk j of its input to rank j, which adds the N contributions in rank order.
void MpiProcessGroup::direct_reduce_scatter(void* out, const char* in, const std::vector<int64_t>& counts, DType dtype,
                                            ReduceOp op, Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(dtype)), mine = counts[size_t(me)] * elem;
  const std::vector<int64_t> off = prefix_offsets(counts);
  std::vector<unsigned char> incoming(size_t(n * mine) + 1);
  std::vector<Request> reqs;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    isend(reqs, in + off[size_t(j)] * elem, counts[size_t(j)] * elem, j, kTagReduceScatter, coll_);
    irecv(reqs, incoming.data() + j * mine, mine, j, kTagReduceScatter, coll_);
  }
  wait(reqs, deadline, context);
  std::vector<const void*> inputs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) inputs[size_t(j)] = j == me ? static_cast<const void*>(in + off[size_t(me)] * elem) : incoming.data() + j * mine;
  reduce_sequence(out, inputs.data(), n, counts[size_t(me)], dtype, op, n, false);
}

void MpiProcessGroup::direct_all_gather(char* work, const std::vector<int64_t>& counts, int64_t elem,
                                        Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const std::vector<int64_t> off = prefix_offsets(counts);
  std::vector<Request> reqs;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    isend(reqs, work + off[size_t(me)] * elem, counts[size_t(me)] * elem, j, kTagAllGather, coll_);
    irecv(reqs, work + off[size_t(j)] * elem, counts[size_t(j)] * elem, j, kTagAllGather, coll_);
  }
  wait(reqs, deadline, context);
}

// Pipelined chain root -> root+1 -> ...: each segment is forwarded as soon as it arrived.
void MpiProcessGroup::chain_broadcast(char* buf, int64_t bytes, int root, Clock::time_point deadline,
                                      const std::string& context) {
  const int n = size(), me = rank(), pos = mod(me - root, n);
  if (n == 1 || bytes == 0) return;
  std::vector<Request> sends;
  for (int64_t o = 0; o < bytes; o += kBroadcastSegment) {
    const int64_t len = std::min(kBroadcastSegment, bytes - o);
    if (pos > 0) {
      std::vector<Request> recv;
      irecv(recv, buf + o, len, mod(me - 1, n), kTagBroadcast, coll_);
      wait(recv, deadline, context);
    }
    if (pos < n - 1) isend(sends, buf + o, len, mod(me + 1, n), kTagBroadcast, coll_);
  }
  wait(sends, deadline, context);
}

void MpiProcessGroup::all_to_all(const CommCall& call, Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  const std::vector<int64_t> send_off = prefix_offsets(call.counts), recv_off = prefix_offsets(call.recv_counts);
  const char* src = static_cast<const char*>(call.in);
  std::vector<unsigned char> copy;
  if (call.in == call.out) {  // peers' blocks land where ours still wait to leave
    copy.assign(static_cast<const unsigned char*>(call.in),
                static_cast<const unsigned char*>(call.in) + (send_off.back() + call.counts.back()) * elem);
    src = reinterpret_cast<const char*>(copy.data());
  }
  char* out = static_cast<char*>(call.out);
  const int64_t own = call.counts[size_t(me)] * elem;
  if (own > 0) std::memmove(out + recv_off[size_t(me)] * elem, src + send_off[size_t(me)] * elem, size_t(own));
  std::vector<Request> reqs;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    isend(reqs, src + send_off[size_t(j)] * elem, call.counts[size_t(j)] * elem, j, kTagAllToAll, coll_);
    irecv(reqs, out + recv_off[size_t(j)] * elem, call.recv_counts[size_t(j)] * elem, j, kTagAllToAll, coll_);
  }
  wait(reqs, deadline, context);
}

double MpiProcessGroup::run_collective(const CommCall& call, int64_t seq, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const auto deadline = Clock::now() + call.timeout;
  const std::string context = where(call, seq);
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));

  double start = ready;
  std::vector<std::vector<int64_t>> a2a;
  if (s_.options.check_calls || call.op == CommOp::all_to_all)
    start = exchange_signatures(call, seq, ready, deadline, context, &a2a);

  CommPlan plan;
  // The traffic log counts the modelled algorithm (ring or direct) whatever the transport.
  const bool single_copy = use_single_copy(call);
  switch (call.op) {
    case CommOp::all_reduce: {
      plan = plan_all_reduce(cluster(), world_ranks(), call.count, elem, algo());
      if (single_copy && single_copy_all_reduce(call, deadline, context)) break;
      const std::vector<int64_t> counts = split_counts(call.count, n);
      char* out = static_cast<char*>(call.out);
      if (algo() == ReduceAlgo::ring) {
        if (call.out != call.in && call.count > 0) std::memcpy(out, call.in, size_t(call.count * elem));
        ring_reduce_scatter(out, counts, call.dtype, call.reduce, deadline, context);
        ring_all_gather(out, counts, elem, deadline, context);
      } else {
        direct_reduce_scatter(out + prefix_offsets(counts)[size_t(me)] * elem, static_cast<const char*>(call.in),
                              counts, call.dtype, call.reduce, deadline, context);
        direct_all_gather(out, counts, elem, deadline, context);
      }
      break;
    }
    case CommOp::reduce_scatter: {
      plan = plan_reduce_scatter(cluster(), world_ranks(), call.counts, elem, algo());
      if (single_copy && single_copy_reduce_scatter(call, deadline, context)) break;
      const int64_t mine = call.counts[size_t(me)] * elem;
      if (algo() == ReduceAlgo::ring) {
        const int64_t total = (prefix_offsets(call.counts).back() + call.counts.back()) * elem;
        std::vector<unsigned char> work(static_cast<const unsigned char*>(call.in),
                                        static_cast<const unsigned char*>(call.in) + total);
        ring_reduce_scatter(reinterpret_cast<char*>(work.data()), call.counts, call.dtype, call.reduce, deadline,
                            context);
        if (mine > 0)
          std::memmove(call.out, work.data() + prefix_offsets(call.counts)[size_t(me)] * elem, size_t(mine));
      } else {
        direct_reduce_scatter(call.out, static_cast<const char*>(call.in), call.counts, call.dtype, call.reduce,
                              deadline, context);
      }
      break;
    }
    case CommOp::all_gather: {
      plan = plan_all_gather(cluster(), world_ranks(), call.counts, elem, algo());
      if (single_copy && single_copy_all_gather(call, deadline, context)) break;
      char* out = static_cast<char*>(call.out);
      const int64_t mine = call.counts[size_t(me)] * elem;
      char* my_block = out + prefix_offsets(call.counts)[size_t(me)] * elem;
      if (mine > 0 && my_block != call.in) std::memmove(my_block, call.in, size_t(mine));
      if (algo() == ReduceAlgo::ring)
        ring_all_gather(out, call.counts, elem, deadline, context);
      else
        direct_all_gather(out, call.counts, elem, deadline, context);
      break;
    }
    case CommOp::broadcast:
      plan = plan_broadcast(cluster(), world_ranks(), call.count * elem, call.root);
      if (single_copy && single_copy_broadcast(call, deadline, context)) break;
      chain_broadcast(static_cast<char*>(call.out), call.count * elem, call.root, deadline, context);
      break;
    case CommOp::all_to_all: {
      std::vector<std::vector<int64_t>> bytes = a2a;
      for (auto& row : bytes)
        for (int64_t& b : row) b *= elem;
      plan = plan_all_to_all(cluster(), world_ranks(), bytes);
      all_to_all(call, deadline, context);
      break;
    }
    default: {
      plan = plan_barrier(cluster(), world_ranks());
      MPI_Request req;
      check_mpi(MPI_Ibarrier(coll_, &req), "MPI_Ibarrier");
      std::vector<Request> reqs = {{req, -1}};
      wait(reqs, deadline, context);
    }
  }
  const double sim1 = start + plan.sim_us;
  record_comm(call, plan, seq, wall0, ready, start, sim1);
  return sim1;
}

double MpiProcessGroup::run_send(const CommCall& call, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  // Eager: copy the payload and let it leave in the background, so a send never waits for its
  // receiver (two ranks sending to each other cannot deadlock), as in the virtual backend.
  MpiSession::Impl::PendingSend pending;
  pending.payload.assign(static_cast<const unsigned char*>(call.in), static_cast<const unsigned char*>(call.in) + bytes);
  std::vector<Request> reqs;
  isend(reqs, pending.payload.data(), bytes, call.peer, call.tag, p2p_);
  for (const Request& r : reqs) pending.requests.push_back(r.request);
  s_.pending_sends.push_back(std::move(pending));
  s_.progress_sends();
  const CommPlan plan = plan_p2p(cluster(), world_ranks(), rank(), call.peer, bytes);
  record_comm(call, plan, next_message_index(call), wall0, ready, ready, ready + plan.sim_us);
  return ready + plan.sim_us;
}

double MpiProcessGroup::run_recv(const CommCall& call, double issue_us) {
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  const std::string context = where(call, -1);
  std::vector<Request> reqs;
  irecv(reqs, call.out, bytes, call.peer, call.tag, p2p_);
  std::vector<int64_t> expected;
  for (int64_t o = 0; o == 0 || o < bytes; o += kMaxPiece) expected.push_back(std::min(kMaxPiece, bytes - o));
  const std::vector<MPI_Status> st = wait(reqs, Clock::now() + call.timeout, context);
  for (size_t i = 0; i < st.size(); ++i) {
    int got = 0;
    MPI_Get_count(&st[i], MPI_BYTE, &got);
    if (got != expected[i])
      fail("send/recv mismatch on group '" + name() + "': " + rank_label(call.peer) + " sent " + std::to_string(got) +
           " bytes but " + rank_label(rank()) + " called " + describe(call));
  }
  // The sender's departure time is not known here: the transfer is modelled from this rank's
  // ready time.
  const CommPlan plan = plan_p2p(cluster(), world_ranks(), call.peer, rank(), bytes);
  record_comm(call, plan, next_message_index(call), wall0, ready, ready, ready + plan.sim_us);
  return ready + plan.sim_us;
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::make_group(const std::vector<int>& members, const std::string& name) {
  auto result = std::make_shared<std::shared_ptr<ProcessGroup>>();
  auto self = shared_from_this();
  s_.stream
      .submit("new_group " + name,
              [self, members, name, result] {
                MpiProcessGroup& pg = *self;
                const std::vector<int> group_ranks = pg.group_ranks_of(members);
                MPI_Group parent, sub;
                check_mpi(MPI_Comm_group(pg.coll_, &parent), "MPI_Comm_group");
                check_mpi(MPI_Group_incl(parent, int(group_ranks.size()), group_ranks.data(), &sub), "MPI_Group_incl");
                // Members agree on a tag from the list and how often they made a group of it.
                const int k = pg.creations_[members]++;
                std::vector<int64_t> key(members.begin(), members.end());
                key.push_back(k);
                const int tag = 100 + int(hash_counts(key) % 30000);
                MPI_Comm coll, p2p;
                check_mpi(MPI_Comm_create_group(pg.coll_, sub, tag, &coll), "MPI_Comm_create_group");
                check_mpi(MPI_Comm_dup(coll, &p2p), "MPI_Comm_dup");
                MPI_Group_free(&sub);
                MPI_Group_free(&parent);
                pg.s_.adopt(coll);
                pg.s_.adopt(p2p);
                Info info = pg.info();
                info.name = name;
                info.world_ranks = members;
                MPI_Comm_rank(coll, &info.rank);
                *result = std::make_shared<MpiProcessGroup>(std::move(info), pg.s_, coll, p2p);
              })
      ->wait();
  return *result;
}


}  // namespace llama4d::mpi_detail
