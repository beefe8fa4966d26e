#include "core/parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"

namespace llama4d {

namespace {

using Op = PipelineAction::Op;

constexpr struct {
  PipelineScheduleKind kind;
  const char* name;
} kScheduleNames[] = {{PipelineScheduleKind::gpipe, "gpipe"},
                      {PipelineScheduleKind::one_f_one_b, "1f1b"},
                      {PipelineScheduleKind::interleaved, "interleaved"},
                      {PipelineScheduleKind::zb_h1, "zb-h1"}};

std::string str(int v) { return std::to_string(v); }

// ---- Compute order of each schedule (transfers are added afterwards) ---------------------------

PipelineAction compute(Op op, int m, int c = 0) { return {op, m, c, -1}; }

// GPipe: every forward, then every backward, in micro-batch order.
std::vector<PipelineAction> gpipe_order(int m) {
  std::vector<PipelineAction> out;
  for (int i = 0; i < m; ++i) out.push_back(compute(Op::forward, i));
  for (int i = 0; i < m; ++i) out.push_back(compute(Op::backward, i));
  return out;
}

// 1F1B: warm-up forwards fill the pipeline below this rank, then F and B alternate, and the
// backwards left drain it. Rank r never holds more than p - r micro-batches.
std::vector<PipelineAction> one_f_one_b_order(int p, int m, int r) {
  const int warmup = std::min(p - 1 - r, m);
  std::vector<PipelineAction> out;
  for (int i = 0; i < warmup; ++i) out.push_back(compute(Op::forward, i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back(compute(Op::forward, warmup + i));
    out.push_back(compute(Op::backward, i));
  }
  for (int i = m - warmup; i < m; ++i) out.push_back(compute(Op::backward, i));
  return out;
}

// Interleaved 1F1B (Megatron-LM): the k-th forward of a rank is micro-batch
// (k / (p v)) p + k % p on chunk (k / p) % v, so micro-batches advance in groups of p through
// chunk 0, then chunk 1, ...; backwards walk the chunks the other way. Warm-up: enough forwards
// that the first backward's gradient can arrive, 2 (p - r - 1) + (v - 1) p; with m == p every
// forward comes first (the steady phase would be empty).
std::vector<PipelineAction> interleaved_order(int p, int m, int v, int r) {
  const int total = m * v;
  auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return compute(Op::forward, mb(k), (k / p) % v); };
  auto bwd = [&](int k) { return compute(Op::backward, mb(k), v - 1 - (k / p) % v); };
  const int warmup = m == p ? total : std::min(2 * (p - r - 1) + (v - 1) * p, total);
  std::vector<PipelineAction> out;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(fwd(warmup + k));
    out.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(bwd(k));
  return out;
}

// ZB-H1 (Qi et al. 2023): 1F1B with each backward split into I and W, where rank r runs the
// W of micro-batch k only after the I of micro-batch k + r (the last r of them at the end).
// Deferring W keeps every rank's I, which the rank below waits for, as early as possible, and
// the deferred W passes fill the cool-down, where 1F1B idles. Rank r then holds at most
// (p - r) + r = p micro-batches: the peak of 1F1B's first rank, so the peak memory is 1F1B's.
std::vector<PipelineAction> zb_h1_order(int p, int m, int r) {
  std::vector<PipelineAction> out;
  int next_w = 0;
  for (PipelineAction a : one_f_one_b_order(p, m, r)) {
    if (a.op != Op::backward) {
      out.push_back(a);
      continue;
    }
    out.push_back(compute(Op::backward_input, a.micro_batch));
    if (a.micro_batch >= r) out.push_back(compute(Op::backward_weight, next_w++));
  }
  while (next_w < m) out.push_back(compute(Op::backward_weight, next_w++));
  return out;
}

// Adds the transfers each compute action needs: a receive right before it, a send right after.
std::vector<PipelineAction> with_transfers(const PipelineSchedule& s, int r, const std::vector<PipelineAction>& order) {
  const int S = s.virtual_stages();
  std::vector<PipelineAction> out;
  for (const PipelineAction& a : order) {
    const int stage = s.virtual_stage(r, a.chunk);
    const bool fwd = a.op == Op::forward, grad_in = a.op == Op::backward || a.op == Op::backward_input;
    if (fwd && stage > 0) out.push_back({Op::recv_activation, a.micro_batch, a.chunk, s.rank_of_stage(stage - 1)});
    if (grad_in && stage < S - 1) out.push_back({Op::recv_gradient, a.micro_batch, a.chunk, s.rank_of_stage(stage + 1)});
    out.push_back(a);
    if (fwd && stage < S - 1) out.push_back({Op::send_activation, a.micro_batch, a.chunk, s.rank_of_stage(stage + 1)});
    if (grad_in && stage > 0) out.push_back({Op::send_gradient, a.micro_batch, a.chunk, s.rank_of_stage(stage - 1)});
  }
  return out;
}

}  // namespace

PipelineScheduleKind parse_pipeline_schedule(std::string_view name) {
  std::string valid;
  for (const auto& k : kScheduleNames) {
    if (name == k.name) return k.kind;
    valid += (valid.empty() ? "" : ", ") + std::string(k.name);
  }
  throw InputError("unknown pipeline schedule '" + std::string(name) + "' (valid: " + valid + ")");
}

std::string_view pipeline_schedule_name(PipelineScheduleKind kind) {
  for (const auto& k : kScheduleNames)
    if (k.kind == kind) return k.name;
  return "?";
}

std::string PipelineAction::describe(bool show_chunk) const {
  std::string id = str(micro_batch);
  if (show_chunk) id += '.' + str(chunk);
  switch (op) {
    case Op::forward: return "F" + id;
    case Op::backward: return "B" + id;
    case Op::backward_input: return "I" + id;
    case Op::backward_weight: return "W" + id;
    case Op::recv_activation: return "recv activation " + id + " from rank " + str(peer);
    case Op::send_activation: return "send activation " + id + " to rank " + str(peer);
    case Op::recv_gradient: return "recv gradient " + id + " from rank " + str(peer);
    case Op::send_gradient: return "send gradient " + id + " to rank " + str(peer);
  }
  return "?";
}

int PipelineSchedule::tag(int rank, const PipelineAction& a) const {
  // Boundary b lies between virtual stages b and b + 1: activations cross it forward,
  // gradients backward. The sender and the receiver name the same boundary.
  const int stage = virtual_stage(rank, a.chunk);
  const bool gradient = a.op == Op::send_gradient || a.op == Op::recv_gradient;
  const bool below = a.op == Op::recv_activation || a.op == Op::send_gradient;
  const int boundary = below ? stage - 1 : stage;
  return 2 * (a.micro_batch * virtual_stages() + boundary) + (gradient ? 1 : 0);
}

std::string PipelineSchedule::name() const {
  switch (kind) {
    case PipelineScheduleKind::gpipe: return "GPipe, p=" + str(ranks) + ", m=" + str(micro_batches);
    case PipelineScheduleKind::one_f_one_b: return "1F1B, p=" + str(ranks) + ", m=" + str(micro_batches);
    case PipelineScheduleKind::interleaved:
      return "interleaved 1F1B, p=" + str(ranks) + ", v=" + str(chunks) + ", m=" + str(micro_batches);
    case PipelineScheduleKind::zb_h1: return "ZB-H1, p=" + str(ranks) + ", m=" + str(micro_batches);
  }
  return "?";
}

std::string PipelineSchedule::describe() const {
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    out += "rank " + str(r) + ":";
    for (const PipelineAction& a : actions[size_t(r)])
      if (a.is_compute()) out += ' ' + a.describe(chunks > 1);
    out += "\n";
  }
  return out;
}

PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int p, int m, int v) {
  const std::string what = std::string(pipeline_schedule_name(kind));
  if (p < 1) throw InputError("pipeline schedule " + what + ": needs at least 1 rank, got " + str(p));
  if (m < 1) throw InputError("pipeline schedule " + what + ": needs at least 1 micro-batch, got " + str(m));
  if (kind == PipelineScheduleKind::interleaved) {
    if (v < 2) throw InputError("the interleaved schedule needs at least 2 model chunks per rank (--pp-chunks), got " + str(v));
    if (m % p != 0)
      throw InputError("the interleaved schedule runs micro-batches in groups of p: " + str(m) +
                       " micro-batches is not a multiple of " + str(p) + " pipeline ranks");
  } else if (v != 1) {
    throw InputError("the " + what + " schedule runs one model chunk per rank; only interleaved takes --pp-chunks " + str(v));
  }
  PipelineSchedule s;
  s.kind = kind, s.ranks = p, s.chunks = v, s.micro_batches = m;
  std::vector<std::vector<PipelineAction>> orders(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    if (kind == PipelineScheduleKind::gpipe) orders[size_t(r)] = gpipe_order(m);
    if (kind == PipelineScheduleKind::one_f_one_b) orders[size_t(r)] = one_f_one_b_order(p, m, r);
    if (kind == PipelineScheduleKind::interleaved) orders[size_t(r)] = interleaved_order(p, m, v, r);
    if (kind == PipelineScheduleKind::zb_h1) orders[size_t(r)] = zb_h1_order(p, m, r);
    s.actions.push_back(with_transfers(s, r, orders[size_t(r)]));
  }
  return s;
}

namespace {

// The structural checks: each (micro-batch, chunk) forwarded once and backwarded once (B, or
// I then W), after its forward, with a receive before and a send after wherever the stage
// needs one. Deadlocks are left to the replay.
void check_structure(const PipelineSchedule& s) {
  const int S = s.virtual_stages();
  if (int(s.actions.size()) != s.ranks) throw InputError(s.name() + ": " + str(int(s.actions.size())) + " action lists for " + str(s.ranks) + " ranks");
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[size_t(r)];
    // Per (micro-batch, chunk): position of each kind of action, -1 when absent.
    std::map<std::pair<int, int>, std::map<Op, int>> seen;
    auto fail = [&](const PipelineAction& a, const std::string& why) {
      throw InputError(s.name() + ": rank " + str(r) + ", action " + a.describe(true) + ": " + why);
    };
    for (int i = 0; i < int(list.size()); ++i) {
      const PipelineAction& a = list[size_t(i)];
      if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches || a.chunk < 0 || a.chunk >= s.chunks)
        fail(a, "micro-batch or chunk out of range");
      auto& at = seen[{a.micro_batch, a.chunk}];
      if (at.count(a.op)) fail(a, "appears twice");
      at[a.op] = i;
      const int stage = s.virtual_stage(r, a.chunk);
      if (!a.is_compute()) {
        const bool to_next = a.op == Op::send_activation || a.op == Op::recv_gradient;
        const int expect = s.rank_of_stage(to_next ? stage + 1 : stage - 1);
        if ((to_next && stage == S - 1) || (!to_next && stage == 0) || a.peer != expect)
          fail(a, "no such neighbour (expected rank " + str(expect) + ")");
      }
    }
    for (int m = 0; m < s.micro_batches; ++m)
      for (int c = 0; c < s.chunks; ++c) {
        auto& at = seen[{m, c}];
        const PipelineAction f{Op::forward, m, c, -1};
        auto pos = [&](Op op) { return at.count(op) ? at[op] : -1; };
        if (pos(Op::forward) < 0) fail(f, "missing");
        const bool split = pos(Op::backward_input) >= 0 || pos(Op::backward_weight) >= 0;
        if (split && pos(Op::backward) >= 0) fail({Op::backward, m, c, -1}, "both B and I/W for one micro-batch");
        const Op first_back = split ? Op::backward_input : Op::backward;
        if (pos(first_back) < 0) fail({first_back, m, c, -1}, "missing");
        if (pos(first_back) < pos(Op::forward)) fail({first_back, m, c, -1}, "runs before its forward");
        if (split && pos(Op::backward_weight) < pos(Op::backward_input))
          fail({Op::backward_weight, m, c, -1}, pos(Op::backward_weight) < 0 ? "missing" : "runs before its I");
        const int stage = s.virtual_stage(r, c);
        auto need = [&](Op op, bool before_it, Op compute_op) {
          const int p = pos(op), q = pos(compute_op);
          const PipelineAction t{op, m, c, -1};
          if (p < 0) fail(t, "missing (" + PipelineAction{compute_op, m, c, -1}.describe(true) + " needs it)");
          if (before_it ? p > q : p < q) fail(t, before_it ? "comes after the action needing it" : "comes before its data exists");
        };
        if (stage > 0) need(Op::recv_activation, true, Op::forward), need(Op::send_gradient, false, first_back);
        if (stage < S - 1) need(Op::send_activation, false, Op::forward), need(Op::recv_gradient, true, first_back);
      }
  }
}

}  // namespace

ScheduleSimulation simulate_pipeline_schedule(const PipelineSchedule& s, const StageCosts& costs) {
  check_structure(s);
  const int p = s.ranks;
  ScheduleSimulation sim;
  sim.busy.assign(size_t(p), 0.0);
  sim.peak_in_flight.assign(size_t(p), 0);
  sim.messages.assign(size_t(p), 0);
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> clock(size_t(p), 0.0);
  std::vector<int> held(size_t(p), 0);
  std::map<int, double> arrival;  // tag -> when the message is available to its receiver
  auto cost = [&](Op op) {
    switch (op) {
      case Op::forward: return costs.forward;
      case Op::backward: return costs.backward_input + costs.backward_weight;
      case Op::backward_input: return costs.backward_input;
      case Op::backward_weight: return costs.backward_weight;
      default: return 0.0;
    }
  };
  // Run every rank as far as it can go; stop when all lists are done or none can move.
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s.actions[size_t(r)];
      for (size_t& i = next[size_t(r)]; i < list.size(); ++i) {
        const PipelineAction& a = list[i];
        double& t = clock[size_t(r)];
        if (a.op == Op::recv_activation || a.op == Op::recv_gradient) {
          auto it = arrival.find(s.tag(r, a));
          if (it == arrival.end()) break;  // its send has not run yet
          t = std::max(t, it->second);
          arrival.erase(it);
        } else if (a.op == Op::send_activation || a.op == Op::send_gradient) {
          arrival[s.tag(r, a)] = t;  // the receiver computes the same tag
          ++sim.messages[size_t(r)];
        } else {
          t += cost(a.op);
          sim.busy[size_t(r)] += cost(a.op);
          if (a.op == Op::forward) held[size_t(r)]++;
          if (a.op == Op::backward || a.op == Op::backward_weight) held[size_t(r)]--;
          sim.peak_in_flight[size_t(r)] = std::max(sim.peak_in_flight[size_t(r)], held[size_t(r)]);
        }
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    if (next[size_t(r)] < s.actions[size_t(r)].size())
      throw InputError(s.name() + ": deadlock: rank " + str(r) + " waits forever at action " +
                       s.actions[size_t(r)][next[size_t(r)]].describe(true) + " (no rank sends it)");
  if (!arrival.empty()) throw InputError(s.name() + ": " + str(int(arrival.size())) + " messages are sent but never received");
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  return sim;
}

double ScheduleSimulation::bubble_fraction() const {
  double total = 0;
  for (double b : busy) total += b;
  return makespan > 0 ? 1.0 - total / (double(busy.size()) * makespan) : 0.0;
}

double pipeline_bubble_formula(PipelineScheduleKind kind, int p, int m, int v, const StageCosts& c) {
  const double F = c.forward, I = c.backward_input, W = c.backward_weight, B = I + W;
  switch (kind) {
    case PipelineScheduleKind::gpipe:
    case PipelineScheduleKind::one_f_one_b: return double(p - 1) / double(m + p - 1);
    case PipelineScheduleKind::interleaved: return double(p - 1) / double(v * m + p - 1);
    case PipelineScheduleKind::zb_h1: {
      const double idle = double(p - 1) * (F + I - W);
      return idle / (double(m) * (F + B) + idle);
    }
  }
  return 0;
}

}  // namespace llama4d
