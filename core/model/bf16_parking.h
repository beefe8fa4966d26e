#pragma once
// bf16 mixed precision keeps activations for the backward in bf16 (2 bytes an element), as a GPU
// stores them. This engine computes bf16 values in T containers (Llama::set_bf16_compute), so a
// tensor the forward keeps is parked as bf16 once its block has run and widened back before the
// backward reads it. Both directions are exact for bf16 values, so the bits do not change; the
// memory of what waits between forward and backward halves. Statistics that are not bf16 values
// (1/rms, attention's log-sum-exp) stay in T.
#include <array>
#include <cstddef>
#include <string>

#include "core/ops.h"
#include "core/tensor/buffer.h"
#include "core/tensor/dtype.h"

namespace llama4d {

// x[n] rounded to bf16 (nearest, ties to even; exact for bf16 values) into a new buffer of
// `category` on `memory`.
template <class T>
Buffer<bf16> bf16_copy(MemoryTracker* memory, MemoryCategory category, const T* x, int64_t n, const std::string& what) {
  Buffer<bf16> out(memory, category, n, what);
  ops::to_bf16(out.data(), x, n);
  return out;
}

// values [n], every element a bf16 value -> parked [n] bf16 (charged to activations); values freed.
template <class T>
void park_bf16(Buffer<T>& values, Buffer<bf16>& parked, MemoryTracker* memory, const std::string& what) {
  if (values.empty()) return;
  parked = bf16_copy(memory, MemoryCategory::activations, values.data(), values.size(), what + " (parked as bf16)");
  values.reset();
}

// The reverse: parked [n] -> values [n] in T (activations); parked freed. Nothing parked: no-op.
template <class T>
void unpark_bf16(Buffer<T>& values, Buffer<bf16>& parked, MemoryTracker* memory, const std::string& what) {
  if (parked.empty()) return;
  values = Buffer<T>(memory, MemoryCategory::activations, parked.size(), what);
  ops::from_bf16(values.data(), parked.data(), parked.size(), false);
  parked.reset();
}

// A struct's bf16-valued tensors, each with its name, in the order of its `parked` array.
template <class T>
struct NamedTensor {
  Buffer<T>* values;
  const char* name;
};

template <class T, size_t N>
void park_all_bf16(const std::array<NamedTensor<T>, N>& tensors, std::array<Buffer<bf16>, N>& parked,
                   MemoryTracker* memory) {
  for (size_t i = 0; i < N; ++i) park_bf16(*tensors[i].values, parked[i], memory, tensors[i].name);
}

template <class T, size_t N>
void unpark_all_bf16(const std::array<NamedTensor<T>, N>& tensors, std::array<Buffer<bf16>, N>& parked,
                     MemoryTracker* memory) {
  for (size_t i = 0; i < N; ++i) unpark_bf16(*tensors[i].values, parked[i], memory, tensors[i].name);
}

}  // namespace llama4d
