#pragma once
// One Llama 3 model on one rank: parameters and gradients in flat buffers (see params.h),
// a hand-written forward and backward, and KV-cache decoding. T is float or double.
//
// Data flow of the training forward (B sequences of T_ tokens, C hidden, V vocab):
//   tokens[B,T_] -> embedding -> x0[B,T_,C]
//   per layer l:  x_{l+1} = h + ffn(rmsnorm(h)),  h = x_l + attn(rmsnorm(x_l))
//   rmsnorm(x_L) -> lm_head -> logits[B,T_,V] -> cross-entropy with targets[B,T_]
// Each stage is a forward/backward pair in its own file (embedding, block, head); parallel
// strategies call those stages directly instead of forking this class.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/model/block.h"
#include "core/model/config.h"
#include "core/model/head.h"
#include "core/model/params.h"
#include "core/model/rope.h"

namespace llama4d {

// Keys and values of every layer for incremental decoding: [L][B, max_len, nkv, hd] each.
template <class T>
struct KVCache {
  int64_t B = 0, max_len = 0, len = 0;  // len = positions already cached
  std::vector<std::vector<T>> k, v;     // one buffer per layer
};

// Called around every stage so a parallel strategy can act at layer granularity without
// forking the model: FSDP gathers a layer's parameters before it runs and releases them after;
// data parallelism starts reducing a layer's gradients the moment its backward is done.
// `layer` is 0..L-1 for transformer blocks and kRootStage for the embedding + final norm +
// LM head, which run first/last (the "root" unit of FSDP).
inline constexpr int kRootStage = -1;
class StageHooks {
 public:
  virtual ~StageHooks() = default;
  virtual void before_forward(int layer) {}
  virtual void after_forward(int layer) {}
  virtual void before_backward(int layer) {}
  virtual void after_backward(int layer) {}  // this stage's gradients are complete
};

template <class T>
class Llama {
 public:
  explicit Llama(const LlamaConfig& cfg);

  const LlamaConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& param_specs() const { return specs_; }
  int64_t num_params() const { return int64_t(params_.size()); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  T* param(std::string_view name);
  T* grad(std::string_view name);

  // Deterministic initialisation from a seed: matrices ~ N(0, 0.02), RMSNorm weights = 1.
  // Draws in double, so the float and double models start from the same values (rounded).
  void init_weights(uint64_t seed);
  void zero_grad();

  // Training forward over tokens[B, T_] with next-token targets[B, T_]; keeps what backward
  // needs. Logits of the last forward stay readable through logits().
  LossSum forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T_);
  // Backward of the last forward. loss_scale = d(objective)/d(each token's loss), e.g.
  // 1 / (tokens in the global batch). Gradients ACCUMULATE into grads().
  void backward(T loss_scale);
  // logits[B, T_, V] of the last forward.
  const T* logits() const { return head_.logits.data(); }

  // Inference with a KV cache: feeds tokens[B, Tn] at positions cache.len .. cache.len+Tn-1,
  // appends their keys/values and writes the last position's logits to logits_last[B, V].
  KVCache<T> make_kv_cache(int64_t B, int64_t max_len) const;
  void decode(const int32_t* tokens, int64_t B, int64_t Tn, KVCache<T>& cache, T* logits_last);

  // Bytes of activations held for backward after the last forward (for memory reports).
  int64_t activation_bytes() const;

  // Hooks for parallel strategies (nullptr: none). Not owned.
  void set_hooks(StageHooks* hooks) { hooks_ = hooks; }

 private:
  void ensure_activations(int64_t B, int64_t T_);
  BlockDims block_dims(int64_t B, int64_t T_) const;
  BlockWeights<T> block_view(T* flat, int layer) const;
  const T* lm_head(const T* flat) const;  // lm_head.weight, or the embedding when tied

  // Offsets into the flat buffer of the non-layer parameters.
  int64_t off_embed_ = 0, off_norm_ = 0, off_lm_head_ = 0;

  LlamaConfig cfg_;
  std::vector<ParamSpec> specs_;
  std::vector<T> params_, grads_;
  RopeTables<T> rope_;

  // Activations of the last forward.
  int64_t batch_ = 0, seq_ = 0;  // B, T of the last training forward
  std::vector<int32_t> tokens_, targets_;
  std::vector<T> x0_;                         // embedding output [B,T,C]
  std::vector<BlockActivations<T>> blocks_;   // one per layer; block l's output is x_{l+1}
  HeadActivations<T> head_;                   // final norm, logits, losses
  std::vector<T> dx_;                         // [B,T,C] gradient flowing down the residual stream
  BlockScratch<T> scratch_;                   // backward temporaries shared by all layers
  StageHooks* hooks_ = nullptr;
};

extern template class Llama<float>;
extern template class Llama<double>;

}  // namespace llama4d
