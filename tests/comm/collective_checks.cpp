#include "tests/comm/collective_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/comm/traffic_log.h"
#include "core/ops.h"

namespace llama4d::test {

namespace {

// ---- typed buffers ------------------------------------------------------------------------

// Where new Buffers live: the calling thread's private heap, the symmetric memory of a group
// (set by with_symmetric_buffers for the duration of a check; every rank then makes the same
// sequence of Buffers, as allocate_symmetric requires), or the compute backend's memory (set by
// with_backend_buffers; the host reads and writes it below, which a GPU's managed memory allows).
thread_local ProcessGroup* t_symmetric_group = nullptr;
thread_local const ops::ComputeBackend* t_backend = nullptr;

std::shared_ptr<void> new_memory(size_t size) {
  if (t_symmetric_group) return t_symmetric_group->allocate_symmetric(int64_t(size));
  if (const ops::ComputeBackend* b = t_backend)
    return std::shared_ptr<void>(b->device_alloc(int64_t(size + 1)), [b](void* p) { b->device_free(p); });
  return std::shared_ptr<void>(new unsigned char[size + 1], std::default_delete<unsigned char[]>());
}

struct Buffer {
  Buffer(DType t, int64_t n) : dtype(t), count(n), size(size_t(n) * dtype_size(t)) {
    memory = new_memory(size);
    std::memset(memory.get(), 0xA5, size);
  }
  // Copies are private snapshots.
  Buffer(const Buffer& o) : dtype(o.dtype), count(o.count), size(o.size) {
    memory = std::shared_ptr<void>(new unsigned char[size + 1], std::default_delete<unsigned char[]>());
    std::memcpy(memory.get(), o.memory.get(), size);
  }
  Buffer& operator=(const Buffer&) = delete;
  DType dtype;
  int64_t count;
  size_t size;
  std::shared_ptr<void> memory;

  bool same_bytes(const Buffer& o) const { return size == o.size && std::memcmp(data(), o.data(), size) == 0; }
  int64_t elem() const { return int64_t(dtype_size(dtype)); }
  unsigned char* data() const { return static_cast<unsigned char*>(memory.get()); }
  unsigned char* at(int64_t i) { return data() + i * elem(); }
  const unsigned char* at(int64_t i) const { return data() + i * elem(); }

  void set(int64_t i, double v) {
    unsigned char* p = at(i);
    switch (dtype) {
      case DType::f32: { float x = float(v); std::memcpy(p, &x, 4); break; }
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::bf16: { bf16 x = float_to_bf16(float(v)); std::memcpy(p, &x.bits, 2); break; }
      case DType::f16: { uint16_t x = uint16_t(int64_t(v) & 0xffff); std::memcpy(p, &x, 2); break; }  // raw bits
      case DType::i32: { int32_t x = int32_t(v); std::memcpy(p, &x, 4); break; }
      case DType::i64: { int64_t x = int64_t(v); std::memcpy(p, &x, 8); break; }
      case DType::u8: *p = uint8_t(int64_t(v) & 0xff); break;
    }
  }
  double get(int64_t i) const {
    const unsigned char* p = at(i);
    switch (dtype) {
      case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
      case DType::f64: { double x; std::memcpy(&x, p, 8); return x; }
      case DType::bf16: { bf16 x; std::memcpy(&x.bits, p, 2); return bf16_to_float(x); }
      case DType::f16: { uint16_t x; std::memcpy(&x, p, 2); return x; }
      case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return x; }
      case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return double(x); }
      case DType::u8: return *p;
    }
    return 0;
  }
};

const DType kReduceTypes[] = {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::u8};
const DType kMoveTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i64, DType::u8};

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

// Small integers: any sum over <= 8 ranks is exact in every dtype. Unsigned types get 0..10,
// f16 (moved as raw bits) a bit pattern.
double int_value(DType t, int r, int64_t i) {
  const int64_t base = (r * 7 + i * 3 + 1) % 11;
  if (t == DType::u8) return double(base);
  if (t == DType::f16) return double((r * 977 + i * 131) % 65536);
  return double(base - 5);
}

// Mixed magnitudes (2^-40 .. 2^40) so that the order of additions changes the rounded result,
// even in fp64. Built with ldexp from integers so every evaluation gives the same bits (a
// formula like sin(a*r + b*i) may be contracted into FMAs differently at each call site).
double float_value(int r, int64_t i) {
  const int64_t m = (int64_t(r) * 7919 + i * 104729) % 2000003 - 1000001;
  const int e = int((i * 5 + int64_t(r) * 3) % 61) - 40;
  return std::ldexp(double(m), e);
}

std::vector<int64_t> balanced(int64_t count, int n) {
  std::vector<int64_t> c(size_t(n), count / n);
  for (int64_t k = 0; k < count % n; ++k) c[size_t(k)] += 1;
  return c;
}

int64_t offset_of(const std::vector<int64_t>& counts, int k) {
  int64_t o = 0;
  for (int j = 0; j < k; ++j) o += counts[size_t(j)];
  return o;
}

int64_t total_of(const std::vector<int64_t>& counts) { return offset_of(counts, int(counts.size())); }

std::string where(const ProcessGroup& pg, const std::string& what, DType t, int64_t count) {
  return "rank " + std::to_string(pg.rank()) + "/" + std::to_string(pg.size()) + " of '" + pg.name() + "' (" +
         std::string(reduce_algo_name(pg.algo())) + "): " + what + " " + std::string(dtype_name(t)) + " count " +
         std::to_string(count);
}

// Compares element by element; reports the first difference only.
void expect_values(const Buffer& got, const std::vector<double>& want, const std::string& ctx) {
  for (int64_t i = 0; i < got.count; ++i)
    if (got.get(i) != want[size_t(i)]) {
      ADD_FAILURE() << ctx << ": element " << i << " is " << got.get(i) << ", expected " << want[size_t(i)];
      return;
    }
}

void expect_bits(const Buffer& got, int64_t i, const unsigned char* want, const std::string& ctx, bool* reported) {
  if (*reported || std::memcmp(got.at(i), want, size_t(got.elem())) == 0) return;
  *reported = true;
  Buffer ref(got.dtype, 1);
  std::memcpy(ref.at(0), want, size_t(got.elem()));
  ADD_FAILURE() << ctx << ": element " << i << " is " << got.get(i) << ", not bitwise equal to the reference "
                << ref.get(0);
}

// The bytes this rank's most recent traffic record counted.
void expect_traffic(const ProcessGroup& pg, const char* op, int64_t sent, int64_t recv, const std::string& ctx) {
  const std::vector<TrafficRecord> records = pg.traffic().records();
  if (records.empty()) {
    ADD_FAILURE() << ctx << ": no traffic record";
    return;
  }
  const TrafficRecord& r = records.back();
  EXPECT_EQ(r.op, op) << ctx;
  EXPECT_EQ(r.group, pg.name()) << ctx;
  EXPECT_EQ(r.bytes_sent, sent) << ctx << ": bytes sent";
  EXPECT_EQ(r.bytes_recv, recv) << ctx << ": bytes received";
  EXPECT_EQ(r.sent_nvlink + r.sent_ib, r.bytes_sent) << ctx << ": link split";
}

// v as the dtype stores it (rounded to fp32 or bf16), back as a double.
double stored(DType t, double v) {
  if (t == DType::f32) return double(float(v));
  if (t == DType::bf16) return double(bf16_to_float(float_to_bf16(float(v))));
  return v;
}

// Expected reduction of the float inputs x (already rounded to the dtype) in the given order,
// as the dtype's bytes. bf16 accumulates in fp32; `round_steps` rounds every partial to bf16.
void reference_float(unsigned char* out, DType t, const std::vector<double>& x, const std::vector<int>& order,
                     ReduceOp op, bool round_steps) {
  const int n = int(x.size());
  if (t == DType::f64) {
    double acc = x[size_t(order[0])];
    for (int k = 1; k < n; ++k) acc = acc + x[size_t(order[size_t(k)])];
    if (op == ReduceOp::avg) acc = acc / double(n);
    std::memcpy(out, &acc, 8);
    return;
  }
  float acc = float(x[size_t(order[0])]);
  for (int k = 1; k < n; ++k) {
    acc = acc + float(x[size_t(order[size_t(k)])]);
    if (t == DType::bf16 && round_steps) acc = bf16_to_float(float_to_bf16(acc));
  }
  if (op == ReduceOp::avg) acc = acc / float(n);
  if (t == DType::bf16) {
    const bf16 b = float_to_bf16(acc);
    std::memcpy(out, &b.bits, 2);
  } else {
    std::memcpy(out, &acc, 4);
  }
}

// Summation order of the chunk owned by group rank k: rank order, or the ring's k+1, ..., k.
std::vector<int> order_for(ReduceAlgo algo, int n, int k) {
  std::vector<int> order;
  for (int j = 0; j < n; ++j) order.push_back(algo == ReduceAlgo::ring ? (k + 1 + j) % n : j);
  return order;
}

// Integer-data expectation of a reduction over ranks, in the dtype's arithmetic.
double expected_int_reduce(DType t, ReduceOp op, int n, const std::vector<double>& vals) {
  double acc = vals[0];
  for (int j = 1; j < n; ++j) {
    if (op == ReduceOp::max) acc = std::max(acc, vals[size_t(j)]);
    else if (op == ReduceOp::min) acc = std::min(acc, vals[size_t(j)]);
    else acc += vals[size_t(j)];
  }
  if (op != ReduceOp::avg) return acc;
  switch (t) {
    case DType::f32: return double(float(acc) / float(n));
    case DType::f64: return acc / double(n);
    case DType::bf16: return double(bf16_to_float(float_to_bf16(float(acc) / float(n))));
    default: return double(int64_t(acc) / int64_t(n));  // integers truncate
  }
}

}  // namespace

// ---- all_reduce -----------------------------------------------------------------------------

void check_all_reduce(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType t : kReduceTypes) {
    // 20011 elements exceed 64 KiB for 4-byte types: MPI's shared-memory transport.
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(1001), int64_t(20011)}) {
      if (count > 1001 && t != DType::f32 && t != DType::i32 && t != DType::bf16) continue;
      const int64_t elem = int64_t(dtype_size(t)), S = count * elem;
      const std::vector<int64_t> chunks = balanced(count, n);
      const int64_t c_me = chunks[size_t(me)] * elem, c_next = chunks[size_t((me + 1) % n)] * elem,
                    c_prev = chunks[size_t((me + n - 1) % n)] * elem;
      int64_t sent, recv;
      if (pg.algo() == ReduceAlgo::ring) {
        sent = 2 * S - c_me - c_next;  // reduce-scatter: all chunks but mine; all-gather: all but (me+1)'s
        recv = 2 * S - c_prev - c_me;
      } else {
        sent = (S - c_me) + (n - 1) * c_me;  // direct: my pieces to their owners, then my chunk to all
        recv = (n - 1) * c_me + (S - c_me);
      }
      if (count % n == 0) {
        EXPECT_EQ(sent, 2 * (n - 1) * S / n) << "textbook ring all-reduce volume";
      }

      // Integer-valued data: exact for every op, in place and out of place.
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        const bool in_place = op == ReduceOp::sum || op == ReduceOp::max;
        const std::string ctx = where(pg, std::string("all_reduce ") + std::string(reduce_op_name(op)) +
                                              (in_place ? " in place" : ""), t, count);
        Buffer in(t, count), out(t, count);
        std::vector<double> want(static_cast<size_t>(count)), vals(static_cast<size_t>(n));
        for (int64_t i = 0; i < count; ++i) {
          in.set(i, int_value(t, me, i));
          for (int r = 0; r < n; ++r) vals[size_t(r)] = int_value(t, r, i);
          want[size_t(i)] = expected_int_reduce(t, op, n, vals);
        }
        const Buffer original = in;
        if (in_place) {
          pg.all_reduce(in.data(), count, t, op);
          expect_values(in, want, ctx);
        } else {
          pg.all_reduce(out.data(), in.data(), count, t, op);
          expect_values(out, want, ctx);
          EXPECT_TRUE(in.same_bytes(original)) << ctx << ": input changed";
        }
        expect_traffic(pg, "all_reduce", sent, recv, ctx);
      }

      // Float data of mixed magnitudes: bitwise equal to the algorithm's documented order.
      if (!is_float(t)) continue;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        const std::string ctx = where(pg, "bitwise all_reduce " + std::string(reduce_op_name(op)), t, count);
        Buffer buf(t, count);
        for (int64_t i = 0; i < count; ++i) buf.set(i, float_value(me, i));
        pg.all_reduce(buf.data(), count, t, op);
        bool reported = false;
        std::vector<double> x(static_cast<size_t>(n));
        unsigned char want[8];
        for (int k = 0, i = 0; k < n; ++k) {
          const std::vector<int> order = order_for(pg.algo(), n, k);
          for (int64_t e = 0; e < chunks[size_t(k)]; ++e, ++i) {
            for (int r = 0; r < n; ++r) x[size_t(r)] = stored(t, float_value(r, i));
            reference_float(want, t, x, order, op, pg.algo() == ReduceAlgo::ring);
            expect_bits(buf, i, want, ctx, &reported);
          }
        }
      }
    }
  }
}

// ---- reduce_scatter -------------------------------------------------------------------------

void check_reduce_scatter(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  std::vector<std::vector<int64_t>> layouts;
  for (int64_t c : {int64_t(1), int64_t(5), int64_t(129), int64_t(16411)})
    layouts.push_back(std::vector<int64_t>(size_t(n), c));
  std::vector<int64_t> uneven;
  for (int j = 0; j < n; ++j) uneven.push_back((j * 3) % 4 + (j == 1 ? 20000 : 0));
  layouts.push_back(uneven);

  for (DType t : kReduceTypes) {
    for (const std::vector<int64_t>& counts : layouts) {
      if (total_of(counts) > 2000 && t != DType::f32 && t != DType::i32 && t != DType::bf16) continue;
      const int64_t elem = int64_t(dtype_size(t)), total = total_of(counts), mine = counts[size_t(me)];
      const int64_t my_off = offset_of(counts, me);
      const bool equal = counts == std::vector<int64_t>(size_t(n), counts[0]);
      const int64_t sent = (total - mine) * elem;
      const int64_t recv = pg.algo() == ReduceAlgo::ring ? (total - counts[size_t((me + n - 1) % n)]) * elem
                                                          : (n - 1) * mine * elem;
      if (equal) {
        EXPECT_EQ(sent, (n - 1) * (n * counts[0] * elem) / n) << "textbook reduce-scatter volume";
      }

      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const bool in_place = op == ReduceOp::sum;
        const std::string ctx = where(pg, std::string(equal ? "reduce_scatter " : "reduce_scatter_v ") +
                                              std::string(reduce_op_name(op)) + (in_place ? " in place" : ""),
                                      t, total);
        Buffer in(t, total), out(t, mine);
        for (int64_t i = 0; i < total; ++i) in.set(i, int_value(t, me, i));
        std::vector<double> want(static_cast<size_t>(mine)), vals(static_cast<size_t>(n));
        for (int64_t i = 0; i < mine; ++i) {
          for (int r = 0; r < n; ++r) vals[size_t(r)] = int_value(t, r, my_off + i);
          want[size_t(i)] = expected_int_reduce(t, op, n, vals);
        }
        void* dst = in_place ? in.at(my_off) : out.data();
        if (equal)
          pg.reduce_scatter(dst, in.data(), counts[0], t, op);
        else
          pg.reduce_scatter_v(dst, in.data(), counts, t, op);
        Buffer result(t, mine);
        if (mine > 0) std::memcpy(result.data(), dst, size_t(mine * elem));
        expect_values(result, want, ctx);
        expect_traffic(pg, "reduce_scatter", sent, recv, ctx);
      }

      if (!is_float(t)) continue;
      const std::string ctx = where(pg, "bitwise reduce_scatter sum", t, total);
      Buffer in(t, total), out(t, mine);
      for (int64_t i = 0; i < total; ++i) in.set(i, float_value(me, i));
      pg.reduce_scatter_v(out.data(), in.data(), counts, t, ReduceOp::sum);
      const std::vector<int> order = order_for(pg.algo(), n, me);
      bool reported = false;
      std::vector<double> x(static_cast<size_t>(n));
      unsigned char want[8];
      for (int64_t i = 0; i < mine; ++i) {
        for (int r = 0; r < n; ++r) x[size_t(r)] = stored(t, float_value(r, my_off + i));
        reference_float(want, t, x, order, ReduceOp::sum, pg.algo() == ReduceAlgo::ring);
        expect_bits(out, i, want, ctx, &reported);
      }
    }
  }
}

// ---- all_gather -----------------------------------------------------------------------------

void check_all_gather(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  std::vector<std::vector<int64_t>> layouts;
  for (int64_t c : {int64_t(1), int64_t(5), int64_t(129), int64_t(16411)})
    layouts.push_back(std::vector<int64_t>(size_t(n), c));
  std::vector<int64_t> uneven;
  for (int j = 0; j < n; ++j) uneven.push_back((j * 3) % 4 + (j == n - 1 ? 20000 : 0));
  layouts.push_back(uneven);

  for (DType t : kMoveTypes) {
    for (const std::vector<int64_t>& counts : layouts) {
      if (total_of(counts) > 2000 && t != DType::f32 && t != DType::u8) continue;
      const int64_t elem = int64_t(dtype_size(t)), total = total_of(counts), mine = counts[size_t(me)];
      const bool equal = counts == std::vector<int64_t>(size_t(n), counts[0]);
      const int64_t sent = pg.algo() == ReduceAlgo::ring ? (total - counts[size_t((me + 1) % n)]) * elem
                                                          : (n - 1) * mine * elem;
      const int64_t recv = (total - mine) * elem;
      if (equal) {
        EXPECT_EQ(sent, (n - 1) * (n * counts[0] * elem) / n) << "textbook all-gather volume";
      }
      std::vector<double> want;
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < counts[size_t(r)]; ++i) want.push_back(int_value(t, r, i));

      for (bool in_place : {false, true}) {
        const std::string ctx =
            where(pg, std::string(equal ? "all_gather" : "all_gather_v") + (in_place ? " in place" : ""), t, total);
        Buffer out(t, total), in(t, mine);
        for (int64_t i = 0; i < mine; ++i) in.set(i, int_value(t, me, i));
        const void* src = in.data();
        if (in_place) {
          if (mine > 0) std::memcpy(out.at(offset_of(counts, me)), in.data(), size_t(mine * elem));
          src = out.at(offset_of(counts, me));
        }
        if (equal)
          pg.all_gather(out.data(), src, counts[0], t);
        else
          pg.all_gather_v(out.data(), src, counts, t);
        expect_values(out, want, ctx);
        expect_traffic(pg, "all_gather", sent, recv, ctx);
      }
    }
  }
}

// ---- broadcast ------------------------------------------------------------------------------

void check_broadcast(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType t : {DType::f32, DType::f16, DType::i64}) {
    for (int64_t count : {int64_t(7), int64_t(1001), int64_t(20011)}) {
      const int64_t S = count * int64_t(dtype_size(t));
      for (int root = 0; root < n; ++root) {
        const std::string ctx = where(pg, "broadcast from " + std::to_string(root), t, count);
        Buffer buf(t, count);
        std::vector<double> want(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) {
          want[size_t(i)] = int_value(t, root, i);
          buf.set(i, me == root ? want[size_t(i)] : int_value(t, me, i + 1));
        }
        BroadcastOptions o{.root = root};
        pg.broadcast(buf.data(), count, t, o);
        expect_values(buf, want, ctx);
        const int pos = (me - root + n) % n;  // place in the chain root -> root+1 -> ...
        expect_traffic(pg, "broadcast", pos < n - 1 ? S : 0, pos > 0 ? S : 0, ctx);
      }
    }
  }
}

// ---- send / recv ----------------------------------------------------------------------------

void check_send_recv(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  if (n < 2) return;
  const int to = (me + 1) % n, from = (me + n - 1) % n;
  for (DType t : {DType::f32, DType::i64, DType::bf16}) {
    const int64_t count = t == DType::f32 ? 33 : 5, S = count * int64_t(dtype_size(t));
    const std::string ctx = where(pg, "send/recv ring shift", t, count);
    // Three messages to the right: tag 1, tag 2, tag 1 again. The receiver takes tag 2 first,
    // then the two tag-1 messages in the order they were sent.
    std::vector<Buffer> out;
    out.reserve(3);  // no reallocation: see check_barrier_and_async
    for (int m = 0; m < 3; ++m) {
      out.emplace_back(t, count);
      for (int64_t i = 0; i < count; ++i) out.back().set(i, int_value(t, me, i + 10 * m));
    }
    SendOptions s1, s2;
    s1.tag = 1;
    s2.tag = 2;
    s1.async_op = s2.async_op = true;
    auto w0 = pg.send(out[0].data(), count, t, to, s1);
    auto w1 = pg.send(out[1].data(), count, t, to, s2);
    auto w2 = pg.send(out[2].data(), count, t, to, s1);
    Buffer got(t, count);
    RecvOptions r1, r2;
    r1.tag = 1;
    r2.tag = 2;
    for (int m : {1, 0, 2}) {
      pg.recv(got.data(), count, t, from, m == 1 ? r2 : r1);
      std::vector<double> want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) want[size_t(i)] = int_value(t, from, i + 10 * m);
      expect_values(got, want, ctx + " message " + std::to_string(m));
      expect_traffic(pg, "recv", 0, S, ctx);
    }
    for (auto& w : {w0, w1, w2}) {
      w->wait();
      EXPECT_TRUE(w->is_completed());
    }
    pg.barrier();  // the next dtype's messages must not overtake these
  }
}

// ---- all_to_all -----------------------------------------------------------------------------

void check_all_to_all(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  // Value rank `from` sends to rank `to` at position i of that block.
  auto value = [](DType t, int from, int to, int64_t i) { return int_value(t, from * 3 + to, i); };
  for (DType t : {DType::f32, DType::bf16, DType::i32, DType::u8}) {
    const int64_t elem = int64_t(dtype_size(t));
    for (int64_t c : {int64_t(1), int64_t(3)}) {
      for (bool in_place : {false, true}) {
        const std::string ctx = where(pg, std::string("all_to_all") + (in_place ? " in place" : ""), t, c);
        Buffer in(t, n * c), out(t, n * c);
        for (int j = 0; j < n; ++j)
          for (int64_t i = 0; i < c; ++i) in.set(j * c + i, value(t, me, j, i));
        std::vector<double> want;
        for (int j = 0; j < n; ++j)
          for (int64_t i = 0; i < c; ++i) want.push_back(value(t, j, me, i));
        if (in_place) {
          pg.all_to_all(in.data(), in.data(), c, t);
          expect_values(in, want, ctx);
        } else {
          pg.all_to_all(out.data(), in.data(), c, t);
          expect_values(out, want, ctx);
        }
        expect_traffic(pg, "all_to_all", (n - 1) * c * elem, (n - 1) * c * elem, ctx);
      }
    }
    // Uneven: rank a sends (a + b) % 3 elements to rank b.
    std::vector<int64_t> send_counts, recv_counts;
    for (int j = 0; j < n; ++j) {
      send_counts.push_back((me + j) % 3);
      recv_counts.push_back((j + me) % 3);
    }
    Buffer in(t, total_of(send_counts)), out(t, total_of(recv_counts));
    for (int j = 0; j < n; ++j)
      for (int64_t i = 0; i < send_counts[size_t(j)]; ++i) in.set(offset_of(send_counts, j) + i, value(t, me, j, i));
    std::vector<double> want;
    for (int j = 0; j < n; ++j)
      for (int64_t i = 0; i < recv_counts[size_t(j)]; ++i) want.push_back(value(t, j, me, i));
    pg.all_to_all_v(out.data(), recv_counts, in.data(), send_counts, t);
    const std::string ctx = where(pg, "all_to_all_v", t, total_of(send_counts));
    expect_values(out, want, ctx);
    expect_traffic(pg, "all_to_all", (total_of(send_counts) - send_counts[size_t(me)]) * elem,
                   (total_of(recv_counts) - recv_counts[size_t(me)]) * elem, ctx);
  }
}

// ---- barrier, async -------------------------------------------------------------------------

void check_barrier_and_async(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  pg.barrier();
  expect_traffic(pg, "barrier", 0, 0, where(pg, "barrier", DType::f32, 0));

  // Several async operations in flight at once, waited in reverse order.
  const int64_t count = 257;
  std::vector<Buffer> bufs;
  bufs.reserve(4);  // no reallocation: a Buffer's copy is a private snapshot on the heap
  for (int k = 0; k < 4; ++k) {
    bufs.emplace_back(DType::i64, count);
    for (int64_t i = 0; i < count; ++i) bufs.back().set(i, int_value(DType::i64, me, i + k));
  }
  std::vector<std::shared_ptr<Work>> works;
  AllReduceOptions ao{.async_op = true, .label = "async bucket"};
  for (int k = 0; k < 4; ++k) works.push_back(pg.all_reduce(bufs[size_t(k)].data(), count, DType::i64, ReduceOp::sum, ao));
  for (int k = 3; k >= 0; --k) {
    works[size_t(k)]->wait();
    EXPECT_TRUE(works[size_t(k)]->is_completed());
    std::vector<double> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += int_value(DType::i64, r, i + k);
      want[size_t(i)] = s;
    }
    expect_values(bufs[size_t(k)], want, where(pg, "async all_reduce " + std::to_string(k), DType::i64, count));
  }

  // Stream order: an async broadcast followed by a synchronous all_reduce of the same buffer
  // reduces the broadcast values.
  Buffer b(DType::i32, 9);
  for (int64_t i = 0; i < 9; ++i) b.set(i, me == 0 ? double(i) : -100.0);
  BroadcastOptions bo{.async_op = true};
  auto w = pg.broadcast(b.data(), 9, DType::i32, bo);
  pg.all_reduce(b.data(), 9, DType::i32, ReduceOp::sum);
  w->wait();
  std::vector<double> want;
  for (int64_t i = 0; i < 9; ++i) want.push_back(double(i) * n);
  expect_values(b, want, where(pg, "async broadcast then all_reduce", DType::i32, 9));
}

// ---- symmetric memory ----------------------------------------------------------------------

void with_symmetric_buffers(ProcessGroup& pg, const std::function<void(ProcessGroup&)>& check) {
  ASSERT_EQ(t_symmetric_group, nullptr);
  t_symmetric_group = &pg;
  check(pg);
  t_symmetric_group = nullptr;
}

void with_backend_buffers(ProcessGroup& pg, const std::function<void(ProcessGroup&)>& check) {
  ASSERT_EQ(t_backend, nullptr);
  t_backend = &ops::compute_backend();
  check(pg);
  t_backend = nullptr;
}

namespace {

// all_reduce(sum) of `count` small integers in place in `buf`, checked exactly.
void all_reduce_symmetric(ProcessGroup& pg, void* buf, int64_t count, const std::string& ctx) {
  const int n = pg.size(), me = pg.rank();
  auto* x = static_cast<int32_t*>(buf);
  for (int64_t i = 0; i < count; ++i) x[i] = int32_t(int_value(DType::i32, me, i));
  pg.all_reduce(buf, count, DType::i32, ReduceOp::sum);
  for (int64_t i = 0; i < count; ++i) {
    int32_t want = 0;
    for (int r = 0; r < n; ++r) want += int32_t(int_value(DType::i32, r, i));
    if (x[i] != want) {
      ADD_FAILURE() << ctx << ": element " << i << " is " << x[i] << ", expected " << want;
      return;
    }
  }
}

}  // namespace

void check_symmetric_allocation(ProcessGroup& pg) {
  const int me = pg.rank();
  const std::string ctx = where(pg, "allocate_symmetric", DType::i32, 0);
  // Sizes may differ by member (uneven shards); every block is 64-byte aligned, even empty ones.
  std::shared_ptr<void> uneven = pg.allocate_symmetric(30000 + 4000 * me);
  std::shared_ptr<void> empty = pg.allocate_symmetric(0);
  ASSERT_NE(uneven, nullptr) << ctx;
  ASSERT_NE(empty, nullptr) << ctx;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(uneven.get()) % 64, 0u) << ctx << ": alignment";
  std::memset(uneven.get(), 0x5A, size_t(30000 + 4000 * me));  // the whole block is this member's

  // Rank 0 keeps a block the others drop: the next allocation must not hand it out again.
  const int64_t count = 40000;  // 160 KB: MPI's node-local path
  std::shared_ptr<void> kept = pg.allocate_symmetric(count * 4);
  std::memset(kept.get(), 0x33, size_t(count * 4));
  std::shared_ptr<void> held = me == 0 ? kept : nullptr;
  void* const was_kept = kept.get();
  kept.reset();
  std::shared_ptr<void> fresh = pg.allocate_symmetric(count * 4);
  if (me == 0) {
    EXPECT_NE(fresh.get(), held.get()) << ctx << ": a block still held was handed out again";
  }
  all_reduce_symmetric(pg, fresh.get(), count, ctx + ", fresh block");
  if (me == 0) {
    const auto* h = static_cast<const unsigned char*>(held.get());
    for (int64_t i = 0; i < count * 4; ++i)
      if (h[i] != 0x33) {
        ADD_FAILURE() << ctx << ": the block rank 0 held changed at byte " << i;
        break;
      }
  }

  // Dropped by everyone: recycled (MPI keeps one of the two dropped windows and frees the other).
  void* const was_fresh = fresh.get();
  held.reset();
  fresh.reset();
  std::shared_ptr<void> again = pg.allocate_symmetric(count * 4);
  if (pg.backend() == "mpi" && pg.size() > 1) {
    EXPECT_TRUE(again.get() == was_kept || again.get() == was_fresh) << ctx << ": no dropped block was recycled";
  }
  all_reduce_symmetric(pg, again.get(), count, ctx + ", recycled block");
}

}  // namespace llama4d::test
