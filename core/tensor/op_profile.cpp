// OpProfile: the active backend's table with every kernel wrapped in a timer (op_profile.h).
#include "core/tensor/op_profile.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

namespace {

// Every kernel of ops::Kernels, in its order (checked below, so a kernel added there and not here
// fails to compile).
#define LLAMA4D_KERNELS(X)                                                                                      \
  X(matmul_forward) X(matmul_backward) X(rmsnorm_forward) X(rmsnorm_backward) X(rope_forward) X(rope_backward)  \
  X(attention_forward) X(attention_backward) X(attention_merge) X(swiglu_forward) X(swiglu_backward)            \
  X(embedding_forward) X(embedding_backward) X(add_forward) X(accumulate) X(cross_entropy_forward)              \
  X(cross_entropy_backward) X(vocab_slice_max_and_target) X(vocab_slice_sum_exp) X(cross_entropy_from_stats)    \
  X(cross_entropy_backward_slice) X(scale) X(fill) X(copy) X(add_scaled) X(adamw_update) X(sum_squares_chunks)  \
  X(sum_losses) X(embedding_forward_rows) X(embedding_backward_rows) X(round_to_bf16) X(to_bf16) X(from_bf16)   \
  X(all_finite) X(router_topk) X(router_backward) X(gather_rows) X(combine_rows) X(combine_rows_backward)

enum KernelId : int {
#define LLAMA4D_ID(name) k_##name,
  LLAMA4D_KERNELS(LLAMA4D_ID)
#undef LLAMA4D_ID
  kKernelCount
};

constexpr const char* kNames[] = {
#define LLAMA4D_NAME(name) #name,
    LLAMA4D_KERNELS(LLAMA4D_NAME)
#undef LLAMA4D_NAME
};

using AnyFunction = void (*)();
constexpr bool listed_in_table_order() {
  size_t i = 0;
  bool in_order = true;
#define LLAMA4D_AT(name) in_order = in_order && offsetof(Kernels<float>, name) == (i++) * sizeof(AnyFunction);
  LLAMA4D_KERNELS(LLAMA4D_AT)
#undef LLAMA4D_AT
  return in_order && i * sizeof(AnyFunction) == sizeof(Kernels<float>);
}
static_assert(listed_in_table_order(), "LLAMA4D_KERNELS must list every kernel of ops::Kernels in its order");

struct Tally {
  std::atomic<int64_t> calls{0}, nanoseconds{0};
  std::atomic<double> flops{0};
};
Tally tallies[kKernelCount];
const ComputeBackend* inner = nullptr;  // the backend being timed (null: no profile lives)
ComputeBackend timed;                   // its entries, with every kernel wrapped

template <class T>
const Kernels<T>& inner_kernels() {
  if constexpr (std::is_same_v<T, float>) {
    return inner->f32;
  } else {
    return inner->f64;
  }
}

// The FLOPs core/ops.h's forwarders report for a call of kernel Id (products and attention).
template <int Id, class... A>
double call_flops(const A&... a) {
  const auto args = std::tie(a...);
  if constexpr (Id == k_matmul_forward) {
    return matmul_forward_flops(std::get<3>(args), std::get<4>(args), std::get<5>(args));
  } else if constexpr (Id == k_matmul_backward) {
    return matmul_backward_flops(std::get<0>(args) != nullptr, std::get<1>(args) != nullptr, std::get<5>(args),
                                 std::get<6>(args), std::get<7>(args));
  } else if constexpr (Id == k_attention_forward) {
    return attention_forward_flops(std::get<5>(args));
  } else if constexpr (Id == k_attention_backward) {
    return attention_backward_flops(std::get<9>(args));
  } else {
    return 0.0;
  }
}

template <class T, int Id, auto Kernel>
struct Timed;
// Calls the inner backend's kernel, waits for it where the backend queues work, and tallies it.
template <class T, int Id, class R, class... A, R (*Kernels<T>::*Kernel)(A...)>
struct Timed<T, Id, Kernel> {
  static R call(A... a) {
    const auto start = std::chrono::steady_clock::now();
    if constexpr (std::is_void_v<R>) {
      (inner_kernels<T>().*Kernel)(a...);
      stop(start, a...);
    } else {
      R result = (inner_kernels<T>().*Kernel)(a...);
      stop(start, a...);
      return result;
    }
  }
  static void stop(std::chrono::steady_clock::time_point start, const A&... a) {
    if (inner->synchronize) inner->synchronize();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    Tally& t = tallies[Id];
    t.calls.fetch_add(1, std::memory_order_relaxed);
    t.nanoseconds.fetch_add(ns.count(), std::memory_order_relaxed);
    if (const double f = call_flops<Id>(a...); f != 0) t.flops.fetch_add(f, std::memory_order_relaxed);
  }
};

template <class T>
Kernels<T> timed_kernels() {
  Kernels<T> k{};
#define LLAMA4D_WRAP(name) k.name = &Timed<T, k_##name, &Kernels<T>::name>::call;
  LLAMA4D_KERNELS(LLAMA4D_WRAP)
#undef LLAMA4D_WRAP
  return k;
}
#undef LLAMA4D_KERNELS

}  // namespace

OpProfile::OpProfile() {
  if (inner) throw InputError("an OpProfile is already timing the ops: one at a time");
  inner = &compute_backend();
  timed = *inner;  // memory, streams and threads stay the inner backend's own entries
  timed.f32 = timed_kernels<float>();
  timed.f64 = timed_kernels<double>();
  take();
  timed_ = exchange_active_compute_backend(&timed);
}

OpProfile::~OpProfile() {
  exchange_active_compute_backend(timed_);
  inner = nullptr;
}

std::vector<OpTime> OpProfile::take() {
  std::vector<OpTime> times;
  for (int id = 0; id < kKernelCount; ++id) {
    Tally& t = tallies[id];
    const int64_t calls = t.calls.exchange(0);
    const int64_t ns = t.nanoseconds.exchange(0);
    const double flops = t.flops.exchange(0);
    if (calls > 0) times.push_back({kNames[id], calls, double(ns) * 1e-9, flops});
  }
  return times;
}

}  // namespace llama4d::ops
