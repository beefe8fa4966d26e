// The mixture-of-experts layer (moe.h): the router, the dispatch in expert order, one SwiGLU per
// expert over its rows, and the weighted combine; the backward in the reverse order.
#include "core/model/moe.h"

#include <limits>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d {

void MoeDims::validate() const {
  auto positive = [](int64_t v, const char* what) {
    if (v < 1) throw InputError(std::string("mixture of experts: ") + what + " must be positive, not " + std::to_string(v));
  };
  positive(C, "hidden_size");
  positive(I, "intermediate_size");
  positive(E, "num_local_experts");
  positive(k, "num_experts_per_tok");
  if (k > E)
    throw InputError("mixture of experts: num_experts_per_tok (" + std::to_string(k) +
                     ") is larger than num_local_experts (" + std::to_string(E) + ")");
  if (BT < 0) throw InputError("mixture of experts: negative token count");
  if (!(aux_coef >= 0.0)) throw InputError("mixture of experts: router_aux_loss_coef must be >= 0");
}

ExpertShard ExpertShard::of(const MoeDims& d, int ep_size, int ep_rank) {
  if (ep_size < 1 || d.E % ep_size != 0)
    throw InputError("expert parallelism: ep=" + std::to_string(ep_size) + " does not divide num_local_experts=" +
                     std::to_string(d.E));
  const int64_t count = d.E / ep_size;
  return {.first = count * ep_rank, .count = count};
}

void ExpertExchange::reset() {
  held = {};
  from_received.reset(), to_received.reset();
  send_rows.clear(), recv_rows.clear(), global_counts.clear();
}

template <class T>
MoeWeights<T> moe_weights(T* segment, const MoeDims& d) {
  return {.gate = segment, .experts = segment + d.E * d.C, .C = d.C, .I = d.I};
}

int64_t moe_numel(const MoeDims& d) { return d.E * d.C + 3 * d.E * d.I * d.C; }

MoeDispatch dispatch_in_expert_order(const std::vector<int32_t>& experts, int64_t E, int64_t k) {
  const int64_t n = int64_t(experts.size());
  if (k < 1 || n % k != 0 || n > std::numeric_limits<int32_t>::max())
    throw InputError("mixture of experts: " + std::to_string(n) + " choices are not k=" + std::to_string(k) +
                     " per token for at most 2^31 rows (the dispatch's indices are int32)");
  MoeDispatch p;
  p.experts = experts;
  p.counts.assign(size_t(E), 0);
  for (int32_t e : experts) {
    if (e < 0 || e >= E) throw InputError("mixture of experts: expert id " + std::to_string(e) + " outside [0, " + std::to_string(E) + ")");
    ++p.counts[size_t(e)];
  }
  p.begin.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) p.begin[size_t(e + 1)] = p.begin[size_t(e)] + p.counts[size_t(e)];
  p.token.resize(size_t(n));
  p.row.resize(size_t(n));
  std::vector<int64_t> next(p.begin.begin(), p.begin.end() - 1);
  for (int64_t i = 0; i < n; ++i) {  // choice i = t*k + j, visited in token order
    const int64_t r = next[size_t(experts[size_t(i)])]++;
    p.token[size_t(r)] = int32_t(i / k);
    p.row[size_t(i)] = int32_t(r);
  }
  return p;
}

template <class T>
void ExpertActivations<T>::reset() {
  for (Buffer<T>* b : {&xs, &h1, &h3, &act}) b->reset();
}

template <class T>
void MoeActivations<T>::reset() {
  for (Buffer<T>* b : {&probs, &weights, &ys}) b->reset();
  for (Buffer<int32_t>* b : {&experts, &token, &row}) b->reset();
  expert.reset();
  dispatch = {};
  exchange.reset();
  aux_loss = 0.0;
}

namespace {

template <class V>
void to_device(Buffer<V>& dst, const std::vector<V>& src) {
  ops::device_memcpy(dst.data(), src.data(), int64_t(src.size() * sizeof(V)));
}

// P_e * BT = the column sums of probs [BT, E], as the product probs^T @ ones [BT, 1]: a weight
// gradient's product (ops::matmul_backward), summed in the order the GEMM fixes from BT alone.
template <class T>
std::vector<T> probability_sums(const T* probs, const MoeDims& d, MemoryTracker* memory) {
  Buffer<T> ones(memory, MemoryCategory::scratch, d.BT, "router: ones");
  Buffer<T> sums(memory, MemoryCategory::scratch, d.E, "router: probability sums");
  ops::fill(ones.data(), T(1), d.BT);
  ops::fill(sums.data(), T(0), d.E);
  ops::matmul_backward<T>(nullptr, sums.data(), probs, ones.data(), nullptr, d.BT, 1, d.E);
  std::vector<T> host(static_cast<size_t>(d.E));
  ops::device_memcpy(host.data(), sums.data(), d.E * int64_t(sizeof(T)));
  return host;
}

ExpertRows every_expert(const MoeDispatch& p) {
  return {.first = 0, .begin = {p.begin.begin(), p.begin.end() - 1}, .counts = p.counts};
}

}  // namespace

template <class T>
void experts_forward(T* ys, ExpertActivations<T>& a, const MoeWeights<T>& w, const ExpertRows& rows, const MoeDims& d,
                     MemoryTracker* memory) {
  const int64_t C = d.C, I = d.I, n = rows.total();
  const auto act = MemoryCategory::activations;
  a.h1 = Buffer<T>(memory, act, n * I, "expert w1 outputs");
  a.h3 = Buffer<T>(memory, act, n * I, "expert w3 outputs");
  a.act = Buffer<T>(memory, act, n * I, "expert SwiGLU outputs");
  for (size_t e = 0; e < rows.counts.size(); ++e) {
    const int64_t b = rows.begin[e], count = rows.counts[e];
    if (count == 0) continue;
    ops::matmul_forward(a.h1.data() + b * I, a.xs.data() + b * C, w.w1(int64_t(e)), count, C, I);
    ops::matmul_forward(a.h3.data() + b * I, a.xs.data() + b * C, w.w3(int64_t(e)), count, C, I);
  }
  ops::swiglu_forward(a.act.data(), a.h1.data(), a.h3.data(), n * I);
  for (size_t e = 0; e < rows.counts.size(); ++e) {
    const int64_t b = rows.begin[e], count = rows.counts[e];
    if (count == 0) continue;
    ops::matmul_forward(ys + b * C, a.act.data() + b * I, w.w2(int64_t(e)), count, I, C);
  }
}

template <class T>
void experts_backward(T* dxs, const MoeWeights<T>& g, const T* dys, const ExpertActivations<T>& a,
                      const MoeWeights<T>& w, const ExpertRows& rows, const MoeDims& d, MemoryTracker* memory) {
  const int64_t C = d.C, I = d.I, n = rows.total();
  const auto s = MemoryCategory::scratch;
  const ops::GradWrite over = ops::GradWrite::overwrite;
  Buffer<T> dact(memory, s, n * I, "backward expert SwiGLU"), dh1(memory, s, n * I, "backward expert w1");
  Buffer<T> dh3(memory, s, n * I, "backward expert w3");
  for (size_t e = 0; e < rows.counts.size(); ++e) {
    const int64_t b = rows.begin[e], count = rows.counts[e];
    if (count == 0) continue;
    ops::matmul_backward(dact.data() + b * I, g.w2(int64_t(e)), dys + b * C, a.act.data() + b * I, w.w2(int64_t(e)),
                         count, I, C, ops::GemmOperands::as_stored, over);
  }
  ops::swiglu_backward(dh1.data(), dh3.data(), dact.data(), a.h1.data(), a.h3.data(), n * I);
  for (size_t e = 0; e < rows.counts.size(); ++e) {
    const int64_t b = rows.begin[e], count = rows.counts[e];
    if (count == 0) continue;
    ops::matmul_backward(dxs + b * C, g.w1(int64_t(e)), dh1.data() + b * I, a.xs.data() + b * C, w.w1(int64_t(e)),
                         count, C, I, ops::GemmOperands::as_stored, over);
    ops::matmul_backward(dxs + b * C, g.w3(int64_t(e)), dh3.data() + b * I, a.xs.data() + b * C, w.w3(int64_t(e)),
                         count, C, I);
  }
}

template <class T>
void moe_route(MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d, MemoryTracker* memory) {
  d.validate();
  const int64_t BT = d.BT, C = d.C, E = d.E, k = d.k, n = d.rows();
  const auto act = MemoryCategory::activations;
  a.reset();
  // Logits, probabilities, the k choices and their weights; the choices go to the host, which
  // sorts them into expert order.
  Buffer<T> logits(memory, MemoryCategory::scratch, BT * E, "router logits");
  ops::matmul_forward(logits.data(), x, w.gate, BT, C, E);
  a.probs = Buffer<T>(memory, act, BT * E, "router probs");
  a.weights = Buffer<T>(memory, act, n, "router weights");
  a.experts = Buffer<int32_t>(memory, act, n, "router experts");
  ops::router_topk(a.probs.data(), a.weights.data(), a.experts.data(), logits.data(), BT, E, k);
  std::vector<int32_t> chosen(static_cast<size_t>(n));
  ops::device_memcpy(chosen.data(), a.experts.data(), n * int64_t(sizeof(int32_t)));
  a.dispatch = dispatch_in_expert_order(chosen, E, k);
  a.token = Buffer<int32_t>(memory, act, n, "dispatch: token of each row");
  a.row = Buffer<int32_t>(memory, act, n, "dispatch: row of each choice");
  to_device(a.token, a.dispatch.token);
  to_device(a.row, a.dispatch.row);
  a.ys = Buffer<T>(memory, act, n * C, "expert outputs");
  // Load balancing: aux = coef * E * sum_e (counts_e / BT) * (sums_e / BT), in double.
  if (BT > 0 && d.aux_coef > 0.0) {
    const std::vector<T> sums = probability_sums(a.probs.data(), d, memory);
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += double(a.dispatch.counts[size_t(e)]) * double(sums[size_t(e)]);
    a.aux_loss = d.aux_coef * double(E) * s / (double(BT) * double(BT));
  }
}

template <class T>
void moe_route_backward(T* dx, const MoeWeights<T>& g, const T* dweights, const T* dxs, const MoeActivations<T>& a,
                        const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale, MemoryTracker* memory) {
  const int64_t BT = d.BT, C = d.C, E = d.E, k = d.k;
  // The dispatch's backward: each token's k input gradients summed in the order of its choices.
  ops::combine_rows<T>(dx, dxs, a.row.data(), nullptr, BT, k, C);
  // The router: through the weights, and through every probability from the load-balancing loss,
  // d(aux)/d(probs[t, e]) = coef * E * f_e / BT for every token.
  Buffer<T> dprobs;
  if (BT > 0 && d.aux_coef > 0.0 && aux_scale != 0.0) {
    std::vector<T> host(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      host[size_t(e)] = T(aux_scale * d.aux_coef * double(E) * double(a.dispatch.counts[size_t(e)]) /
                          (double(BT) * double(BT)));
    dprobs = Buffer<T>(memory, MemoryCategory::scratch, E, "backward load-balancing loss");
    to_device(dprobs, host);
  }
  Buffer<T> dlogits(memory, MemoryCategory::scratch, BT * E, "backward router logits");
  ops::router_backward(dlogits.data(), dweights, dprobs.empty() ? nullptr : dprobs.data(), a.probs.data(),
                       a.weights.data(), a.experts.data(), BT, E, k);
  ops::matmul_backward(dx, g.gate, dlogits.data(), x, w.gate, BT, C, E);
}

template <class T>
void moe_forward(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d,
                 MemoryTracker* memory) {
  moe_route(a, w, x, d, memory);
  const int64_t n = d.rows();
  a.expert.xs = Buffer<T>(memory, MemoryCategory::activations, n * d.C, "expert inputs");
  ops::gather_rows(a.expert.xs.data(), x, a.token.data(), n, d.C);
  experts_forward(a.ys.data(), a.expert, w, every_expert(a.dispatch), d, memory);
  // Combine: each token's k outputs, weighted, in the order of its choices.
  ops::combine_rows(out, a.ys.data(), a.row.data(), a.weights.data(), d.BT, d.k, d.C);
}

template <class T>
void moe_backward(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a, const MoeWeights<T>& w,
                  const T* x, const MoeDims& d, double aux_scale, MemoryTracker* memory) {
  const int64_t n = d.rows(), C = d.C;
  const auto s = MemoryCategory::scratch;
  // The combine's backward: each row's output gradient, and each choice's weight gradient.
  Buffer<T> dys(memory, s, n * C, "backward expert outputs"), dweights(memory, s, n, "backward router weights");
  ops::combine_rows_backward(dys.data(), dweights.data(), dout, a.ys.data(), a.row.data(), a.weights.data(), d.BT,
                             d.k, C);
  Buffer<T> dxs(memory, s, n * C, "backward expert inputs");
  experts_backward(dxs.data(), g, dys.data(), a.expert, w, every_expert(a.dispatch), d, memory);
  moe_route_backward(dx, g, dweights.data(), dxs.data(), a, w, x, d, aux_scale, memory);
}

#define LLAMA4D_MOE(T)                                                                                           \
  template MoeWeights<T> moe_weights<T>(T*, const MoeDims&);                                                     \
  template struct ExpertActivations<T>;                                                                          \
  template struct MoeActivations<T>;                                                                             \
  template void experts_forward<T>(T*, ExpertActivations<T>&, const MoeWeights<T>&, const ExpertRows&,           \
                                   const MoeDims&, MemoryTracker*);                                              \
  template void experts_backward<T>(T*, const MoeWeights<T>&, const T*, const ExpertActivations<T>&,             \
                                    const MoeWeights<T>&, const ExpertRows&, const MoeDims&, MemoryTracker*);    \
  template void moe_route<T>(MoeActivations<T>&, const MoeWeights<T>&, const T*, const MoeDims&, MemoryTracker*); \
  template void moe_route_backward<T>(T*, const MoeWeights<T>&, const T*, const T*, const MoeActivations<T>&,     \
                                      const MoeWeights<T>&, const T*, const MoeDims&, double, MemoryTracker*);   \
  template void moe_forward<T>(T*, MoeActivations<T>&, const MoeWeights<T>&, const T*, const MoeDims&,           \
                               MemoryTracker*);                                                                  \
  template void moe_backward<T>(T*, const MoeWeights<T>&, const T*, const MoeActivations<T>&, const MoeWeights<T>&, \
                                const T*, const MoeDims&, double, MemoryTracker*);
LLAMA4D_MOE(float)
LLAMA4D_MOE(double)
#undef LLAMA4D_MOE

}  // namespace llama4d
