#pragma once
// Incremental decoding with a KV cache: the model's blocks run on the new positions only, reading
// the keys and values of every earlier position from the cache instead of recomputing them.
// Equal, to rounding, to a full forward over the whole prefix at its last position
// (tests/model/kv_cache_test.cpp). One device (the whole model), inference only: nothing is kept
// for a backward, so one set of block activations serves every layer in turn.
#include <cstdint>
#include <vector>

#include "core/model/llama.h"
#include "core/tensor/buffer.h"

namespace llama4d {

template <class T>
class Decoder {
 public:
  // A cache of keys and values, [L][B, max_len, nkv, hd] each, on the model's tracker.
  // InputError when max_len exceeds the model's positions; Error for a tensor- or
  // pipeline-parallel part of a model.
  Decoder(Llama<T>& model, int64_t B, int64_t max_len);

  // Feeds tokens[B, seq] at positions len() .. len()+seq-1, appends their keys and values and
  // writes each row's last position's logits to logits_last[B, V] (host memory, as tokens).
  // InputError for an id outside the vocabulary or more tokens than the cache has room for.
  void feed(const int32_t* tokens, int64_t seq, T* logits_last);

  // Forgets positions len .. len()-1: the next feed starts at position `len` (a chat turn
  // whose ids differ from what was generated). InputError unless 0 <= len <= len().
  void rewind(int64_t len);

  int64_t len() const { return len_; }  // positions already cached
  int64_t max_len() const { return max_len_; }

 private:
  Llama<T>& model_;
  int64_t B_ = 0, max_len_ = 0, len_ = 0;
  std::vector<Buffer<T>> k_, v_;  // one buffer per layer
};

extern template class Decoder<float>;
extern template class Decoder<double>;

}  // namespace llama4d
