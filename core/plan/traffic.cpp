// What one optimizer step sends, per communication group, from formulas only.
//
// Nothing here runs a strategy or calls its code (ShardLayout, tp_layout, pipeline_layout):
// every rule is re-derived below from the documented formulas, so tests/plan/traffic_test.cpp
// can hold this independent account against the bytes the virtual cluster's traffic log
// measures, collective by collective.
//
// ---- What a collective costs (core/comm/comm_model.cpp) --------------------------------------
// For a group of n ranks and elements of e bytes, summed over the ranks of the group:
//   reduce-scatter / all-gather with per-rank counts c_r:  (n-1)·Σc_r·e   (each rank's block
//       goes to the n-1 others, directly or around the ring: the same total either way)
//   all-reduce of c elements = reduce-scatter + all-gather of split_counts(c):  2(n-1)·c·e
//       (the split counts add up to c, even when c = 1 leaves some ranks an empty block)
//   send: its bytes (its recv: 0).
// Calls are counted as the log's summary counts them: a collective once per group instance
// (by its group rank 0), a send once (by its sender); receives are not calls.
// Groups of one rank move nothing, so they are left out; a key appears only for a group that
// sends bytes (every group of more than one rank here does).
//
// ---- Shapes -------------------------------------------------------------------------------
// C hidden, I SwiGLU width, nh/nkv heads of hd, V vocabulary, L layers; a micro-batch of B rows
// of T = seq_len/cp tokens per context-parallel rank (BT = B·T rows), M micro-batches per step.
// Tensor-parallel rank t of tp holds nh/tp query heads, the kv_t key/value heads they read
// (kv_heads_of_tp_rank: nkv/tp, or 1-2 when tp > nkv and a head is replicated), I/tp SwiGLU
// columns and ceil(V/tp) vocabulary rows (the last rank what is left). Its units (the flat
// segments ZeRO shards and DP buckets):
//   embedding  vocab_t·C       block  2C + 2·C·(nh/tp)·hd + 2·C·kv_t·hd + 3·C·I/tp
//   head       C (+ vocab_t·C unless the LM head is tied to the embedding)
// Sequence parallelism gives tp rank t the rows [BT·t/tp, BT·(t+1)/tp) of the residual stream.
//
// ---- Tensor parallelism: per micro-batch on every tp group (X = BT·C elements) --------------
//   without SP                                   with SP (same bytes: AR = RS + AG)
//   embedding fwd   AR X                         RS X
//   block fwd       2 AR X (o_proj, down_proj)   2 AG X (n1, n2) + 2 RS X (o_proj, down_proj)
//   head fwd        3 AR BT (loss max, Σexp, target logit)  + AG X (normed rows) before them
//   head bwd        AR X (input gradient)        RS X + AR C (final norm gain)
//   block bwd       2 AR X (f's input grads)     2 AG X + 2 RS X + 2 AR C (the norms' gains)
//                   + AR 2·nkv·hd·C when a key/value head is replicated (tp > nkv)
//   embedding bwd   -                            AG X (every row reaches every vocab slice)
// Activations and their gradients travel at the activation width; the norm gains' and the KV
// replicas' sums are weight gradients, at the gradient width (they differ under bf16).
// Activation checkpointing reruns forward communication in backward, per block:
//   selective  recomputes n1, n2 and the attention core: SP's 2 AG X (none without SP)
//   full       reruns the block's forward up to, not including, down_proj: AR X (o_proj), or
//              with SP 2 AG X + RS X. every:k reruns a segment of k blocks: the top one like
//              full, the others whole (their output feeds the next): 2 AR X / 2 AG + 2 RS.
//
// ---- Context parallelism: per block and micro-batch on every cp group ------------------------
// K and V of a rank: 2n elements, n = BT·kv_t·hd.
//   allgather  fwd AG 2n per rank; bwd AG 2n again + RS 2n per rank: (cp-1)·cp·2n·e each
//   ring       fwd cp-1 passes, each rank sends 2n; bwd cp-1 passes of 4n (K, V, dK, dV)
//              and one last pass of 2n (dK, dV home)
// Every recompute of a block (selective, full, every:k) reruns its forward attention.
// Document masks change which pairs are computed, never what is sent.
//
// ---- Pipeline parallelism: per pp group -----------------------------------------------------
// S = pp·v virtual stages, S-1 boundaries; per micro-batch and boundary one activation send
// forward and one gradient send backward, each of the rank's residual rows·C (BT·C, or its SP
// rows). The schedule (gpipe, 1f1b, interleaved, zb-h1) only orders them. After backward:
// loss AR of 2 f64, the grad-norm partials AR (every unit's chunk partials, one f64 per 512
// elements of the slice's segment), and with tp an AR of 1 f64 for the replicas' share. Tied
// embeddings: the first and last stage all-reduce the embedding gradient (DP: the whole slice;
// ZeRO: each shard rank's piece) in the group "tied embedding (...)".
//
// ---- Data parallelism: per (tp rank, pp rank) slice ------------------------------------------
// The data group is cp x dp (all data ranks and context ranks share weights). D its size; under
// HSDP the shard group is cp x dp_shard (N ranks) and dp_replicate (R) replicas of it.
//   DP       per held unit, AR of its segment at the last micro-batch's backward
//   ZeRO-1   per held unit, RS of its segment at the last micro-batch, AG of the updated pieces
//   ZeRO-2   per held unit, RS every micro-batch (--reduce-once: at the last only), AG of the
//            updated pieces
//   ZeRO-3   RS every micro-batch (--reduce-once: at the last only), plus AG of a unit's parameters each time it is needed and not
//            held: blocks 2M times (freed after forward and after backward), embedding and
//            head M times (kept from forward to backward: a stage's backward of micro-batch m
//            frees them, whatever the schedule, and the next forward or backward gathers
//            again). --keep-params: M per unit, or once per step under pp (kept to the end).
//   HSDP     after each RS, AR of the rank's piece over dp_replicate (skipped when empty)
//   then     loss AR 2 f64 over the data group; ZeRO: AG of the grad-norm chunk partials of each
//            rank's pieces (f64) over the shard group, and with tp an AR of 1 f64 there; tp: AR
//            of 1 f64 over tp (each slice's sum of squares).
// ZeRO pieces (core/parallel/shard_layout.h): a segment of m elements is cut into pieces of
// P = ceil(m/N) rounded up to a multiple of 512; rank r owns [r·P, (r+1)·P) clipped to m. The
// pieces add up to m, so the padding changes no gradient or parameter byte, only the piece
// sizes: the grad-norm partial counts, the HSDP all-reduces and which of them are empty.
#include "core/plan/traffic.h"

#include <algorithm>
#include <set>
#include <vector>

namespace llama4d {

namespace {

constexpr int64_t kNormChunkElems = 512;  // core/optim/segmented_norm.h's chunk (and ZeRO's piece alignment)
constexpr int64_t kF64 = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t norm_partials(int64_t numel) { return ceil_div(numel, kNormChunkElems); }

// Bytes a whole group sends.
int64_t all_reduce_bytes(int64_t n, int64_t count, int64_t e) { return 2 * (n - 1) * count * e; }
int64_t scatter_gather_bytes(int64_t n, int64_t total, int64_t e) { return (n - 1) * total * e; }

// Sizes of the ZeRO pieces of a segment of m elements over n shard ranks.
std::vector<int64_t> piece_sizes(int64_t m, int64_t n) {
  const int64_t p = ceil_div(ceil_div(m, n), kNormChunkElems) * kNormChunkElems;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < n; ++r) out.push_back(std::clamp(m - r * p, int64_t(0), p));
  return out;
}

class Tally {
 public:
  void add(const std::string& group, int64_t size, int64_t bytes, int64_t calls) {
    if (size <= 1) return;
    GroupTraffic& g = map_[group];
    g.bytes_sent += bytes;
    g.calls += calls;
  }
  std::map<std::string, GroupTraffic> take() { return std::move(map_); }

 private:
  std::map<std::string, GroupTraffic> map_;
};

// The step's numbers, named once.
struct Step {
  const StepShape& s;
  int64_t tp, cp, pp, chunks, dp_shard, dp_rep, world;
  int64_t C, I, hd, nh, nkv, V, L;
  int64_t e, e_param, e_grad;  // bytes of an activation, a parameter, a gradient element
  int64_t e_reduce;            // bytes of a gradient element in the data group's reductions
  int64_t B, T, M;
  bool sp, tied;
  std::string data_name, shard_name;

  explicit Step(const StepShape& shape) : s(shape) {
    const ParallelPlan& p = s.plan;
    const LlamaConfig& m = s.model;
    tp = p.size("tp"), cp = p.size("cp"), pp = p.size("pp"), chunks = pp > 1 ? p.pp_chunks : 1;
    dp_shard = p.dp_shard(), dp_rep = p.dp_replicate(), world = tp * cp * pp * dp_shard * dp_rep;
    C = m.hidden_size, I = m.intermediate_size, hd = m.head_dim, nh = m.num_attention_heads;
    nkv = m.num_key_value_heads, V = m.vocab_size, L = m.num_hidden_layers;
    e = s.precision.activation, e_param = s.precision.param, e_grad = s.precision.grad;
    // bf16 gradient reductions move 2 bytes; the tensor-parallel sums inside a backward (norm
    // gains, replicated key/value heads) stay at the gradients' width.
    e_reduce = p.bf16_grad_reduce ? 2 : e_grad;
    B = s.micro_rows(), T = s.seq_len / cp, M = s.micro_batches();
    sp = tp > 1 && p.sequence_parallel;
    tied = m.tie_word_embeddings;
    name_groups();
  }

  int64_t BT() const { return B * T; }
  int64_t dp() const { return dp_shard * dp_rep; }
  int64_t data_size() const { return cp * dp(); }
  int64_t shard_size() const { return cp * dp_shard; }
  bool hsdp() const { return dp_rep > 1; }
  int zero() const { return int(s.plan.zero); }

  // ---- The tensor-parallel slice of tp rank t ----
  int64_t kv_heads(int64_t t) const { return kv_heads_of_tp_rank(s.model, tp, t); }
  int64_t vocab_rows(int64_t t) const {
    const int64_t per = ceil_div(V, tp);
    return std::min(per, V - t * per);
  }
  int64_t block_numel(int64_t t) const {
    return 2 * C + 2 * C * (nh / tp) * hd + 2 * C * kv_heads(t) * hd + 3 * C * (I / tp);
  }
  int64_t unit_numel(int64_t u, int64_t t) const {
    if (u == 0) return vocab_rows(t) * C;
    if (u == L + 1) return C + (tied ? 0 : vocab_rows(t) * C);
    return block_numel(t);
  }
  // Residual-stream rows of tp rank t (what a pipeline boundary carries).
  int64_t residual_rows(int64_t t) const { return sp ? BT() * (t + 1) / tp - BT() * t / tp : BT(); }

  // ---- Pipeline stages: layers of virtual stage v, and the units pp rank r holds ----
  std::vector<int64_t> stage_layers() const {
    const int64_t S = pp * chunks;
    std::vector<int64_t> out;
    if (!s.plan.pp_layers.empty()) {
      for (int n : s.plan.pp_layers) out.push_back(n);
      return out;
    }
    for (int64_t v = 0; v < S; ++v) out.push_back(L * (v + 1) / S - L * v / S);
    return out;
  }
  // [first block, end block) of each virtual stage.
  std::vector<std::pair<int64_t, int64_t>> stage_blocks() const {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t at = 0;
    for (int64_t n : stage_layers()) {
      out.push_back({at, at + n});
      at += n;
    }
    return out;
  }
  // Units (0 embedding, 1..L blocks, L+1 head) held by pp rank r: its chunks' stages r, pp + r,
  // ...; the last stage also holds a tied embedding's copy (its head reads it).
  std::vector<int64_t> held_units(int64_t r) const {
    const auto stages = stage_blocks();
    const int64_t S = int64_t(stages.size());
    std::set<int64_t> units;
    for (int64_t v = r; v < S; v += pp) {
      if (v == 0) units.insert(0);
      for (int64_t l = stages[size_t(v)].first; l < stages[size_t(v)].second; ++l) units.insert(l + 1);
      if (v == S - 1) units.insert(L + 1);
    }
    if (tied && pp > 1 && r == pp - 1) units.insert(0);
    return {units.begin(), units.end()};
  }
  // The last stage's tied copy of the embedding (counted by the first stage only).
  bool is_copy(int64_t u, int64_t r) const { return u == 0 && tied && pp > 1 && r == pp - 1; }

  // ---- Group names, as ParallelTrainer builds them (DeviceMesh joins dims in mesh order) ----
  void name_groups() {
    std::vector<std::string> dims;
    bool names_data = false;
    for (const MeshDim& d : s.plan.mesh) {
      dims.push_back(d.name);
      names_data = names_data || d.name == "dp" || d.name == "dp_shard" || d.name == "dp_replicate";
    }
    if (!names_data) dims.push_back("dp");  // a mesh without data dims gets dp=1 last
    auto join = [&](const std::set<std::string>& wanted) {
      std::string out;
      for (const std::string& d : dims)
        if (wanted.count(d)) out += (out.empty() ? "" : "+") + d;
      return out;
    };
    std::set<std::string> data;
    for (const std::string& d : s.plan.data_dims()) data.insert(d);
    if (data.empty()) data.insert("dp");
    if (cp > 1) data.insert("cp");
    data_name = data_size() == world ? "world" : join(data);
    shard_name = !hsdp() ? data_name : cp > 1 ? join({"cp", "dp_shard"}) : "dp_shard";
  }
  std::string tied_name() const { return "tied embedding (pp ranks 0, " + std::to_string(pp - 1) + ")"; }
};

// ---- Forward and backward: tensor and context parallelism -----------------------------------

// Bytes and calls of tp collectives, added up point by point.
struct TpCost {
  int64_t bytes = 0, calls = 0;
  void all_reduce(const Step& p, int64_t count) { bytes += all_reduce_bytes(p.tp, count, p.e), calls += 1; }
  // A weight gradient summed over the group (SP's norm gains, replicated KV heads): gradient width
  // (fp32 under Llama 3's mixed precision, where activations are bf16).
  void grad_sum(const Step& p, int64_t count) { bytes += all_reduce_bytes(p.tp, count, p.e_grad), calls += 1; }
  void scatter_gather(const Step& p, int64_t total) { bytes += scatter_gather_bytes(p.tp, total, p.e), calls += 1; }
  // A row-parallel output (o_proj, down_proj), a column-parallel input gradient, the embedding.
  void partial_sum(const Step& p) { p.sp ? scatter_gather(p, p.BT() * p.C) : all_reduce(p, p.BT() * p.C); }
  // A column-parallel input (n1, n2, the head's n), a row-parallel output gradient: SP only.
  void gather_rows(const Step& p) {
    if (p.sp) scatter_gather(p, p.BT() * p.C);
  }
};

// The tp points of one block's forward: `whole` with down_proj's, else up to it (a recompute
// whose output is not needed again stops before down_proj).
void block_forward_tp(const Step& p, TpCost& c, bool whole) {
  c.gather_rows(p);   // n1
  c.partial_sum(p);   // o_proj
  c.gather_rows(p);   // n2
  if (whole) c.partial_sum(p);  // down_proj
}

// How many times a block's forward attention reruns in backward, and its tp points with it.
struct Recompute {
  int64_t attentions = 0;  // per micro-batch, all blocks
  TpCost tp;
};

Recompute recomputation(const Step& p) {
  Recompute r;
  const Checkpointing& ac = p.s.plan.ac;
  if (ac.kind == Checkpointing::Kind::none) return r;
  if (ac.kind == Checkpointing::Kind::selective) {
    r.attentions = p.L;
    for (int64_t l = 0; l < p.L; ++l) {
      r.tp.gather_rows(p);  // n1
      r.tp.gather_rows(p);  // n2
    }
    return r;
  }
  // every:k (full = every:1): per stage's block range [f, e), block l's input is kept when
  // l == f or l % k == 0; a segment's top block (the next one's input kept, or the range's last)
  // reruns up to down_proj, the others whole.
  for (const auto& [f, end] : p.stage_blocks())
    for (int64_t l = f; l < end; ++l) {
      const bool top = l + 1 == end || (l + 1) % ac.every == 0;
      block_forward_tp(p, r.tp, !top);
      r.attentions += 1;
    }
  return r;
}

void tensor_parallel(const Step& p, Tally& out) {
  if (p.tp == 1) return;
  TpCost mb;  // one micro-batch over every block, the embedding and the head
  mb.partial_sum(p);  // embedding forward (vocab-parallel lookups summed)
  for (int64_t l = 0; l < p.L; ++l) block_forward_tp(p, mb, true);
  mb.gather_rows(p);  // head input
  for (int i = 0; i < 3; ++i) mb.all_reduce(p, p.BT());  // loss: max, sum of exp, target logit
  mb.partial_sum(p);  // head input gradient
  if (p.sp) mb.grad_sum(p, p.C);  // final norm gain
  for (int64_t l = 0; l < p.L; ++l) {
    mb.gather_rows(p);  // down_proj output gradient
    mb.partial_sum(p);  // MLP input gradient
    mb.gather_rows(p);  // o_proj output gradient
    mb.partial_sum(p);  // attention input gradient
    if (p.sp) mb.grad_sum(p, p.C), mb.grad_sum(p, p.C);  // both norms' gains
    if (p.tp > p.nkv) mb.grad_sum(p, 2 * p.nkv * p.hd * p.C);  // replicated key/value heads
  }
  mb.gather_rows(p);  // embedding output gradient
  const TpCost again = recomputation(p).tp;
  // Every tp group (pp·cp·dp of them) runs the units of its pp rank; together, all units once
  // per micro-batch for each of the cp·dp data coordinates.
  const int64_t n = p.cp * p.dp() * p.M;
  out.add("tp", p.tp, n * (mb.bytes + again.bytes), n * (mb.calls + again.calls));
}

void context_parallel(const Step& p, Tally& out) {
  if (p.cp == 1) return;
  const int64_t forwards = p.L + recomputation(p).attentions;  // per micro-batch
  // Every cp group (tp·pp·dp of them) runs its pp rank's blocks; the groups of tp rank t move
  // that rank's key/value heads.
  for (int64_t t = 0; t < p.tp; ++t) {
    const int64_t kv = 2 * p.BT() * p.kv_heads(t) * p.hd;  // K and V of one rank (2n)
    int64_t bytes = 0, calls = 0;
    if (p.s.plan.cp_algo == ContextAlgo::allgather) {
      const int64_t one = scatter_gather_bytes(p.cp, p.cp * kv, p.e);
      bytes = forwards * one + p.L * 2 * one;  // backward: all-gather again, reduce-scatter gradients
      calls = forwards + p.L * 2;
    } else {
      bytes = forwards * (p.cp - 1) * p.cp * kv * p.e + p.L * ((p.cp - 1) * 2 * kv + kv) * p.cp * p.e;
      calls = forwards * (p.cp - 1) * p.cp + p.L * p.cp * p.cp;
    }
    const int64_t n = p.dp() * p.M;
    out.add("cp", p.cp, n * bytes, n * calls);
  }
}

void pipeline_sends(const Step& p, Tally& out) {
  if (p.pp == 1) return;
  const int64_t boundaries = p.pp * p.chunks - 1, groups = p.cp * p.dp();  // pp groups per tp rank
  for (int64_t t = 0; t < p.tp; ++t) {
    const int64_t sends = boundaries * p.M * 2;  // activation forward, gradient backward
    out.add("pp", p.pp, groups * sends * p.residual_rows(t) * p.C * p.e, groups * sends);
  }
}

// ---- After backward: gradients, loss, norm -------------------------------------------------

// Gradient reduction, parameter gathers and the grad-norm partials of the slice (t, r).
void data_parallel_slice(const Step& p, int64_t t, int64_t r, Tally& out) {
  const int64_t D = p.data_size(), N = p.shard_size(), R = p.dp_rep, eg = p.e_reduce;
  const bool pipelined = p.pp > 1, keep = !p.s.plan.reshard_after_forward;
  int64_t norm_partials_total = 0;  // f64 partials every shard rank contributes
  for (int64_t u : p.held_units(r)) {
    const int64_t m = p.unit_numel(u, t);
    if (m == 0) continue;
    if (p.zero() == 0) {
      out.add(p.data_name, D, all_reduce_bytes(D, m, eg), 1);
      continue;
    }
    const std::vector<int64_t> pieces = piece_sizes(m, N);
    const int64_t reductions = p.zero() >= 2 && !p.s.plan.reduce_once ? p.M : 1;
    out.add(p.shard_name, N, reductions * R * scatter_gather_bytes(N, m, eg), reductions * R);
    if (p.hsdp())
      for (int64_t piece : pieces)
        if (piece > 0) out.add("dp_replicate", R, reductions * all_reduce_bytes(R, piece, eg), reductions);
    int64_t gathers = 1;  // stages 1 and 2: the updated pieces, once
    if (p.zero() == 3) {
      const bool block = u != 0 && u != p.L + 1;
      gathers = keep ? (pipelined ? 1 : p.M) : (block ? 2 * p.M : p.M);
    }
    out.add(p.shard_name, N, gathers * R * scatter_gather_bytes(N, m, p.e_param), gathers * R);
    if (!p.is_copy(u, r))
      for (int64_t piece : pieces) norm_partials_total += norm_partials(piece);
  }
  if (p.zero() > 0) {
    out.add(p.shard_name, N, R * scatter_gather_bytes(N, norm_partials_total, kF64), R);
    if (p.tp > 1) out.add(p.shard_name, N, R * all_reduce_bytes(N, 1, kF64), R);  // replicas' share
  }
  out.add(p.data_name, D, all_reduce_bytes(D, 2, kF64), 1);  // loss sum and tokens
}

// Tied embeddings: the first and last stage of every pipeline sum the embedding's gradient.
void tied_embedding(const Step& p, int64_t t, Tally& out) {
  if (!p.tied || p.pp == 1) return;
  const int64_t m = p.unit_numel(0, t);
  if (p.zero() == 0) {
    out.add(p.tied_name(), 2, p.data_size() * all_reduce_bytes(2, m, p.e_reduce), p.data_size());
    return;
  }
  for (int64_t piece : piece_sizes(m, p.shard_size()))
    if (piece > 0) out.add(p.tied_name(), 2, p.dp_rep * all_reduce_bytes(2, piece, p.e_reduce), p.dp_rep);
}

// Per pp group: the loss, every unit's grad-norm partials, the tp replicas' share.
void pipeline_norm(const Step& p, int64_t t, Tally& out) {
  if (p.pp == 1) return;
  int64_t partials = 0;
  for (int64_t u = 0; u < p.L + 2; ++u) partials += norm_partials(p.unit_numel(u, t));
  const int64_t n = p.cp * p.dp();  // pp groups of this tp rank
  int64_t bytes = all_reduce_bytes(p.pp, 2, kF64) + all_reduce_bytes(p.pp, partials, kF64), calls = 2;
  if (p.tp > 1) bytes += all_reduce_bytes(p.pp, 1, kF64), calls += 1;
  out.add("pp", p.pp, n * bytes, n * calls);
}

}  // namespace

std::map<std::string, GroupTraffic> predict_step_traffic(const StepShape& shape) {
  const Step p(shape);
  Tally out;
  tensor_parallel(p, out);
  context_parallel(p, out);
  pipeline_sends(p, out);
  for (int64_t t = 0; t < p.tp; ++t) {
    for (int64_t r = 0; r < p.pp; ++r) data_parallel_slice(p, t, r, out);
    tied_embedding(p, t, out);
    pipeline_norm(p, t, out);
  }
  // Each slice's sum of squares over the tp group: pp·cp·dp groups.
  out.add("tp", p.tp, p.pp * p.data_size() * all_reduce_bytes(p.tp, 1, kF64), p.pp * p.data_size());
  return out.take();
}

}  // namespace llama4d
