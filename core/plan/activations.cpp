// One micro-batch's activations and scratch on one chunk of units, walked in the order the
// engine allocates them (core/model/llama.cpp, block.cpp, head.cpp), written here from those
// rules so the planner never runs the model. Notation as in memory.cpp; e bytes per element,
// ids are int32. BT = micro-batch rows x seq_len / cp tokens; under sequence parallelism a
// tensor rank's residual stream holds `rows` of them (BT t/tp .. BT (t+1)/tp), otherwise all.
//
//   tokens [BT] (embedding's chunk), targets [BT] (head's chunk), ids kept to the backward.
//   x_l [rows, C]  the residual stream: a chunk's input, each block's output. Kept to the
//                  backward unless checkpointing every:k drops block l's input (l % k != 0 and
//                  not the chunk's first block); a chunk's output is kept until its backward
//                  starts (the send may still read it).
//   block          kept  q [BT, nh hd], k v [BT, nkv hd], h [rows, C], gate up [BT, I]
//                  recomputable  n1 n2 [BT, C] (gathered under SP), rstd1 rstd2 [rows],
//                  att [BT, nh hd], lse [BT, nh], act [BT, I]
//                  none keeps both, selective the kept part (rebuilds the rest in the block's
//                  backward), every:k nothing (reruns a run from its kept input).
//   head           n [BT, C], rstd [rows], logits [BT, V_t], losses [BT], and under tensor
//                  parallelism (vocabulary-parallel loss) each token's log-sum-exp [BT].
//   scratch        forward: the row-parallel output [BT, C] (SP), the embedding's partial
//                  lookups [BT, C] (SP), the vocabulary-parallel loss's max, sum and target [BT];
//                  backward: the residual gradient [rows, C] for the whole pass, one block's
//                  temporaries dn dh [BT, C], dq datt [BT, nh hd], dk dv [BT, nkv hd],
//                  dgate dup dact [BT, I] (the input pass: datt and dact only), the head's
//                  dlogits [BT, V_t] and dn [BT, C], the SP gain gradients [C] (the head's for
//                  its call, the blocks' kept to the pass's end) and, where KV heads are
//                  replicated, the k and v weight gradients [nkv hd, C] (kept likewise) and
//                  their sum over the replicas [2, all KV heads' hd, C] (for its call);
//                  context parallelism's attention adds its own for each call (sizes below).
//   input pass     (zero-bubble) keeps what the weight pass reads: per block ddown dattn [BT, C],
//                  dn2 dn1 [rows, C], dgate dup [BT, I], dq [BT, nh hd], dk dv [BT, nkv hd]
//                  beside act n2 att n1 h rstd1 rstd2 and its input; the head's dlogits, dn
//                  [rows, C] and n rstd and its input; the embedding's input gradient [rows, C];
//                  the tokens. Its scratch: datt dact for the blocks, and under SP dn [BT, C] for
//                  the blocks and the head (every row, summed before this rank's rows are kept).
//   weight-gradient temporaries (the SP gains', the KV replicas') are at the gradient width.
//   document ids   (--doc-mask) [B, seq_len] int32 on every chunk, from the forward to the end of
//                  the backward (the input pass: the weight pass has no attention).
#include "core/plan/activations.h"

#include <algorithm>
#include <vector>

#include "core/plan/memory.h"

namespace llama4d {
namespace {

// Bytes alive now and the most ever, for one category.
struct Ledger {
  int64_t now = 0, peak = 0;
  void add(int64_t b) { now += b, peak = std::max(peak, now); }
  void sub(int64_t b) { now -= b; }
  void transient(int64_t b) { peak = std::max(peak, now + b); }  // allocated and freed inside a call
};

struct Sizes {
  int64_t x, tokens, docs, block_kept, block_recomputable, head, targets;
  int64_t block_scratch, input_pass_scratch, head_input_pass_scratch, head_scratch, gain, kv_grads;
  int64_t block_keep_for_weight, block_inputs_moved, head_keep_for_weight, head_inputs_moved;
  int64_t sp_partial, vocab_stats;
  int64_t cp_forward, cp_backward, kv_sum;  // transients of context-parallel attention, KV replicas' sum
  int64_t ring_sends;
};

Sizes sizes(const StepShape& s, int t) {
  const LlamaConfig& cfg = s.model;
  const int tp = s.plan.size("tp"), cp = s.plan.size("cp");
  const bool sp = tp > 1 && s.plan.sequence_parallel, vocab_parallel = tp > 1;
  const int64_t e = s.precision.activation, C = cfg.hidden_size, hd = cfg.head_dim;
  const int64_t BT = s.micro_rows() * s.seq_len / cp, rows = sp ? BT * (t + 1) / tp - BT * t / tp : BT;
  const int64_t nh = cfg.num_attention_heads / tp, q = nh * hd;
  const int64_t kv = kv_heads_of_tp_rank(cfg, tp, t) * hd, I = cfg.intermediate_size / tp;
  const int64_t vocab = unit_elements(cfg, tp, t)[0] / C;  // the embedding's rows on this rank
  Sizes z{};
  z.x = e * rows * C;
  z.tokens = z.targets = 4 * BT;
  z.docs = s.doc_mask ? 4 * s.micro_rows() * s.seq_len : 0;
  z.block_kept = e * (BT * q + 2 * BT * kv + rows * C + 2 * BT * I);
  z.block_recomputable = e * (2 * BT * C + 2 * rows + BT * q + BT * nh + BT * I);
  z.head = e * (BT * C + rows + BT * vocab + BT + (vocab_parallel ? BT : 0));
  z.block_scratch = e * BT * (2 * C + 2 * q + 2 * kv + 3 * I);
  // datt, dact, and under SP dn (every row, summed before this rank's rows are kept)
  z.input_pass_scratch = e * BT * ((sp ? C : 0) + q + I);
  z.head_input_pass_scratch = sp ? e * BT * C : 0;
  z.head_scratch = e * BT * (vocab + C);
  const int64_t g = s.precision.grad;  // the weight-gradient temporaries' width
  z.gain = sp ? g * C : 0;
  z.kv_grads = tp > cfg.num_key_value_heads ? 2 * g * kv * C : 0;
  z.block_keep_for_weight = e * (2 * BT * C + 2 * rows * C + 2 * BT * I + BT * q + 2 * BT * kv);
  z.block_inputs_moved = e * (BT * I + 2 * BT * C + BT * q + rows * C + 2 * rows);  // act n2 n1 att h rstd2 rstd1
  z.head_keep_for_weight = e * (BT * vocab + rows * C);
  z.head_inputs_moved = e * (BT * C + rows);  // n, rstd
  z.sp_partial = sp ? e * BT * C : 0;
  z.vocab_stats = vocab_parallel ? 3 * e * BT : 0;
  // Context parallelism (core/parallel/context_parallel.cpp), n = BT nkv hd of this rank's K or V:
  // all-gather gathers K and V of all cp ranks and lays them out again (2 buffers of 2 cp n), the
  // backward adds their gradients (2 cp n more); ring holds a block and the next (2 n each) and a
  // chunk's partial output and log-sum-exp forward, and each with its gradients (4 n) backward.
  const int64_t n = BT * kv, chunk = s.seq_len / cp / 2;
  if (cp > 1 && s.plan.cp_algo == ContextAlgo::allgather) z.cp_forward = z.cp_backward = 4 * e * cp * n;
  if (cp > 1 && s.plan.cp_algo == ContextAlgo::ring) {
    z.cp_forward = e * (4 * n + chunk * (q + nh));
    z.cp_backward = 8 * e * n;
    z.ring_sends = cp * 4 * e * n;
  }
  // Replicated KV heads: their gradients placed in a zeroed [2, nkv hd, C] of the whole model.
  z.kv_sum = z.kv_grads ? 2 * g * cfg.num_key_value_heads * hd * C : 0;
  return z;
}

}  // namespace

ChunkMemory chunk_memory(const StepShape& s, int t, int begin, int end) {
  const int L = int(s.model.num_hidden_layers), head = L + 1;
  const Checkpointing& ac = s.plan.ac;
  const bool has_embedding = begin == 0, has_head = end == head + 1;
  const Sizes z = sizes(s, t);
  const int first_block = std::max(begin, 1) - 1;
  const bool has_blocks = end - 1 > 0 && begin < head;  // the backward allocates a block's temporaries
  enum class Held { none, kept, complete };

  ChunkMemory out;
  out.boundary = out.input_grad = z.x;
  out.ring_sends = z.ring_sends;
  if (has_embedding) out.input_grad = 0;

  // ---- forward ------------------------------------------------------------------------------
  Ledger act, scratch;
  std::vector<bool> x_alive(size_t(L + 1), false);
  std::vector<Held> block(size_t(L), Held::none);
  act.add(z.docs);
  if (has_embedding) {
    act.add(z.tokens);
    act.add(z.x);
    scratch.transient(z.sp_partial);  // the partial lookups of every row, before the reduce-scatter
  } else {
    act.add(z.x);  // the received input
  }
  x_alive[size_t(first_block)] = true;
  for (int u = std::max(begin, 1); u < std::min(end, head); ++u) {
    const int l = u - 1;
    act.add(z.x);
    x_alive[size_t(l + 1)] = true;
    act.add(z.block_kept + z.block_recomputable);
    scratch.transient(z.sp_partial + z.cp_forward);
    block[size_t(l)] = Held::complete;
    if (ac.kind == Checkpointing::Kind::selective) act.sub(z.block_recomputable), block[size_t(l)] = Held::kept;
    if (ac.recomputes_blocks()) act.sub(z.block_kept + z.block_recomputable), block[size_t(l)] = Held::none;
    if (!ac.keeps_input(l, first_block)) act.sub(z.x), x_alive[size_t(l)] = false;
  }
  if (has_head) {
    act.add(z.head + z.targets);
    scratch.transient(z.vocab_stats);
  }
  out.forward = {0, act.peak, act.now};
  out.scratch_forward = scratch.peak;
  const int64_t resident = act.now;

  // ---- backward: full (B) or its input half (I); the weight half (W) after -----------------
  // Rebuilds what block l's backward reads: selective's recomputable part, or every:k's run
  // from the nearest kept input below (each block of it complete, its outputs kept).
  auto rebuild = [&](Ledger& a, Ledger& sc, std::vector<bool>& xs, std::vector<Held>& blocks, int l) {
    if (blocks[size_t(l)] == Held::complete) return;
    if (blocks[size_t(l)] == Held::kept) {
      a.add(z.block_recomputable);
      sc.transient(z.cp_forward);
      blocks[size_t(l)] = Held::complete;
      return;
    }
    int from = l;
    while (!xs[size_t(from)]) --from;
    for (int j = from; j <= l; ++j) {
      if (j < l) a.add(z.x), xs[size_t(j + 1)] = true;
      a.add(z.block_kept + z.block_recomputable);
      sc.transient(z.sp_partial + z.cp_forward);
      blocks[size_t(j)] = Held::complete;
    }
  };

  for (const bool input_only : {false, true}) {
    Ledger a{resident, resident}, sc;
    std::vector<bool> xs = x_alive;
    std::vector<Held> blocks = block;
    sc.add(z.x);  // the residual gradient dx
    if (!has_head) a.sub(z.x), xs[size_t(end - 1)] = false;  // the chunk's output, sent in forward
    if (has_blocks) sc.add(input_only ? z.input_pass_scratch : z.block_scratch);
    bool block_grads_allocated = false;
    for (int u = end - 1; u >= begin; --u) {
      if (u == head) {
        if (input_only) {
          a.add(z.head_keep_for_weight);
          a.sub(z.head - z.head_inputs_moved + z.targets);
          xs[size_t(L)] = false;  // moved to what the weight pass reads
          sc.transient(z.head_input_pass_scratch);
        } else {
          sc.transient(z.head_scratch + z.gain);
          a.sub(z.head + z.targets);
        }
      } else if (u == 0) {
        if (input_only) {
          a.add(z.x);  // dx_0 for the weight pass; the tokens stay for it
        } else {
          sc.transient(z.sp_partial);  // the gathered output gradient of every row
          a.sub(z.tokens);
        }
      } else {
        const int l = u - 1;
        rebuild(a, sc, xs, blocks, l);
        if (input_only) {
          sc.transient(z.cp_backward);
          a.add(z.block_keep_for_weight);
          xs[size_t(l)] = false;  // the block's input moves to the weight pass
          a.sub(z.block_kept + z.block_recomputable - z.block_inputs_moved);
        } else {
          // ln2's gain gradient (kept), attention's backward, the k/v weight gradients (kept)
          // and their sum over the replicas, in block.cpp's order.
          if (!block_grads_allocated) sc.add(z.gain);
          sc.transient(z.cp_backward);
          if (!block_grads_allocated) sc.add(z.kv_grads);
          sc.transient(z.kv_sum);
          block_grads_allocated = true;
          a.sub(z.block_kept + z.block_recomputable);
        }
        blocks[size_t(l)] = Held::none;
      }
      const int below = std::max(u - 1, 0);
      if (xs[size_t(below)]) a.sub(z.x), xs[size_t(below)] = false;
    }
    a.sub(z.docs);
    (input_only ? out.input : out.backward) = {resident, a.peak, a.now};
    (input_only ? out.scratch_input : out.scratch_backward) = sc.peak;
  }

  // The weight pass frees what the input pass kept, unit by unit, last first.
  Ledger w{out.input.end, out.input.end}, sw;
  bool block_grads_allocated = false;
  for (int u = end - 1; u >= begin; --u) {
    if (u == head) {
      sw.transient(z.gain);
      w.sub(z.head_keep_for_weight + z.head_inputs_moved + z.x);
    } else if (u == 0) {
      sw.transient(z.sp_partial);
      w.sub(z.tokens + z.x);
    } else {
      if (!block_grads_allocated) sw.add(z.gain + z.kv_grads);
      sw.transient(z.kv_sum);
      block_grads_allocated = true;
      w.sub(z.block_keep_for_weight + z.block_inputs_moved + z.x);
    }
  }
  out.weight = {out.input.end, w.peak, w.now};
  out.scratch_weight = sw.peak;
  return out;
}

}  // namespace llama4d
