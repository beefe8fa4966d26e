#pragma once
// A compute backend for tests of what a GPU needs from the code that calls ops: the CPU's
// kernels, with the products (matmul_forward, matmul_backward) and attention (forward, backward)
// wrapped to count what their callers say the operands hold (ops::GemmOperands;
// AttentionShape::operands), to check that operands said to be bf16 are (every element a bf16
// value: the contract that lets the CUDA backend read them as bf16 on tensor cores), and to
// check that every tensor they touch is the backend's memory (device_alloc; on a GPU the host's
// heap is not): whole tensors for the products and attention, and the first element of every
// pointer any other fp32 kernel takes. A CPU run cannot see either broken otherwise: the CPU sums
// bf16 operands as fp32 and its memory is the host's. Given a host reduction, it also takes the
// virtual process group's reductions (ComputeBackend::collective_reduce, as a GPU does) and logs
// what memory they and the copies (device_memcpy) touch. Thread-safe: virtual GPUs are threads
// of one process.
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/tensor/dtype.h"

namespace llama4d::test {

// True when every element of x[n] is a bf16 value: the low 16 bits of each float are zero.
inline bool all_bf16(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    if ((u & 0xffffu) != 0) return false;
  }
  return true;
}

struct OperandLog {
  int allocations = 0;                              // device_alloc calls that returned memory
  int products_bf16 = 0, products_as_stored = 0;    // matmul_forward and matmul_backward calls
  int attention_bf16 = 0, attention_as_stored = 0;  // attention_forward and attention_backward calls
  std::vector<std::string> not_bf16;                // operands said to be bf16 that are not
  std::vector<std::string> not_backend_memory;      // tensors outside every device_alloc block
  // collective_reduce calls (when the logger was given a host reduction): those whose pointers
  // all lie in backend memory, and the others.
  int collective_reductions_on_backend = 0;
  struct HostReduction {
    DType dtype;
    int64_t count;
    int host_pointers, pointers;  // inputs and outputs
    std::string describe() const {
      return std::string(dtype_name(dtype)) + " x" + std::to_string(count) + ": " + std::to_string(host_pointers) +
             " of its " + std::to_string(pointers) + " pointers are host memory";
    }
  };
  std::vector<HostReduction> collective_reductions_touching_host;
  // device_memcpy calls with both sides in backend memory, and the others (host <-> device).
  int copies_on_backend = 0, copies_touching_host = 0;
};

// ComputeBackend::collective_reduce computed on the host (the logging backend runs the CPU's
// kernels). The communication layer's reduce_sequence is one; passed in by tests that link it.
using HostCollectiveReduce = void (*)(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count,
                                      DType dtype, ReduceOp op, int group_size, bool step_rounding);

namespace operand_log_detail {
inline std::mutex mutex;
inline OperandLog log;
inline ops::ComputeBackend cpu;
inline std::map<uintptr_t, uintptr_t> blocks;  // live device_alloc blocks: begin -> end
inline HostCollectiveReduce host_reduce = nullptr;

inline void* device_alloc(int64_t bytes) {
  void* p = cpu.device_alloc(bytes);
  std::lock_guard<std::mutex> lock(mutex);
  if (p) {
    blocks[uintptr_t(p)] = uintptr_t(p) + uintptr_t(bytes);
    ++log.allocations;
  }
  return p;
}
inline void device_free(void* p) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    blocks.erase(uintptr_t(p));
  }
  cpu.device_free(p);
}
// Whether [p, p + bytes) lies in one live block (call with the mutex held). With bytes = 0 the
// block's end itself counts (where an empty tensor may point).
inline bool in_backend_memory(const void* p, int64_t bytes) {
  auto it = blocks.upper_bound(uintptr_t(p));
  if (it == blocks.begin()) return false;
  --it;
  if (bytes == 0 && uintptr_t(p) == it->second) return true;
  return uintptr_t(p) >= it->first && uintptr_t(p) + uintptr_t(bytes) <= it->second;
}
// Records the tensors (pointer, elements) of one call that are not backend memory (null: unused).
inline void check_memory(std::initializer_list<std::pair<const void*, int64_t>> tensors, size_t element,
                         const char* what) {
  int i = 0;
  for (const auto& [p, n] : tensors) {
    if (p && n > 0 && !in_backend_memory(p, n * int64_t(element)))
      log.not_backend_memory.push_back(std::string(what) + " tensor " + std::to_string(i));
    ++i;
  }
}

inline void device_memcpy(void* dst, const void* src, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    (in_backend_memory(dst, bytes) && in_backend_memory(src, bytes) ? log.copies_on_backend
                                                                     : log.copies_touching_host)++;
  }
  cpu.device_memcpy(dst, src, bytes);
}

inline void collective_reduce(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count,
                              DType dtype, ReduceOp op, int group_size, bool step_rounding) {
  {
    const int64_t bytes = count * int64_t(dtype_size(dtype));
    std::lock_guard<std::mutex> lock(mutex);
    int host = 0;
    for (int j = 0; j < n; ++j) host += !in_backend_memory(inputs[j], bytes);
    for (int o = 0; o < n_outs; ++o) host += !in_backend_memory(outs[o], bytes);
    if (host == 0)
      ++log.collective_reductions_on_backend;
    else
      log.collective_reductions_touching_host.push_back({dtype, count, host, n + n_outs});
  }
  host_reduce(outs, n_outs, inputs, n, count, dtype, op, group_size, step_rounding);
}

inline void product(ops::GemmOperands operands, std::initializer_list<std::pair<const float*, int64_t>> read,
                    const char* what) {
  std::vector<std::string> bad;
  int i = 0;
  for (const auto& [x, n] : read) {
    if (operands == ops::GemmOperands::bf16 && x && !all_bf16(x, n))
      bad.push_back(std::string(what) + " operand " + std::to_string(i));
    ++i;
  }
  std::lock_guard<std::mutex> lock(mutex);
  (operands == ops::GemmOperands::bf16 ? log.products_bf16 : log.products_as_stored)++;
  log.not_bf16.insert(log.not_bf16.end(), bad.begin(), bad.end());
}
inline void products_memory(std::initializer_list<std::pair<const void*, int64_t>> tensors, const char* what) {
  std::lock_guard<std::mutex> lock(mutex);
  check_memory(tensors, sizeof(float), what);
}
// q-shaped operands [B, Tq, nh, hd], k-shaped [B, kv rows, nkv, hd] (a cache's rows included);
// `written`: the call's outputs (q-shaped, k-shaped or lse-shaped [B, nh, Tq]), checked for
// memory only.
struct AttentionOutputs {
  std::initializer_list<const float*> q_shaped, k_shaped, lse_shaped;
};
inline void attention(const ops::AttentionShape& s, std::initializer_list<const float*> q_shaped,
                      std::initializer_list<const float*> k_shaped, AttentionOutputs written, const char* what) {
  const bool bf16 = s.operands == ops::GemmOperands::bf16;
  const int64_t q = s.B * s.Tq * s.nh * s.hd, lse = s.B * s.nh * s.Tq;
  const int64_t kv = s.B * (s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd);
  std::vector<std::string> bad;
  for (const float* x : q_shaped)
    if (bf16 && !all_bf16(x, q)) bad.push_back(std::string(what) + " q-shaped operand");
  for (const float* x : k_shaped)
    if (bf16 && !all_bf16(x, kv)) bad.push_back(std::string(what) + " k-shaped operand");
  std::lock_guard<std::mutex> lock(mutex);
  (bf16 ? log.attention_bf16 : log.attention_as_stored)++;
  log.not_bf16.insert(log.not_bf16.end(), bad.begin(), bad.end());
  for (auto [list, n] : {std::pair{q_shaped, q}, {k_shaped, kv}, {written.q_shaped, q}, {written.k_shaped, kv},
                         {written.lse_shaped, lse}})
    for (const float* x : list) check_memory({{x, n}}, sizeof(float), what);
}

inline void matmul_forward(float* out, const float* inp, const float* w, int64_t BT, int64_t C, int64_t OC,
                           ops::GemmOperands operands) {
  product(operands, {{inp, BT * C}, {w, OC * C}}, "matmul_forward");
  products_memory({{out, BT * OC}, {inp, BT * C}, {w, OC * C}}, "matmul_forward");
  cpu.f32.matmul_forward(out, inp, w, BT, C, OC, operands);
}
inline void matmul_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, int64_t BT,
                            int64_t C, int64_t OC, ops::GemmOperands operands, ops::GradWrite dinp_write) {
  product(operands, {{dout, BT * OC}, {dw ? inp : nullptr, BT * C}, {dinp ? w : nullptr, OC * C}}, "matmul_backward");
  products_memory({{dinp, BT * C}, {dw, OC * C}, {dout, BT * OC}, {dw ? inp : nullptr, BT * C},
                   {dinp ? w : nullptr, OC * C}},
                  "matmul_backward");
  cpu.f32.matmul_backward(dinp, dw, dout, inp, w, BT, C, OC, operands, dinp_write);
}
inline void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                              const ops::AttentionShape& s) {
  attention(s, {q}, {k, v}, {.q_shaped = {out}, .k_shaped = {}, .lse_shaped = {lse}}, "attention_forward");
  cpu.f32.attention_forward(out, lse, q, k, v, s);
}
inline void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                               const float* v, const float* out, const float* lse, const ops::AttentionShape& s) {
  attention(s, {dout, q, out}, {k, v}, {.q_shaped = {dq}, .k_shaped = {dk, dv}, .lse_shaped = {lse}},
            "attention_backward");
  cpu.f32.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
}

// Every kernel but copy (a memcpy: either side may be host memory, core/ops.h) wrapped once more:
// each pointer argument must start inside a live device_alloc block, or be null. The host
// outputs core/ops.h allows (sum_squares_chunks' double partials, sum_losses' double sum and
// int64_t count) and AttentionShape's document ids (passed inside the shape) are not checked.
inline ops::Kernels<float> logged;  // the table with the products and attention logged (above)

template <class P>
void check_argument(const P& arg, int index, const char* kernel) {
  if constexpr (std::is_pointer_v<P>) {
    using E = std::remove_cv_t<std::remove_pointer_t<P>>;
    if constexpr (!std::is_same_v<E, double> && !std::is_same_v<E, int64_t>) {
      // Zero bytes: an empty tensor may point just past a block's end (an empty shard's piece).
      if (arg != nullptr && !in_backend_memory(arg, 0))
        log.not_backend_memory.push_back(std::string(kernel) + " argument " + std::to_string(index));
    }
  }
}

template <class F>
struct Checked;
template <class R, class... A>
struct Checked<R (*)(A...)> {
  template <auto Member, const char* Name>
  static R call(A... args) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      int index = 0;
      (check_argument(args, index++, Name), ...);
    }
    return (logged.*Member)(args...);
  }
};

#define LLAMA4D_CHECKED_KERNELS(X)                                                                              \
  X(matmul_forward) X(matmul_backward) X(rmsnorm_forward) X(rmsnorm_backward) X(rope_forward) X(rope_backward) \
  X(attention_forward) X(attention_backward) X(attention_merge) X(swiglu_forward) X(swiglu_backward)            \
  X(embedding_forward) X(embedding_backward) X(add_forward) X(accumulate) X(cross_entropy_forward)            \
  X(cross_entropy_backward) X(vocab_slice_max_and_target) X(vocab_slice_sum_exp) X(cross_entropy_from_stats)  \
  X(cross_entropy_backward_slice) X(scale) X(fill) X(add_scaled) X(adamw_update) X(sum_squares_chunks)        \
  X(sum_losses) X(embedding_forward_rows) X(embedding_backward_rows) X(round_to_bf16) X(to_bf16) X(from_bf16) \
  X(all_finite) X(router_topk) X(router_backward) X(gather_rows) X(combine_rows) X(combine_rows_backward)
#define LLAMA4D_KERNEL_NAME(name) inline constexpr char name##_name[] = #name;
LLAMA4D_CHECKED_KERNELS(LLAMA4D_KERNEL_NAME)
#undef LLAMA4D_KERNEL_NAME

}  // namespace operand_log_detail

// While it lives, the logging backend ("cpu-logging-operands") is active and the log starts
// empty; the CPU backend is active again after. Create it before the buffers of the run it logs
// (its memory is the CPU's, so buffers outlive the switch either way). With `host_reduce` it
// takes the virtual process group's reductions too (collective_reduce); without, it leaves them
// to the process group, as the CPU backend does.
class LoggingOperands {
 public:
  explicit LoggingOperands(HostCollectiveReduce host_reduce = nullptr) {
    ops::select_compute_backend("cpu");  // the table it wraps
    static ops::ComputeBackend logging = ops::compute_backend();
    static const bool registered = [] {
      namespace d = operand_log_detail;
      d::cpu = logging;
      logging.name = "cpu-logging-operands";
      logging.device_alloc = &d::device_alloc;
      logging.device_free = &d::device_free;
      logging.device_memcpy = &d::device_memcpy;
      logging.f32.matmul_forward = &d::matmul_forward;
      logging.f32.matmul_backward = &d::matmul_backward;
      logging.f32.attention_forward = &d::attention_forward;
      logging.f32.attention_backward = &d::attention_backward;
      d::logged = logging.f32;
#define LLAMA4D_CHECK_KERNEL(name)                                                                       \
  logging.f32.name = &d::Checked<decltype(ops::Kernels<float>::name)>::template call<&ops::Kernels<float>::name, \
                                                                                      d::name##_name>;
      LLAMA4D_CHECKED_KERNELS(LLAMA4D_CHECK_KERNEL)
#undef LLAMA4D_CHECK_KERNEL
      ops::register_compute_backend(&logging);
      return true;
    }();
    (void)registered;
    {
      // Blocks a previous logger saw allocated may have been freed since, unseen: forget them.
      std::lock_guard<std::mutex> lock(operand_log_detail::mutex);
      operand_log_detail::log = {};
      operand_log_detail::blocks.clear();
      operand_log_detail::host_reduce = host_reduce;
    }
    // No run uses the table now (a virtual world made after this reads the entry at each reduction).
    logging.collective_reduce = host_reduce ? &operand_log_detail::collective_reduce : nullptr;
    ops::select_compute_backend("cpu-logging-operands");
  }
  ~LoggingOperands() { ops::select_compute_backend("cpu"); }
  LoggingOperands(const LoggingOperands&) = delete;
  LoggingOperands& operator=(const LoggingOperands&) = delete;

  OperandLog log() const {
    std::lock_guard<std::mutex> lock(operand_log_detail::mutex);
    return operand_log_detail::log;
  }
};

}  // namespace llama4d::test
