#pragma once
// The op signatures every compute backend implements (backends/cpu today, backends/cuda
// later). The model calls only these; it never sees OpenMP or CUDA.
//
// Each op below forwards to the ACTIVE compute backend (a table of kernels, ComputeBackend at
// the end of this file), chosen at run time: `--device cpu|cuda` selects it before any buffer is
// allocated, and the model, optimizer, strategies and harness run unchanged on either. A
// backend registers itself when its library is linked; until an entry program selects one, the
// active backend is "cpu".
//
// Conventions (kept everywhere in llama4d):
// - Outputs first, then inputs, then sizes. Pointers are contiguous row-major buffers.
// - Shapes are written in comments as [A, B, C]; BT means B*T rows flattened.
// - Every backward ACCUMULATES (+=) into its gradient outputs, so a caller zeroes them once
//   and gradients from several uses (tied embeddings, residual branches) simply add up.
// - Forward outputs are overwritten (=), never accumulated.
// - T is float or double; backends explicitly instantiate both.
#include <cstdint>
#include <string>
#include <vector>

namespace llama4d {
struct bf16;                   // core/tensor/dtype.h: bfloat16 as raw bits
enum class DType : uint8_t;    // core/tensor/dtype.h
enum class ReduceOp : uint8_t; // core/comm/comm_types.h
}

namespace llama4d::ops {

template <class T>
struct Kernels;
// The active backend's kernels for element type T (float or double).
template <class T>
const Kernels<T>& kernels();

// ---- Work accounting: what the simulated clock charges ---------------------------------------
// Ops that multiply matrices (matmul_*, attention_*) report the FLOPs their math needs to the
// sink installed on the calling thread, if any (the forwarders below report them, whichever
// backend runs the op): a virtual GPU's trace (core/comm/trace.h) turns them into simulated time
// at the modelled GPU's rate. Every backend reports the same numbers,
// from the functions below, whatever its kernels waste (padding, masked blocks). Elementwise ops
// (RMSNorm, RoPE, SwiGLU, the loss, AdamW, fills) report nothing: on a GPU they are bound by
// memory bandwidth, a cost this model leaves out.
class FlopSink {
 public:
  virtual ~FlopSink() = default;
  virtual void add_flops(double flops) = 0;
};
// The calling thread's sink (null: nothing is counted).
inline FlopSink*& thread_flop_sink() {
  static thread_local FlopSink* sink = nullptr;
  return sink;
}
inline void report_flops(double flops) {
  if (FlopSink* s = thread_flop_sink()) s->add_flops(flops);
}
// Installs a sink on this thread for the guard's lifetime (the previous one comes back after).
class ScopedFlopSink {
 public:
  explicit ScopedFlopSink(FlopSink* sink) : previous_(thread_flop_sink()) { thread_flop_sink() = sink; }
  ~ScopedFlopSink() { thread_flop_sink() = previous_; }
  ScopedFlopSink(const ScopedFlopSink&) = delete;
  ScopedFlopSink& operator=(const ScopedFlopSink&) = delete;

 private:
  FlopSink* previous_;
};

// 2 FLOPs per multiply-add: out[BT, OC] = inp[BT, C] @ weight^T is 2·BT·C·OC; each of the
// backward's two products (dinp, dweight) costs the same, and a skipped one nothing.
inline double matmul_forward_flops(int64_t BT, int64_t C, int64_t OC) { return 2.0 * double(BT) * double(C) * double(OC); }
inline double matmul_backward_flops(bool dinp, bool dweight, int64_t BT, int64_t C, int64_t OC) {
  return (double(dinp) + double(dweight)) * matmul_forward_flops(BT, C, OC);
}

// ---- Linear layer without bias, nn.Linear layout (weight is [OC, C]) -----------------------
// What a product's operands hold, and so how a backend may read them.
// - as_stored: any T. Each element is summed as backends/cpu/gemm.h documents (K in blocks of
//   256, one multiply-add per k, fused in the release build); the CUDA backend does the same,
//   but sums a weight gradient's tokens without the CPU's depth chunks (backends/cuda/gemm.cu).
// - bf16: every element of every operand holds a bf16 value (bf16 mixed precision rounds them
//   before they are read, Llama::set_bf16_compute). A backend may then read them as bf16 (half
//   the bytes; tensor cores on a GPU): each product of two bf16 values is exact in fp32, so only
//   the order and precision of the sum over K change, in an order the backend fixes from K
//   alone, so that a slice of the rows or columns has the bits of the whole product's slice.
//   The CPU backend sums them as as_stored. An element that is not a bf16 value may be rounded
//   to one first (the CUDA backend does), so callers must round.
enum class GemmOperands { as_stored, bf16 };

// How a backward op writes an input gradient: added to what its buffer holds (a tensor with
// several gradient sources, as the attention input's from q, k and v), or written over it (the
// first source, which spares zeroing the buffer: on 16 cores the zeroing took 9% of a `small`
// step).
enum class GradWrite { add, overwrite };

// out[BT, OC] = inp[BT, C] @ weight[OC, C]^T
template <class T>
inline void matmul_forward(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC,
                           GemmOperands operands = GemmOperands::as_stored) {
  report_flops(matmul_forward_flops(BT, C, OC));
  kernels<T>().matmul_forward(out, inp, weight, BT, C, OC, operands);
}
// dinp[BT, C] += dout[BT, OC] @ weight[OC, C];  dweight[OC, C] += dout^T @ inp[BT, C].
// Either of dinp / dweight may be null to skip it (e.g. no input gradient for layer 0's input);
// weight is read only for dinp, inp only for dweight, and the other keeps its bits.
// dinp_write = overwrite: dinp = the product instead, for an input gradient's first (or only)
// source, so its buffer needs no zeroing first; its bits are those of adding into zeros (but
// for the sign of an exact zero: 0 + -0 is +0).
template <class T>
inline void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT,
                            int64_t C, int64_t OC, GemmOperands operands = GemmOperands::as_stored,
                            GradWrite dinp_write = GradWrite::add) {
  report_flops(matmul_backward_flops(dinp != nullptr, dweight != nullptr, BT, C, OC));
  kernels<T>().matmul_backward(dinp, dweight, dout, inp, weight, BT, C, OC, operands, dinp_write);
}

// ---- RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight ---------------------------------
// out[BT, C], rstd[BT] (saved 1/rms for backward), inp[BT, C], weight[C]
template <class T>
inline void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps) {
  kernels<T>().rmsnorm_forward(out, rstd, inp, weight, BT, C, eps);
}
// dinp[BT, C] +=, dweight[C] +=. Either may be null to skip it, and the other keeps its bits;
// weight is read only for dinp.
template <class T>
inline void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                             const T* rstd, int64_t BT, int64_t C) {
  kernels<T>().rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, BT, C);
}

// ---- Rotary position embedding, rotate-half convention (Hugging Face Llama) ----------------
// x[B, T, nh, hd] rotated in place. Pair (i, i + hd/2) at absolute position p uses
// cos[p, i], sin[p, i] from tables [max_pos, hd/2]; positions are pos_start .. pos_start+T-1.
//   x'[i]        = x[i] * cos - x[i+hd/2] * sin
//   x'[i+hd/2]   = x[i+hd/2] * cos + x[i] * sin
template <class T>
inline void rope_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd,
                         int64_t pos_start) {
  kernels<T>().rope_forward(x, cos, sin, B, seq, nh, hd, pos_start);
}
// dx[B, T, nh, hd] in place: applies the transpose (inverse) rotation to the incoming gradient.
template <class T>
inline void rope_backward(T* dx, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd,
                          int64_t pos_start) {
  kernels<T>().rope_backward(dx, cos, sin, B, seq, nh, hd, pos_start);
}

// ---- Causal grouped-query attention ---------------------------------------------------------
// Query head h reads key/value head h / (nh / nkv). Query row i sits at absolute position
// q_start + i, key row j at k_start + j; key j is visible to query i iff k_start + j <= q_start + i.
// That one rule covers training (q_start = k_start = 0), KV-cache decoding (Tq = 1, q_start =
// past) and context-parallel chunks. Keys/values may live in a larger cache: kv_batch_stride is
// the distance between batch items in elements (0 means Tk * nkv * hd).
//
// Document masking (Llama 3 trains on several documents packed into one sequence, and a token
// attends only within its own document): q_doc[B, Tq] and k_doc[B, Tk] give each query and key
// row a document id (contiguous, batch-major, no stride). Key j is then visible to query i iff it
// is causally visible AND q_doc[b, i] == k_doc[b, j]. Both null: no document mask; exactly one
// null is an InputError. Ids need not be sorted, but contiguous runs (packed documents) let a
// block of queries skip the keys of earlier documents, which is where the saving is.
struct AttentionShape {
  int64_t B = 0, Tq = 0, Tk = 0, nh = 0, nkv = 0, hd = 0;
  int64_t q_start = 0, k_start = 0;
  int64_t kv_batch_stride = 0;
  const int32_t* q_doc = nullptr;  // [B, Tq] document id of each query row, or null
  const int32_t* k_doc = nullptr;  // [B, Tk] document id of each key row, or null
  // bf16: q, k, v (and in the backward dout and out) hold bf16 values, so a backend may run the
  // score and weighted-sum products on bf16 operands (tensor cores), as GemmOperands says for a
  // linear layer; the softmax and its statistics stay in T.
  GemmOperands operands = GemmOperands::as_stored;
};
// Keys causally visible to query row i: [0, min(Tk, q_start + i - k_start + 1)).
inline int64_t attention_causal_keys(const AttentionShape& s, int64_t i) {
  const int64_t seen = s.q_start + i - s.k_start + 1;
  return seen <= 0 ? 0 : (seen < s.Tk ? seen : s.Tk);
}
// Causal (query, key) pairs of ONE batch item and query head, documents ignored. Causal training
// with Tq = Tk = T gives T(T+1)/2, about half of the T² square the MFU convention counts
// (core/model/flops.h).
inline int64_t attention_causal_pairs(const AttentionShape& s) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < s.Tq; ++i) pairs += attention_causal_keys(s, i);
  return pairs;
}
// (query, key) pairs one call scores per query head, summed over the batch: the causal pairs,
// and with document ids only those whose ids agree (B · attention_causal_pairs without them).
// Document ids cost a pass over the causal pairs: integer compares, far below the hd·nh
// multiply-adds each pair costs the op itself.
inline int64_t attention_visible_pairs(const AttentionShape& s) {
  if (s.q_doc == nullptr || s.k_doc == nullptr) return s.B * attention_causal_pairs(s);
  int64_t pairs = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.Tq; ++i) {
      const int32_t doc = s.q_doc[b * s.Tq + i];
      const int32_t* k_doc = s.k_doc + b * s.Tk;
      for (int64_t j = 0, n = attention_causal_keys(s, i); j < n; ++j) pairs += k_doc[j] == doc;
    }
  return pairs;
}
// Forward: scores q·k and the weighted sum p·v, 2 products of hd multiply-adds per pair: 4·hd.
// Backward: the scores again (only the log-sum-exp was saved), dv += pᵀ·do, dp = do·vᵀ,
// dq += ds·k and dk += dsᵀ·q: 5 products, 10·hd per pair (2.5x the forward, as in FlashAttention-2).
// Without documents the product is formed as core/model/flops.cpp forms it (B·nh times the pairs
// of one item), so the traced FLOPs and the model's count agree to the bit.
inline double attention_forward_flops(const AttentionShape& s) {
  if (s.q_doc == nullptr || s.k_doc == nullptr)
    return 4.0 * double(s.hd) * double(s.B * s.nh) * double(attention_causal_pairs(s));
  return 4.0 * double(s.hd) * double(s.nh) * double(attention_visible_pairs(s));
}
inline double attention_backward_flops(const AttentionShape& s) { return 2.5 * attention_forward_flops(s); }
// out[B, Tq, nh, hd] = softmax(q k^T / sqrt(hd), causal [and document] mask) v
// lse[B, nh, Tq] = log-sum-exp of each softmax row (saved instead of the [Tq, Tk] probabilities,
// as flash attention does; also what context parallelism needs to merge partial results).
// A query row with no visible key gets out = 0 and lse = -inf.
// q[B, Tq, nh, hd], k[B, Tk, nkv, hd], v[B, Tk, nkv, hd]
// InputError for a shape no backend can compute: negative sizes, nh not a multiple of nkv, a
// kv_batch_stride below Tk * nkv * hd, exactly one of q_doc / k_doc. The forwarders check it, so
// every backend refuses the same shapes with the same message.
void check_attention_shape(const AttentionShape& s);
template <class T>
inline void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s) {
  check_attention_shape(s);
  if (thread_flop_sink()) report_flops(attention_forward_flops(s));  // with documents, counting costs O(B Tq Tk)
  kernels<T>().attention_forward(out, lse, q, k, v, s);
}
// dq[B, Tq, nh, hd] +=, dk[B, Tk, nkv, hd] +=, dv[B, Tk, nkv, hd] += (kv_batch_stride applies to
// dk/dv too). Probabilities are recomputed from q, k and lse; a row with no visible key
// contributes nothing.
template <class T>
inline void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                               const T* out, const T* lse, const AttentionShape& s) {
  check_attention_shape(s);
  if (thread_flop_sink()) report_flops(attention_backward_flops(s));
  kernels<T>().attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
}
// InputError unless B, Tq >= 0 and nh, hd >= 1 (attention_merge's forwarder checks it).
void check_merge_shape(int64_t B, int64_t Tq, int64_t nh, int64_t hd);
// Combines attention over two disjoint sets of keys into attention over their union, in place:
// out[B, Tq, nh, hd] and lse[B, nh, Tq] hold the result over one set, part_out / part_lse (same
// shapes) the result over the other. Per row (b, i, h):
//   lse' = log(exp(lse) + exp(part_lse)) = max + log1p(exp(min - max))
//   out' = out * exp(lse - lse') + part_out * exp(part_lse - lse')
// A side with lse = -inf (it saw no key) contributes nothing: the other side's row is kept or
// copied bit for bit, and both -inf leaves out = 0, lse = -inf. Each row is computed alone, so
// the result does not depend on the thread count.
// Ring attention (context parallelism) calls it once per ring step, to fold in the block of keys
// that step brought. Its backward needs no merge: attention_backward called on one key block with
// the FINAL out and lse of each row returns exactly that block's share of dq, dk and dv. Per key,
// dS = P * (dP - D) needs only the key's own score and value plus two per-row numbers, and both
// are then the final ones: p = exp(s - lse_final) is the key's probability in the full softmax,
// and D = rowsum(dout * out_final) is the same for every key of the row. So dk, dv of the block's
// keys come out whole, and the blocks' dq add up to the full dq.
template <class T>
inline void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq,
                            int64_t nh, int64_t hd) {
  check_merge_shape(B, Tq, nh, hd);
  kernels<T>().attention_merge(out, lse, part_out, part_lse, B, Tq, nh, hd);
}

// ---- SwiGLU: out = silu(gate) * up ----------------------------------------------------------
// out[N], gate[N], up[N] (N = BT * I)
template <class T>
inline void swiglu_forward(T* out, const T* gate, const T* up, int64_t N) {
  kernels<T>().swiglu_forward(out, gate, up, N);
}
// dgate[N] =, dup[N] = (written over: SwiGLU's gate and up have no other gradient source)
template <class T>
inline void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N) {
  kernels<T>().swiglu_backward(dgate, dup, dout, gate, up, N);
}

// ---- Token embedding ------------------------------------------------------------------------
// out[BT, C] = wte[tokens[i], :]; tokens[BT] in [0, V)
template <class T>
inline void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
  kernels<T>().embedding_forward(out, tokens, wte, BT, C);
}
// dwte[V, C] += scatter-add of dout[BT, C] rows by token (in row order, deterministically)
template <class T>
inline void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  kernels<T>().embedding_backward(dwte, dout, tokens, BT, C);
}

// ---- Residual add ---------------------------------------------------------------------------
// out[N] = a[N] + b[N] (out may alias a)
template <class T>
inline void add_forward(T* out, const T* a, const T* b, int64_t N) {
  kernels<T>().add_forward(out, a, b, N);
}
// y[N] += x[N]
template <class T>
inline void accumulate(T* y, const T* x, int64_t N) {
  kernels<T>().accumulate(y, x, N);
}

// ---- Fused softmax + cross-entropy over the vocabulary --------------------------------------
// losses[BT] = logsumexp(logits[i]) - logits[i, targets[i]]; a target < 0 is ignored (loss 0).
// logits[BT, V]
template <class T>
inline void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t BT, int64_t V) {
  kernels<T>().cross_entropy_forward(losses, logits, targets, BT, V);
}
// dlogits[BT, V] += scale * (softmax(logits[i]) - onehot(targets[i])) for non-ignored rows.
// `scale` is d(total loss)/d(losses[i]), the same for every row (1 / tokens in the global batch).
template <class T>
inline void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T scale, int64_t BT,
                                   int64_t V) {
  kernels<T>().cross_entropy_backward(dlogits, logits, targets, scale, BT, V);
}

// ---- Vocabulary-parallel cross-entropy (tensor parallelism) -----------------------------------
// A rank holds columns [vocab_begin, vocab_begin + V) of the full logits: logits[BT, V] here is
// that slice. The loss needs three per-token statistics over ALL columns; each rank computes its
// part and an all-reduce (max, then sum) combines them, so no rank holds the full [BT, V_full].
// row_max[BT] = max of the row's slice; target_logit[BT] = logits[i, targets[i] - vocab_begin]
// when this slice holds the target, else 0 (the sum over ranks is the target's logit).
template <class T>
inline void vocab_slice_max_and_target(T* row_max, T* target_logit, const T* logits, const int32_t* targets, int64_t BT,
                                       int64_t V, int64_t vocab_begin) {
  kernels<T>().vocab_slice_max_and_target(row_max, target_logit, logits, targets, BT, V, vocab_begin);
}
// sum_exp[BT] = sum_j exp(logits[i, j] - row_max[i]) over the slice, row_max the GLOBAL max.
template <class T>
inline void vocab_slice_sum_exp(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V) {
  kernels<T>().vocab_slice_sum_exp(sum_exp, logits, row_max, BT, V);
}
// From the global statistics: lse[i] = row_max[i] + log(sum_exp[i]); losses[i] = lse[i] -
// target_logit[i] (0 where targets[i] < 0).
template <class T>
inline void cross_entropy_from_stats(T* losses, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                                     const int32_t* targets, int64_t BT) {
  kernels<T>().cross_entropy_from_stats(losses, lse, row_max, sum_exp, target_logit, targets, BT);
}
// dlogits[BT, V] += scale * (exp(logits - lse) - onehot(targets - vocab_begin)) over the slice,
// for non-ignored rows.
template <class T>
inline void cross_entropy_backward_slice(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T scale,
                                         int64_t BT, int64_t V, int64_t vocab_begin) {
  kernels<T>().cross_entropy_backward_slice(dlogits, logits, lse, targets, scale, BT, V, vocab_begin);
}

// ---- Small helpers backends must provide ----------------------------------------------------
// x[N] *= a
template <class T>
inline void scale(T* x, T a, int64_t N) {
  kernels<T>().scale(x, a, N);
}

// ---- Buffer and vector ops (what the model, optimizer and strategies would otherwise loop over)
// Outside backends/ no code touches tensor elements, so the same model, optimizer and
// strategies run wherever the buffers live. Every op here produces each output element (or
// each partial sum) in an order fixed by the sizes alone, never by the thread count.

// x[N] = value
template <class T>
inline void fill(T* x, T value, int64_t N) {
  kernels<T>().fill(x, value, N);
}
// dst[N] = src[N] (memcpy semantics: the buffers must not overlap)
template <class T>
inline void copy(T* dst, const T* src, int64_t N) {
  kernels<T>().copy(dst, src, N);
}
// y[N] += a * x[N]  (one rounding for the product, one for the sum: never fused)
template <class T>
inline void add_scaled(T* y, const T* x, T a, int64_t N) {
  kernels<T>().add_scaled(y, x, a, N);
}

// The per-step scalars of one AdamW step, computed on the host in double and rounded once to
// T, exactly as core/optim/adamw.cpp does (see adamw_step_scalars below). The update itself
// runs in T, in PyTorch's operation order (torch.optim.AdamW; decoupled weight decay as in
// Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019):
//   p = w * decay;  m = beta1 * m + one_minus_beta1 * g;  v = beta2 * v + one_minus_beta2 * g * g
//   w = p - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
// The defaults are placeholders, not a usable step: fill it with adamw_step_scalars.
template <class T>
struct AdamWStep {
  T decay = T(1);            // 1 - lr * weight_decay; exactly 1 for parameters without decay
  T beta1 = T(0);
  T one_minus_beta1 = T(0);  // rounded from 1.0 - beta1 in double, not T(1) - beta1
  T beta2 = T(0);
  T one_minus_beta2 = T(0);
  T step_size = T(0);        // lr / (1 - beta1^t)
  T bc2_sqrt = T(1);         // sqrt(1 - beta2^t)
  T eps = T(0);
};
// Fills AdamWStep for step t (t = 1 for the first step, as PyTorch counts) with learning rate
// lr; `decay` false gives decay = 1 (RMSNorm weights). Bitwise the scalars AdamW<T>::step uses.
template <class T>
AdamWStep<T> adamw_step_scalars(double lr, double beta1, double beta2, double eps,
                                double weight_decay, int64_t t, bool decay);
// One AdamW step over N elements: w[N], m[N] (exp_avg), v[N] (exp_avg_sq) updated in place from
// g[N]. Each element depends only on its own w, m, v, g and the scalars, so any split of the
// elements (threads, ZeRO shards) gives the same bits. The four buffers must not overlap.
template <class T>
inline void adamw_update(T* w, T* m, T* v, const T* g, int64_t N, const AdamWStep<T>& s) {
  kernels<T>().adamw_update(w, m, v, g, N, s);
}

// partials[ceil(N / chunk)]: partials[k] = sum of x[i]^2 over i in [k*chunk, min((k+1)*chunk, N)),
// in double. Inside a chunk, element i goes to accumulator (i - k*chunk) % 8 and the eight are
// added accumulator 0 first. Gradient-norm clipping adds these partials in order
// (core/optim/segmented_norm.h), with chunk = kNormChunk. chunk must be > 0.
template <class T>
inline void sum_squares_chunks(double* partials, const T* x, int64_t N, int64_t chunk) {
  kernels<T>().sum_squares_chunks(partials, x, N, chunk);
}

// *loss_sum = sum of losses[i] over rows with targets[i] >= 0, converted to double and added in
// row order; *count = number of such rows. losses[BT], targets[BT].
template <class T>
inline void sum_losses(double* loss_sum, int64_t* count, const T* losses, const int32_t* targets,
                       int64_t BT) {
  kernels<T>().sum_losses(loss_sum, count, losses, targets, BT);
}

// Vocabulary-parallel token embedding: this rank holds rows [row_begin, row_begin + rows) of
// the [V, C] table as wte_rows[rows, C]. out[BT, C] row i = that row when tokens[i] is in range,
// zeros otherwise; summing out over the ranks that tile [0, V) (an all-reduce) gives
// embedding_forward. With row_begin = 0, rows = V it is embedding_forward.
template <class T>
inline void embedding_forward_rows(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C,
                                   int64_t row_begin, int64_t rows) {
  kernels<T>().embedding_forward_rows(out, tokens, wte_rows, BT, C, row_begin, rows);
}
// dwte_rows[rows, C] += scatter-add of the dout[BT, C] rows whose token is in range, in row order
// as embedding_backward (each table row lives on one rank, so the shards are exact slices of it).
template <class T>
inline void embedding_backward_rows(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT,
                                    int64_t C, int64_t row_begin, int64_t rows) {
  kernels<T>().embedding_backward_rows(dwte_rows, dout, tokens, BT, C, row_begin, rows);
}

// x[N] = each element rounded to the nearest bf16 value, kept in T (nearest_bf16,
// core/tensor/bf16_rounding.h: ties to even, NaN stays NaN). What bf16 mixed precision does to
// every tensor it stores in bf16 (core/model/llama.h, set_bf16_compute); elementwise, so any split
// gives the same bits.
template <class T>
inline void round_to_bf16(T* x, int64_t N) {
  kernels<T>().round_to_bf16(x, N);
}

// out[N] = x[N] rounded to the nearest bf16 (as round_to_bf16), stored as bf16: what a gradient
// reduction in bf16 puts on the wire (core/parallel/data_parallel.h, bf16_grad_reduce).
template <class T>
inline void to_bf16(bf16* out, const T* x, int64_t N) {
  kernels<T>().to_bf16(out, x, N);
}
// y[N] = x[N] (accumulate false) or y[N] += x[N] (true), x widened exactly from bf16 to T: a
// reduced bf16 gradient back into the f32 gradient, or added to the f32 sum of earlier
// micro-batches (f32 accumulation).
template <class T>
inline void from_bf16(T* y, const bf16* x, int64_t N, bool accumulate) {
  kernels<T>().from_bf16(y, x, N, accumulate);
}

// True when x[N] holds no NaN and no infinity (a diverged run shows up here first).
template <class T>
inline bool all_finite(const T* x, int64_t N) {
  return kernels<T>().all_finite(x, N);
}

// ---- Mixture of experts: Mixtral's router and the token dispatch --------------------------
// A token's k experts and their weights (Mixtral, Jiang et al. 2024; Hugging Face's
// MixtralSparseMoeBlock): softmax over the E router logits, the k largest probabilities, and
// those k divided by their sum. Every row is computed alone, so any split of the rows (micro-
// batches, data-parallel ranks) gives the same bits.
// probs[BT, E] = softmax(logits[BT, E]) per row (kept for the backward and the load-balancing
// loss); experts[BT, k] = the ids of the k largest probabilities, largest first, an equal pair
// broken by the lower id; weights[BT, k] = probs[t, experts[t, j]] / S_t, S_t = the sum of the k.
// 1 <= k <= E (the forwarder checks it).
void check_router_shape(int64_t BT, int64_t E, int64_t k);
template <class T>
inline void router_topk(T* probs, T* weights, int32_t* experts, const T* logits, int64_t BT, int64_t E, int64_t k) {
  check_router_shape(BT, E, k);
  kernels<T>().router_topk(probs, weights, experts, logits, BT, E, k);
}
// dlogits[BT, E] (written over) from the gradients of router_topk's weights, dweights[BT, k], and
// of every probability, dprobs[E] (the same for each token: the load-balancing loss's; null: 0):
//   dp[t, e] = dprobs[e] + sum over j with experts[t, j] = e of (dweights[t, j] - D_t) / S_t,
//              D_t = sum_j dweights[t, j] * weights[t, j]
//   dlogits[t, e] = probs[t, e] * (dp[t, e] - sum_f probs[t, f] * dp[t, f])   (softmax's backward)
// The choice of experts is a step function of the logits: no gradient flows through it.
template <class T>
inline void router_backward(T* dlogits, const T* dweights, const T* dprobs, const T* probs, const T* weights,
                            const int32_t* experts, int64_t BT, int64_t E, int64_t k) {
  check_router_shape(BT, E, k);
  kernels<T>().router_backward(dlogits, dweights, dprobs, probs, weights, experts, BT, E, k);
}
// out[N, C] row i = src[index[i], :] (the dispatch: tokens copied into expert order).
template <class T>
inline void gather_rows(T* out, const T* src, const int32_t* index, int64_t N, int64_t C) {
  kernels<T>().gather_rows(out, src, index, N, C);
}
// out[BT, C] row t = sum over j = 0, 1, ..., k-1 in that order of weights[t, j] * src[slot[t*k + j], :]
// (written over; weights null: each weight 1, the dispatch's backward). The combine: each
// token's k expert outputs, weighted, summed in the order of its choices (never of the experts').
template <class T>
inline void combine_rows(T* out, const T* src, const int32_t* slot, const T* weights, int64_t BT, int64_t k,
                         int64_t C) {
  kernels<T>().combine_rows(out, src, slot, weights, BT, k, C);
}
// The combine's backward, both written over: dsrc[slot[t*k + j], :] = weights[t, j] * dout[t, :]
// (slot must reach every row of dsrc exactly once) and dweights[t, j] = dout[t, :] . src[slot[t*k + j], :].
template <class T>
inline void combine_rows_backward(T* dsrc, T* dweights, const T* dout, const T* src, const int32_t* slot,
                                  const T* weights, int64_t BT, int64_t k, int64_t C) {
  kernels<T>().combine_rows_backward(dsrc, dweights, dout, src, slot, weights, BT, k, C);
}

// ---- The compute backend ----------------------------------------------------------------------
// One table per element type: the kernels of every op above, with the same signatures and
// contracts (a backend that cannot meet one must not register).
template <class T>
struct Kernels {
  void (*matmul_forward)(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC, GemmOperands operands);
  void (*matmul_backward)(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC, GemmOperands operands, GradWrite dinp_write);
  void (*rmsnorm_forward)(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps);
  void (*rmsnorm_backward)(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t BT, int64_t C);
  void (*rope_forward)(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd, int64_t pos_start);
  void (*rope_backward)(T* dx, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd, int64_t pos_start);
  void (*attention_forward)(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s);
  void (*attention_backward)(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, const AttentionShape& s);
  void (*attention_merge)(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq, int64_t nh, int64_t hd);
  void (*swiglu_forward)(T* out, const T* gate, const T* up, int64_t N);
  void (*swiglu_backward)(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N);
  void (*embedding_forward)(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C);
  void (*embedding_backward)(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C);
  void (*add_forward)(T* out, const T* a, const T* b, int64_t N);
  void (*accumulate)(T* y, const T* x, int64_t N);
  void (*cross_entropy_forward)(T* losses, const T* logits, const int32_t* targets, int64_t BT, int64_t V);
  void (*cross_entropy_backward)(T* dlogits, const T* logits, const int32_t* targets, T scale, int64_t BT, int64_t V);
  void (*vocab_slice_max_and_target)(T* row_max, T* target_logit, const T* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t vocab_begin);
  void (*vocab_slice_sum_exp)(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V);
  void (*cross_entropy_from_stats)(T* losses, T* lse, const T* row_max, const T* sum_exp, const T* target_logit, const int32_t* targets, int64_t BT);
  void (*cross_entropy_backward_slice)(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T scale, int64_t BT, int64_t V, int64_t vocab_begin);
  void (*scale)(T* x, T a, int64_t N);
  void (*fill)(T* x, T value, int64_t N);
  void (*copy)(T* dst, const T* src, int64_t N);
  void (*add_scaled)(T* y, const T* x, T a, int64_t N);
  void (*adamw_update)(T* w, T* m, T* v, const T* g, int64_t N, const AdamWStep<T>& s);
  void (*sum_squares_chunks)(double* partials, const T* x, int64_t N, int64_t chunk);
  void (*sum_losses)(double* loss_sum, int64_t* count, const T* losses, const int32_t* targets, int64_t BT);
  void (*embedding_forward_rows)(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C, int64_t row_begin, int64_t rows);
  void (*embedding_backward_rows)(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, int64_t row_begin, int64_t rows);
  void (*round_to_bf16)(T* x, int64_t N);
  void (*to_bf16)(bf16* out, const T* x, int64_t N);
  void (*from_bf16)(T* y, const bf16* x, int64_t N, bool accumulate);
  bool (*all_finite)(const T* x, int64_t N);
  void (*router_topk)(T* probs, T* weights, int32_t* experts, const T* logits, int64_t BT, int64_t E, int64_t k);
  void (*router_backward)(T* dlogits, const T* dweights, const T* dprobs, const T* probs, const T* weights, const int32_t* experts, int64_t BT, int64_t E, int64_t k);
  void (*gather_rows)(T* out, const T* src, const int32_t* index, int64_t N, int64_t C);
  void (*combine_rows)(T* out, const T* src, const int32_t* slot, const T* weights, int64_t BT, int64_t k, int64_t C);
  void (*combine_rows_backward)(T* dsrc, T* dweights, const T* dout, const T* src, const int32_t* slot, const T* weights, int64_t BT, int64_t k, int64_t C);
};

// Which of a backend's two sets of kernels run its products (--kernels), for a backend that has
// two (the CUDA backend):
//   exact  every element of a product summed in an order fixed by K alone (backends/cuda/gemm.cu),
//          so a data or tensor rank's slice has the whole product's bits: verify's bitwise claims
//          and the lessons rest on it;
//   fast   NVIDIA's library (cuBLASLt, backends/cuda/lt_gemm.cu): repeatable run to run on one
//          GPU and library version, but its order depends on the shape, so a slice is not bitwise
//          the whole product.
enum class KernelMode { exact, fast };
const char* kernel_mode_name(KernelMode mode);

// A compute device's kernels, memory and identity. Pointers the kernels take are the backend's
// memory (device_alloc), except the host outputs documented as such (sum_squares_chunks'
// partials, sum_losses' loss_sum and count), the document ids of AttentionShape and either side
// of copy (a memcpy). tests/ops/operand_log.h holds the model, the strategies and the harness to it.
struct ComputeBackend {
  const char* name = nullptr;  // "cpu", "cuda": the value of --device
  // Why this backend cannot run on this machine (no GPU, no driver), or an empty string when
  // it can. Asked when the backend is selected, so a linked backend without its hardware is
  // refused with the reason instead of failing inside the first kernel.
  std::string (*unusable_reason)() = nullptr;
  Kernels<float> f32;
  Kernels<double> f64;

  // Raw storage where this backend computes (host memory on the CPU, HBM on a GPU). Allocations
  // are 64-byte aligned (one cache line, one AVX-512 vector); bytes == 0 gives nullptr. Throws
  // OutOfMemoryError when the memory is not there (InputError for bytes < 0).
  void* (*device_alloc)(int64_t bytes) = nullptr;
  // Frees what device_alloc returned; nullptr is a no-op. The backend may keep freed blocks for
  // reuse (a caching allocator, as GPU frameworks have).
  void (*device_free)(void* p) = nullptr;
  // Returns the freed blocks the backend keeps to the system (torch.cuda.empty_cache's job):
  // before a phase that needs host memory instead, such as writing a checkpoint.
  void (*device_release_cached)() = nullptr;
  // dst[bytes] = src[bytes]; each side is this backend's memory or host memory (tokens come in
  // from the host, checkpoints go out to it). The ranges must not overlap.
  void (*device_memcpy)(void* dst, const void* src, int64_t bytes) = nullptr;
  // The reduction of a collective whose ranks share this backend's memory (the virtual process
  // group: virtual GPUs as threads of one process, over one GPU). For every o < n_outs,
  //   outs[o][count] = ((inputs[0] op inputs[1]) op ...) op inputs[n-1]
  // element-wise, with the bits of core/comm/reduce_kernels.h's reduce_sequence (same order, bf16
  // accumulated in fp32 or rounded at every step, avg divided by group_size at the end). Any
  // output may be any input. Each pointer is this backend's memory or host memory, and the call
  // returns with the outputs written. Null: this backend computes in host memory, where the
  // process group reduces with reduce_sequence itself (the CPU).
  void (*collective_reduce)(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count,
                            DType dtype, ReduceOp op, int group_size, bool step_rounding) = nullptr;

  // Measures the peak GEMM rate of fp32 products whose operands hold what `operands` says
  // (bf16: the rate of bf16 mixed precision's products): times the three products of a linear
  // layer (forward, input gradient, weight gradient) at n x n x n for about `seconds` in all and
  // returns the best FLOP/s seen (2*n^3 per product). `llama4d bench` reports model FLOP
  // utilisation against it.
  double (*measure_peak_gemm_flops)(int64_t n, double seconds, GemmOperands operands) = nullptr;

  // Stream order (a GPU). set_queue_only(true) lets the calling thread's ops return once their
  // work is queued, which the device then runs in order; false (the default) makes each op wait
  // for its work again. Returns the previous setting in effect (a backend may keep waiting where
  // its device cannot queue safely). Ops whose result the host reads at once wait whatever it
  // says: the host outputs above, all_finite, cross-entropy (its target check), a copy to or
  // from host memory (document ids of AttentionShape included), device_memcpy and
  // collective_reduce. synchronize() waits for what the calling thread queued. Null: every op is
  // done when it returns (the CPU). Use them through QueuedOps.
  bool (*set_queue_only)(bool on) = nullptr;
  void (*synchronize)() = nullptr;

  // Compute threads for ops called from the CALLING thread only (results never depend on it). A
  // virtual GPU is one thread of the process: each sets its own share of the cores, so N ranks
  // do not start N full teams. InputError outside [1, kMaxBackendThreads].
  int (*threads)() = nullptr;
  void (*set_threads)(int n) = nullptr;

  // The kernels every thread's products run from now on (KernelMode); set before any op runs.
  // InputError (exit 2) naming the library when fast's is missing or too old here. Null: the
  // backend has one set of kernels (the CPU), exact in the sense above.
  void (*set_kernel_mode)(KernelMode mode) = nullptr;
  KernelMode (*kernel_mode)() = nullptr;
};

// Each OpenMP thread reserves its own stack and team state; far past any machine's core count a
// team cannot even be created (100000 threads crash the OpenMP runtime), so the count is bounded.
inline constexpr int kMaxBackendThreads = 1024;

// Makes `backend` selectable by its name (a backend library does this for itself when linked).
// The first one registered named "cpu" becomes active unless another was selected already.
// The table must outlive every use; InputError if the name is taken or a kernel is missing.
void register_compute_backend(const ComputeBackend* backend);
// Makes the backend named `name` active for every thread of the process. Call it before any
// buffer is allocated: memory from one backend is not another's. InputError naming the linked
// backends if `name` is not among them, and naming the reason when the backend cannot run here.
void select_compute_backend(const std::string& name);
// Makes `backend` active in place of the active one, which it returns, without registering it:
// for a wrapper of the active backend's kernels that keeps its memory entries (OpProfile,
// core/tensor/op_profile.h), so buffers allocated before stay valid. Not while other threads
// call ops.
const ComputeBackend* exchange_active_compute_backend(const ComputeBackend* backend);
// The names of the linked backends, in registration order.
std::vector<std::string> compute_backend_names();
// The active backend. Error if no backend library is linked into the program.
const ComputeBackend& compute_backend();
// The active backend, or null in a program that links none (the communication layer's own
// programs, whose buffers are host memory).
const ComputeBackend* compute_backend_if_linked();

template <>
inline const Kernels<float>& kernels<float>() {
  return compute_backend().f32;
}
template <>
inline const Kernels<double>& kernels<double>() {
  return compute_backend().f64;
}

inline void* device_alloc(int64_t bytes) { return compute_backend().device_alloc(bytes); }
inline void device_free(void* p) { compute_backend().device_free(p); }
inline void device_release_cached() { compute_backend().device_release_cached(); }
inline void device_memcpy(void* dst, const void* src, int64_t bytes) {
  compute_backend().device_memcpy(dst, src, bytes);
}
inline double measure_peak_gemm_flops(int64_t n, double seconds, GemmOperands operands = GemmOperands::as_stored) {
  return compute_backend().measure_peak_gemm_flops(n, seconds, operands);
}
// While it lives, the calling thread's ops may return before their work is done (a GPU runs it
// in stream order); finish() waits for it. Only for a thread that touches backend memory through
// ops alone and shares it with no other thread meanwhile: a single-rank training step, whose
// host reads (loss, gradient norm) come from ops that wait (Trainer::step_queued; tests/cuda
// holds its bits to those of a step whose every op waits). A no-op on a backend without stream
// order.
class QueuedOps {
 public:
  QueuedOps();
  // Without finish(): restores the setting and waits, dropping an error from the wait (a
  // destructor cannot throw; on the path without an exception, call finish()).
  ~QueuedOps();
  // Whether the calling thread's ops are queuing now (false on a backend or device that cannot).
  bool queuing() const { return queuing_; }
  QueuedOps(const QueuedOps&) = delete;
  QueuedOps& operator=(const QueuedOps&) = delete;
  // Waits for the queued work (throws the device's error) and restores the setting.
  void finish();

 private:
  const ComputeBackend* backend_ = nullptr;  // null: nothing to do
  bool previous_ = false, queuing_ = false;
};

// Name of the active compute backend ("cpu", "cuda") and its thread count, for reports.
inline const char* backend_name() { return compute_backend().name; }
inline int backend_threads() { return compute_backend().threads(); }
// The active backend's kernel mode (exact on a backend with one set).
inline KernelMode kernel_mode() {
  const ComputeBackend& b = compute_backend();
  return b.kernel_mode ? b.kernel_mode() : KernelMode::exact;
}
// Sets the calling thread's compute threads on the active backend; InputError outside
// [1, kMaxBackendThreads], whatever the backend.
void set_backend_threads(int n);

}  // namespace llama4d::ops
