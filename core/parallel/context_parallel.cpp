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
//    model then runs T = S/cp tokens per row (BlockDims::cp) with RoPE at the true positions.
//
// 2. All-gather attention (Llama 3's choice). Before attention each rank all-gathers the keys
//    and values of the whole sequence, [B, S, nkv, hd] each, and computes its own queries
//    against them. Under GQA K and V are nh/nkv times smaller than Q (4x for Llama 3 70B and
//    405B), which is what makes gathering them cheap. The backward gathers K and V again (the
//    forward keeps only this rank's, so activation memory stays divided by cp), computes dK and
//    dV for the whole sequence from this rank's queries, and reduce-scatters them: each rank
//    ends with the sum over all ranks' queries for its own tokens' keys.
//
//    Bytes per layer and micro-batch, with n = B·(S/cp)·nkv·hd elements of K (or V) per rank:
//      forward:  all-gather of 2n per rank (K and V together): (cp-1)·2n received per rank
//      backward: the same all-gather again, and a reduce-scatter of 2n per rank
//    Activation checkpointing's recompute repeats the forward all-gather.
//
//    Each query row is computed as on one device: the same keys, at the same positions, in the
//    same order, by the same op (core/ops.h attention_forward). The rows of one call are cut into
//    blocks of 32 from the call's first row; when a chunk (S/(2·cp) tokens) is a multiple of 32
//    the blocks are those of one device and the outputs are bitwise equal. dK and dV are sums
//    over queries that now sit on different ranks, added in the reduce-scatter's order: close to
//    one device's, not bitwise.
#include "core/parallel/context_parallel.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/buffer.h"

namespace llama4d {

std::string_view context_algo_name(ContextAlgo a) { return a == ContextAlgo::ring ? "ring" : "allgather"; }

ContextAlgo parse_context_algo(std::string_view name) {
  if (name == "allgather") return ContextAlgo::allgather;
  if (name == "ring") return ContextAlgo::ring;
  throw InputError("--cp-algo " + std::string(name) + ": expected allgather or ring");
}

Batch context_slice(const Batch& b, int cp, int rank) {
  if (b.T % (2 * cp) != 0)  // ParallelPlan::check_sequence tells the user first
    throw Error("context_slice: " + std::to_string(b.T) + " tokens per row do not cut into " + std::to_string(2 * cp) + " chunks");
  const int64_t c = b.T / (2 * cp), first = rank * c, second = (2 * cp - 1 - rank) * c;
  Batch out;
  out.B = b.B;
  out.T = 2 * c;
  for (int64_t r = 0; r < b.B; ++r)
    for (const int64_t start : {first, second}) {
      const auto at = r * b.T + start;
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
  const int64_t c = d.cp_chunk(), S = d.T * d.cp, row = d.nkv * d.hd, n = d.BT() * row, all = d.B * S * row;
  for (int64_t r = 0; r < d.cp; ++r)
    for (int64_t which = 0; which < 2; ++which)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t part = 0; part < 2; ++part) {
          T* w = whole + which * all + (b * S + global_chunk(r, part, d.cp) * c) * row;
          T* mine = by_rank + (r * 2 + which) * n + (b * d.T + part * c) * row;
          to_whole ? ops::copy(w, mine, c * row) : ops::copy(mine, w, c * row);
        }
}

// One call of the attention op: this rank's part `part` of row b (its c queries, at their true
// positions) against the whole row's keys up to the chunk's end; keys later than that are in
// every query's future and are not even looked at.
ops::AttentionShape part_shape(const BlockDims& d, int64_t part) {
  const int64_t c = d.cp_chunk(), start = d.cp_part_start(part);
  return {.B = 1, .Tq = c, .Tk = start + c, .nh = d.nh, .nkv = d.nkv, .hd = d.hd, .q_start = start, .k_start = 0};
}

}  // namespace

template <class T>
ContextParallelComm<T>::ContextParallelComm(ProcessGroup& cp, ContextAlgo algo) : cp_(cp), algo_(algo) {
  if (algo_ == ContextAlgo::ring)
    throw InputError("--cp-algo ring is not implemented in this build yet; use --cp-algo allgather");
}

namespace {

// K and V of the whole sequence, [2][B][S][nkv][hd] (keys, then values), from every rank's.
template <class T>
Buffer<T> gather_key_values(ProcessGroup& cp, const T* k, const T* v, const BlockDims& d, const char* label) {
  const int64_t row = d.nkv * d.hd, n = d.BT() * row, whole = n * d.cp;
  MemoryTracker* memory = &cp.memory();
  Buffer<T> mine(memory, MemoryCategory::scratch, 2 * n, "context parallelism: own keys and values");
  ops::copy(mine.data(), k, n);
  ops::copy(mine.data() + n, v, n);
  Buffer<T> gathered(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: gathered keys and values");
  AllGatherOptions o;
  o.label = label;
  cp.all_gather(gathered.data(), mine.data(), 2 * n, dtype_of<T>(), o)->wait();
  Buffer<T> kv(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: whole-sequence keys and values");
  relayout(kv.data(), gathered.data(), d, true);
  return kv;
}

}  // namespace

template <class T>
void ContextParallelComm<T>::attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d) {
  const int64_t c = d.cp_chunk(), S = d.T * d.cp, qrow = d.nh * d.hd, kvrow = d.nkv * d.hd;
  const int64_t whole = d.B * S * kvrow;
  const Buffer<T> kv = gather_key_values(cp_, k, v, d, "context parallelism: all-gather keys and values");
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t part = 0; part < 2; ++part) {
      const int64_t at = (b * d.T + part * c) * qrow;  // this part's queries and outputs
      ops::attention_forward(out + at, lse + (b * 2 + part) * d.nh * c, q + at, kv.data() + b * S * kvrow,
                             kv.data() + whole + b * S * kvrow, part_shape(d, part));
    }
}

template <class T>
void ContextParallelComm<T>::attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                                const T* out, const T* lse, const BlockDims& d) {
  const int64_t c = d.cp_chunk(), S = d.T * d.cp, qrow = d.nh * d.hd, kvrow = d.nkv * d.hd;
  const int64_t whole = d.B * S * kvrow, n = d.BT() * kvrow;
  const Buffer<T> kv = gather_key_values(cp_, k, v, d, "context parallelism: all-gather keys and values (backward)");
  MemoryTracker* memory = &cp_.memory();
  // dK, dV of the whole sequence from this rank's queries: [2][B][S][nkv][hd].
  Buffer<T> dkv(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: whole-sequence key/value gradients");
  ops::fill(dkv.data(), T(0), 2 * whole);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t part = 0; part < 2; ++part) {
      const int64_t at = (b * d.T + part * c) * qrow;
      ops::attention_backward(dq + at, dkv.data() + b * S * kvrow, dkv.data() + whole + b * S * kvrow, dout + at,
                              q + at, kv.data() + b * S * kvrow, kv.data() + whole + b * S * kvrow, out + at,
                              lse + (b * 2 + part) * d.nh * c, part_shape(d, part));
    }
  // Back to the ranks' layout, [cp][K or V][B][T][row], and summed over the ranks: each rank
  // keeps its own tokens' [K or V][B][T][row].
  Buffer<T> scattered(memory, MemoryCategory::scratch, 2 * whole, "context parallelism: key/value gradients by rank");
  relayout(dkv.data(), scattered.data(), d, false);
  Buffer<T> mine(memory, MemoryCategory::scratch, 2 * n, "context parallelism: own key/value gradients");
  ReduceScatterOptions o;
  o.label = "context parallelism: reduce-scatter key/value gradients";
  cp_.reduce_scatter(mine.data(), scattered.data(), 2 * n, dtype_of<T>(), ReduceOp::sum, o)->wait();
  ops::add_forward(dk, dk, mine.data(), n);
  ops::add_forward(dv, dv, mine.data() + n, n);
}

template class ContextParallelComm<float>;
template class ContextParallelComm<double>;

}  // namespace llama4d
