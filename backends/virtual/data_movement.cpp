#include "backends/virtual/data_movement.h"

#include <algorithm>
#include <cstring>

#include "core/comm/reduce_kernels.h"

namespace llama4d::virt {

namespace {

constexpr int64_t kTileBytes = 32 * 1024;  // one tile of reduced values stays in L1

char* at(void* p, int64_t elems, int64_t elem) { return static_cast<char*>(p) + elems * elem; }
const char* at(const void* p, int64_t elems, int64_t elem) { return static_cast<const char*>(p) + elems * elem; }

// outs[o][count] = the reduction of inputs (in order), for o < outs.size(): on the device when
// the backend reduces there, else on the host, tile by tile so each tile is read once.
void reduce_into(const ops::ComputeBackend* device, const std::vector<void*>& outs,
                 const std::vector<const void*>& inputs, int64_t count, const CommCall& c, int group_size,
                 ReduceAlgo algo) {
  const bool step_rounding = algo == ReduceAlgo::ring;
  const int n = int(inputs.size());
  if (device && device->collective_reduce) {
    device->collective_reduce(outs.data(), int(outs.size()), inputs.data(), n, count, c.dtype, c.reduce,
                              group_size, step_rounding);
    return;
  }
  if (outs.size() == 1) {  // reduce_sequence allows the output to be an input
    reduce_sequence(outs[0], inputs.data(), n, count, c.dtype, c.reduce, group_size, step_rounding);
    return;
  }
  const int64_t elem = int64_t(dtype_size(c.dtype));
  const int64_t tile = std::max<int64_t>(1, kTileBytes / elem);
  alignas(64) unsigned char reduced[kTileBytes];
  std::vector<const void*> tile_inputs(inputs.size());
  for (int64_t t0 = 0; t0 < count; t0 += tile) {
    const int64_t m = std::min(tile, count - t0);
    for (int k = 0; k < n; ++k) tile_inputs[size_t(k)] = at(inputs[size_t(k)], t0, elem);
    reduce_sequence(reduced, tile_inputs.data(), n, m, c.dtype, c.reduce, group_size, step_rounding);
    for (void* out : outs) std::memcpy(at(out, t0, elem), reduced, size_t(m * elem));
  }
}

void all_reduce_share(const Slot& s, int me, ReduceAlgo algo, const ops::ComputeBackend* device) {
  const int n = int(s.pub.size());
  const CommCall& c = s.pub[size_t(me)].call;
  const int64_t elem = int64_t(dtype_size(c.dtype));
  const std::vector<int64_t> counts = split_counts(c.count, n);
  const int64_t begin = prefix_offsets(counts)[size_t(me)];
  const std::vector<int> order = reduction_order(n, me, algo);
  std::vector<const void*> inputs(static_cast<size_t>(n));
  std::vector<void*> outs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) inputs[size_t(k)] = at(s.pub[size_t(order[size_t(k)])].in, begin, elem);
  for (int j = 0; j < n; ++j) outs[size_t(j)] = at(s.pub[size_t(j)].out, begin, elem);
  reduce_into(device, outs, inputs, counts[size_t(me)], c, n, algo);
}

void reduce_scatter_share(const Slot& s, int me, ReduceAlgo algo, const ops::ComputeBackend* device) {
  const int n = int(s.pub.size());
  const CommCall& c = s.pub[size_t(me)].call;
  const int64_t elem = int64_t(dtype_size(c.dtype));
  const int64_t begin = prefix_offsets(c.counts)[size_t(me)];
  const std::vector<int> order = reduction_order(n, me, algo);
  std::vector<const void*> inputs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) inputs[size_t(k)] = at(s.pub[size_t(order[size_t(k)])].in, begin, elem);
  // The output may be the in-place block of this member's input; both reductions allow that.
  reduce_into(device, {s.pub[size_t(me)].out}, inputs, c.counts[size_t(me)], c, n, algo);
}

void all_gather_share(const Slot& s, int me, const ops::ComputeBackend* device) {
  const int n = int(s.pub.size());
  const CommCall& c = s.pub[size_t(me)].call;
  const int64_t elem = int64_t(dtype_size(c.dtype));
  const std::vector<int64_t> offsets = prefix_offsets(c.counts);
  for (int j = 0; j < n; ++j)
    copy_bytes(device, at(s.pub[size_t(me)].out, offsets[size_t(j)], elem), s.pub[size_t(j)].in,
               c.counts[size_t(j)] * elem);
}

void broadcast_share(const Slot& s, int me, const ops::ComputeBackend* device) {
  const CommCall& c = s.pub[size_t(me)].call;
  if (me == c.root) return;
  copy_bytes(device, s.pub[size_t(me)].out, s.pub[size_t(c.root)].in, c.count * int64_t(dtype_size(c.dtype)));
}

void all_to_all_share(const Slot& s, int me, const ops::ComputeBackend* device) {
  const int n = int(s.pub.size());
  const CommCall& mine = s.pub[size_t(me)].call;
  const int64_t elem = int64_t(dtype_size(mine.dtype));
  const std::vector<int64_t> recv_offsets = prefix_offsets(mine.recv_counts);
  for (int j = 0; j < n; ++j) {
    const CommCall& theirs = s.pub[size_t(j)].call;
    const int64_t send_offset = prefix_offsets(theirs.counts)[size_t(me)];
    copy_bytes(device, at(s.pub[size_t(me)].out, recv_offsets[size_t(j)], elem),
               at(s.pub[size_t(j)].in, send_offset, elem), mine.recv_counts[size_t(j)] * elem);
  }
}

}  // namespace

void move_data(const Slot& slot, int me, ReduceAlgo algo, const ops::ComputeBackend* device) {
  switch (slot.pub[size_t(me)].call.op) {
    case CommOp::all_reduce: all_reduce_share(slot, me, algo, device); return;
    case CommOp::reduce_scatter: reduce_scatter_share(slot, me, algo, device); return;
    case CommOp::all_gather: all_gather_share(slot, me, device); return;
    case CommOp::broadcast: broadcast_share(slot, me, device); return;
    case CommOp::all_to_all: all_to_all_share(slot, me, device); return;
    default: return;  // barrier: arriving was the point
  }
}

void copy_bytes(const ops::ComputeBackend* device, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  if (device)
    device->device_memcpy(dst, src, bytes);
  else
    std::memcpy(dst, src, size_t(bytes));
}

StagedBytes::StagedBytes(const ops::ComputeBackend* device, const void* src, int64_t bytes) : device_(device) {
  if (bytes <= 0) return;
  data_ = device ? device->device_alloc(bytes) : ::operator new(size_t(bytes));
  try {
    copy_bytes(device, data_, src, bytes);
  } catch (...) {
    release();
    throw;
  }
}

void StagedBytes::release() {
  if (!data_) return;
  if (device_)
    device_->device_free(data_);
  else
    ::operator delete(data_);
  data_ = nullptr;
}

StagedBytes::~StagedBytes() { release(); }

StagedBytes::StagedBytes(StagedBytes&& o) noexcept : device_(o.device_), data_(o.data_) { o.data_ = nullptr; }

StagedBytes& StagedBytes::operator=(StagedBytes&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = o.data_;
    o.data_ = nullptr;
  }
  return *this;
}

std::string incompatibility(const CommCall& a, const CommCall& b) {
  if (a.op != b.op) return "different operations";
  if (a.op == CommOp::barrier) return "";
  if (a.dtype != b.dtype) return "different dtypes";
  switch (a.op) {
    case CommOp::all_reduce:
      if (a.count != b.count) return "different counts";
      if (a.reduce != b.reduce) return "different reduce ops";
      return "";
    case CommOp::reduce_scatter:
      if (a.counts != b.counts) return "different counts";
      if (a.reduce != b.reduce) return "different reduce ops";
      return "";
    case CommOp::all_gather:
      if (a.counts != b.counts) return "different counts";
      return "";
    case CommOp::broadcast:
      if (a.count != b.count) return "different counts";
      if (a.root != b.root) return "different roots";
      return "";
    default: return "";  // all_to_all: checked pairwise once everyone arrived
  }
}

}  // namespace llama4d::virt
