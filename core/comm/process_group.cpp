#include "core/comm/process_group.h"

#include <algorithm>
#include <new>
#include <numeric>
#include <set>

#include "core/error.h"

namespace llama4d {

namespace {

std::string counts_text(const std::vector<int64_t>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i) { s += i ? "," : ""; s += std::to_string(counts[i]); }
  return s + "]";
}

bool all_equal(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
}

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// Do [a, a + na) and [b, b + nb) share a byte?
bool overlaps(const void* a, int64_t na, const void* b, int64_t nb) {
  if (na <= 0 || nb <= 0 || !a || !b) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + uint64_t(nb) && pb < pa + uint64_t(na);
}

}  // namespace

std::string describe(const CommCall& c) {
  std::string s(comm_op_name(c.op));
  const std::string dt(dtype_name(c.dtype));
  const std::string red(reduce_op_name(c.reduce));
  switch (c.op) {
    case CommOp::all_reduce: return s + "(count=" + std::to_string(c.count) + ", " + dt + ", " + red + ")";
    case CommOp::reduce_scatter:
    case CommOp::all_gather: {
      std::string n = c.uneven ? s + "_v(counts=" + counts_text(c.counts)
                               : s + "(count=" + std::to_string(c.counts.empty() ? 0 : c.counts[0]) + " per rank";
      n += ", " + dt;
      if (c.op == CommOp::reduce_scatter) n += ", " + red;
      return n + ")";
    }
    case CommOp::broadcast:
      return s + "(count=" + std::to_string(c.count) + ", " + dt + ", root " + std::to_string(c.root) + ")";
    case CommOp::all_to_all:
      if (c.uneven)
        return s + "_v(send_counts=" + counts_text(c.counts) + ", recv_counts=" + counts_text(c.recv_counts) + ", " +
               dt + ")";
      return s + "(count=" + std::to_string(c.counts.empty() ? 0 : c.counts[0]) + " per rank, " + dt + ")";
    case CommOp::send:
      return s + "(count=" + std::to_string(c.count) + ", " + dt + ", to " + std::to_string(c.peer) + ", tag " +
             std::to_string(c.tag) + ")";
    case CommOp::recv:
      return s + "(count=" + std::to_string(c.count) + ", " + dt + ", from " + std::to_string(c.peer) + ", tag " +
             std::to_string(c.tag) + ")";
    case CommOp::barrier: return s + "()";
  }
  return s;
}

ProcessGroup::ProcessGroup(Info info) : info_(std::move(info)) {
  if (info_.world_ranks.empty() || info_.rank < 0 || info_.rank >= int(info_.world_ranks.size()) ||
      !info_.accounting || info_.timeout.count() <= 0)
    throw Error("process group '" + info_.name + "': inconsistent construction");
}

std::string ProcessGroup::rank_label(int group_rank) const {
  std::string s = "rank " + std::to_string(group_rank);
  if (name() == "world" || group_rank < 0 || group_rank >= size()) return s;
  return s + " of '" + name() + "' (world rank " + std::to_string(world_ranks()[size_t(group_rank)]) + ")";
}

void ProcessGroup::check_buffer(const void* p, int64_t count, const char* what) const {
  if (count < 0) throw InputError(std::string(what) + ": negative count " + std::to_string(count));
  if (count > 0 && !p) throw InputError(std::string(what) + ": null buffer for " + std::to_string(count) + " elements");
}

void ProcessGroup::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size())
    throw InputError(std::string(what) + " rank " + std::to_string(r) + " is outside group '" + name() + "' of size " +
                     std::to_string(size()));
}

std::shared_ptr<Work> ProcessGroup::run(CommCall call) {
  if (call.timeout.count() <= 0) call.timeout = info_.timeout;
  const bool async = call.async_op;
  std::shared_ptr<Work> work = submit(std::move(call));
  if (!async) work->wait();
  return work;
}

std::shared_ptr<Work> ProcessGroup::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                               const AllReduceOptions& opts) {
  return all_reduce(buf, buf, count, dtype, op, opts);
}

std::shared_ptr<Work> ProcessGroup::all_reduce(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                                               const AllReduceOptions& opts) {
  check_buffer(out, count, "all_reduce");
  check_buffer(in, count, "all_reduce");
  if (!reduction_supported(dtype)) throw InputError("all_reduce: no reductions for " + std::string(dtype_name(dtype)));
  const int64_t bytes = count * int64_t(dtype_size(dtype));
  if (out != in && overlaps(out, bytes, in, bytes)) throw InputError("all_reduce: out and in overlap partially");
  return run({.op = CommOp::all_reduce, .out = out, .in = in, .count = count, .dtype = dtype, .reduce = op,
              .timeout = opts.timeout, .async_op = opts.async_op, .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                                                   const ReduceScatterOptions& opts) {
  if (count < 0) throw InputError("reduce_scatter: negative count " + std::to_string(count));
  return reduce_scatter_v(out, in, std::vector<int64_t>(size_t(size()), count), dtype, op, opts);
}

// One count per rank, none negative.
void ProcessGroup::check_counts(const std::vector<int64_t>& counts, const char* what) const {
  if (counts.size() != size_t(size()))
    throw InputError(std::string(what) + ": need " + std::to_string(size()) + " counts, got " + std::to_string(counts.size()));
  for (int64_t c : counts)
    if (c < 0) throw InputError(std::string(what) + ": negative count " + std::to_string(c));
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_v(void* out, const void* in, const std::vector<int64_t>& counts,
                                                     DType dtype, ReduceOp op, const ReduceScatterOptions& opts) {
  check_counts(counts, "reduce_scatter");
  if (!reduction_supported(dtype))
    throw InputError("reduce_scatter: no reductions for " + std::string(dtype_name(dtype)));
  const int64_t total = sum_of(counts), mine = counts[size_t(rank())];
  check_buffer(out, mine, "reduce_scatter");
  check_buffer(in, total, "reduce_scatter");
  const int64_t elem = int64_t(dtype_size(dtype));
  const int64_t my_offset = sum_of(std::vector<int64_t>(counts.begin(), counts.begin() + rank()));
  const void* in_place = static_cast<const char*>(in) + my_offset * elem;
  if (out != in_place && overlaps(out, mine * elem, in, total * elem))
    throw InputError("reduce_scatter: out overlaps in but is not its block rank() (the in-place layout)");
  return run({.op = CommOp::reduce_scatter, .out = out, .in = in, .counts = counts, .dtype = dtype, .reduce = op,
              .timeout = opts.timeout, .async_op = opts.async_op, .uneven = !all_equal(counts), .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::all_gather(void* out, const void* in, int64_t count, DType dtype,
                                               const AllGatherOptions& opts) {
  if (count < 0) throw InputError("all_gather: negative count " + std::to_string(count));
  return all_gather_v(out, in, std::vector<int64_t>(size_t(size()), count), dtype, opts);
}

std::shared_ptr<Work> ProcessGroup::all_gather_v(void* out, const void* in, const std::vector<int64_t>& counts,
                                                 DType dtype, const AllGatherOptions& opts) {
  check_counts(counts, "all_gather");
  const int64_t total = sum_of(counts), mine = counts[size_t(rank())];
  check_buffer(out, total, "all_gather");
  check_buffer(in, mine, "all_gather");
  const int64_t elem = int64_t(dtype_size(dtype));
  const int64_t my_offset = sum_of(std::vector<int64_t>(counts.begin(), counts.begin() + rank()));
  const void* in_place = static_cast<const char*>(out) + my_offset * elem;
  if (in != in_place && overlaps(out, total * elem, in, mine * elem))
    throw InputError("all_gather: in overlaps out but is not its block rank() (the in-place layout)");
  return run({.op = CommOp::all_gather, .out = out, .in = in, .counts = counts, .dtype = dtype, .timeout = opts.timeout,
              .async_op = opts.async_op, .uneven = !all_equal(counts), .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::broadcast(void* buf, int64_t count, DType dtype, const BroadcastOptions& opts) {
  check_buffer(buf, count, "broadcast");
  check_rank(opts.root, "broadcast: root");
  return run({.op = CommOp::broadcast, .out = buf, .in = buf, .count = count, .dtype = dtype, .root = opts.root,
              .timeout = opts.timeout, .async_op = opts.async_op, .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::send(const void* buf, int64_t count, DType dtype, int dst, const SendOptions& opts) {
  check_buffer(buf, count, "send");
  check_rank(dst, "send: destination");
  if (dst == rank()) throw InputError("send: " + rank_label(dst) + " cannot send to itself");
  return run({.op = CommOp::send, .in = buf, .count = count, .dtype = dtype, .peer = dst, .tag = opts.tag,
              .timeout = opts.timeout, .async_op = opts.async_op, .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::recv(void* buf, int64_t count, DType dtype, int src, const RecvOptions& opts) {
  check_buffer(buf, count, "recv");
  check_rank(src, "recv: source");
  if (src == rank()) throw InputError("recv: " + rank_label(src) + " cannot receive from itself");
  return run({.op = CommOp::recv, .out = buf, .count = count, .dtype = dtype, .peer = src, .tag = opts.tag,
              .timeout = opts.timeout, .async_op = opts.async_op, .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::all_to_all(void* out, const void* in, int64_t count, DType dtype,
                                               const AllToAllOptions& opts) {
  if (count < 0) throw InputError("all_to_all: negative count " + std::to_string(count));
  const std::vector<int64_t> counts(size_t(size()), count);
  return all_to_all_v(out, counts, in, counts, dtype, opts);
}

std::shared_ptr<Work> ProcessGroup::all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in,
                                                 const std::vector<int64_t>& send_counts, DType dtype,
                                                 const AllToAllOptions& opts) {
  if (recv_counts.size() != size_t(size()) || send_counts.size() != size_t(size()))
    throw InputError("all_to_all: need " + std::to_string(size()) + " send and receive counts");
  for (int64_t c : recv_counts)
    if (c < 0) throw InputError("all_to_all: negative count " + std::to_string(c));
  for (int64_t c : send_counts)
    if (c < 0) throw InputError("all_to_all: negative count " + std::to_string(c));
  check_buffer(out, sum_of(recv_counts), "all_to_all");
  check_buffer(in, sum_of(send_counts), "all_to_all");
  const int64_t elem = int64_t(dtype_size(dtype));
  if (out != in && overlaps(out, sum_of(recv_counts) * elem, in, sum_of(send_counts) * elem))
    throw InputError("all_to_all: out and in overlap partially");
  return run({.op = CommOp::all_to_all, .out = out, .in = in, .counts = send_counts, .recv_counts = recv_counts,
              .dtype = dtype, .timeout = opts.timeout, .async_op = opts.async_op,
              .uneven = !(all_equal(send_counts) && send_counts == recv_counts), .label = opts.label});
}

std::shared_ptr<Work> ProcessGroup::barrier(const BarrierOptions& opts) {
  return run({.op = CommOp::barrier, .timeout = opts.timeout, .async_op = opts.async_op, .label = opts.label});
}

void ProcessGroup::record_comm(const CommCall& call, const CommPlan& plan, int64_t seq, double wall_start_us,
                               double ready_us, double sim_start_us, double sim_end_us) {
  const size_t me = size_t(rank());
  TrafficRecord r;
  r.op = std::string(comm_op_name(call.op));
  r.group = name();
  r.algorithm = plan.algorithm;
  r.label = call.label;
  r.world_rank = world_rank();
  r.group_rank = rank();
  r.group_size = size();
  r.seq = seq;
  r.dtype = call.dtype;
  switch (call.op) {
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_to_all: r.count = sum_of(call.counts); break;
    case CommOp::barrier: r.count = 0; break;
    default: r.count = call.count;
  }
  r.bytes_sent = plan.bytes_sent[me];
  r.bytes_recv = plan.bytes_recv[me];
  r.sent_nvlink = plan.sent_nvlink[me];
  r.sent_ib = plan.sent_ib[me];
  r.sim_start_us = sim_start_us;
  r.sim_end_us = sim_end_us;
  r.wall_start_us = wall_start_us;
  r.wall_end_us = trace().wall_now_us();
  std::string detail = "group '" + name() + "', " + plan.algorithm + ", sent " + format_bytes(r.bytes_sent) +
                       ", received " + format_bytes(r.bytes_recv);
  if (!call.label.empty()) detail += ", " + call.label;
  trace().add_comm(r.op, std::move(detail), r.wall_start_us, r.wall_end_us, ready_us, sim_start_us, sim_end_us);
  traffic().add(std::move(r));
}

std::shared_ptr<Work> ProcessGroup::submit_on(CommStream& stream, CommCall call, Runner run) {
  const double issue_us = trace().sim_now_us();
  const bool p2p = call.op == CommOp::send || call.op == CommOp::recv;
  const int64_t seq = p2p ? -1 : next_seq_++;
  const bool caller_waits = !call.async_op;
  auto sim_end = std::make_shared<double>(issue_us);
  std::string description = describe(call);
  std::string waited_for = description;  // names the compute lane's wait, if there is one
  RankAccounting* acc = &accounting();
  int64_t bytes = call.count;
  for (const int64_t c : call.counts) bytes += c;  // the whole buffer of a reduce_scatter, all_gather, all_to_all
  const int64_t flight_id = acc->flight.issued(
      {0, name(), world_ranks(), seq, description, bytes * int64_t(dtype_size(call.dtype)), FlightEntry::State::issued, ""});
  auto task = [run = std::move(run), call = std::move(call), seq, issue_us, sim_end, acc, flight_id] {
    try {
      *sim_end = run(call, seq, issue_us);
    } catch (const std::exception& e) {
      acc->flight.failed(flight_id, e.what());
      throw;
    }
    acc->flight.completed(flight_id);
  };
  return stream.submit(
      std::move(description), std::move(task),
      [acc, sim_end, waited_for] { acc->trace.join_comm(*sim_end, waited_for); }, caller_waits);
}

std::string ProcessGroup::where(const CommCall& call, int64_t seq) const {
  std::string s = describe(call);
  if (seq >= 0) s += " #" + std::to_string(seq);
  return s + " on group '" + name() + "'";
}

int64_t ProcessGroup::next_message_index(const CommCall& call) {
  return message_index_[{call.peer, call.tag, call.op == CommOp::send}]++;
}

std::vector<int> ProcessGroup::group_ranks_of(const std::vector<int>& members) const {
  std::vector<int> ranks;
  for (int w : members)
    ranks.push_back(int(std::find(world_ranks().begin(), world_ranks().end(), w) - world_ranks().begin()));
  return ranks;
}

std::shared_ptr<void> ProcessGroup::allocate_symmetric(int64_t bytes) {
  if (bytes < 0) throw InputError("allocate_symmetric: negative size " + std::to_string(bytes));
  return make_symmetric(bytes);
}

std::shared_ptr<void> ProcessGroup::make_symmetric(int64_t bytes) {
  constexpr std::align_val_t kAlign{64};
  return std::shared_ptr<void>(::operator new(size_t(std::max<int64_t>(bytes, 1)), kAlign),
                               [](void* p) { ::operator delete(p, kAlign); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  if (ranks.empty()) throw InputError("new_group: empty rank list");
  std::set<int> seen;
  for (int r : ranks) {
    check_rank(r, "new_group:");
    if (!seen.insert(r).second) throw InputError("new_group: rank " + std::to_string(r) + " listed twice");
  }
  if (!seen.count(rank()))
    throw InputError("new_group: " + rank_label(rank()) + " is not in the list it asked for; only members call new_group");
  std::vector<int> world;
  std::string label = name;
  if (label.empty()) label = this->name() + "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    world.push_back(world_ranks()[size_t(ranks[i])]);
    if (name.empty()) { label += i ? "," : ""; label += std::to_string(ranks[i]); }
  }
  if (name.empty()) label += "]";
  return make_group(world, label);
}

}  // namespace llama4d
