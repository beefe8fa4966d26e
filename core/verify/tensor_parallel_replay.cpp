#include "core/verify/tensor_parallel_replay.h"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/model/block.h"
#include "core/model/llama.h"
#include "core/model/params.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/dp_common.h"
#include "core/parallel/shard_layout.h"
#include "core/tensor/backend_array.h"

namespace llama4d {

// What tp rank r holds, by Megatron's cut (worked out here, not taken from TpLayout):
// query heads [h0, h0 + nh), the key/value heads they read [k0, k0 + nkv) (group nh_all / nkv_all),
// SwiGLU columns [f0, f0 + I) and vocabulary rows [v0, v0 + V) of ceil(V_all / tp) per rank.
template <class T>
struct TensorParallelReplay<T>::Slice {
  int64_t h0 = 0, nh = 0, k0 = 0, nkv = 0, f0 = 0, I = 0, v0 = 0, V = 0;
};

namespace {

// out[n] = parts[0] + parts[1] + ... element-wise, left to right: an ordered reduction's order.
template <class T>
void add_in_rank_order(T* out, const std::vector<BackendArray<T>>& parts, int64_t n) {
  std::copy_n(parts[0].data(), n, out);
  for (size_t r = 1; r < parts.size(); ++r)
    for (int64_t i = 0; i < n; ++i) out[i] += parts[r][size_t(i)];
}

// Columns [c0, c0 + n) of w[rows, cols], contiguous [rows, n]: a row-parallel rank's weight.
template <class T>
BackendArray<T> columns(const T* w, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  BackendArray<T> out(size_t(rows * n));
  for (int64_t i = 0; i < rows; ++i) std::copy_n(w + i * cols + c0, n, out.data() + i * n);
  return out;
}

template <class T>
void zero(BackendArray<T>& v, int64_t n) {
  v.assign(size_t(n), T(0));
}

}  // namespace

template <class T>
TensorParallelReplay<T>::TensorParallelReplay(const LlamaConfig& cfg, int tp, bool sequence_parallel, const T* params,
                                              bool separate_tied_head, bool bf16)
    : cfg_(cfg), tp_(tp), sp_(sequence_parallel), bf16_(bf16), params_(params), specs_(llama_param_specs(cfg)),
      rope_(make_rope_tables<T>(cfg, cfg.max_position_embeddings)) {
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, I = cfg.intermediate_size;
  const int64_t V = cfg.vocab_size, group = nh / nkv, vocab_share = (V + tp - 1) / tp;
  if (tp < 2 || nh % tp != 0 || I % tp != 0)
    throw InputError("tensor-parallel replay: tp=" + std::to_string(tp) + " does not divide the heads and SwiGLU width");
  for (int r = 0; r < tp; ++r) {
    Slice s;
    s.nh = nh / tp, s.h0 = r * s.nh;
    s.k0 = s.h0 / group, s.nkv = (s.h0 + s.nh - 1) / group + 1 - s.k0;
    s.I = I / tp, s.f0 = r * s.I;
    s.v0 = r * vocab_share, s.V = std::min(V, s.v0 + vocab_share) - s.v0;
    if (s.V <= 0 || s.nh % s.nkv != 0)
      throw InputError("tensor-parallel replay: tp=" + std::to_string(tp) + " cannot cut this model");
    slices_.push_back(s);
  }
  const int64_t total = flat_numel(specs_);
  grads_.assign(size_t(total), T(0));
  if (separate_tied_head && cfg.tie_word_embeddings) head_part_.assign(size_t(V * cfg.hidden_size), T(0));
  const int64_t C = cfg.hidden_size, hd = cfg.head_dim;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const Slice& s : slices_) {
      wo_grads_.emplace_back(size_t(C * s.nh * hd), T(0));
      wdown_grads_.emplace_back(size_t(C * s.I), T(0));
    }
}

template <class T>
TensorParallelReplay<T>::~TensorParallelReplay() = default;

template <class T>
void TensorParallelReplay<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
  std::fill(head_part_.begin(), head_part_.end(), T(0));
  for (auto* all : {&wo_grads_, &wdown_grads_})
    for (BackendArray<T>& g : *all) std::fill(g.begin(), g.end(), T(0));
}

template <class T>
std::vector<T> TensorParallelReplay<T>::grads() const {
  std::vector<T> out = grads_.host();
  const int64_t C = cfg_.hidden_size, hd = cfg_.head_dim, qd = cfg_.num_attention_heads * hd, I = cfg_.intermediate_size;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string layer = "model.layers." + std::to_string(l);
    T* wo = out.data() + find_param(specs_, layer + ".self_attn.o_proj.weight").offset;
    T* wdown = out.data() + find_param(specs_, layer + ".mlp.down_proj.weight").offset;
    for (int r = 0; r < tp_; ++r) {
      const Slice& s = slices_[size_t(r)];
      const BackendArray<T>& go = wo_grads_[size_t(l * tp_ + r)];
      const BackendArray<T>& gd = wdown_grads_[size_t(l * tp_ + r)];
      for (int64_t i = 0; i < C; ++i) {
        std::copy_n(go.data() + i * s.nh * hd, s.nh * hd, wo + i * qd + s.h0 * hd);
        std::copy_n(gd.data() + i * s.I, s.I, wdown + i * I + s.f0);
      }
    }
  }
  return out;
}

// One micro-batch's forward and backward through every rank's slice, phase by phase. The
// tensors of the whole model (flat params and grads) are read and written in place; each rank's
// partial products live in `parts` until they are added in rank order (an ordered all-reduce).
template <class T>
struct TensorParallelReplay<T>::Pass {
  struct RankActivations {
    BackendArray<T> q, k, v, att, lse, gate, up, act;
  };
  struct LayerActivations {
    BackendArray<T> n1, rstd1, h, n2, rstd2;
    std::vector<RankActivations> ranks;
  };

  TensorParallelReplay& rp;
  const int64_t B, seq, BT, C, hd, L, nh, nkv, I;
  const T eps;
  T loss_scale;
  // The kernels read the backend's memory (core/ops.h): the batch's ids are copied there.
  const BackendArray<int32_t> token_ids, target_ids;
  const int32_t* tokens;
  const int32_t* targets;
  const int32_t* doc;
  const bool replicated_kv;
  const BlockDims whole;
  BackendArray<T> bf16_params;  // under bf16: the weights as the ops read them, rounded
  const T* params;
  const T* embed = nullptr;
  T* g_embed = nullptr;
  const ParamSpec* norm_spec = nullptr;
  const T* lm = nullptr;
  T* g_lm = nullptr;
  std::vector<BackendArray<T>> parts;  // each rank's partial [BT, C]
  std::vector<BackendArray<T>> x;      // [L+1] the residual stream, x[l] the input of layer l
  std::vector<LayerActivations> acts;  // [L]
  BackendArray<T> sum;                 // [BT, C] the ranks' partials, added
  BackendArray<T> n, rstd;             // the final norm's output and 1/rms
  std::vector<BackendArray<T>> logits;  // [rank] its slice [BT, V_r]
  BackendArray<T> lse;                  // [BT] each token's log-sum-exp over all slices
  BackendArray<T> dx, dh;               // [BT, C] the residual gradient, and at the attention's output

  Pass(TensorParallelReplay& replay, const Batch& b, T scale)
      : rp(replay), B(b.B), seq(b.seq), BT(b.B * b.seq), C(replay.cfg_.hidden_size), hd(replay.cfg_.head_dim),
        L(replay.cfg_.num_hidden_layers), nh(replay.cfg_.num_attention_heads), nkv(replay.cfg_.num_key_value_heads),
        I(replay.cfg_.intermediate_size), eps(T(replay.cfg_.rms_norm_eps)), loss_scale(scale), token_ids(b.tokens),
        target_ids(b.targets), tokens(token_ids.data()), targets(target_ids.data()), doc(b.documents()),
        replicated_kv(nkv < replay.tp_), whole{.C = C, .nh = nh, .nkv = nkv, .hd = hd, .I = I},
        params(replay.params_), parts(size_t(replay.tp_)) {
    const std::vector<ParamSpec>& specs = rp.specs_;
    if (rp.bf16_) {
      bf16_params = BackendArray<T>(rp.params_, size_t(flat_numel(specs)));
      rounded(bf16_params.data(), int64_t(bf16_params.size()));
      params = bf16_params.data();
    }
    embed = params + find_param(specs, "model.embed_tokens.weight").offset;
    g_embed = rp.grads_.data() + find_param(specs, "model.embed_tokens.weight").offset;
    norm_spec = &find_param(specs, "model.norm.weight");
    lm = rp.cfg_.tie_word_embeddings ? embed : params + find_param(specs, "lm_head.weight").offset;
    g_lm = !rp.cfg_.tie_word_embeddings ? rp.grads_.data() + find_param(specs, "lm_head.weight").offset
           : rp.head_part_.empty()      ? g_embed
                                        : rp.head_part_.data();
  }

  // ---- Helpers ------------------------------------------------------------------------------------
  // A tensor as bf16 would hold it (bf16 mixed precision), else as it is.
  void rounded(T* p, int64_t count) { round_if_bf16(p, count, rp.bf16_); }
  void rounded_all(std::initializer_list<BackendArray<T>*> tensors) {
    for (BackendArray<T>* t : tensors) rounded(t->data(), int64_t(t->size()));
  }
  ops::GemmOperands operands() const { return gemm_operands(rp.bf16_); }
  // Layer l's nine tensors in the whole flat buffers (params is only read).
  BlockWeights<T> weights(int64_t l) {
    return block_weights(const_cast<T*>(params) + layer_param_range(rp.specs_, int(l)).begin, whole);
  }
  BlockWeights<T> grads(int64_t l) { return block_weights(rp.grads_.data() + layer_param_range(rp.specs_, int(l)).begin, whole); }
  ops::AttentionShape shape(const Slice& s) const {
    return ops::AttentionShape{.B = B, .Tq = seq, .Tk = seq, .nh = s.nh, .nkv = s.nkv, .hd = hd, .q_doc = doc, .k_doc = doc,
                               .operands = operands()};
  }
  // Row-wise work (norms, residual adds): under SP each rank runs it on its rows; fn(r0, rows).
  template <class Fn>
  void for_rows(Fn&& fn) {
    const int shards = rp.sp_ ? rp.tp_ : 1;
    for (int r = 0; r < shards; ++r) fn(BT * r / shards, BT * (r + 1) / shards - BT * r / shards);
  }
  // dinp[BT, C] += the RMSNorm's input gradient; g_gain += its gain's: under SP each rank's rows
  // give a partial gain gradient, summed in rank order before it is added.
  void norm_backward(T* dinp, T* g_gain, const T* dn, const T* inp, const T* gain, const T* rstd_) {
    if (!rp.sp_) return ops::rmsnorm_backward(dinp, g_gain, dn, inp, gain, rstd_, BT, C);
    std::vector<BackendArray<T>> part(size_t(rp.tp_), BackendArray<T>(size_t(C), T(0)));
    int r = 0;
    for_rows([&](int64_t r0, int64_t rows) {
      ops::rmsnorm_backward(dinp + r0 * C, part[size_t(r++)].data(), dn + r0 * C, inp + r0 * C, gain, rstd_ + r0, rows, C);
    });
    BackendArray<T> total(static_cast<size_t>(C));
    add_in_rank_order(total.data(), part, C);
    ops::accumulate(g_gain, total.data(), C);
  }

  // ---- Forward ----------------------------------------------------------------------------------
  // Each rank looks up the ids of its vocabulary rows; the lookups added are the embedding.
  void forward_embedding() {
    x.assign(size_t(L + 1), BackendArray<T>(size_t(BT * C)));
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      parts[size_t(r)].resize(size_t(BT * C));
      ops::embedding_forward_rows(parts[size_t(r)].data(), tokens, embed + s.v0 * C, BT, C, s.v0, s.V);
    }
    add_in_rank_order(x[0].data(), parts, BT * C);
    rounded_all({&x[0]});
    acts.resize(static_cast<size_t>(L));
    sum = BackendArray<T>(size_t(BT * C));
  }

  void forward_layer(int64_t l) {
    const BlockWeights<T> w = weights(l);
    LayerActivations& a = acts[size_t(l)];
    a.ranks.resize(size_t(rp.tp_));
    a.n1.resize(size_t(BT * C)), a.rstd1.resize(size_t(BT)), a.h.resize(size_t(BT * C));
    a.n2.resize(size_t(BT * C)), a.rstd2.resize(size_t(BT));
    const T* xl = x[size_t(l)].data();
    for_rows([&](int64_t r0, int64_t rows) {
      ops::rmsnorm_forward(a.n1.data() + r0 * C, a.rstd1.data() + r0, xl + r0 * C, w.ln1, rows, C, eps);
    });
    rounded_all({&a.n1});
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      RankActivations& ra = a.ranks[size_t(r)];
      const int64_t qd = s.nh * hd, kvd = s.nkv * hd;
      ra.q.resize(size_t(BT * qd)), ra.k.resize(size_t(BT * kvd)), ra.v.resize(size_t(BT * kvd));
      ra.att.resize(size_t(BT * qd)), ra.lse.resize(size_t(BT * s.nh));
      ops::matmul_forward(ra.q.data(), a.n1.data(), w.wq + s.h0 * hd * C, BT, C, qd, operands());
      ops::matmul_forward(ra.k.data(), a.n1.data(), w.wk + s.k0 * hd * C, BT, C, kvd, operands());
      ops::matmul_forward(ra.v.data(), a.n1.data(), w.wv + s.k0 * hd * C, BT, C, kvd, operands());
      rounded_all({&ra.q, &ra.k, &ra.v});
      ops::rope_forward(ra.q.data(), rp.rope_.cos.data(), rp.rope_.sin.data(), B, seq, s.nh, hd, 0);
      ops::rope_forward(ra.k.data(), rp.rope_.cos.data(), rp.rope_.sin.data(), B, seq, s.nkv, hd, 0);
      rounded_all({&ra.q, &ra.k});
      ops::attention_forward(ra.att.data(), ra.lse.data(), ra.q.data(), ra.k.data(), ra.v.data(), shape(s));
      rounded_all({&ra.att});
      const BackendArray<T> wo = columns(w.wo, C, nh * hd, s.h0 * hd, qd);
      ops::matmul_forward(parts[size_t(r)].data(), ra.att.data(), wo.data(), BT, qd, C, operands());
    }
    add_in_rank_order(sum.data(), parts, BT * C);  // g: the o_proj partial sums
    rounded_all({&sum});
    for_rows([&](int64_t r0, int64_t rows) {
      ops::add_forward(a.h.data() + r0 * C, sum.data() + r0 * C, xl + r0 * C, rows * C);
      rounded(a.h.data() + r0 * C, rows * C);
      ops::rmsnorm_forward(a.n2.data() + r0 * C, a.rstd2.data() + r0, a.h.data() + r0 * C, w.ln2, rows, C, eps);
    });
    rounded_all({&a.n2});
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      RankActivations& ra = a.ranks[size_t(r)];
      ra.gate.resize(size_t(BT * s.I)), ra.up.resize(size_t(BT * s.I)), ra.act.resize(size_t(BT * s.I));
      ops::matmul_forward(ra.gate.data(), a.n2.data(), w.wgate + s.f0 * C, BT, C, s.I, operands());
      ops::matmul_forward(ra.up.data(), a.n2.data(), w.wup + s.f0 * C, BT, C, s.I, operands());
      rounded_all({&ra.gate, &ra.up});
      ops::swiglu_forward(ra.act.data(), ra.gate.data(), ra.up.data(), BT * s.I);
      rounded_all({&ra.act});
      const BackendArray<T> wdown = columns(w.wdown, C, I, s.f0, s.I);
      ops::matmul_forward(parts[size_t(r)].data(), ra.act.data(), wdown.data(), BT, s.I, C, operands());
    }
    add_in_rank_order(sum.data(), parts, BT * C);  // g: the down_proj partial sums
    rounded_all({&sum});
    for_rows([&](int64_t r0, int64_t rows) {
      ops::add_forward(x[size_t(l + 1)].data() + r0 * C, sum.data() + r0 * C, a.h.data() + r0 * C, rows * C);
    });
    rounded_all({&x[size_t(l + 1)]});
  }

  // The head: final norm, each rank's logits slice, the loss from the combined statistics.
  double forward_head() {
    const T* norm_w = params + norm_spec->offset;
    n = BackendArray<T>(static_cast<size_t>(BT * C)), rstd = BackendArray<T>(static_cast<size_t>(BT));
    for_rows([&](int64_t r0, int64_t rows) {
      ops::rmsnorm_forward(n.data() + r0 * C, rstd.data() + r0, x[size_t(L)].data() + r0 * C, norm_w, rows, C, eps);
    });
    rounded_all({&n});
    // Per rank: its logits slice [BT, V_r] and its part of each token's statistics [BT].
    const size_t ranks = size_t(rp.tp_), tokens_n = size_t(BT);
    logits.assign(ranks, BackendArray<T>());
    std::vector<BackendArray<T>> maxes(ranks), sums(ranks), target_parts(ranks);
    BackendArray<T> row_max(tokens_n), sum_exp(tokens_n), target(tokens_n), losses(tokens_n);
    lse = BackendArray<T>(tokens_n);
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      logits[size_t(r)].resize(size_t(BT * s.V)), maxes[size_t(r)].resize(size_t(BT));
      target_parts[size_t(r)].resize(size_t(BT)), sums[size_t(r)].resize(size_t(BT));
      ops::matmul_forward(logits[size_t(r)].data(), n.data(), lm + s.v0 * C, BT, C, s.V, operands());
      rounded_all({&logits[size_t(r)]});
      ops::vocab_slice_max_and_target(maxes[size_t(r)].data(), target_parts[size_t(r)].data(), logits[size_t(r)].data(),
                                      targets, BT, s.V, s.v0);
    }
    row_max = maxes[0];  // a max is exact in any order
    for (int r = 1; r < rp.tp_; ++r)
      for (int64_t i = 0; i < BT; ++i) row_max[size_t(i)] = std::max(row_max[size_t(i)], maxes[size_t(r)][size_t(i)]);
    for (int r = 0; r < rp.tp_; ++r)
      ops::vocab_slice_sum_exp(sums[size_t(r)].data(), logits[size_t(r)].data(), row_max.data(), BT, rp.slices_[size_t(r)].V);
    add_in_rank_order(sum_exp.data(), sums, BT);
    add_in_rank_order(target.data(), target_parts, BT);
    ops::cross_entropy_from_stats(losses.data(), lse.data(), row_max.data(), sum_exp.data(), target.data(), targets, BT);
    double loss_sum = 0;
    int64_t counted = 0;
    ops::sum_losses(&loss_sum, &counted, losses.data(), targets, BT);
    return loss_sum;
  }

  // ---- Backward ---------------------------------------------------------------------------------
  void backward_head() {
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      BackendArray<T> dlogits;
      zero(dlogits, BT * s.V);
      ops::cross_entropy_backward_slice(dlogits.data(), logits[size_t(r)].data(), lse.data(), targets, loss_scale, BT,
                                        s.V, s.v0);
      rounded_all({&dlogits});
      zero(parts[size_t(r)], BT * C);
      ops::matmul_backward(parts[size_t(r)].data(), g_lm + s.v0 * C, dlogits.data(), n.data(), lm + s.v0 * C, BT, C, s.V,
                           operands());
    }
    add_in_rank_order(sum.data(), parts, BT * C);  // f backward: the head's input gradient
    rounded_all({&sum});
    dx = BackendArray<T>(size_t(BT * C), T(0));
    norm_backward(dx.data(), rp.grads_.data() + norm_spec->offset, sum.data(), x[size_t(L)].data(),
                  params + norm_spec->offset, rstd.data());
    rounded_all({&dx});
    dh = BackendArray<T>(size_t(BT * C));
  }

  // Feed-forward half: the residual passes dx to dh; down_proj's output gradient is dx too.
  void backward_mlp(int64_t l) {
    const BlockWeights<T> w = weights(l), g = grads(l);
    const LayerActivations& a = acts[size_t(l)];
    dh = dx;
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      const RankActivations& ra = a.ranks[size_t(r)];
      BackendArray<T> dact, dgate, dup;
      zero(dact, BT * s.I), zero(dgate, BT * s.I), zero(dup, BT * s.I);
      const BackendArray<T> wdown = columns(w.wdown, C, I, s.f0, s.I);
      ops::matmul_backward(dact.data(), rp.wdown_grads_[size_t(l * rp.tp_ + r)].data(), dx.data(), ra.act.data(),
                           wdown.data(), BT, s.I, C, operands());
      rounded_all({&dact});
      ops::swiglu_backward(dgate.data(), dup.data(), dact.data(), ra.gate.data(), ra.up.data(), BT * s.I);
      rounded_all({&dgate, &dup});
      zero(parts[size_t(r)], BT * C);
      ops::matmul_backward(parts[size_t(r)].data(), g.wgate + s.f0 * C, dgate.data(), a.n2.data(), w.wgate + s.f0 * C, BT,
                           C, s.I, operands());
      ops::matmul_backward(parts[size_t(r)].data(), g.wup + s.f0 * C, dup.data(), a.n2.data(), w.wup + s.f0 * C, BT, C,
                           s.I, operands());
    }
    add_in_rank_order(sum.data(), parts, BT * C);  // f backward: the MLP's input gradient
    rounded_all({&sum});
    norm_backward(dh.data(), g.ln2, sum.data(), a.h.data(), w.ln2, a.rstd2.data());
    rounded_all({&dh});
  }

  // Attention half: replicated key/value heads' weight gradients are summed over their replicas.
  void backward_attention(int64_t l) {
    const BlockWeights<T> w = weights(l), g = grads(l);
    const LayerActivations& a = acts[size_t(l)];
    dx = dh;
    const int64_t kv_whole = nkv * hd * C;
    std::vector<BackendArray<T>> kv_parts(static_cast<size_t>(rp.tp_));  // replicated heads: [2, nkv·hd, C] per rank
    for (int r = 0; r < rp.tp_; ++r) {
      const Slice& s = rp.slices_[size_t(r)];
      const RankActivations& ra = a.ranks[size_t(r)];
      const int64_t qd = s.nh * hd, kvd = s.nkv * hd;
      BackendArray<T> datt, dq, dk, dv;
      zero(datt, BT * qd), zero(dq, BT * qd), zero(dk, BT * kvd), zero(dv, BT * kvd);
      const BackendArray<T> wo = columns(w.wo, C, nh * hd, s.h0 * hd, qd);
      ops::matmul_backward(datt.data(), rp.wo_grads_[size_t(l * rp.tp_ + r)].data(), dh.data(), ra.att.data(), wo.data(),
                           BT, qd, C, operands());
      rounded_all({&datt});
      ops::attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), ra.q.data(), ra.k.data(), ra.v.data(),
                              ra.att.data(), ra.lse.data(), shape(s));
      rounded_all({&dq, &dk, &dv});
      ops::rope_backward(dq.data(), rp.rope_.cos.data(), rp.rope_.sin.data(), B, seq, s.nh, hd, 0);
      ops::rope_backward(dk.data(), rp.rope_.cos.data(), rp.rope_.sin.data(), B, seq, s.nkv, hd, 0);
      rounded_all({&dq, &dk});
      zero(parts[size_t(r)], BT * C);
      T* dn = parts[size_t(r)].data();
      ops::matmul_backward(dn, g.wq + s.h0 * hd * C, dq.data(), a.n1.data(), w.wq + s.h0 * hd * C, BT, C, qd, operands());
      const int64_t at = s.k0 * hd * C;
      if (!replicated_kv) {
        ops::matmul_backward(dn, g.wk + at, dk.data(), a.n1.data(), w.wk + at, BT, C, kvd, operands());
        ops::matmul_backward(dn, g.wv + at, dv.data(), a.n1.data(), w.wv + at, BT, C, kvd, operands());
        continue;
      }
      BackendArray<T> gk, gv;
      zero(gk, kvd * C), zero(gv, kvd * C);
      ops::matmul_backward(dn, gk.data(), dk.data(), a.n1.data(), w.wk + at, BT, C, kvd, operands());
      ops::matmul_backward(dn, gv.data(), dv.data(), a.n1.data(), w.wv + at, BT, C, kvd, operands());
      zero(kv_parts[size_t(r)], 2 * kv_whole);
      std::copy(gk.begin(), gk.end(), kv_parts[size_t(r)].begin() + at);
      std::copy(gv.begin(), gv.end(), kv_parts[size_t(r)].begin() + kv_whole + at);
    }
    if (replicated_kv) {  // the replicas' k/v weight gradients, summed, then added
      BackendArray<T> both(size_t(2 * kv_whole));
      add_in_rank_order(both.data(), kv_parts, 2 * kv_whole);
      ops::accumulate(g.wk, both.data(), kv_whole);
      ops::accumulate(g.wv, both.data() + kv_whole, kv_whole);
    }
    add_in_rank_order(sum.data(), parts, BT * C);  // f backward: attention's input gradient
    rounded_all({&sum});
    norm_backward(dx.data(), g.ln1, sum.data(), x[size_t(l)].data(), w.ln1, a.rstd1.data());
    rounded_all({&dx});
  }

  // The embedding: each rank scatter-adds the rows of the ids it holds.
  void backward_embedding() {
    for (const Slice& s : rp.slices_) ops::embedding_backward_rows(g_embed + s.v0 * C, dx.data(), tokens, BT, C, s.v0, s.V);
  }
};

template <class T>
double TensorParallelReplay<T>::forward_backward(const Batch& b, T loss_scale) {
  Pass pass(*this, b, loss_scale);
  pass.forward_embedding();
  for (int64_t l = 0; l < pass.L; ++l) pass.forward_layer(l);
  const double loss_sum = pass.forward_head();
  pass.backward_head();
  for (int64_t l = pass.L - 1; l >= 0; --l) {
    pass.backward_mlp(l);
    pass.backward_attention(l);
  }
  pass.backward_embedding();
  return loss_sum;
}

template <class T>
std::vector<T> slice_of_whole(const std::vector<ParamSpec>& local, const std::vector<ParamSpec>& whole_specs,
                              const std::vector<T>& whole) {
  std::vector<T> out(size_t(flat_numel(local)));
  for (const ParamSpec& p : local) {
    const T* src = whole.data() + find_param(whole_specs, p.name).offset;
    for_each_whole_run(p, 0, p.numel,
                       [&](int64_t at, int64_t w, int64_t n) { std::copy_n(src + w, n, out.data() + p.offset + at); });
  }
  return out;
}

template <class T>
double tensor_parallel_grad_sum_squares(const LlamaConfig& cfg, const ParallelPlan& plan, const std::vector<T>& whole) {
  const std::vector<ParamSpec> whole_specs = llama_param_specs(cfg);
  const int tp = plan.size("tp"), pp = plan.size("pp");
  // One world rank per (tp rank, pp stage), at data and context coordinate 0: every data rank
  // of a slice computes the same value.
  std::vector<int> rank_of(size_t(tp * pp), -1);
  for (int w = 0; w < plan.world_size(); ++w) {
    bool origin = true;
    for (const MeshDim& d : plan.mesh)
      if (d.name != "tp" && d.name != "pp") origin = origin && plan.coordinate(d.name, w) == 0;
    if (origin) rank_of[size_t(plan.coordinate("tp", w) * pp + plan.coordinate("pp", w))] = w;
  }
  double total = 0;
  for (int r = 0; r < tp; ++r) {
    std::vector<std::unique_ptr<Llama<T>>> stages;  // layouts only: no storage is allocated
    std::vector<BackendArray<T>> g;  // in the backend's memory, which sum_squares_chunks reads
    for (int p = 0; p < pp; ++p) {
      const int w = rank_of[size_t(r * pp + p)];
      stages.push_back(std::make_unique<Llama<T>>(cfg, nullptr, plan.tp_layout(cfg, w), plan.held_units(cfg, w)));
      g.push_back(BackendArray<T>(slice_of_whole(stages.back()->param_specs(), whole_specs, whole)));
    }
    // The slices' chunk partials in unit order, each unit from the stage that counts it.
    std::vector<double> partials;
    for (int u = 0; u < stages[0]->num_units(); ++u)
      for (int p = 0; p < pp; ++p)
        if (counts_segment(*stages[size_t(p)], u)) {
          const ParamRange range = stages[size_t(p)]->unit_range(u);
          append_chunk_partials(partials, g[size_t(p)].data() + range.begin, range.end - range.begin);
        }
    const double slices = combine_chunk_sums(partials.data(), int64_t(partials.size()));
    // The replicas this rank does not count: per stage (per ZeRO piece, the shard ranks in
    // order), then the stages in order.
    double replicas = 0;
    for (int p = 0; p < pp; ++p) {
      const Llama<T>& m = *stages[size_t(p)];
      const BackendArray<T>& gp = g[size_t(p)];
      double stage = 0;
      if (plan.zero == ZeroStage::none) {
        stage = replica_sum_squares(m.param_specs(), 0, int64_t(gp.size()), gp.data());
      } else {
        const ShardLayout layout(held_segments(m), plan.dp_shard());
        for (int sh = 0; sh < layout.num_shards(); ++sh) {
          double piece_sum = 0;
          for (size_t s = 0; s < layout.segments().size(); ++s) {
            const Piece piece = layout.piece(s, sh);
            piece_sum += replica_sum_squares(m.param_specs(), piece.begin, piece.end, gp.data() + piece.begin);
          }
          stage = sh == 0 ? piece_sum : stage + piece_sum;
        }
      }
      replicas = p == 0 ? stage : replicas + stage;
    }
    const double mine = slices - replicas;
    total = r == 0 ? mine : total + mine;
  }
  return total;
}

template class TensorParallelReplay<float>;
template class TensorParallelReplay<double>;
template std::vector<float> slice_of_whole<float>(const std::vector<ParamSpec>&, const std::vector<ParamSpec>&,
                                                  const std::vector<float>&);
template std::vector<double> slice_of_whole<double>(const std::vector<ParamSpec>&, const std::vector<ParamSpec>&,
                                                    const std::vector<double>&);
template double tensor_parallel_grad_sum_squares<float>(const LlamaConfig&, const ParallelPlan&, const std::vector<float>&);
template double tensor_parallel_grad_sum_squares<double>(const LlamaConfig&, const ParallelPlan&,
                                                         const std::vector<double>&);

}  // namespace llama4d
