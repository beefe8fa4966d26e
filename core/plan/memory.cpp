// Per-rank memory of a plan, from the shapes alone. Notation: e bytes per element, C hidden,
// I SwiGLU width, V vocabulary, L layers, nh / nkv heads of hd; a rank's slice under tensor
// parallelism (core/model/tp_layout.h) holds nh/tp query heads, max(nkv/tp, 1) key/value heads,
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
// ZeRO-2/3's comm buffer is the reduce-scatter's output, alive all step (ZeRO-1 reduces into the
// full gradient buffer in place); a pipeline rank adds the [BT, C] boundary tensors it has
// received and not yet consumed (one per micro-batch in flight, estimated). ZeRO-3 keeps the embedding
// gathered from its forward to its backward, and otherwise the unit computing plus the one
// prefetched behind it (consecutive units of a chunk), or every unit of the stage when
// parameters stay gathered from forward to backward (--keep-params).
//
// Activations and scratch (one micro-batch of B rows x T tokens, BT = B T):
//   per block  n1, n2 [BT, C], rstd1, rstd2 [BT], q, att [BT, nh hd], k, v [BT, nkv hd],
//              lse [BT, nh], h [BT, C], gate, up, act [BT, I]
//   the model  tokens and targets (int32), the residual stream x_0..x_L [BT, C], and the head's
//              normed input [BT, C], rstd [BT], logits [BT, V] and per-token losses [BT]
//   scratch    the backward's residual gradient [BT, C], one block's temporaries (dn dh dq dk
//              dv datt dgate dup dact) and the head's dlogits [BT, V] and dn [BT, C]
//   checkpointing  selective keeps q k v h gate up of each block and rebuilds the rest of one
//              block in its backward; full keeps only the residual stream and rebuilds a whole
//              block (core/model/checkpointing.h); every:k (k > 1) is estimated
// Under tp, cp and pp the same formulas run on the rank's share (BT / cp tokens, its heads and
// columns, the residual rows / tp under sequence parallelism, its stages' units times the
// micro-batches a schedule keeps in flight): an estimate, not held to the allocator's bytes.
#include "core/plan/memory.h"

#include <algorithm>

#include "core/error.h"

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

}  // namespace

std::vector<int64_t> unit_elements(const LlamaConfig& cfg, int tp, int t) {
  const int64_t C = cfg.hidden_size, hd = cfg.head_dim, V = cfg.vocab_size, L = cfg.num_hidden_layers;
  const int64_t q = cfg.num_attention_heads / tp * hd;
  const int64_t kv = std::max<int64_t>(cfg.num_key_value_heads / tp, 1) * hd;
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
  const int L = int(cfg.num_hidden_layers), tp = plan.size("tp"), cp = plan.size("cp");
  const Precision& pr = s.precision;
  const int64_t e = pr.activation, C = cfg.hidden_size, hd = cfg.head_dim;
  const bool sp = tp > 1 && plan.sequence_parallel;
  std::vector<std::string> shard_dims = {"cp", plan.hsdp() ? "dp_shard" : "dp"};
  const int stage = int(plan.zero);

  std::vector<MemoryPrediction> out;
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
      gathered = std::max(gathered, plan.reshard_after_forward ? pair : all);
    }
    std::sort(held.rbegin(), held.rend());
    const int64_t largest = held.empty() ? 0 : held[0];
    int64_t three = 0;
    for (size_t i = 0; i < held.size() && i < 3; ++i) three += held[i];

    m.params = pr.param * (stage == 3 ? sh + embedding + gathered : N);
    m.grads = pr.grad * (stage >= 2 ? sh + three : N);
    m.grads_min = pr.grad * (stage >= 2 ? sh + largest : N);
    m.optimizer = pr.optimizer * (stage >= 1 ? sh : N);
    m.comm_buffers = stage >= 2 ? pr.grad * sh : 0;

    // Activations of one micro-batch on this rank's share, times the micro-batches in flight.
    const int64_t BT = s.micro_rows() * s.seq_len / cp, rows = sp ? (BT * (t + 1) / tp - BT * t / tp) : BT;
    const int64_t q = cfg.num_attention_heads / tp * hd, kv = std::max<int64_t>(cfg.num_key_value_heads / tp, 1) * hd;
    const int64_t nh = cfg.num_attention_heads / tp, I = cfg.intermediate_size / tp;
    const int64_t vocab = units[0] / C;
    int64_t blocks = 0;
    bool first = false, last = false;
    for (const std::vector<int>& chunk : chunks)
      for (int u : chunk) {
        blocks += u >= 1 && u <= L;
        first = first || u == 0;
        last = last || u == L + 1;
      }
    // One block: what its backward reads, split into what selective checkpointing keeps (q k v,
    // h, gate, up) and what it recomputes (n1 rstd1 att lse n2 rstd2 act).
    const int64_t kept = e * (BT * q + 2 * BT * kv + rows * C + 2 * BT * I);
    const int64_t recomputed = e * (BT * C + rows + BT * q + BT * nh + BT * C + rows + BT * I);
    const int64_t block = kept + recomputed;
    const Checkpointing& ac = plan.ac;
    const bool full = ac.kind == Checkpointing::Kind::every;
    const int64_t tokens = first ? BT * 4 : 0, inputs = first ? 2 * BT * 4 : 0;  // int32 tokens, targets
    const int64_t residual = e * (blocks + (last ? 1 : 0)) * rows * C;          // x_0 .. x_L
    const int64_t head = last ? e * BT * (C + 1 + vocab + 1) : 0;                // n rstd logits losses
    const int pp = plan.size("pp"), m_batches = int(s.micro_batches());
    const int in_flight = pp == 1 ? 1
                          : plan.schedule == PipelineScheduleKind::gpipe
                              ? m_batches
                              : std::min(m_batches, pp - plan.coordinate("pp", w));
    // Without checkpointing the peak is the end of the forward. With it, either that (every
    // block's kept part and the head) or a block's backward (the kept parts, the block rebuilt,
    // the targets already consumed by the loss), whichever is larger.
    int64_t per_micro_batch = inputs + residual + blocks * block + head;
    if (ac.kind == Checkpointing::Kind::selective)
      per_micro_batch = std::max(inputs + residual + blocks * kept + head, tokens + residual + blocks * kept + recomputed);
    if (full)  // every:k keeps only the inputs of blocks 0, k, 2k, ... and rebuilds k blocks at once
      per_micro_batch = std::max(inputs + residual + head, tokens + residual + ac.every * block);
    m.activations = in_flight * per_micro_batch;
    if (pp > 1) m.comm_buffers += int64_t(in_flight) * e * BT * C;
    m.scratch = e * BT * (C + (2 * C + 2 * q + 2 * kv + 3 * I) + (last ? vocab + C : 0));
    m.estimated = tp > 1 || pp > 1 || (full && ac.every > 1);
    out.push_back(m);
  }
  return out;
}

}  // namespace llama4d
