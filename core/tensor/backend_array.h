#pragma once
// BackendArray<T>: a resizable, copyable array in the compute backend's memory (ops::device_alloc),
// for host code that builds tensors as it would in a std::vector and hands them to ops: the
// kernels take the backend's memory only (core/ops.h), and on a GPU that is not the host's heap.
// Host code may index it too (the CUDA backend's memory is managed, and every op has finished
// when it returns, except on a thread inside ops::QueuedOps, which must not read it meanwhile). Not charged to a MemoryTracker: for harness-side work such as the
// tensor-parallel replay, never for a rank's tensors (those are Buffers).
//
// Header-only, as Buffer: only programs that link a compute backend allocate.
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/ops.h"

namespace llama4d {

template <class T>
class BackendArray {
  static_assert(std::is_trivially_copyable_v<T>, "BackendArray holds plain values");

 public:
  BackendArray() = default;
  // n elements, each `value`.
  explicit BackendArray(size_t n, T value = T(0)) { assign(n, value); }
  // A copy of host or backend memory [first, first + n).
  BackendArray(const T* first, size_t n) {
    BackendArray fresh;  // freed if the copy throws
    fresh.allocate(n);
    fresh.copy_in_at(0, first, n);
    swap(fresh);
  }
  explicit BackendArray(const std::vector<T>& host) : BackendArray(host.data(), host.size()) {}
  BackendArray(const BackendArray& o) : BackendArray(o.data(), o.size()) {}
  BackendArray& operator=(const BackendArray& o) {
    if (this != &o) *this = BackendArray(o);
    return *this;
  }
  BackendArray(BackendArray&& o) noexcept { swap(o); }
  BackendArray& operator=(BackendArray&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~BackendArray() { release(); }

  // n elements, each `value`.
  void assign(size_t n, T value) {
    BackendArray fresh;
    fresh.allocate(n);
    fresh.fill(0, n, value);
    *this = std::move(fresh);
  }
  // As std::vector::resize: the first min(size, n) elements kept, new ones zero.
  void resize(size_t n) {
    if (n == size_) return;
    BackendArray fresh;
    fresh.allocate(n);
    const size_t kept = n < size_ ? n : size_;
    fresh.copy_in_at(0, data_, kept);
    fresh.fill(kept, n, T(0));
    *this = std::move(fresh);
  }
  // The elements, copied to the host.
  std::vector<T> host() const {
    std::vector<T> out(size_);
    if (size_ > 0) ops::device_memcpy(out.data(), data_, int64_t(size_ * sizeof(T)));
    return out;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void allocate(size_t n) {
    owner_ = &ops::compute_backend();
    data_ = static_cast<T*>(owner_->device_alloc(int64_t(n * sizeof(T))));
    size_ = n;
  }
  // [begin, end) = value: the backend's fill for its element types, else through the host.
  void fill(size_t begin, size_t end, T value) {
    if (end <= begin) return;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      ops::fill(data_ + begin, value, int64_t(end - begin));
    } else {
      const std::vector<T> values(end - begin, value);
      copy_in_at(begin, values.data(), values.size());
    }
  }
  void copy_in_at(size_t at, const T* src, size_t n) {
    if (n > 0) ops::device_memcpy(data_ + at, src, int64_t(n * sizeof(T)));
  }
  // Freed by the backend that allocated it, whichever is active now.
  void release() {
    if (data_ != nullptr) owner_->device_free(data_);
    data_ = nullptr, size_ = 0;
  }
  void swap(BackendArray& o) noexcept {
    std::swap(owner_, o.owner_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

  const ops::ComputeBackend* owner_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace llama4d
