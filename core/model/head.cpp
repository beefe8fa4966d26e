#include "core/model/head.h"

#include <utility>

#include "core/model/block.h"
#include "core/ops.h"

namespace llama4d {

template <class T>
void HeadActivations<T>::allocate(MemoryTracker* m, int64_t BT, int64_t C, int64_t V, bool vocab_parallel,
                                  int64_t rows) {
  const auto act = MemoryCategory::activations;
  n = Buffer<T>(m, act, BT * C, "final norm"), rstd = Buffer<T>(m, act, rows < 0 ? BT : rows, "final norm rstd");
  logits = Buffer<T>(m, act, BT * V, vocab_parallel ? "logits (vocabulary slice)" : "logits");
  losses = Buffer<T>(m, act, BT, "token losses");
  if (vocab_parallel) lse = Buffer<T>(m, act, BT, "token log-sum-exp");
}

template <class T>
void HeadActivations<T>::reset() {
  for (Buffer<T>* b : {&n, &rstd, &logits, &losses, &lse}) b->reset();
}

template <class T>
int64_t HeadActivations<T>::bytes() const {
  return n.bytes() + rstd.bytes() + logits.bytes() + losses.bytes() + lse.bytes();
}

namespace {

// The rows of the B*T tokens this rank's residual stream holds (all of them without sequence
// parallelism), split as the blocks split them.
template <class T>
BlockDims sequence_rows(int64_t BT, int64_t C, const Vocabulary<T>& vocab) {
  return {.B = BT, .seq = 1, .C = C, .sp = vocab.sequence_shards(), .sp_rank = vocab.sequence_rank()};
}

}  // namespace

template <class T>
LossSum head_forward(HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w, const int32_t* targets,
                     int64_t BT, int64_t C, int64_t V, double eps, Vocabulary<T>& vocab) {
  const BlockDims d = sequence_rows(BT, C, vocab);
  const int64_t rows = d.rows(), mine = d.row0() * C;
  ops::rmsnorm_forward(a.n.data() + mine, a.rstd.data(), x, norm_w, rows, C, T(eps));
  round_if_bf16(a.n.data() + mine, rows * C, a.bf16);
  vocab.gather_head_input(a.n.data(), BT, C);
  ops::matmul_forward(a.logits.data(), a.n.data(), lm_w, BT, C, V, gemm_operands(a.bf16));
  round_if_bf16(a.logits.data(), BT * V, a.bf16);
  if (!targets) return {};
  vocab.cross_entropy(a.losses.data(), a.lse.data(), a.logits.data(), targets, BT, V, a.n.memory());
  // Summed in double in row order: deterministic, and exact enough to compare runs bitwise.
  LossSum sum;
  ops::sum_losses(&sum.loss_sum, &sum.tokens, a.losses.data(), targets, BT);
  return sum;
}

template <class T>
void HeadWeightGradInputs<T>::allocate(MemoryTracker* m, int64_t BT, int64_t rows, int64_t C, int64_t V) {
  const auto act = MemoryCategory::activations;
  dlogits = Buffer<T>(m, act, BT * V, "weight-gradient inputs of the head: dlogits");
  dn = Buffer<T>(m, act, rows * C, "weight-gradient inputs of the head: d(final norm), this rank's rows");
}

template <class T>
void HeadWeightGradInputs<T>::take_inputs(HeadActivations<T>& a, Buffer<T>& head_input) {
  n = std::move(a.n), rstd = std::move(a.rstd), x = std::move(head_input);
  bf16_compute = a.bf16;
}

template <class T>
void HeadWeightGradInputs<T>::reset() {
  for (Buffer<T>* b : {&dlogits, &dn, &n, &x, &rstd}) b->reset();
  for (Buffer<bf16>& b : parked) b.reset();
}

template <class T>
int64_t HeadWeightGradInputs<T>::bytes() const {
  int64_t bytes = dlogits.bytes() + dn.bytes() + n.bytes() + x.bytes() + rstd.bytes();
  for (const Buffer<bf16>& b : parked) bytes += b.bytes();
  return bytes;
}

namespace {

// dx[rows, C] += the final RMSNorm's input gradient and dnorm_w[C] += its gain's (either may be
// null; norm_w is read only for dx), from dn_rows[rows, C], this rank's rows of the LM head's
// input gradient (summed over the vocabulary slices). Under sequence parallelism the gain's
// gradient from this rank's rows is summed over the ranks first.
template <class T>
void final_norm_backward(T* dx, T* dnorm_w, const T* dn_rows, const T* x, const T* norm_w, const T* rstd,
                         int64_t BT, int64_t C, MemoryTracker* memory, Vocabulary<T>& vocab) {
  const BlockDims d = sequence_rows(BT, C, vocab);
  const int64_t rows = d.rows();
  if (d.sp == 1 || !dnorm_w) {
    ops::rmsnorm_backward(dx, dnorm_w, dn_rows, x, norm_w, rstd, rows, C);
    return;
  }
  Buffer<T> gain(memory, MemoryCategory::scratch, C, "backward final norm gain grad");
  ops::fill(gain.data(), T(0), C);
  ops::rmsnorm_backward(dx, gain.data(), dn_rows, x, norm_w, rstd, rows, C);
  vocab.norm_gain_grad(gain.data(), C);
  ops::accumulate(dnorm_w, gain.data(), C);
}

// head_backward computing dlogits[BT, V] and dn[BT, C] into the given buffers; dnorm_w and
// dlm_w null: the input pass (no weight gradient), which keeps this rank's rows of dn in kept_dn.
template <class T>
void head_backward_into(T* dx, T* dnorm_w, T* dlm_w, T* dlogits, T* dn, const HeadActivations<T>& a, const T* x,
                        const T* norm_w, const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C,
                        int64_t V, MemoryTracker* memory, Vocabulary<T>& vocab, T* kept_dn = nullptr) {
  ops::fill(dlogits, T(0), BT * V);
  vocab.cross_entropy_backward(dlogits, a.logits.data(), a.lse.data(), targets, loss_scale, BT, V);
  round_if_bf16(dlogits, BT * V, a.bf16);
  ops::matmul_backward(dn, dlm_w, dlogits, a.n.data(), lm_w, BT, C, V, gemm_operands(a.bf16),
                       ops::GradWrite::overwrite);
  const BlockDims d = sequence_rows(BT, C, vocab);
  ops::fill(dx, T(0), d.rows() * C);
  vocab.head_input_grad(dn, BT, C);
  T* dn_rows = dn + d.row0() * C;
  round_if_bf16(dn_rows, d.rows() * C, a.bf16);
  if (kept_dn) ops::copy(kept_dn, dn_rows, d.rows() * C);
  final_norm_backward(dx, dnorm_w, dn_rows, x, norm_w, a.rstd.data(), BT, C, memory, vocab);
  round_if_bf16(dx, d.rows() * C, a.bf16);
}

}  // namespace

template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, const HeadActivations<T>& a, const T* x, const T* norm_w,
                   const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V,
                   MemoryTracker* memory, Vocabulary<T>& vocab) {
  Buffer<T> dlogits(memory, MemoryCategory::scratch, BT * V, "backward dlogits");
  Buffer<T> dn(memory, MemoryCategory::scratch, BT * C, "backward dn (head)");
  head_backward_into(dx, dnorm_w, dlm_w, dlogits.data(), dn.data(), a, x, norm_w, lm_w, targets, loss_scale, BT, C,
                     V, memory, vocab);
}

template <class T>
void head_backward_input(T* dx, HeadWeightGradInputs<T>& keep, const HeadActivations<T>& a, const T* x,
                         const T* norm_w, const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT,
                         int64_t C, int64_t V, Vocabulary<T>& vocab) {
  // Under sequence parallelism dn is summed over every row in scratch, then this rank's rows kept.
  Buffer<T> dn;
  if (sequence_rows(BT, C, vocab).sp > 1)
    dn = Buffer<T>(keep.dn.memory(), MemoryCategory::scratch, BT * C, "backward dn (head)");
  head_backward_into<T>(dx, nullptr, nullptr, keep.dlogits.data(), dn.empty() ? keep.dn.data() : dn.data(), a, x, norm_w,
                        lm_w, targets, loss_scale, BT, C, V, keep.dn.memory(), vocab,
                        dn.empty() ? nullptr : keep.dn.data());
}

template <class T>
void head_backward_weight(T* dnorm_w, T* dlm_w, const HeadWeightGradInputs<T>& in, int64_t BT, int64_t C, int64_t V,
                          MemoryTracker* memory, Vocabulary<T>& vocab) {
  // head_backward's weight-gradient calls, in its order; no input gradient, so no parameter read.
  ops::matmul_backward<T>(nullptr, dlm_w, in.dlogits.data(), in.n.data(), nullptr, BT, C, V, gemm_operands(in.bf16_compute));
  final_norm_backward<T>(nullptr, dnorm_w, in.dn.data(), in.x.data(), nullptr, in.rstd.data(), BT, C, memory, vocab);
}

#define LLAMA4D_HEAD(T)                                                                                         \
  template struct HeadActivations<T>;                                                                           \
  template LossSum head_forward<T>(HeadActivations<T>&, const T*, const T*, const T*, const int32_t*, int64_t, \
                                   int64_t, int64_t, double, Vocabulary<T>&);                                    \
  template void head_backward<T>(T*, T*, T*, const HeadActivations<T>&, const T*, const T*, const T*,           \
                                 const int32_t*, T, int64_t, int64_t, int64_t, MemoryTracker*, Vocabulary<T>&); \
  template struct HeadWeightGradInputs<T>;                                                                      \
  template void head_backward_input<T>(T*, HeadWeightGradInputs<T>&, const HeadActivations<T>&, const T*,       \
                                       const T*, const T*, const int32_t*, T, int64_t, int64_t, int64_t,        \
                                       Vocabulary<T>&);                                                          \
  template void head_backward_weight<T>(T*, T*, const HeadWeightGradInputs<T>&, int64_t, int64_t, int64_t,      \
                                        MemoryTracker*, Vocabulary<T>&);
LLAMA4D_HEAD(float)
LLAMA4D_HEAD(double)
#undef LLAMA4D_HEAD

}  // namespace llama4d
