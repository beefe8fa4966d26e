// Element conversion loops, one instantiation per (source, destination) pair.
#include "core/io/convert.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace llama4d {

namespace {

// Loads element i of a buffer of dtype S as double (exact for every floating source).
template <DType S> double load(const unsigned char* p, size_t i) {
  if constexpr (S == DType::f32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  } else if constexpr (S == DType::f64) {
    double v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  } else if constexpr (S == DType::bf16) {
    bf16 v;
    std::memcpy(&v.bits, p + 2 * i, 2);
    return bf16_to_float(v);
  } else {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return f16_to_float(h);
  }
}

template <DType D> void store(unsigned char* p, size_t i, double x) {
  if constexpr (D == DType::f32) {
    float v = float(x);
    std::memcpy(p + 4 * i, &v, 4);
  } else if constexpr (D == DType::f64) {
    std::memcpy(p + 8 * i, &x, 8);
  } else {
    static_assert(D == DType::bf16);
    bf16 v = float_to_bf16(float(x));
    std::memcpy(p + 2 * i, &v.bits, 2);
  }
}

template <DType D, DType S> void convert_loop(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) store<D>(d, i, load<S>(s, i));
}

template <DType D> void convert_to(void* dst, const void* src, DType src_type, size_t n) {
  switch (src_type) {
    case DType::f32: return convert_loop<D, DType::f32>(dst, src, n);
    case DType::f64: return convert_loop<D, DType::f64>(dst, src, n);
    case DType::bf16: return convert_loop<D, DType::bf16>(dst, src, n);
    case DType::f16: return convert_loop<D, DType::f16>(dst, src, n);
    default: break;
  }
}

}  // namespace

bool can_convert(DType dst, DType src) {
  if (dst == src) return true;
  return is_floating(src) && (dst == DType::f32 || dst == DType::f64 || dst == DType::bf16);
}

void convert_elements(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (!can_convert(dst_type, src_type))
    throw InputError("cannot convert " + std::string(dtype_name(src_type)) + " elements to " +
                     std::string(dtype_name(dst_type)));
  if (n == 0) return;
  if (dst_type == src_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  switch (dst_type) {
    case DType::f32: return convert_to<DType::f32>(dst, src, src_type, n);
    case DType::f64: return convert_to<DType::f64>(dst, src, src_type, n);
    case DType::bf16: return convert_to<DType::bf16>(dst, src, src_type, n);
    default: break;
  }
}

void emit_converted(DType dst_type, const void* src, DType src_type, size_t n,
                    const std::function<void(const void*, size_t, size_t)>& emit) {
  const size_t out_size = dtype_size(dst_type), in_size = dtype_size(src_type);
  if (n == 0) return;
  if (dst_type == src_type) {
    emit(src, n * out_size, 0);
    return;
  }
  constexpr size_t kChunkBytes = size_t(4) << 20;
  const size_t per_chunk = std::max<size_t>(1, kChunkBytes / out_size);
  std::vector<unsigned char> buf(std::min(n, per_chunk) * out_size);
  const auto* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; i += per_chunk) {
    const size_t here = std::min(per_chunk, n - i);
    convert_elements(buf.data(), dst_type, p + i * in_size, src_type, here);
    emit(buf.data(), here * out_size, i);
  }
}

}  // namespace llama4d
