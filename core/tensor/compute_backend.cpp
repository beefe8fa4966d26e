// The registry of compute backends behind core/ops.h: which are linked, which is active.
#include <atomic>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<const ComputeBackend*> backends;  // registration order
  // Read on every op call from every rank's thread; written by registration and selection.
  std::atomic<const ComputeBackend*> active{nullptr};
};

Registry& registry() {
  static Registry r;  // built on first use, so backends may register from static initialisers
  return r;
}

// True when a kernel of the table is null (a backend that fills it with designated initializers
// and forgets one leaves it null).
template <class T>
bool missing_kernel(const Kernels<T>& k) {
  // Kernels<T> holds function pointers only: walk them as such.
  static_assert(sizeof(Kernels<T>) % sizeof(void (*)()) == 0);
  const auto* p = reinterpret_cast<void (*const*)()>(&k);
  for (size_t i = 0; i < sizeof(Kernels<T>) / sizeof(void (*)()); ++i)
    if (p[i] == nullptr) return true;
  return false;
}

}  // namespace

void register_compute_backend(const ComputeBackend* backend) {
  if (!backend || !backend->name) throw InputError("a compute backend needs a name");
  const std::string name = backend->name;
  if (!backend->device_alloc || !backend->device_free || !backend->device_release_cached ||
      !backend->device_memcpy || !backend->measure_peak_gemm_flops || !backend->threads || !backend->set_threads ||
      !backend->unusable_reason ||
      missing_kernel(backend->f32) || missing_kernel(backend->f64))
    throw InputError("compute backend '" + name + "' leaves an entry of its table empty");
  if (!backend->set_queue_only != !backend->synchronize)
    throw InputError("compute backend '" + name + "' has one of set_queue_only and synchronize without the other");
  if (!backend->set_kernel_mode != !backend->kernel_mode)
    throw InputError("compute backend '" + name + "' has one of set_kernel_mode and kernel_mode without the other");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const ComputeBackend* b : r.backends)
    if (name == b->name) throw InputError("two compute backends are named '" + name + "'");
  r.backends.push_back(backend);
  const ComputeBackend* none = nullptr;
  if (name == "cpu") r.active.compare_exchange_strong(none, backend);
}

void select_compute_backend(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string linked;
  for (const ComputeBackend* b : r.backends) {
    if (name == b->name) {
      const std::string why = b->unusable_reason();
      if (!why.empty()) throw InputError("--device " + name + ": " + why);
      r.active.store(b);
      return;
    }
    linked += (linked.empty() ? "" : ", ") + std::string(b->name);
  }
  throw InputError("--device " + name + ": this build has no such compute backend (it has: " +
                   (linked.empty() ? "none" : linked) + ")");
}

const ComputeBackend* exchange_active_compute_backend(const ComputeBackend* backend) {
  if (!backend) throw InputError("exchange_active_compute_backend needs a backend");
  return registry().active.exchange(backend);
}

std::vector<std::string> compute_backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const ComputeBackend* b : r.backends) names.push_back(b->name);
  return names;
}

const ComputeBackend* compute_backend_if_linked() { return registry().active.load(std::memory_order_acquire); }

const ComputeBackend& compute_backend() {
  const ComputeBackend* b = compute_backend_if_linked();
  if (!b) throw Error("no compute backend is linked into this program (link llama4d_backend_cpu)");
  return *b;
}

const char* kernel_mode_name(KernelMode mode) { return mode == KernelMode::fast ? "fast" : "exact"; }

void set_backend_threads(int n) {
  if (n < 1 || n > kMaxBackendThreads)
    throw InputError("thread count must be in [1, " + std::to_string(kMaxBackendThreads) + "], got " +
                     std::to_string(n));
  compute_backend().set_threads(n);
}

QueuedOps::QueuedOps() {
  const ComputeBackend& b = compute_backend();
  if (!b.set_queue_only) return;  // registration: both or neither
  previous_ = b.set_queue_only(true);
  queuing_ = b.set_queue_only(true);  // the setting in effect after the first call
  backend_ = &b;
}

void QueuedOps::finish() {
  if (!backend_) return;
  const ComputeBackend* b = std::exchange(backend_, nullptr);
  b->set_queue_only(previous_);
  b->synchronize();
}

QueuedOps::~QueuedOps() {
  try {
    finish();
  } catch (...) {  // a destructor cannot throw (see the header)
  }
}

}  // namespace llama4d::ops
