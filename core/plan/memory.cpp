// Per-rank memory of a plan, from the shapes alone. Notation: e bytes per element, C hidden,
// I SwiGLU width, V vocabulary, L layers, nh / nkv heads of hd; a rank's slice under tensor
// parallelism (core/model/tp_layout.h) holds nh/tp query heads, the kv_t key/value heads they read,
// I/tp SwiGLU columns and ceil(V/tp) vocabulary rows (the last rank what is left).
//
// Weight states (exact). A rank holds the units of its pipeline stages, each cut to its tensor
// slice: N_r elements. ZeRO shards every unit separately over the shard group (cp x dp, or cp x
// dp_shard under HSDP): sh_r elements, by the 512-aligned piece rule.
// With p, g, o bytes per parameter, gradient and optimizer element (fp32: 4, 4, 8):
//               params              grads                              optimizer  comm buffers
//   DP          p N_r               g N_r                              o N_r      0
//   ZeRO-1      p N_r               g N_r                              o sh_r     0
//   ZeRO-2      p N_r               g sh_r + 1..3 units' full grads    o sh_r     g sh_r
//   ZeRO-3      p sh_r + gathered   g sh_r + 1..3 units' full grads    o sh_r     g sh_r
//               (tied embeddings: + the embedding's full gradient, alive through the backward:
//               the head's backward writes it first, the embedding's completes it last)
//   --reduce-once (ZeRO-2/3)        g sh_r + full grads accumulating to the last micro-batch:
//                                   g N_r without pp (M > 1); under pp the chunks' overlap
//                                   along the schedule (accumulated_grads)
// ZeRO-2/3's comm buffer is the reduce-scatter's output, alive all step (ZeRO-1 reduces into the
// full gradient buffer in place); a pipeline rank adds the boundary tensors it has received and
// not yet consumed (below). ZeRO-3 keeps the embedding
// gathered from its forward to its backward, and otherwise the unit computing plus the one
// prefetched behind it (consecutive units of a chunk), or every unit of the stage (all its
// chunks) when parameters stay gathered from forward to backward (--keep-params).
//
// Other (exact): the RoPE tables, cos and sin [seq_len, hd/2] in fp32 (fp64 under fp64), on every
// rank that runs a block.
//
// Activations, scratch and a pipeline's receive buffers (exact): one micro-batch's levels on
// each chunk, pass by pass (core/plan/activations.cpp), played along the rank's schedule: the
// pipeline schedule's action list (core/parallel/pipeline_schedule.h), or F B per micro-batch
// without pipeline parallelism. A micro-batch chunk holds its activations from its F to the end
// of its B (or W); a received activation or gradient is held from its receive to the end of the
// action that reads it. Two things depend on thread timing, and come as the least and the most
// (play_schedule says why each bound holds): an input gradient sent to the previous stage is
// freed once its send has run (scratch_min .. scratch), and the virtual cluster's eager copy of
// a sent message once the peer has received it (comm_buffers_min .. comm_buffers).
#include "core/plan/memory.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/parallel/pipeline_schedule.h"
#include "core/plan/activations.h"

namespace llama4d {
namespace {

constexpr int64_t kPieceAlign = 512;  // core/parallel/shard_layout.h: kShardAlign

// The rank's coordinate on a group made of `dims` (mesh order, innermost first), and its size.
std::pair<int, int> group_position(const ParallelPlan& plan, const std::vector<std::string>& dims, int world_rank) {
  int rank = 0, size = 1;
  for (const MeshDim& d : plan.mesh)
    if (std::find(dims.begin(), dims.end(), d.name) != dims.end()) {
      rank += size * plan.coordinate(d.name, world_rank);
      size *= d.size;
    }
  return {rank, size};
}

// The units of each chunk a pipeline rank runs, in forward order (unit 0 the embedding, 1..L
// the blocks, L + 1 the norm + head): balanced layers per virtual stage unless --pp-layers.
std::vector<std::vector<int>> chunk_units(const ParallelPlan& plan, int L, int pp_rank) {
  const int pp = plan.size("pp"), v = pp > 1 ? plan.pp_chunks : 1, S = pp * v;
  std::vector<int> first(size_t(S + 1), 0);
  for (int s = 0; s < S; ++s)
    first[size_t(s + 1)] = plan.pp_layers.empty() ? int(int64_t(L) * (s + 1) / S) : first[size_t(s)] + plan.pp_layers[size_t(s)];
  std::vector<std::vector<int>> chunks;
  for (int s = pp_rank; s < S; s += pp) {
    std::vector<int> units;
    if (s == 0) units.push_back(0);
    for (int l = first[size_t(s)]; l < first[size_t(s + 1)]; ++l) units.push_back(1 + l);
    if (s == S - 1) units.push_back(L + 1);
    chunks.push_back(units);
  }
  return chunks;
}

// The most bytes of activations, scratch and received buffers one rank holds over a step.
// Comm buffers: what it received and has not consumed, and (virtual GPUs' eager sends) what it
// sent and its peer has not received yet: at the least none, at the most an activation until its
// gradient comes back (the peer received it before sending that), and a gradient until the peer's
// next activation to this rank arrives (or the step's end).
struct SchedulePlay {
  int64_t activations = 0, scratch = 0, scratch_min = 0, received = 0, received_min = 0;
  int64_t ring_sends = 0;  // ring attention's, at the most (ChunkMemory::ring_sends)
  // --reduce-once: full gradient elements alive at once (accumulated_grads).
  int64_t accumulated_grads = 0;
};

// --reduce-once with M > 1 micro-batches: a chunk's full gradients are allocated by its first
// pass that adds weight gradients (B, or W when the backward is split) and freed by the end of
// its pass of micro-batch M-1, which reduces them (the pass waits for its reductions). Nothing is
// freed inside a first pass, so the most elements alive is reached at the end of one: exact.
// Without pipelining it is every unit; an interleaved rank's chunk 1 may finish its last pass
// before chunk 0 starts its first, and then they are never alive together.
int64_t accumulated_grads(const std::vector<PipelineAction>& actions, const std::vector<int64_t>& chunk_elements, int M) {
  using Op = PipelineAction::Op;
  std::vector<uint8_t> started(chunk_elements.size(), 0);
  int64_t alive = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.op != Op::backward && a.op != Op::backward_weight) continue;
    const size_t c = size_t(a.chunk);
    if (!started[c]) {
      started[c] = 1;
      alive += chunk_elements[c];
      peak = std::max(peak, alive);
    }
    if (a.micro_batch == M - 1) alive -= chunk_elements[c];
  }
  return peak;
}

SchedulePlay play_schedule(const StepShape& s, int t, int pp_rank, const std::vector<std::vector<int>>& chunks) {
  using Op = PipelineAction::Op;
  const ParallelPlan& plan = s.plan;
  const int pp = plan.size("pp"), v = int(chunks.size()), M = int(s.micro_batches());
  std::vector<ChunkMemory> chunk;
  for (const std::vector<int>& units : chunks) chunk.push_back(chunk_memory(s, t, units.front(), units.back() + 1));
  PipelineSchedule schedule;
  if (pp > 1) {
    schedule = make_pipeline_schedule(plan.schedule, pp, M, plan.pp_chunks);
  } else {
    schedule.actions.resize(1);
    for (int m = 0; m < M; ++m) {
      schedule.actions[0].push_back({Op::forward, m, 0, -1});
      schedule.actions[0].push_back({Op::backward, m, 0, -1});
    }
  }
  const std::vector<PipelineAction>& actions = schedule.actions[size_t(pp_rank)];
  // When, at the latest, each eager copy of a sent input gradient is freed: the peer received it
  // before it sent us any activation later in its list, so by the end of our receive of the first
  // such activation (the index into `actions`; none: the step's end).
  std::vector<int> copy_freed_at(actions.size(), -1);
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    if (a.op != Op::send_gradient) continue;
    const int tag = schedule.tag(pp_rank, a);
    const std::vector<PipelineAction>& peer = schedule.actions[size_t(a.peer)];
    size_t j = 0;
    while (j < peer.size() && !(peer[j].op == Op::recv_gradient && peer[j].peer == pp_rank &&
                                schedule.tag(a.peer, peer[j]) == tag))
      ++j;
    while (j < peer.size() && !(peer[j].op == Op::send_activation && peer[j].peer == pp_rank)) ++j;
    if (j == peer.size()) continue;
    const int arrives = schedule.tag(a.peer, peer[j]);
    for (size_t k = i + 1; k < actions.size(); ++k)
      if (actions[k].op == Op::recv_activation && actions[k].peer == a.peer && schedule.tag(pp_rank, actions[k]) == arrives) {
        copy_freed_at[k] = int(i);
        break;
      }
  }

  SchedulePlay out;
  for (const ChunkMemory& c : chunk) out.ring_sends = std::max(out.ring_sends, c.ring_sends);
  const std::vector<int64_t> units = unit_elements(s.model, plan.size("tp"), t);
  std::vector<int64_t> chunk_elements;
  for (const std::vector<int>& c : chunks) {
    int64_t n = 0;
    for (int u : c) n += units[size_t(u)];
    chunk_elements.push_back(n);
  }
  out.accumulated_grads = accumulated_grads(actions, chunk_elements, M);
  int64_t activations = 0, received = 0;
  // Sent input gradients not yet freed (scratch). The earliest: before the next compute action.
  // The latest: the send task is queued on the rank's one FIFO comm stream, so it has run once a
  // later receive returned; the next compute action after that frees it.
  int64_t held_min = 0, held_max = 0;
  int64_t sent_gradients = 0;  // eager copies of input gradients the peer may not have received
  std::vector<int64_t> inbox(size_t(M * v), 0), sent_activation(size_t(M * v), 0), sent_gradient(actions.size(), 0);
  int64_t sent_activations = 0;  // the sum of sent_activation: copies the peer has not taken yet
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const size_t k = size_t(a.micro_batch * v + a.chunk);
    const ChunkMemory& c = chunk[size_t(a.chunk)];
    switch (a.op) {
      case Op::recv_activation:
      case Op::recv_gradient:
        // Allocated before the wait; then what the wait proves received is freed.
        inbox[k] = c.boundary;
        received += c.boundary;
        out.received_min = std::max(out.received_min, received);
        out.received = std::max(out.received, received + sent_activations + sent_gradients);
        if (a.op == Op::recv_gradient) {  // the peer took it before sending this
          sent_activations -= sent_activation[k];
          sent_activation[k] = 0;
        }
        if (copy_freed_at[i] >= 0) sent_gradients -= sent_gradient[size_t(copy_freed_at[i])];
        held_max = 0;  // earlier sends have run: the next compute action frees them
        continue;
      case Op::send_activation:
        sent_activations += c.boundary - sent_activation[k];
        sent_activation[k] = c.boundary;
        break;
      case Op::send_gradient:
        sent_gradient[i] = c.boundary;
        sent_gradients += c.boundary;
        break;
      default: break;
    }
    out.received = std::max(out.received, received + sent_activations + sent_gradients);
    if (!a.is_compute()) continue;
    held_min = 0;  // the earliest: every earlier send has run
    const PassLevel& level = a.op == Op::forward           ? c.forward
                             : a.op == Op::backward        ? c.backward
                             : a.op == Op::backward_input  ? c.input
                                                           : c.weight;
    const int64_t scratch = a.op == Op::forward           ? c.scratch_forward
                            : a.op == Op::backward        ? c.scratch_backward
                            : a.op == Op::backward_input  ? c.scratch_input
                                                          : c.scratch_weight;
    out.activations = std::max(out.activations, activations - level.start + level.peak);
    activations += level.end - level.start;
    out.scratch = std::max(out.scratch, held_max + scratch);
    out.scratch_min = std::max(out.scratch_min, held_min + scratch);
    if (a.op == Op::backward || a.op == Op::backward_input) held_min += c.input_grad, held_max += c.input_grad;
    received -= inbox[k];
    inbox[k] = 0;
  }
  return out;
}

}  // namespace

std::vector<int64_t> unit_elements(const LlamaConfig& cfg, int tp, int t) {
  const int64_t C = cfg.hidden_size, hd = cfg.head_dim, V = cfg.vocab_size, L = cfg.num_hidden_layers;
  const int64_t q = cfg.num_attention_heads / tp * hd;
  const int64_t kv = kv_heads_of_tp_rank(cfg, tp, t) * hd;
  const int64_t ffn = cfg.intermediate_size / tp;
  const int64_t rows_each = (V + tp - 1) / tp, vocab = std::min(rows_each, V - t * rows_each);
  std::vector<int64_t> units;
  units.push_back(vocab * C);  // embedding rows
  const int64_t block = C + C * q + 2 * C * kv + q * C + C + 3 * C * ffn;  // ln1 q k v o ln2 gate up down
  for (int64_t l = 0; l < L; ++l) units.push_back(block);
  units.push_back(C + (cfg.tie_word_embeddings ? 0 : vocab * C));  // final norm (+ untied head)
  return units;
}

int64_t owned_elements(int64_t len, int n, int r) {
  const int64_t piece = ((len + n - 1) / n + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  return std::max<int64_t>(0, std::min(len, (r + 1) * piece) - std::min(len, r * piece));
}

std::vector<MemoryPrediction> predict_memory(const StepShape& s) {
  const ParallelPlan& plan = s.plan;
  const LlamaConfig& cfg = s.model;
  if (cfg.tie_word_embeddings && plan.size("pp") > 1)
    throw InputError("planner: tied embeddings across pipeline stages are not modelled");
  if (plan.bf16_grad_reduce)
    throw InputError("planner: the bf16 copies of gradient reductions (--grad-reduce-in-bf16) are not modelled");
  const int L = int(cfg.num_hidden_layers), tp = plan.size("tp");
  const Precision& pr = s.precision;
  std::vector<std::string> shard_dims = {"cp", plan.hsdp() ? "dp_shard" : "dp"};
  const int stage = int(plan.zero);

  std::vector<MemoryPrediction> out;
  std::map<std::pair<int, int>, SchedulePlay> plays;  // by (tp rank, pp rank): the rest changes nothing here
  for (int w = 0; w < plan.world_size(); ++w) {
    MemoryPrediction m;
    m.world_rank = w;
    const int t = plan.coordinate("tp", w);
    const std::vector<int64_t> units = unit_elements(cfg, tp, t);
    const auto [r, n] = group_position(plan, shard_dims, w);
    const std::vector<std::vector<int>> chunks = chunk_units(plan, L, plan.coordinate("pp", w));
    int64_t N = 0, sh = 0, embedding = 0, gathered = 0;
    std::vector<int64_t> held;
    for (const std::vector<int>& chunk : chunks) {
      int64_t pair = 0, all = 0;
      for (size_t i = 0; i < chunk.size(); ++i) {
        const int64_t len = units[size_t(chunk[i])];
        N += len;
        sh += owned_elements(len, n, r);
        held.push_back(len);
        if (chunk[i] == 0) {
          embedding = len;
          continue;
        }
        all += len;
        const bool next_gathers = plan.prefetch && i + 1 < chunk.size();
        pair = std::max(pair, len + (next_gathers ? units[size_t(chunk[i + 1])] : 0));
      }
      // Kept parameters stay gathered to the step's end under pp (every chunk of an
      // interleaved rank at once), else from a micro-batch's forward to its backward.
      gathered = plan.reshard_after_forward ? std::max(gathered, pair) : gathered + all;
    }
    // A tied embedding's full gradient is written first (by the head's backward, which reads the
    // embedding's rows) and final last (after the embedding's own backward): under ZeRO-2/3 it is
    // alive beside whichever other units' full gradients are, so it is counted on top of them.
    int64_t whole_throughout = 0;
    if (cfg.tie_word_embeddings && embedding > 0) {
      whole_throughout = embedding;
      held.erase(std::find(held.begin(), held.end(), embedding));
    }
    std::sort(held.rbegin(), held.rend());
    const int64_t largest = whole_throughout + (held.empty() ? 0 : held[0]);
    int64_t three = whole_throughout;
    for (size_t i = 0; i < held.size() && i < 3; ++i) three += held[i];

    m.params = pr.param * (stage == 3 ? sh + embedding + gathered : N);
    // Full gradients alive at once: below ZeRO-2 all of them; a few units while each
    // micro-batch reduces them; with --reduce-once and several micro-batches, those that
    // accumulate to their last micro-batch (one micro-batch reduces and frees them as they come).
    const bool accumulate = plan.reduce_once && s.micro_batches() > 1;
    const std::pair<int, int> key{t, plan.coordinate("pp", w)};
    auto played = plays.find(key);
    if (played == plays.end()) played = plays.emplace(key, play_schedule(s, t, key.second, chunks)).first;
    const int64_t full_max = stage < 2 ? N : accumulate ? played->second.accumulated_grads : three;
    const int64_t full_min = stage < 2 ? N : accumulate ? played->second.accumulated_grads : largest;
    m.grads = pr.grad * (full_max + (stage >= 2 ? sh : 0));
    m.grads_min = pr.grad * (full_min + (stage >= 2 ? sh : 0));
    m.optimizer = pr.optimizer * (stage >= 1 ? sh : N);
    m.comm_buffers = stage >= 2 ? pr.grad * sh : 0;
    // RoPE tables for every position of the sequence (a context-parallel rank reads positions
    // from both ends of it), made by the forward before its first block.
    const bool has_block = std::any_of(chunks.begin(), chunks.end(), [&](const std::vector<int>& c) {
      return std::any_of(c.begin(), c.end(), [&](int u) { return u >= 1 && u <= L; });
    });
    m.other = has_block ? pr.table * 2 * s.seq_len * (cfg.head_dim / 2) : 0;

    m.activations = played->second.activations;
    m.scratch = played->second.scratch;
    m.scratch_min = played->second.scratch_min;
    m.comm_buffers_min = m.comm_buffers + played->second.received_min;
    m.comm_buffers += played->second.received + played->second.ring_sends;
    out.push_back(m);
  }
  return out;
}

}  // namespace llama4d
