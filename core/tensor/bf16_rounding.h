#pragma once
// Rounding to bfloat16 (1 sign, 8 exponent, 7 mantissa bits: the top half of an IEEE float),
// written once for the host and for CUDA kernels (nvcc compiles the functions for both).
// Round to nearest, ties to even, as PyTorch's float -> bfloat16 conversion; NaN stays NaN (a
// float NaN comes out quiet); a value past the largest bf16 (about 3.39e38) becomes infinity; bf16's subnormals are
// float's, so tiny values round like any other.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LLAMA4D_HOST_DEVICE __host__ __device__
#else
#define LLAMA4D_HOST_DEVICE
#endif

namespace llama4d {

// The float bits of the bf16 value nearest the float with bits u (the low 16 bits are zero).
// Both results are computed and one selected, with no branch, so a loop that rounds a tensor in
// place vectorises (with an early return for NaN GCC 12 left it scalar: "control flow in loop").
LLAMA4D_HOST_DEVICE inline uint32_t bf16_rounded_bits(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// x rounded to the nearest bf16 value, kept in its container type.
LLAMA4D_HOST_DEVICE inline float nearest_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = bf16_rounded_bits(u);
  std::memcpy(&x, &u, 4);
  return x;
}

// A double is rounded directly, not through a float: rounding twice to nearest can land on a
// bf16 tie that x was not on. The first step rounds to odd instead (truncate to a float, then
// set its last bit when that was inexact), which with float's 16 spare bits makes the second
// rounding the correct one (Boldo & Melquiond, "When double rounding is odd", 2005). Writing an
// f64 tensor to a BF16 checkpoint is another matter: it goes through f32 as PyTorch's conversion
// does (core/io/convert.h), so files agree with PyTorch's byte for byte.
LLAMA4D_HOST_DEVICE inline double nearest_bf16(double x) {
  if (x != x) return x;
  float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const double fx = static_cast<double>(f);
  if ((fx > x && x >= 0) || (fx < x && x <= 0)) --u;  // one float step toward zero (|f| > |x| > 0)
  std::memcpy(&f, &u, 4);
  if (static_cast<double>(f) != x) u |= 1u;  // inexact: odd
  u = bf16_rounded_bits(u);
  std::memcpy(&f, &u, 4);
  return static_cast<double>(f);
}

}  // namespace llama4d
