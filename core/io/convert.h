#pragma once
// Element conversion between the floating dtypes a checkpoint may hold (F32, F64, BF16, F16),
// used when reading a bf16 checkpoint into a float model or saving a float model as bf16.
#include <cstddef>
#include <functional>

#include "core/tensor/dtype.h"

namespace llama4d {

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

// True when convert_elements can turn `src` elements into `dst` elements: identical dtypes
// (any), or floating to F32 / F64 / BF16. F16 is readable but not a write target.
bool can_convert(DType dst, DType src);

// dst[n] = src[n] converted. Rounding is to nearest even. F64 -> BF16 goes through F32 (two
// roundings), as PyTorch's double -> bfloat16 cast does. Throws InputError if !can_convert.
void convert_elements(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

// The bytes of src[n] stored as `dst_type`, handed to emit(bytes, size, element_offset) in order:
// src itself when the dtypes match, otherwise converted through a 4 MiB buffer rather than a
// full-size copy. The one streaming path of every writer (whole files and ranges alike).
void emit_converted(DType dst_type, const void* src, DType src_type, size_t n,
                    const std::function<void(const void* bytes, size_t size, size_t element_offset)>& emit);

}  // namespace llama4d
