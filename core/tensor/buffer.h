#pragma once
// Buffer<T>: the one way tensor storage is allocated. The bytes come from the compute backend
// (ops::device_alloc: host memory on the CPU backend, device memory on CUDA) and are charged to
// the owning rank's MemoryTracker under a category, so a virtual GPU's memory report is what the
// process allocated for that rank, not a declaration. Freed (and credited back) when the Buffer
// is reset or destroyed. Move-only; a default Buffer holds nothing.
//
// Header-only on purpose: only programs that link a compute backend allocate, and layers below
// the backends can still name the type.
#include <cstdint>
#include <string_view>
#include <utility>

#include "core/ops.h"
#include "core/tensor/memory_tracker.h"

namespace llama4d {

template <class T>
class Buffer {
 public:
  Buffer() = default;
  // count elements of T charged to `memory` as `category` (memory may be null: not accounted,
  // for host-side staging such as checkpoint I/O). OutOfMemoryError when the rank's capacity is
  // exceeded; nothing is allocated then. Contents are uninitialised.
  Buffer(MemoryTracker* memory, MemoryCategory category, int64_t count, std::string_view what = "")
      : memory_(memory), category_(category), count_(count) {
    const int64_t b = bytes();
    if (memory_) memory_->allocate(category_, b, what);
    try {
      data_ = static_cast<T*>(ops::device_alloc(b));
    } catch (...) {
      if (memory_) memory_->release(category_, b);
      throw;
    }
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    if (!memory_ && !data_) {
      count_ = 0;
      return;
    }
    ops::device_free(data_);
    if (memory_) memory_->release(category_, bytes());
    data_ = nullptr, memory_ = nullptr, count_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  int64_t bytes() const { return count_ * int64_t(sizeof(T)); }
  MemoryCategory category() const { return category_; }
  MemoryTracker* memory() const { return memory_; }  // where it is charged (null: nowhere)

 private:
  void swap(Buffer& o) noexcept {
    std::swap(memory_, o.memory_);
    std::swap(category_, o.category_);
    std::swap(count_, o.count_);
    std::swap(data_, o.data_);
  }

  MemoryTracker* memory_ = nullptr;
  MemoryCategory category_ = MemoryCategory::other;
  int64_t count_ = 0;
  T* data_ = nullptr;
};

}  // namespace llama4d
