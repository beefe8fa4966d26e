// Expert parallelism (GShard, Lepikhin et al. 2020; Switch Transformer; as Megatron-LM's
// token_dispatcher.py and torchtitan's expert_parallel.py place it): the ranks of an `ep` group
// hold the same router (and attention) but different experts, rank r experts [r·E/P, (r+1)·E/P),
// and each routes its own tokens. One layer's forward, on rank r of P:
//
//   1. route (moe_route): the router, the k choices of each token, the dispatch in expert order
//      (moe.h). Because a rank's experts are consecutive ids, the rows for rank q are one
//      contiguous run of that order: send_rows[q] = the counts of q's experts.
//   2. counts: an all_to_all of the per-expert counts (E/P int64 to each rank), so every rank
//      learns how many rows each source sends to each of its experts before any token moves.
//   3. tokens: an all_to_all_v of the dispatched rows (send_rows[q]·C values to rank q). They
//      arrive source by source, each source's rows expert by expert.
//   4. permutation to local-expert order: expert e's rows from source 0, then source 1, ... (a
//      gather_rows by from_received). That is the order one device holding every rank's tokens
//      back to back (rank 0's first) dispatches them in, so each expert's products run over the
//      same rows in the same order, and the expert weights' gradients have one device's bits.
//   5. experts (experts_forward): one SwiGLU per local expert over its contiguous rows.
//   6. back: the inverse permutation (to_received), an all_to_all_v with the counts swapped, and
//      the weighted combine of each token's k outputs, in the order of its choices.
// The backward runs it in reverse: the combine's backward, the output gradients to the experts
// (all_to_all_v, permutation), experts_backward, back (permutation, all_to_all_v), then the
// dispatch's and the router's backward on the token side (moe_route_backward).
//
// Exactness: every token-side op works row by row and every product's elements sum over K in an
// order fixed by K, so out, the aux loss, dx and the router's gradient on rank r are bitwise those
// of one device running rank r's tokens alone, and the experts' gradients those of one device
// running all ranks' tokens back to back (tests/parallel/expert_parallel_test.cpp).
//
// Memory per rank (values of T), with n = BT·k dispatched rows and m = sum(recv_rows) received:
//   token side (moe_route):   (E + k + k·C)·BT, and 3·n int32 (choices, token, row)
//   expert side (activations): m·C (the received rows, permuted) + 3·m·I, and 2·m int32
//   forward scratch:          2·m·C (received, then outputs to return) and n·C (rows to send)
//   parameters:               E·C + (E/P)·3·I·C, against E·C + 3·E·I·C on one device
// Traffic per layer and step, as the traffic log counts this rank's sends (label::kExpertParallel):
//   counts:   (P-1)·(E/P)·8 bytes (the all_to_all), and an all_reduce of E int64 (the group's
//             per-expert counts, for the metrics)
//   forward:  sum over q != r of send_rows[q]·C·sizeof(T) for the tokens (kEpDispatch), and
//             sum over s != r of recv_rows[s]·C·sizeof(T) for their outputs back (kEpCombine)
//   backward: the same two again (kEpDispatchGrad as kEpDispatch, kEpCombineGrad as kEpCombine).
// With uniform routing (each of a rank's n = BT·k rows equally likely to reach any expert) a
// rank sends (P-1)/P of its rows away: per MoE layer and micro-batch, forward plus backward,
//   all-to-all bytes ≈ 4 · (P-1)/P · BT·k·C·sizeof(T)      (dispatch, combine, and their gradients)
// against a dense layer's none; the routing decides the exact figure, which the trainer's test
// (tests/parallel/moe_expert_parallel_test.cpp) derives by hand from one device's counts.
//
// In the trainer (ParallelTrainer, --mesh ep=P[,dp=D]): the ep ranks are data ranks too, D·P of
// them each running its own rows of the global batch. Rank (e, d) holds the whole attention and
// router and experts [e·E/P, (e+1)·E/P) of every MoE layer (ParallelPlan::make_model, the
// model's ExpertShard), and its MoE layers run the two functions below through
// ExpertParallelComm, the model's BlockComm::moe point. Per rank, with N one device's
// parameters, L MoE layers:
//   parameters    N - L·(E - E/P)·3·I·C     (and as many gradients, and twice as many AdamW moments)
//   gradients     DDP (data_parallel.cpp) all-reduces each MoE block's attention and router part
//                 over all D·P data ranks and its experts' part, L·(E/P)·3·I·C elements in all,
//                 over the D ranks holding the same experts: ring bytes 2(DP-1)/(DP)·(N - L·E·3·I·C)
//                 and 2(D-1)/D·L·(E/P)·3·I·C, times sizeof(T).
// ZeRO with ep, and ep with tp, cp or pp, are refused by name (ParallelPlan) until written, and so
// is an ep group that does not fit the experts: ep must divide E and be at most E
// (ParallelPlan::check_model), so that every rank holds E/ep >= 1 consecutive experts.
#include "core/parallel/expert_parallel.h"

#include <string>
#include <string_view>

#include "core/comm/traffic_labels.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/dtype.h"

namespace llama4d {

namespace {

std::vector<int64_t> times(const std::vector<int64_t>& rows, int64_t C) {
  std::vector<int64_t> v(rows);
  for (int64_t& x : v) x *= C;
  return v;
}

// Rows of an expert-ordered buffer go out to the ranks holding their experts (send_rows) and
// come back from them (recv_rows): one all_to_all_v of C values per row.
template <class T>
void exchange_rows(T* out, const std::vector<int64_t>& out_rows, const T* in, const std::vector<int64_t>& in_rows,
                   int64_t C, ProcessGroup& ep, std::string_view what) {
  ep.all_to_all_v(out, times(out_rows, C), in, times(in_rows, C), dtype_of<T>(), {.label = std::string(what)})->wait();
}

}  // namespace

template <class T>
void moe_forward_expert_parallel(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x,
                                 const MoeDims& d, ProcessGroup& ep, MemoryTracker* memory) {
  const int P = ep.size();
  const ExpertShard shard = ExpertShard::of(d, P, ep.rank());
  const int64_t C = d.C, El = shard.count, n = d.rows();
  // 1. Route this rank's tokens; the rows for rank q are its experts' run of the expert order.
  moe_route(a, w, x, d, memory);
  const MoeDispatch& p = a.dispatch;
  ExpertExchange& xc = a.exchange;
  xc.send_rows.assign(size_t(P), 0);
  for (int q = 0; q < P; ++q)
    xc.send_rows[size_t(q)] = p.begin[size_t((q + 1) * El)] - p.begin[size_t(q * El)];
  // 2. Counts: from each source s, counts[s·El + e] rows for local expert e.
  std::vector<int64_t> counts(size_t(P * El));
  ep.all_to_all(counts.data(), p.counts.data(), El, DType::i64, {.label = std::string(label::kEpCounts)})->wait();
  xc.global_counts = p.counts;
  ep.all_reduce(xc.global_counts.data(), d.E, DType::i64, ReduceOp::sum, {.label = std::string(label::kEpCounts)})->wait();
  xc.recv_rows.assign(size_t(P), 0);
  for (int s = 0; s < P; ++s)
    for (int64_t e = 0; e < El; ++e) xc.recv_rows[size_t(s)] += counts[size_t(s * El + e)];
  // 3. Tokens out.
  Buffer<T> send(memory, MemoryCategory::scratch, n * C, "expert parallelism: rows to send");
  ops::gather_rows(send.data(), x, a.token.data(), n, C);
  xc.held = {.first = shard.first, .begin = std::vector<int64_t>(size_t(El), 0),
            .counts = std::vector<int64_t>(size_t(El), 0)};
  for (int s = 0; s < P; ++s)
    for (int64_t e = 0; e < El; ++e) xc.held.counts[size_t(e)] += counts[size_t(s * El + e)];
  for (int64_t e = 1; e < El; ++e) xc.held.begin[size_t(e)] = xc.held.begin[size_t(e - 1)] + xc.held.counts[size_t(e - 1)];
  const int64_t m = xc.held.total();
  Buffer<T> received(memory, MemoryCategory::scratch, m * C, "expert parallelism: received rows");
  exchange_rows(received.data(), xc.recv_rows, send.data(), xc.send_rows, C, ep, label::kEpDispatch);
  send.reset();
  // 4. The permutation from source-then-expert to expert-then-source order, and its inverse.
  std::vector<int32_t> from(static_cast<size_t>(m)), to(static_cast<size_t>(m));
  std::vector<int64_t> next(xc.held.begin);
  for (int s = 0, at = 0; s < P; ++s)
    for (int64_t e = 0; e < El; ++e)
      for (int64_t i = 0; i < counts[size_t(s * El + e)]; ++i, ++at) {
        const int64_t local = next[size_t(e)]++;
        from[size_t(local)] = at;
        to[size_t(at)] = int32_t(local);
      }
  xc.from_received = Buffer<int32_t>(memory, MemoryCategory::activations, m, "expert parallelism: permutation");
  xc.to_received = Buffer<int32_t>(memory, MemoryCategory::activations, m, "expert parallelism: inverse permutation");
  ops::device_memcpy(xc.from_received.data(), from.data(), m * int64_t(sizeof(int32_t)));
  ops::device_memcpy(xc.to_received.data(), to.data(), m * int64_t(sizeof(int32_t)));
  a.expert.xs = Buffer<T>(memory, MemoryCategory::activations, m * C, "expert inputs (received)");
  ops::gather_rows(a.expert.xs.data(), received.data(), xc.from_received.data(), m, C);
  // 5. This rank's experts.
  Buffer<T> ys(memory, MemoryCategory::scratch, m * C, "expert parallelism: outputs to return");
  experts_forward(ys.data(), a.expert, w, xc.held, d, memory);
  // 6. Back to the tokens' ranks, then the combine.
  ops::gather_rows(received.data(), ys.data(), xc.to_received.data(), m, C);
  exchange_rows(a.ys.data(), xc.send_rows, received.data(), xc.recv_rows, C, ep, label::kEpCombine);
  ops::combine_rows(out, a.ys.data(), a.row.data(), a.weights.data(), d.BT, d.k, C);
}

template <class T>
void moe_backward_expert_parallel(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a,
                                  const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale,
                                  ProcessGroup& ep, MemoryTracker* memory) {
  const ExpertExchange& xc = a.exchange;
  const int64_t C = d.C, n = d.rows(), m = xc.held.total();
  const auto s = MemoryCategory::scratch;
  // The combine's backward on the token side.
  Buffer<T> dys(memory, s, n * C, "backward expert outputs"), dweights(memory, s, n, "backward router weights");
  ops::combine_rows_backward(dys.data(), dweights.data(), dout, a.ys.data(), a.row.data(),
                             a.weights.data(), d.BT, d.k, C);
  // The output gradients to the experts' ranks, into local-expert order.
  Buffer<T> received(memory, s, m * C, "backward expert parallelism: received rows");
  exchange_rows(received.data(), xc.recv_rows, dys.data(), xc.send_rows, C, ep, label::kEpDispatchGrad);
  Buffer<T> dys_held(memory, s, m * C, "backward expert outputs (held)");
  ops::gather_rows(dys_held.data(), received.data(), xc.from_received.data(), m, C);
  Buffer<T> dxs_held(memory, s, m * C, "backward expert inputs (held)");
  experts_backward(dxs_held.data(), g, dys_held.data(), a.expert, w, xc.held, d, memory);
  // The input gradients back to the tokens' ranks, then the dispatch's and router's backward.
  ops::gather_rows(received.data(), dxs_held.data(), xc.to_received.data(), m, C);
  exchange_rows(dys.data(), xc.send_rows, received.data(), xc.recv_rows, C, ep, label::kEpCombineGrad);
  moe_route_backward(dx, g, dweights.data(), dys.data(), a, w, x, d, aux_scale, memory);
}

#define LLAMA4D_EXPERT_PARALLEL(T)                                                                                  \
  template void moe_forward_expert_parallel<T>(T*, MoeActivations<T>&, const MoeWeights<T>&, const T*,   \
                                               const MoeDims&, ProcessGroup&, MemoryTracker*);                      \
  template void moe_backward_expert_parallel<T>(T*, const MoeWeights<T>&, const T*,                                 \
                                                const MoeActivations<T>&, const MoeWeights<T>&, const T*, \
                                                const MoeDims&, double, ProcessGroup&, MemoryTracker*);
LLAMA4D_EXPERT_PARALLEL(float)
LLAMA4D_EXPERT_PARALLEL(double)
#undef LLAMA4D_EXPERT_PARALLEL

}  // namespace llama4d
