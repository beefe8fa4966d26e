#pragma once
// AdamW over a contiguous element range [begin, end) of the model's ONE flat parameter buffer.
//
// Why a range: ZeRO-1/2/3 give each data-parallel rank one contiguous shard of the flat buffer
// to update. The full (single-rank) update is simply the range [0, total). Every element's
// update depends only on that element's param, grad and state, plus per-step scalars, so the
// result for an element is bitwise the same whichever range (shard) it was updated in, and
// whatever the OpenMP thread count.
//
// The math, per element, step t = 1, 2, ... (torch.optim.AdamW, decoupled weight decay as in
// Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019):
//   p  <- p * (1 - lr * wd)                      wd = 0 for params whose ParamSpec says
//                                                weight_decay == false (RMSNorm weights)
//   m  <- beta1 * m + (1 - beta1) * g            first moment  (exp_avg)
//   v  <- beta2 * v + (1 - beta2) * g * g        second moment (exp_avg_sq)
//   bc1 = 1 - beta1^t,  bc2 = 1 - beta2^t        bias corrections
//   p  <- p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// which is p - lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / bc1, v_hat = v / bc2, written
// in PyTorch's operation order. The scalars (1 - lr*wd, lr/bc1, sqrt(bc2), ...) are computed in
// double once per step and rounded to T; the per-element arithmetic runs in T.
//
// Defaults: beta1 0.9, beta2 0.95, weight decay 0.1 are the Llama recipe (Llama 2 paper,
// Touvron et al. 2023, Sec. 2.2; Llama 3, "The Llama 3 Herd of Models" 2024, Sec. 3.4.1, trains
// with AdamW too). eps is PyTorch's default 1e-8 (Llama 2 reports 1e-5).
#include <cstdint>
#include <span>
#include <vector>

#include "core/model/params.h"
#include "core/tensor/buffer.h"

namespace llama4d {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled: multiplied by the step's lr, as PyTorch does

  // Throws InputError naming the first bad value (betas outside [0, 1), eps or wd negative).
  void validate() const;
};

template <class T>  // float or double
class AdamW {
 public:
  // A run of elements, in range-local indices [begin, end), that all share one decay flag.
  struct Segment {
    int64_t begin = 0, end = 0;
    bool decay = true;
  };

  // Updates flat elements [begin, end) of the buffer described by `specs` (flat order, tiling
  // [0, total) contiguously, as llama_param_specs returns them). The range may start or end in
  // the middle of a tensor. Throws InputError for a bad config, non-contiguous specs or a range
  // outside [0, total). The moments are allocated on `memory` (the rank's tracker; null: not
  // accounted) as optimizer state, zeroed.
  AdamW(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
        MemoryTracker* memory = nullptr);
  // The whole buffer, [0, total): the single-rank optimizer.
  AdamW(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs, MemoryTracker* memory = nullptr);

  // One optimizer step with learning rate `lr` (>= 0, finite; InputError otherwise).
  // params[numel()], grads[numel()] are RANGE-LOCAL: element 0 is flat element begin(). This is
  // what ZeRO holds (a shard of grads after reduce-scatter, a shard of params under ZeRO-3);
  // with full flat buffers, pass `flat_params + begin()` and `flat_grads + begin()`.
  void step(T* params, const T* grads, double lr);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t numel() const { return end_ - begin_; }
  const AdamWConfig& config() const { return cfg_; }
  const std::vector<Segment>& segments() const { return segments_; }

  // ---- State, for checkpoints (saved and restored bitwise) ----
  // Number of steps taken so far (0 before the first step; bias corrections use step_count()).
  int64_t step_count() const { return step_count_; }
  // [numel()] each, range-local like the params.
  std::span<const T> exp_avg() const { return {exp_avg_.data(), size_t(exp_avg_.size())}; }
  std::span<const T> exp_avg_sq() const { return {exp_avg_sq_.data(), size_t(exp_avg_sq_.size())}; }
  // Where a sharded checkpoint read writes the moments directly (then set_step_count).
  T* mutable_exp_avg() { return exp_avg_.data(); }
  T* mutable_exp_avg_sq() { return exp_avg_sq_.data(); }
  void set_step_count(int64_t step_count);
  // Restores a saved state. Throws InputError if a size differs from numel() or step_count < 0.
  void load_state(int64_t step_count, std::span<const T> exp_avg, std::span<const T> exp_avg_sq);

  // Bytes of optimizer state held (exp_avg + exp_avg_sq): 2 * numel() * sizeof(T).
  int64_t state_bytes() const { return 2 * numel() * static_cast<int64_t>(sizeof(T)); }

 private:
  AdamWConfig cfg_;
  int64_t begin_ = 0, end_ = 0;
  int64_t step_count_ = 0;
  std::vector<Segment> segments_;
  Buffer<T> exp_avg_, exp_avg_sq_;
};

extern template class AdamW<float>;
extern template class AdamW<double>;

}  // namespace llama4d
