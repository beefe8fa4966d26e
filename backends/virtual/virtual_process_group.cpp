#include "backends/virtual/virtual_process_group.h"

#include <algorithm>

#include "backends/virtual/data_movement.h"
#include "core/error.h"

namespace llama4d::virt {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

VirtualProcessGroup::VirtualProcessGroup(Info info, std::shared_ptr<World> world, std::shared_ptr<GroupState> group,
                                         CommStream& stream)
    : ProcessGroup(std::move(info)), world_(std::move(world)), group_(std::move(group)), stream_(stream) {}

std::shared_ptr<Work> VirtualProcessGroup::submit(CommCall call) {
  auto self = shared_from_this();
  return submit_on(stream_, std::move(call), [self](const CommCall& c, int64_t seq, double issue_us) {
    if (c.op == CommOp::send) return self->run_send(c, issue_us);
    if (c.op == CommOp::recv) return self->run_recv(c, issue_us);
    return self->run_collective(c, seq, issue_us);
  });
}

std::string VirtualProcessGroup::missing(const std::vector<uint8_t>& flags) const {
  std::string out;
  for (int j = 0; j < size(); ++j)
    if (!flags[size_t(j)]) {
      if (!out.empty()) out += ", ";
      out += rank_label(j);
    }
  return out;
}

void VirtualProcessGroup::throw_aborted(std::unique_lock<std::mutex>& lock, const std::string& context) {
  const std::string reason = world_->abort_reason;
  lock.unlock();
  throw CommError(reason + " (" + rank_label(rank()) + " gave up in " + context + ")");
}

// Leaves a slot on any path. Members that already started moving data may be touching this
// member's buffers, so wait for them (they never block) before the caller may return.
void VirtualProcessGroup::leave_slot(std::unique_lock<std::mutex>& lock, int64_t seq, Slot& s) {
  const int me = rank();
  world_->cv.wait(lock, [&] {
    for (size_t j = 0; j < s.pub.size(); ++j)
      if (s.started[j] && !s.done[j]) return false;
    return true;
  });
  if (s.left[size_t(me)]) return;
  s.left[size_t(me)] = 1;
  if (++s.n_left == size()) group_->slots.erase(seq);
}

double VirtualProcessGroup::run_collective(const CommCall& call, int64_t seq, double issue_us) {
  World& w = *world_;
  const int me = rank(), n = size();
  const std::string context = where(call, seq);
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());

  // An all_to_all that reads and writes one buffer must publish a private copy of its input,
  // because peers read it while this member overwrites the buffer.
  Publication mine{call, call.out, call.in, ready};
  StagedBytes input_copy;
  if (call.op == CommOp::all_to_all && call.in == call.out) {
    int64_t total = 0;
    for (int64_t x : call.counts) total += x;
    input_copy = StagedBytes(w.device, call.in, total * int64_t(dtype_size(call.dtype)));
    mine.in = input_copy.data();
  }

  std::unique_lock<std::mutex> lock(w.mu);
  if (w.aborted) throw_aborted(lock, context);
  Slot& s = group_->slots.try_emplace(seq, n).first->second;

  // Arrive: publish, and check the call against a member that is already here.
  s.pub[size_t(me)] = mine;
  s.arrived[size_t(me)] = 1;
  ++s.n_arrived;
  for (int j = 0; j < n; ++j) {
    if (j == me || !s.arrived[size_t(j)]) continue;
    const std::string why = incompatibility(s.pub[size_t(j)].call, call);
    if (!why.empty()) {
      const int a = std::min(j, me), b = std::max(j, me);
      w.abort_locked("collective mismatch on group '" + name() + "' (call #" + std::to_string(seq) + ", " + why +
                         "): " + rank_label(a) + " called " + describe(s.pub[size_t(a)].call) + " but " +
                         rank_label(b) + " called " + describe(s.pub[size_t(b)].call),
                     nullptr);
      leave_slot(lock, seq, s);
      throw_aborted(lock, context);
    }
    break;
  }
  if (s.n_arrived == n) {
    // The last to arrive plans the collective for everyone (same plan, same simulated start).
    const int64_t elem = int64_t(dtype_size(call.dtype));
    double start = 0;
    for (const Publication& p : s.pub) start = std::max(start, p.ready_us);
    s.sim_start_us = start;
    switch (call.op) {
      case CommOp::all_reduce: s.plan = plan_all_reduce(cluster(), world_ranks(), call.count, elem, w.algo); break;
      case CommOp::reduce_scatter:
        s.plan = plan_reduce_scatter(cluster(), world_ranks(), call.counts, elem, w.algo);
        break;
      case CommOp::all_gather: s.plan = plan_all_gather(cluster(), world_ranks(), call.counts, elem, w.algo); break;
      case CommOp::broadcast: s.plan = plan_broadcast(cluster(), world_ranks(), call.count * elem, call.root); break;
      case CommOp::all_to_all: {
        std::vector<std::vector<int64_t>> bytes(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < n; ++j) {
            const int64_t sends = s.pub[size_t(i)].call.counts[size_t(j)];
            const int64_t expects = s.pub[size_t(j)].call.recv_counts[size_t(i)];
            if (sends != expects) {
              w.abort_locked("all_to_all mismatch on group '" + name() + "' (call #" + std::to_string(seq) + "): " +
                                 rank_label(i) + " sends " + std::to_string(sends) + " elements to " + rank_label(j) +
                                 ", which expects " + std::to_string(expects) + ": " + rank_label(i) + " called " +
                                 describe(s.pub[size_t(i)].call) + ", " + rank_label(j) + " called " +
                                 describe(s.pub[size_t(j)].call),
                             nullptr);
              leave_slot(lock, seq, s);
              throw_aborted(lock, context);
            }
            bytes[size_t(i)].push_back(sends * elem);
          }
        }
        s.plan = plan_all_to_all(cluster(), world_ranks(), bytes);
        break;
      }
      default: s.plan = plan_barrier(cluster(), world_ranks()); break;
    }
    w.cv.notify_all();
  }

  // Wait for everyone to arrive.
  auto deadline = Clock::now() + call.timeout;
  const auto exited_missing = [&] {
    for (int j = 0; j < n; ++j)
      if (!s.arrived[size_t(j)] && w.exited[size_t(world_ranks()[size_t(j)])]) return j;
    return -1;
  };
  w.cv.wait_until(lock, deadline, [&] { return s.n_arrived == n || w.aborted || exited_missing() >= 0; });
  if (s.n_arrived != n || w.aborted) {
    if (!w.aborted) {
      const int gone = exited_missing();
      if (gone >= 0)
        w.abort_locked(rank_label(gone) + " finished its function without calling " + context, nullptr);
      else
        w.abort_locked("timeout after " + std::to_string(call.timeout.count()) + " ms: " + missing(s.arrived) +
                           " never called " + context,
                       nullptr);
    }
    leave_slot(lock, seq, s);
    throw_aborted(lock, context);
  }

  // Mid-collective fault injection (tests): everyone is here, nothing moved yet.
  if (w.fault_hook) {
    lock.unlock();
    try {
      w.fault_hook(world_rank(), call.op, seq);
    } catch (const std::exception& e) {
      lock.lock();
      w.abort_locked(rank_label(me) + " failed in the middle of " + context + ": " + e.what(), nullptr);
      leave_slot(lock, seq, s);
      lock.unlock();
      throw;
    }
    lock.lock();
    if (w.aborted) {
      leave_slot(lock, seq, s);
      throw_aborted(lock, context);
    }
  }

  // Move this member's share of the data, without the lock.
  s.started[size_t(me)] = 1;
  lock.unlock();
  std::exception_ptr failed;  // a copy or reduction the backend refused (a GPU error, its memory)
  try {
    move_data(s, me, w.algo, w.device);
  } catch (...) {
    failed = std::current_exception();
  }
  lock.lock();
  s.done[size_t(me)] = 1;
  // Wake waiters only when it matters: everyone is done, or an abort is waiting for us to finish.
  if (++s.n_done == n || w.aborted || failed) w.cv.notify_all();
  if (failed) {
    // Stop the world, so no peer waits for this member, and wait for the peers still moving data
    // in this member's buffers before unwinding frees them.
    w.abort_locked(rank_label(me) + " failed moving its share of " + context + ": " + what_of(failed), failed);
    leave_slot(lock, seq, s);
    lock.unlock();
    std::rethrow_exception(failed);
  }

  // Peers may still be reading or writing this member's buffers: wait until all are done.
  deadline = Clock::now() + call.timeout;
  w.cv.wait_until(lock, deadline, [&] { return s.n_done == n || w.aborted; });
  // Aborted with every share done: one may have failed (its chunk was never reduced).
  if (s.n_done != n || w.aborted) {
    if (!w.aborted)
      w.abort_locked("timeout after " + std::to_string(call.timeout.count()) + " ms: " + missing(s.done) +
                         " stopped in the middle of " + context,
                     nullptr);
    leave_slot(lock, seq, s);
    throw_aborted(lock, context);
  }
  const CommPlan plan = s.plan;
  const double sim0 = s.sim_start_us;
  leave_slot(lock, seq, s);
  lock.unlock();

  const double sim1 = sim0 + plan.sim_us;
  record_comm(call, plan, seq, wall0, ready, sim0, sim1);
  return sim1;
}

double VirtualProcessGroup::run_send(const CommCall& call, double issue_us) {
  World& w = *world_;
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  const CommPlan plan = plan_p2p(cluster(), world_ranks(), rank(), call.peer, bytes);
  const double sim1 = ready + plan.sim_us;

  // Eager protocol: the payload is copied into a comm buffer now, so a send never waits for its
  // receiver and two ranks sending to each other cannot deadlock.
  Message m;
  m.reservation = MemoryReservation(memory(), MemoryCategory::comm_buffers, bytes,
                                    "send buffer for " + rank_label(call.peer));
  m.payload = StagedBytes(w.device, call.in, bytes);
  m.call = call;
  m.depart_us = ready;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    if (w.aborted) throw_aborted(lock, where(call, -1));
    w.channels[{group_->id, rank(), call.peer, call.tag}].push_back(std::move(m));
    w.cv.notify_all();
  }
  record_comm(call, plan, next_message_index(call), wall0, ready, ready, sim1);
  return sim1;
}

double VirtualProcessGroup::run_recv(const CommCall& call, double issue_us) {
  World& w = *world_;
  const double wall0 = trace().wall_now_us();
  const double ready = std::max(issue_us, trace().comm_clock_us());
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  const int src_world = world_ranks()[size_t(call.peer)];
  // The caller's label names what the message is for ("pipeline: recv gradient 3 from rank 2").
  const std::string context = where(call, -1) + (call.label.empty() ? std::string() : " for " + call.label);

  Message m;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    std::deque<Message>& q = w.channels[{group_->id, call.peer, rank(), call.tag}];
    const auto deadline = Clock::now() + call.timeout;
    w.cv.wait_until(lock, deadline, [&] { return w.aborted || !q.empty() || w.exited[size_t(src_world)]; });
    if (w.aborted) throw_aborted(lock, context);
    if (q.empty()) {
      if (w.exited[size_t(src_world)])
        w.abort_locked(rank_label(call.peer) + " finished its function without the send that " + rank_label(rank()) +
                           " waits for in " + context,
                       nullptr);
      else
        w.abort_locked("timeout after " + std::to_string(call.timeout.count()) + " ms: " + rank_label(rank()) +
                           " waited in " + context + " but " + rank_label(call.peer) + " never sent",
                       nullptr);
      throw_aborted(lock, context);
    }
    m = std::move(q.front());
    q.pop_front();
    if (m.call.count != call.count || m.call.dtype != call.dtype) {
      w.abort_locked("send/recv mismatch on group '" + name() + "': " + rank_label(call.peer) + " called " +
                         describe(m.call) + " but " + rank_label(rank()) + " called " + describe(call),
                     nullptr);
      throw_aborted(lock, context);
    }
  }
  copy_bytes(w.device, call.out, m.payload.data(), bytes);
  m.reservation.reset();

  const CommPlan plan = plan_p2p(cluster(), world_ranks(), call.peer, rank(), bytes);
  const double sim0 = std::max(ready, m.depart_us);
  const double sim1 = std::max(ready, m.depart_us + plan.sim_us);
  record_comm(call, plan, next_message_index(call), wall0, ready, sim0, sim1);
  return sim1;
}

std::shared_ptr<ProcessGroup> VirtualProcessGroup::make_group(const std::vector<int>& world_ranks,
                                                              const std::string& group_name) {
  World& w = *world_;
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (w.aborted) throw CommError(w.abort_reason + " (" + rank_label(rank()) + " gave up in new_group)");
    const int k = w.creations[size_t(world_rank())][{group_->id, world_ranks}]++;
    std::shared_ptr<GroupState>& slot = w.groups[{group_->id, world_ranks, k}];
    if (!slot) slot = std::make_shared<GroupState>(w.next_group_id++, group_name, world_ranks);
    g = slot;
  }
  Info info = this->info();
  info.name = g->name;
  info.world_ranks = world_ranks;
  info.rank = int(std::find(world_ranks.begin(), world_ranks.end(), world_rank()) - world_ranks.begin());
  return std::make_shared<VirtualProcessGroup>(std::move(info), world_, std::move(g), stream_);
}

}  // namespace llama4d::virt
