// Context parallelism (Llama 3 paper, section 3.3.2), top to bottom.
//
// The cp ranks of a context-parallel group hold the SAME weights and run the same rows of the
// batch, each on a different part of every sequence. Everything but attention is per token, so
// it runs locally on the rank's tokens; attention needs every earlier key of the sequence.
//
// 1. The split. A causal query at position i attends to i+1 keys, so a contiguous split gives
//    the last rank far more work than the first (cp=2: 3/4 of the pairs on rank 1). Llama 3 cuts
//    each sequence of S tokens into 2·cp chunks of S/(2·cp) and gives rank r the chunks r and
//    2·cp-1-r: an early chunk and its mirror image, so every rank scores the same number of
//    (query, key) pairs up to one chunk's triangle. context_slice() does it to a batch; the
//    model then runs seq = S/cp tokens per row (BlockDims::seq, BlockDims::cp) with RoPE at the true positions.
//
// 2. All-gather attention (Llama 3's choice). Before attention each rank all-gathers the keys
//    and values of the whole sequence, [B, S, nkv, hd] each, and computes its own queries
//    against them. Under GQA K and V are nh/nkv times smaller than Q (4x for Llama 3 8B, 8x
//    for 70B, 16x for 405B: 8 KV heads against 32, 64 and 128 query heads), which is what makes
//    gathering them cheap. The backward gathers K and V again (the
//    forward keeps only this rank's, so activation memory stays divided by cp), computes dK and
//    dV for the whole sequence from this rank's queries, and reduce-scatters them: each rank
//    ends with the sum over all ranks' queries for its own tokens' keys.
//
//    Bytes per layer and micro-batch, with n = B·(S/cp)·nkv·hd elements of K (or V) per rank:
//      forward:  all-gather of 2n per rank (K and V together): (cp-1)·2n received per rank
//      backward: the same all-gather again, and a reduce-scatter of 2n per rank
//    Activation checkpointing's recompute repeats the forward all-gather.
//    Scratch at the peak: the whole sequence's K and V twice (as gathered, then in sequence
//    order), and in backward K, V and dK, dV: 4·cp·n elements, O(S) per rank whatever cp is.
//
//    Each query row is computed as on one device: the same keys, at the same positions, in the
//    same order, by the same op (core/ops.h attention_forward). The rows of one call are cut into
//    blocks of 32 from the call's first row; when a chunk (S/(2·cp) tokens) is a multiple of 32
//    the blocks are those of one device and the outputs are bitwise equal. dK and dV are sums
//    over queries that now sit on different ranks, added in the reduce-scatter's order: close to
//    one device's, not bitwise.
//
// 3. Ring attention (Liu et al. 2023). No rank ever holds the whole sequence's K and V: each
//    holds one rank's block (its two chunks) at a time. At step s = 0 .. cp-1 rank r holds the
//    block of rank (r - s) mod cp, attends its own queries to it, and passes it on to rank r+1
//    while receiving the next from rank r-1. Each step gives a partial result over some keys;
//    partial results are merged by their log-sum-exps (ops::attention_merge), so the end result
//    is attention over all the keys. A query chunk skips key chunks that lie entirely in its
//    future (gk > gq), computes the diagonal one causally (gk = gq), and the earlier ones in full.
//    The backward passes the block around again with a dK, dV accumulator that travels with it:
//    every rank adds its queries' share (attention_backward with the FINAL out and lse gives each
//    block its exact share), and after the cp-th pass each accumulator is home, complete.
//
//    Bytes per layer and micro-batch, per rank (n as above):
//      forward:  cp-1 sends of K and V, 2n each time: (cp-1)·2n
//      backward: cp-1 sends of K, V, dK, dV (4n), then the last pass of dK, dV home (2n)
//    Memory: two blocks of K and V (the one in use and the one arriving) instead of the whole
//    sequence's, each with its dK, dV accumulator in backward: 8n elements at the peak, O(S/cp). Ring attention moves more bytes than the
//    all-gather (the gradients travel cp times instead of being reduce-scattered) but its steps
//    can overlap compute with the next block's transfer; here they run one after the other.
//
// 4. Document masks (Llama 3 masks attention between the documents packed into one sequence).
//    A token's document is a property of its position in the whole row, so the ids travel as
//    metadata every rank holds for whole rows (Batch::docs, BlockDims::doc), not with the keys:
//    each op call reads the ids at its queries' and keys' true positions. Nothing else changes,
//    and the bytes moved stay those above. Ring attention also skips a block pair whose keys all
//    belong to documents that ended before its queries' began; the all-gather variant leaves
//    that to the op, which trims each block of queries' key range to its documents.
#include "core/parallel/context_parallel.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/buffer.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

std::string_view context_algo_name(ContextAlgo a) { return a == ContextAlgo::ring ? "ring" : "allgather"; }

ContextAlgo parse_context_algo(std::string_view name) {
  if (name == "allgather") return ContextAlgo::allgather;
  if (name == "ring") return ContextAlgo::ring;
  throw InputError("--cp-algo " + std::string(name) + ": expected allgather or ring");
}

Batch context_slice(const Batch& b, int cp, int rank) {
  if (b.seq % (2 * cp) != 0)  // ParallelPlan::check_sequence tells the user first
    throw Error("context_slice: " + std::to_string(b.seq) + " tokens per row do not cut into " + std::to_string(2 * cp) + " chunks");
  const int64_t c = b.seq / (2 * cp), first = rank * c, second = (2 * cp - 1 - rank) * c;
  Batch out;
  out.B = b.B;
  out.seq = 2 * c;
  out.docs = b.docs;  // whole rows: the keys of every rank's chunks
  for (int64_t r = 0; r < b.B; ++r)
    for (const int64_t start : {first, second}) {
      const auto at = r * b.seq + start;
      out.tokens.insert(out.tokens.end(), b.tokens.begin() + at, b.tokens.begin() + at + c);
      out.targets.insert(out.targets.end(), b.targets.begin() + at, b.targets.begin() + at + c);
    }
  return out;
}

namespace {

// Where a rank's part (0 or 1) of each row sits in the whole sequence, in chunks.
int64_t global_chunk(int64_t rank, int64_t part, int64_t cp) { return part == 0 ? rank : 2 * cp - 1 - rank; }

// The two layouts of keys and values (or their gradients), `row` = nkv·hd elements per token:
//   by rank  [cp][K, V][B][T][row]: rank r's own tokens (part 0, then part 1 of each row), as
//            the collectives lay them out, ranks back to back;
//   whole    [K, V][B][S][row]: each row in sequence order, chunk g at [g·c, (g+1)·c).
// Copies by rank -> whole (to_whole) or whole -> by rank.
template <class T>
void relayout(T* whole, T* by_rank, const BlockDims& d, bool to_whole) {
  const int64_t c = d.cp_chunk(), S = d.seq * d.cp, row = d.nkv * d.hd, n = d.BT() * row, all = d.B * S * row;
  for (int64_t r = 0; r < d.cp; ++r)
    for (int64_t which = 0; which < 2; ++which)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t part = 0; part < 2; ++part) {
          T* w = whole + which * all + (b * S + global_chunk(r, part, d.cp) * c) * row;
          T* mine = by_rank + (r * 2 + which) * n + (b * d.seq + part * c) * row;
          to_whole ? ops::copy(w, mine, c * row) : ops::copy(mine, w, c * row);
        }
}

// One call of the attention op: this rank's part `part` of row b (its c queries, at their true
// positions) against the whole row's keys up to the chunk's end; keys later than that are in
// every query's future and are not even looked at. Document ids (d.doc, whole rows) are read at
// the same true positions.
ops::AttentionShape part_shape(const BlockDims& d, int64_t b, int64_t part) {
  const int64_t c = d.cp_chunk(), start = d.cp_part_start(part);
  const int32_t* row_doc = d.doc ? d.doc + b * d.seq * d.cp : nullptr;
  return {.B = 1, .Tq = c, .Tk = start + c, .nh = d.nh, .nkv = d.nkv, .hd = d.hd, .q_start = start, .k_start = 0,
          .q_doc = row_doc ? row_doc + start : nullptr, .k_doc = row_doc, .operands = d.operands()};
}

}  // namespace

template <class T>
ContextParallelComm<T>::ContextParallelComm(ProcessGroup& cp, ContextAlgo algo) : cp_(cp), algo_(algo) {}

namespace {

// K and V of the whole sequence, [2][B][S][nkv][hd] (keys, then values), from every rank's.
template <class T>
Buffer<T> gather_key_values(ProcessGroup& cp, const T* k, const T* v, const BlockDims& d, std::string_view label) {
  const int64_t row = d.nkv * d.hd, n = d.BT() * row, whole = n * d.cp;
  MemoryTracker* memory = &cp.memory();
  // In place: this rank's K and V go straight into their slot of the gathered buffer.
  Buffer<T> gathered(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: gathered keys and values");
  T* mine = gathered.data() + cp.rank() * 2 * n;
  ops::copy(mine, k, n);
  ops::copy(mine + n, v, n);
  AllGatherOptions o{.label = std::string(label)};
  cp.all_gather(gathered.data(), mine, 2 * n, dtype_of<T>(), o)->wait();
  Buffer<T> kv(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: whole-sequence keys and values");
  relayout(kv.data(), gathered.data(), d, true);
  return kv;
}

}  // namespace

template <class T>
void ContextParallelComm<T>::attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d) {
  if (algo_ == ContextAlgo::ring) return ring_attention(out, lse, q, k, v, d);
  const int64_t c = d.cp_chunk(), S = d.seq * d.cp, qrow = d.nh * d.hd, kvrow = d.nkv * d.hd;
  const int64_t whole = d.B * S * kvrow;
  const Buffer<T> kv = gather_key_values(cp_, k, v, d, label::kCpAllGather);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t part = 0; part < 2; ++part) {
      const int64_t at = (b * d.seq + part * c) * qrow;  // this part's queries and outputs
      ops::attention_forward(out + at, lse + (b * 2 + part) * d.nh * c, q + at, kv.data() + b * S * kvrow,
                             kv.data() + whole + b * S * kvrow, part_shape(d, b, part));
    }
}

template <class T>
void ContextParallelComm<T>::attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                                const T* out, const T* lse, const BlockDims& d) {
  if (algo_ == ContextAlgo::ring) return ring_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d);
  const int64_t c = d.cp_chunk(), S = d.seq * d.cp, qrow = d.nh * d.hd, kvrow = d.nkv * d.hd;
  const int64_t whole = d.B * S * kvrow, n = d.BT() * kvrow;
  Buffer<T> kv = gather_key_values(cp_, k, v, d, label::kCpAllGatherBackward);
  MemoryTracker* memory = &cp_.memory();
  // dK, dV of the whole sequence from this rank's queries: [2][B][S][nkv][hd].
  Buffer<T> dkv(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: whole-sequence key/value gradients");
  ops::fill(dkv.data(), T(0), 2 * whole);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t part = 0; part < 2; ++part) {
      const int64_t at = (b * d.seq + part * c) * qrow;
      ops::attention_backward(dq + at, dkv.data() + b * S * kvrow, dkv.data() + whole + b * S * kvrow, dout + at,
                              q + at, kv.data() + b * S * kvrow, kv.data() + whole + b * S * kvrow, out + at,
                              lse + (b * 2 + part) * d.nh * c, part_shape(d, b, part));
    }
  // Back to the ranks' layout, [cp][K or V][B][T][row], in K and V's buffer (read no more), and
  // summed over the ranks in place: each rank keeps its own tokens' [K or V][B][T][row].
  T* scattered = kv.data();
  relayout(dkv.data(), scattered, d, false);
  T* mine = scattered + cp_.rank() * 2 * n;
  ReduceScatterOptions o{.label = std::string(label::kCpReduceScatter)};
  cp_.reduce_scatter(mine, scattered, 2 * n, dtype_of<T>(), ReduceOp::sum, o)->wait();
  ops::add_forward(dk, dk, mine, n);
  ops::add_forward(dv, dv, mine + n, n);
}

// ---- Ring attention ---------------------------------------------------------------------------

namespace {

// The op call of this rank's query part qp (global chunk gq) of row b against key part kp of the
// block of rank `src` (global chunk gk), or nothing when no query can see any key: every key is
// in every query's future, or (document mask) every key belongs to an earlier document than
// every query. Ids never decrease along a row, so comparing the key chunk's last id with the
// query chunk's first decides it. (The ids are read here on the host, as the ops' pair counts
// read them: the CPU backend's memory is host memory; a device backend keeps a host copy.)
struct ChunkPair {
  bool skip;
  ops::AttentionShape shape;
};
ChunkPair chunk_pair(const BlockDims& d, int64_t b, int64_t src, int64_t qp, int64_t kp) {
  const int64_t c = d.cp_chunk(), gq = global_chunk(d.cp_rank, qp, d.cp), gk = global_chunk(src, kp, d.cp);
  ChunkPair pair{gk > gq, {.B = 1, .Tq = c, .Tk = c, .nh = d.nh, .nkv = d.nkv, .hd = d.hd, .q_start = gq * c,
                           .k_start = gk * c, .operands = d.operands()}};
  if (d.doc) {
    const int32_t* row_doc = d.doc + b * d.seq * d.cp;
    pair.shape.q_doc = row_doc + gq * c;
    pair.shape.k_doc = row_doc + gk * c;
    pair.skip = pair.skip || pair.shape.k_doc[c - 1] < pair.shape.q_doc[0];
  }
  return pair;
}

// Calls fn(q_at, kv_at, lse_at, shape) for every (row, query part, key part) of this rank's
// queries against the block of rank `src` that is not wholly in the future: the offsets of the
// queries (and outputs) in [B,T,nh,hd], of the keys (and values) in [B,T,nkv,hd], and of the
// rows' log-sum-exps in this file's [B][2][nh][c] layout.
template <class Fn>
void for_each_visible_pair(const BlockDims& d, int64_t src, Fn&& fn) {
  const int64_t c = d.cp_chunk(), qrow = d.nh * d.hd, kvrow = d.nkv * d.hd;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t qp = 0; qp < 2; ++qp)
      for (int64_t kp = 0; kp < 2; ++kp) {
        const ChunkPair pair = chunk_pair(d, b, src, qp, kp);
        if (!pair.skip)
          fn((b * d.seq + qp * c) * qrow, (b * d.seq + kp * c) * kvrow, (b * 2 + qp) * d.nh * c, pair.shape);
      }
}

}  // namespace

// One hop: `block` (elements) goes to rank r+1 and the next arrives into `next` from rank r-1.
// Sends complete once buffered, so every rank sends first and then receives.
template <class T>
void ContextParallelComm<T>::pass_on(const T* block, T* next, int64_t elements, int step, std::string_view label) {
  const int P = cp_.size(), r = cp_.rank();
  SendOptions so{.tag = step, .label = std::string(label)};
  RecvOptions ro{.tag = step, .label = std::string(label)};
  cp_.send(block, elements, dtype_of<T>(), (r + 1) % P, so)->wait();
  cp_.recv(next, elements, dtype_of<T>(), (r + P - 1) % P, ro)->wait();
}

template <class T>
void ContextParallelComm<T>::ring_attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d) {
  const int64_t c = d.cp_chunk(), qrow = d.nh * d.hd, kvrow = d.nkv * d.hd, n = d.BT() * kvrow;
  MemoryTracker* memory = &cp_.memory();
  // The block in hand, [K, V][B][T][nkv][hd], starting with this rank's own.
  Buffer<T> block(memory, MemoryCategory::scratch, 2 * n, "ring attention: keys and values in hand");
  Buffer<T> next(memory, MemoryCategory::scratch, 2 * n, "ring attention: keys and values arriving");
  ops::copy(block.data(), k, n);
  ops::copy(block.data() + n, v, n);
  Buffer<T> part_out(memory, MemoryCategory::scratch, c * qrow, "ring attention: partial output");
  Buffer<T> part_lse(memory, MemoryCategory::scratch, c * d.nh, "ring attention: partial log-sum-exp");
  // Nothing seen yet: out = 0 and lse = -inf, which the first merge replaces.
  ops::fill(out, T(0), d.BT() * qrow);
  ops::fill(lse, -std::numeric_limits<T>::infinity(), d.BT() * d.nh);
  for (int s = 0; s < d.cp; ++s) {
    const T* kv = block.data();
    for_each_visible_pair(d, (d.cp_rank - s + d.cp) % d.cp,
                          [&](int64_t at, int64_t kv_at, int64_t lse_at, const ops::AttentionShape& shape) {
                            ops::attention_forward(part_out.data(), part_lse.data(), q + at, kv + kv_at, kv + n + kv_at, shape);
                            ops::attention_merge(out + at, lse + lse_at, part_out.data(), part_lse.data(), 1, c, d.nh, d.hd);
                          });
    if (s + 1 == d.cp) break;
    pass_on(block.data(), next.data(), 2 * n, s, label::kCpRingKeysValues);
    std::swap(block, next);
  }
}

template <class T>
void ContextParallelComm<T>::ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                                                     const T* v, const T* out, const T* lse, const BlockDims& d) {
  const int64_t n = d.BT() * d.nkv * d.hd;
  MemoryTracker* memory = &cp_.memory();
  // [K, V, dK, dV][B][T][nkv][hd]: the block in hand and its gradient accumulator travel together.
  Buffer<T> block(memory, MemoryCategory::scratch, 4 * n, "ring attention: keys, values and their gradients in hand");
  Buffer<T> next(memory, MemoryCategory::scratch, 4 * n, "ring attention: keys, values and their gradients arriving");
  ops::copy(block.data(), k, n);
  ops::copy(block.data() + n, v, n);
  ops::fill(block.data() + 2 * n, T(0), 2 * n);
  for (int s = 0; s < d.cp; ++s) {
    T* kv = block.data();
    for_each_visible_pair(d, (d.cp_rank - s + d.cp) % d.cp,
                          [&](int64_t at, int64_t kv_at, int64_t lse_at, const ops::AttentionShape& shape) {
                            ops::attention_backward(dq + at, kv + 2 * n + kv_at, kv + 3 * n + kv_at, dout + at, q + at,
                                                    kv + kv_at, kv + n + kv_at, out + at, lse + lse_at, shape);
                          });
    if (s + 1 == d.cp) break;
    pass_on(block.data(), next.data(), 4 * n, s, label::kCpRingWithGradients);
    std::swap(block, next);
  }
  // The accumulator in hand belongs to rank r+1 (it started there cp-1 hops ago): one more hop
  // of the gradients alone brings every accumulator home (cp > 1 always here).
  pass_on(block.data() + 2 * n, next.data() + 2 * n, 2 * n, d.cp, label::kCpRingGradientsHome);
  ops::add_forward(dk, dk, next.data() + 2 * n, n);
  ops::add_forward(dv, dv, next.data() + 3 * n, n);
}

template class ContextParallelComm<float>;
template class ContextParallelComm<double>;

}  // namespace llama4d
