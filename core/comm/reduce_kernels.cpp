#include "core/comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace llama4d {

namespace {

// The type partial results live in while a tile is reduced.
template <class T> struct AccOf { using type = T; };
template <> struct AccOf<bf16> { using type = float; };

template <class T> typename AccOf<T>::type load(T v) { return v; }
template <> float load<bf16>(bf16 v) { return bf16_to_float(v); }

template <class T> T store(typename AccOf<T>::type a) { return a; }
template <> bf16 store<bf16>(float a) { return float_to_bf16(a); }

// Integer addition that wraps instead of overflowing (signed overflow is undefined in C++).
template <class A> A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return A(U(a) + U(b));
  } else {
    return a + b;
  }
}

template <class A> A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::max: return b > a ? b : a;
    case ReduceOp::min: return b < a ? b : a;
    default: return add(a, b);
  }
}

template <class A> A divide(A a, int n) { return a / A(n); }

constexpr int64_t kTile = 2048;  // elements per tile: the accumulator stays in L1

template <class T>
void reduce_sequence_t(T* out, const void* const* inputs, int n, int64_t count, ReduceOp op, int group_size,
                       bool step_rounding) {
  using A = typename AccOf<T>::type;
  const bool round_steps = step_rounding && std::is_same_v<T, bf16>;
  A acc[kTile];
  for (int64_t t0 = 0; t0 < count; t0 += kTile) {
    const int64_t m = std::min(kTile, count - t0);
    const T* first = static_cast<const T*>(inputs[0]) + t0;
    for (int64_t i = 0; i < m; ++i) acc[i] = load(first[i]);
    for (int j = 1; j < n; ++j) {
      const T* __restrict src = static_cast<const T*>(inputs[j]) + t0;
      if (op == ReduceOp::sum || op == ReduceOp::avg) {
        for (int64_t i = 0; i < m; ++i) acc[i] = add(acc[i], load(src[i]));
      } else {
        for (int64_t i = 0; i < m; ++i) acc[i] = combine(op, acc[i], load(src[i]));
      }
      if (round_steps)
        for (int64_t i = 0; i < m; ++i) acc[i] = load(store<T>(acc[i]));
    }
    if (op == ReduceOp::avg)
      for (int64_t i = 0; i < m; ++i) acc[i] = divide(acc[i], group_size);
    T* dst = out + t0;
    for (int64_t i = 0; i < m; ++i) dst[i] = store<T>(acc[i]);
  }
}

template <class T>
void reduce_step_t(T* __restrict acc, const T* __restrict x, int64_t count, ReduceOp op) {
  // One loop per operator so the common sum vectorises.
  switch (op) {
    case ReduceOp::max:
      for (int64_t i = 0; i < count; ++i) acc[i] = store<T>(combine(ReduceOp::max, load(acc[i]), load(x[i])));
      return;
    case ReduceOp::min:
      for (int64_t i = 0; i < count; ++i) acc[i] = store<T>(combine(ReduceOp::min, load(acc[i]), load(x[i])));
      return;
    default:
      for (int64_t i = 0; i < count; ++i) acc[i] = store<T>(add(load(acc[i]), load(x[i])));
  }
}

template <class T>
void finish_average_t(T* buf, int64_t count, int group_size) {
  for (int64_t i = 0; i < count; ++i) buf[i] = store<T>(divide(load(buf[i]), group_size));
}

template <class F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::f16: break;
  }
  throw InputError("reductions are not supported for dtype " + std::string(dtype_name(dtype)));
}

}  // namespace

void reduce_sequence(void* out, const void* const* inputs, int n, int64_t count, DType dtype, ReduceOp op,
                     int group_size, bool step_rounding) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_sequence_t<T>(static_cast<T*>(out), inputs, n, count, op, group_size, step_rounding);
  });
}

std::vector<int> reduction_order(int n, int me, ReduceAlgo algo) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) order[size_t(k)] = algo == ReduceAlgo::ring ? (me + 1 + k) % n : k;
  return order;
}

void reduce_step(void* acc, const void* x, int64_t count, DType dtype, ReduceOp op) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_step_t<T>(static_cast<T*>(acc), static_cast<const T*>(x), count, op);
  });
}

void finish_average(void* buf, int64_t count, DType dtype, int group_size) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    finish_average_t<T>(static_cast<T*>(buf), count, group_size);
  });
}

}  // namespace llama4d
