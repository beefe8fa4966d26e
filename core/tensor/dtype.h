#pragma once
// Element types shared by checkpoints (safetensors) and collectives (ProcessGroup).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/tensor/bf16_rounding.h"

namespace llama4d {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

// Names as safetensors writes them ("F32", "BF16", ...).
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}

inline DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (dtype_name(t) == name) return t;
  throw InputError("unknown dtype '" + std::string(name) + "'");
}

// The DType of a C++ scalar, for templates over float/double.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

// bfloat16 as raw bits: the top half of an IEEE float. Conversion rounds to nearest even,
// as PyTorch does, and keeps NaN a NaN.
struct bf16 {
  uint16_t bits = 0;
};
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }

inline float bf16_to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16{uint16_t(bf16_rounded_bits(u) >> 16)};
}

// IEEE half precision, for reading fp16 checkpoints.
inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace llama4d
