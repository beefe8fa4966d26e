#include "core/model/decode.h"

#include <string>
#include <utility>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d {

template <class T>
Decoder<T>::Decoder(Llama<T>& model, int64_t B, int64_t max_len) : model_(model), B_(B), max_len_(max_len) {
  const LlamaConfig& cfg = model.config();
  if (max_len > cfg.max_position_embeddings)
    throw InputError("KV cache length " + std::to_string(max_len) + " exceeds max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  if (model.tp_layout().sliced() || !model.holds_all_units())
    throw Error("Decoder runs on one device (whole model), not on a tensor- or pipeline-parallel part of it");
  const int64_t per_layer = B * max_len * cfg.kv_dim();
  for (int l = 0; l < model.num_layers(); ++l) {
    k_.emplace_back(&model.memory(), MemoryCategory::activations, per_layer, "KV cache keys");
    v_.emplace_back(&model.memory(), MemoryCategory::activations, per_layer, "KV cache values");
  }
}

template <class T>
void Decoder<T>::feed(const int32_t* tokens, int64_t seq, T* logits_last) {
  Llama<T>& m = model_;
  const int64_t B = B_;
  if (len_ + seq > max_len_)
    throw InputError("KV cache full: " + std::to_string(len_) + " + " + std::to_string(seq) + " tokens > " +
                     std::to_string(max_len_));
  m.check_ids(tokens, nullptr, B * seq);
  m.cover_positions(max_len_);  // every step of this cache reads the same tables
  const int64_t C = m.cfg_.hidden_size, V = m.cfg_.vocab_size;
  const BlockDims d = m.block_dims(B, seq);
  // Nothing is kept for a backward: one set of block activations and two residual buffers
  // serve every layer in turn.
  BlockActivations<T> a;
  a.allocate(m.memory_, d);
  Buffer<T> x(m.memory_, MemoryCategory::activations, B * seq * C, "decode x");
  Buffer<T> y(m.memory_, MemoryCategory::activations, B * seq * C, "decode x (next)");
  // The ids come from the host (the sampler); kernels read the backend's memory.
  Buffer<int32_t> ids(m.memory_, MemoryCategory::activations, B * seq, "decode token ids");
  ops::device_memcpy(ids.data(), tokens, B * seq * int64_t(sizeof(int32_t)));
  ops::embedding_forward(x.data(), ids.data(), m.unit_params(embedding_unit()), B * seq, C);
  round_if_bf16(x.data(), B * seq * C, m.bf16_);
  for (int l = 0; l < m.num_layers(); ++l) {
    BlockKvCache<T> kv{k_[size_t(l)].data(), v_[size_t(l)].data(), len_, max_len_};
    Buffer<T> rounded;
    block_forward(y.data(), a, m.block_params(l, rounded), x.data(), d, m.rope(), len_, m.comm_, &kv);
    std::swap(x, y);
  }
  len_ += seq;
  // Only each row's last position needs logits.
  Buffer<T> last(m.memory_, MemoryCategory::activations, B * C, "last positions");
  for (int64_t b = 0; b < B; ++b) ops::copy(last.data() + b * C, x.data() + (b * seq + seq - 1) * C, C);
  HeadActivations<T> ha;
  ha.allocate(m.memory_, B, C, V);
  ha.bf16 = m.bf16_;
  Buffer<T> rounded_head, rounded_embedding;
  const auto [norm_w, lm_w] = m.head_params_for_compute(rounded_head, rounded_embedding);
  head_forward(ha, last.data(), norm_w, lm_w, nullptr, B, C, V, m.cfg_.rms_norm_eps, m.whole_vocabulary_);
  ops::copy(logits_last, ha.logits.data(), B * V);
}

template <class T>
void Decoder<T>::rewind(int64_t len) {
  if (len < 0 || len > len_)
    throw InputError("KV cache rewind to " + std::to_string(len) + " of " + std::to_string(len_) + " positions");
  len_ = len;  // later feeds overwrite the keys and values from here on
}

template class Decoder<float>;
template class Decoder<double>;

}  // namespace llama4d
