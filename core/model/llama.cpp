#include "core/model/llama.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d {

namespace {

// splitmix64: a counter-based generator, identical on every platform and compiler.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal draws by Box-Muller from splitmix64 uniforms (std::normal_distribution is
// implementation-defined, and we want the same initial weights everywhere).
double normal_draw(uint64_t& state) {
  const double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

template <class T>
Llama<T>::Llama(const LlamaConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  specs_ = llama_param_specs(cfg_);
  const int64_t n = specs_.back().offset + specs_.back().numel;
  params_.assign(size_t(n), T(0));
  grads_.assign(size_t(n), T(0));
  off_embed_ = find_param(specs_, "model.embed_tokens.weight").offset;
  off_norm_ = find_param(specs_, "model.norm.weight").offset;
  off_lm_head_ = cfg_.tie_word_embeddings ? off_embed_ : find_param(specs_, "lm_head.weight").offset;
  rope_ = make_rope_tables<T>(cfg_, cfg_.max_position_embeddings);
  blocks_.resize(size_t(cfg_.num_hidden_layers));
}

template <class T>
T* Llama<T>::param(std::string_view name) {
  return params_.data() + find_param(specs_, std::string(name)).offset;
}

template <class T>
T* Llama<T>::grad(std::string_view name) {
  return grads_.data() + find_param(specs_, std::string(name)).offset;
}

template <class T>
void Llama<T>::init_weights(uint64_t seed) {
  uint64_t state = seed;
  for (const ParamSpec& p : specs_) {
    T* w = params_.data() + p.offset;
    if (p.shape.size() == 1) {  // RMSNorm gains start at 1
      std::fill_n(w, p.numel, T(1));
    } else {
      for (int64_t i = 0; i < p.numel; ++i) w[i] = T(0.02 * normal_draw(state));
    }
  }
}

template <class T>
void Llama<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
BlockDims Llama<T>::block_dims(int64_t B, int64_t T_) const {
  return {.B = B, .T = T_, .C = cfg_.hidden_size, .nh = cfg_.num_attention_heads,
          .nkv = cfg_.num_key_value_heads, .hd = cfg_.head_dim, .I = cfg_.intermediate_size,
          .eps = cfg_.rms_norm_eps};
}

template <class T>
BlockWeights<T> Llama<T>::block_view(T* flat, int layer) const {
  // The nine tensors of a layer are consecutive in params.h order.
  const ParamRange r = layer_param_range(specs_, layer);
  const int64_t C = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), I = cfg_.intermediate_size;
  BlockWeights<T> w;
  T* p = flat + r.begin;
  w.ln1 = p, p += C;
  w.wq = p, p += qd * C;
  w.wk = p, p += kvd * C;
  w.wv = p, p += kvd * C;
  w.wo = p, p += C * qd;
  w.ln2 = p, p += C;
  w.wgate = p, p += I * C;
  w.wup = p, p += I * C;
  w.wdown = p, p += C * I;
  return w;
}

template <class T>
const T* Llama<T>::lm_head(const T* flat) const {
  return flat + off_lm_head_;
}

template <class T>
void Llama<T>::ensure_activations(int64_t B, int64_t T_) {
  if (T_ > cfg_.max_position_embeddings)
    throw InputError("sequence length " + std::to_string(T_) + " exceeds max_position_embeddings " +
                     std::to_string(cfg_.max_position_embeddings));
  batch_ = B, seq_ = T_;
  const BlockDims d = block_dims(B, T_);
  x0_.resize(size_t(d.BT() * d.C));
  for (auto& a : blocks_) a.resize(d);
  scratch_.resize(d);
  head_.resize(d.BT(), d.C, cfg_.vocab_size);
  dx_.resize(size_t(d.BT() * d.C));
  tokens_.resize(size_t(d.BT()));
  targets_.resize(size_t(d.BT()));
}

template <class T>
LossSum Llama<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T_) {
  // Validate before touching any state, so a rejected call leaves the model as it was.
  const int64_t V = cfg_.vocab_size;
  for (int64_t i = 0; i < B * T_; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw InputError("token id " + std::to_string(tokens[i]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (targets && targets[i] >= V)
      throw InputError("target id " + std::to_string(targets[i]) + " outside the vocabulary [0, " + std::to_string(V) +
                       ") (use -1 to ignore a position)");
  }
  ensure_activations(B, T_);
  const BlockDims d = block_dims(B, T_);
  const int64_t BT = d.BT(), C = d.C;
  std::copy_n(tokens, BT, tokens_.begin());
  if (targets)
    std::copy_n(targets, BT, targets_.begin());
  else  // inference: a later backward then sees only ignored targets and adds nothing
    std::fill(targets_.begin(), targets_.end(), -1);

  StageHooks none;
  StageHooks& h = hooks_ ? *hooks_ : none;
  h.before_forward(kRootStage);
  ops::embedding_forward(x0_.data(), tokens, params_.data() + off_embed_, BT, C);
  const T* x = x0_.data();
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    h.before_forward(l);
    block_forward(blocks_[size_t(l)], block_view(params_.data(), l), x, d, rope_, 0);
    h.after_forward(l);
    x = blocks_[size_t(l)].out.data();
  }
  const LossSum loss = head_forward(head_, x, params_.data() + off_norm_, lm_head(params_.data()),
                                    targets ? targets_.data() : nullptr, BT, C, V, cfg_.rms_norm_eps);
  h.after_forward(kRootStage);
  return loss;
}

template <class T>
void Llama<T>::backward(T loss_scale) {
  if (batch_ == 0) throw Error("Llama::backward called before forward");
  const BlockDims d = block_dims(batch_, seq_);
  const int64_t BT = d.BT(), C = d.C, V = cfg_.vocab_size;
  const int L = int(cfg_.num_hidden_layers);
  StageHooks none;
  StageHooks& h = hooks_ ? *hooks_ : none;
  const T* x_last = L ? blocks_[size_t(L - 1)].out.data() : x0_.data();
  h.before_backward(kRootStage);
  head_backward(dx_.data(), grads_.data() + off_norm_, grads_.data() + off_lm_head_, head_, x_last,
                params_.data() + off_norm_, lm_head(params_.data()), targets_.data(), loss_scale, BT, C, V);
  for (int l = L - 1; l >= 0; --l) {
    const T* x_in = l ? blocks_[size_t(l - 1)].out.data() : x0_.data();
    h.before_backward(l);
    block_backward(dx_.data(), block_view(grads_.data(), l), dx_.data(), blocks_[size_t(l)],
                   block_view(params_.data(), l), x_in, d, rope_, 0, scratch_);
    h.after_backward(l);
  }
  // With tied embeddings this adds to the same buffer the LM head already accumulated into.
  ops::embedding_backward(grads_.data() + off_embed_, dx_.data(), tokens_.data(), BT, C);
  h.after_backward(kRootStage);
}

template <class T>
KVCache<T> Llama<T>::make_kv_cache(int64_t B, int64_t max_len) const {
  if (max_len > cfg_.max_position_embeddings)
    throw InputError("KV cache length " + std::to_string(max_len) + " exceeds max_position_embeddings " +
                     std::to_string(cfg_.max_position_embeddings));
  KVCache<T> c;
  c.B = B, c.max_len = max_len;
  const size_t per_layer = size_t(B * max_len * cfg_.kv_dim());
  c.k.assign(size_t(cfg_.num_hidden_layers), std::vector<T>(per_layer));
  c.v.assign(size_t(cfg_.num_hidden_layers), std::vector<T>(per_layer));
  return c;
}

template <class T>
void Llama<T>::decode(const int32_t* tokens, int64_t B, int64_t Tn, KVCache<T>& cache, T* logits_last) {
  if (B != cache.B) throw InputError("decode batch " + std::to_string(B) + " != KV cache batch " + std::to_string(cache.B));
  if (cache.len + Tn > cache.max_len)
    throw InputError("KV cache full: " + std::to_string(cache.len) + " + " + std::to_string(Tn) + " tokens > " +
                     std::to_string(cache.max_len));
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  for (int64_t i = 0; i < B * Tn; ++i)
    if (tokens[i] < 0 || tokens[i] >= V) throw InputError("token id " + std::to_string(tokens[i]) + " outside the vocabulary");
  // Decoding reuses the training buffers (B x Tn), so a later backward would be meaningless.
  ensure_activations(B, Tn);
  batch_ = 0;
  const BlockDims d = block_dims(B, Tn);
  ops::embedding_forward(x0_.data(), tokens, params_.data() + off_embed_, B * Tn, C);
  const T* x = x0_.data();
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    BlockKvCache<T> kv{cache.k[size_t(l)].data(), cache.v[size_t(l)].data(), cache.len, cache.max_len};
    block_forward(blocks_[size_t(l)], block_view(params_.data(), l), x, d, rope_, cache.len, &kv);
    x = blocks_[size_t(l)].out.data();
  }
  cache.len += Tn;
  // Only each row's last position needs logits.
  std::vector<T> last(static_cast<size_t>(B * C));
  for (int64_t b = 0; b < B; ++b) std::copy_n(x + (b * Tn + Tn - 1) * C, C, last.begin() + b * C);
  HeadActivations<T> h;
  h.resize(B, C, V);
  head_forward(h, last.data(), params_.data() + off_norm_, lm_head(params_.data()), nullptr, B, C, V,
               cfg_.rms_norm_eps);
  std::copy_n(h.logits.data(), B * V, logits_last);
}

template <class T>
int64_t Llama<T>::activation_bytes() const {
  int64_t n = int64_t(x0_.size() * sizeof(T)) + head_.bytes();
  for (const auto& a : blocks_) n += a.bytes();
  return n;
}

template class Llama<float>;
template class Llama<double>;

}  // namespace llama4d
