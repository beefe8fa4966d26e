// Attention on the GPU against the CPU backend (backends/cuda/attention.cu vs
// backends/cpu/attention.cpp), in float and double: the forward (out, lse), the backward (dq, dk,
// dv accumulated onto non-zero buffers), and attention_merge. Shapes cover grouped-query heads
// (nh = 4 over nkv = 2 and 1), odd sizes (hd = 10, 33, 100; Tq != Tk), context-parallel position
// offsets with rows that see no key, a KV cache's batch stride, packed and scattered document ids
// (device and host memory), head_dim up to the kernels' 256, the merge of two key blocks (ring
// attention's step) and the same bits when the GPU repeats a call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

using ops::AttentionShape;
using test::DeviceBuffer;
using test::OnGpu;

// How many query rows of a case see no key at all (lse = -inf), checked on the CPU's result so
// each case is known to exercise what it claims.
enum class Empty { kNone, kSome, kAll, kAny };

struct Case {
  const char* name;
  int64_t B, Tq, Tk, nh, nkv, hd;
  int64_t q_start = 0, k_start = 0, kv_batch_stride = 0;
  // Document ids by absolute position p of batch item b: 0 = none; > 0: packed runs of `docs`
  // positions, id (p + 3 b) / docs; < 0: ids scattered over -docs values.
  int docs = 0;
  Empty empty = Empty::kNone;
};

const Case kCases[] = {
    {.name = "odd_gqa", .B = 2, .Tq = 7, .Tk = 7, .nh = 4, .nkv = 2, .hd = 10},
    {.name = "one_kv_head", .B = 1, .Tq = 33, .Tk = 33, .nh = 4, .nkv = 1, .hd = 64},
    {.name = "multi_head_hd33", .B = 2, .Tq = 11, .Tk = 11, .nh = 3, .nkv = 3, .hd = 33},
    // Context parallelism: a chunk of queries after the start of the keys (q_start > k_start).
    {.name = "cp_queries_after_keys", .B = 2, .Tq = 5, .Tk = 9, .nh = 6, .nkv = 3, .hd = 16, .q_start = 4},
    {.name = "cp_hd100", .B = 1, .Tq = 12, .Tk = 20, .nh = 4, .nkv = 4, .hd = 100, .q_start = 8},
    // Keys at positions 7..11, queries at 4..9: rows 0..2 see no key, rows 3..5 see 1..3.
    {.name = "cp_some_rows_see_nothing", .B = 2, .Tq = 6, .Tk = 5, .nh = 4, .nkv = 2, .hd = 12, .q_start = 4,
     .k_start = 7, .empty = Empty::kSome},
    // A ring step whose keys all lie after the queries: no row sees anything.
    {.name = "cp_keys_all_later", .B = 1, .Tq = 4, .Tk = 4, .nh = 4, .nkv = 2, .hd = 8, .k_start = 4,
     .empty = Empty::kAll},
    // Decoding: one query at the end of 5 keys in a cache with room for 9 per batch item.
    {.name = "kv_cache_stride", .B = 2, .Tq = 1, .Tk = 5, .nh = 4, .nkv = 2, .hd = 12, .q_start = 4,
     .kv_batch_stride = 9 * 2 * 12},
    {.name = "packed_documents", .B = 2, .Tq = 40, .Tk = 40, .nh = 4, .nkv = 2, .hd = 24, .docs = 9},
    // Queries at 8..15, keys at 0..7, documents of 6 positions: rows whose document starts after
    // position 7 see no key.
    {.name = "packed_documents_cp", .B = 2, .Tq = 8, .Tk = 8, .nh = 4, .nkv = 2, .hd = 16, .q_start = 8,
     .docs = 6, .empty = Empty::kSome},
    {.name = "scattered_documents_cp", .B = 2, .Tq = 20, .Tk = 30, .nh = 4, .nkv = 2, .hd = 20, .q_start = 25,
     .docs = -4, .empty = Empty::kAny},
    {.name = "head_dim_128", .B = 1, .Tq = 17, .Tk = 17, .nh = 2, .nkv = 1, .hd = 128},
    {.name = "head_dim_256", .B = 1, .Tq = 9, .Tk = 12, .nh = 2, .nkv = 2, .hd = 256, .q_start = 3},
};

int32_t document_at(int docs, int64_t b, int64_t p) {
  if (docs > 0) return int32_t((p + 3 * b) / docs);
  const uint64_t x = (uint64_t(b) * 1000003u + uint64_t(p)) * 0x9E3779B97F4A7C15ull;
  return int32_t((x >> 33) % uint64_t(-docs));
}

int64_t kv_stride(const AttentionShape& s) {
  return s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd;
}

// Inputs of one case: q [B, Tq, nh, hd], k/v [B, kv_stride] (a cache's unused rows included),
// dout, the gradients' starting values (the backward adds to them) and the document ids.
template <class T>
struct Problem {
  AttentionShape base;  // without document ids
  std::vector<T> q, k, v, dout, dq0, dk0, dv0;
  std::vector<int32_t> q_doc, k_doc;

  size_t nq() const { return q.size(); }
  size_t nlse() const { return size_t(base.B * base.nh * base.Tq); }
  // The shape with the given id pointers (host or device), or none when the case has no ids.
  AttentionShape shape(const int32_t* qd, const int32_t* kd) const {
    AttentionShape s = base;
    if (!q_doc.empty()) s.q_doc = qd, s.k_doc = kd;
    return s;
  }
  AttentionShape host_shape() const { return shape(q_doc.data(), k_doc.data()); }
};

template <class T>
Problem<T> make_problem(const Case& c, uint64_t seed) {
  Problem<T> p;
  AttentionShape& s = p.base;
  s.B = c.B, s.Tq = c.Tq, s.Tk = c.Tk, s.nh = c.nh, s.nkv = c.nkv, s.hd = c.hd;
  s.q_start = c.q_start, s.k_start = c.k_start, s.kv_batch_stride = c.kv_batch_stride;
  const size_t nq = size_t(c.B * c.Tq * c.nh * c.hd), nkv = size_t(c.B * kv_stride(s));
  // q and k in [-2, 2]: scores of a few units, so softmax rows are far from uniform.
  p.q = test::random_values<T>(nq, seed, -2, 2);
  p.k = test::random_values<T>(nkv, seed + 1, -2, 2);
  p.v = test::random_values<T>(nkv, seed + 2);
  p.dout = test::random_values<T>(nq, seed + 3);
  p.dq0 = test::random_values<T>(nq, seed + 4);
  p.dk0 = test::random_values<T>(nkv, seed + 5);
  p.dv0 = test::random_values<T>(nkv, seed + 6);
  if (c.docs != 0)
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t i = 0; i < c.Tq; ++i) p.q_doc.push_back(document_at(c.docs, b, c.q_start + i));
      for (int64_t j = 0; j < c.Tk; ++j) p.k_doc.push_back(document_at(c.docs, b, c.k_start + j));
    }
  return p;
}

template <class T>
bool is_neg_inf(T x) {
  return std::isinf(x) && x < 0;
}

// lse [B, nh, Tq]: -inf exactly where the CPU has -inf (rows that see no key), elsewhere within
// kGpuTolerance relative to max(1, |lse|).
template <class T>
void expect_lse_close(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    const bool ok = is_neg_inf(want[r])
                        ? is_neg_inf(got[r])
                        : std::abs(double(got[r]) - double(want[r])) <=
                              test::kGpuTolerance<T> * std::max(1.0, std::abs(double(want[r])));
    if (!ok) {
      ADD_FAILURE() << what << ": row " << r << " is " << got[r] << ", the CPU backend gives " << want[r];
      return;
    }
  }
}

template <class T>
int64_t count_empty_rows(const std::vector<T>& lse) {
  return std::count_if(lse.begin(), lse.end(), [](T x) { return is_neg_inf(x); });
}

// out, lse, dq, dk, dv of one forward and backward.
template <class T>
struct Result {
  std::vector<T> out, lse, dq, dk, dv;
};

template <class T>
Result<T> run_on_cpu(const Problem<T>& p) {
  const AttentionShape s = p.host_shape();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Result<T> r{std::vector<T>(p.nq(), nan), std::vector<T>(p.nlse(), nan), p.dq0, p.dk0, p.dv0};
  ops::attention_forward(r.out.data(), r.lse.data(), p.q.data(), p.k.data(), p.v.data(), s);
  ops::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), p.q.data(), p.k.data(), p.v.data(),
                          r.out.data(), r.lse.data(), s);
  return r;
}

// The same on the GPU (call with the CUDA backend active); document ids in device memory, or in
// host memory when host_ids (core/ops.h allows both).
template <class T>
Result<T> run_on_gpu(const Problem<T>& p, bool host_ids = false) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // Outputs start as NaN: a row the forward left unwritten would show.
  DeviceBuffer<T> q(p.q), k(p.k), v(p.v), dout(p.dout), out(std::vector<T>(p.nq(), nan)),
      lse(std::vector<T>(p.nlse(), nan)), dq(p.dq0), dk(p.dk0), dv(p.dv0);
  DeviceBuffer<int32_t> q_doc(p.q_doc), k_doc(p.k_doc);
  const AttentionShape s = host_ids ? p.host_shape() : p.shape(q_doc.data(), k_doc.data());
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                          lse.data(), s);
  return {out.host(), lse.host(), dq.host(), dk.host(), dv.host()};
}

template <class T>
void expect_matches_cpu(const Case& c) {
  SCOPED_TRACE(c.name);
  const Problem<T> p = make_problem<T>(c, 100);
  const Result<T> want = run_on_cpu(p);
  const int64_t empty = count_empty_rows(want.lse), rows = int64_t(p.nlse());
  switch (c.empty) {
    case Empty::kNone: EXPECT_EQ(empty, 0); break;
    case Empty::kSome:
      EXPECT_GT(empty, 0);
      EXPECT_LT(empty, rows);
      break;
    case Empty::kAll: EXPECT_EQ(empty, rows); break;
    case Empty::kAny: break;
  }
  Result<T> got, got_host_ids;
  {
    OnGpu gpu;
    got = run_on_gpu(p);
    if (!p.q_doc.empty()) got_host_ids = run_on_gpu(p, /*host_ids=*/true);
  }
  test::expect_close(got.out, want.out, "out");
  expect_lse_close(got.lse, want.lse, "lse");
  test::expect_close(got.dq, want.dq, "dq");
  test::expect_close(got.dk, want.dk, "dk");  // a cache's unused rows included: left as they were
  test::expect_close(got.dv, want.dv, "dv");
  if (c.empty == Empty::kAll) {  // nothing is visible: the gradients keep their bits
    test::expect_bitwise(got.dq, p.dq0, "dq with no visible key");
    test::expect_bitwise(got.dk, p.dk0, "dk with no visible key");
    test::expect_bitwise(got.dv, p.dv0, "dv with no visible key");
  }
  if (!p.q_doc.empty()) {  // ids from host memory: the same kernels, the same bits
    test::expect_bitwise(got_host_ids.out, got.out, "out with host document ids");
    test::expect_bitwise(got_host_ids.lse, got.lse, "lse with host document ids");
    test::expect_bitwise(got_host_ids.dq, got.dq, "dq with host document ids");
    test::expect_bitwise(got_host_ids.dk, got.dk, "dk with host document ids");
    test::expect_bitwise(got_host_ids.dv, got.dv, "dv with host document ids");
  }
}

TEST(CudaAttention, ForwardAndBackwardMatchTheCpuFloat) {
  LLAMA4D_REQUIRE_GPU();
  for (const Case& c : kCases) expect_matches_cpu<float>(c);
}

TEST(CudaAttention, ForwardAndBackwardMatchTheCpuDouble) {
  LLAMA4D_REQUIRE_GPU();
  for (const Case& c : kCases) expect_matches_cpu<double>(c);
}

// The GPU repeats forward, backward and merge bit for bit (no atomics, fixed summation orders).
template <class T>
void expect_repeatable() {
  const Case c{.name = "repeat", .B = 2, .Tq = 70, .Tk = 90, .nh = 6, .nkv = 2, .hd = 40, .q_start = 20,
               .docs = 23, .empty = Empty::kAny};
  const Problem<T> p = make_problem<T>(c, 200);
  OnGpu gpu;
  const Result<T> first = run_on_gpu(p), second = run_on_gpu(p);
  test::expect_bitwise(second.out, first.out, "repeated out");
  test::expect_bitwise(second.lse, first.lse, "repeated lse");
  test::expect_bitwise(second.dq, first.dq, "repeated dq");
  test::expect_bitwise(second.dk, first.dk, "repeated dk");
  test::expect_bitwise(second.dv, first.dv, "repeated dv");
  // Merge the result with itself shifted by one lse unit, twice.
  std::vector<T> part_lse = first.lse;
  for (T& x : part_lse) x += T(1);
  std::vector<std::vector<T>> merged;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<T> out(first.out), lse(first.lse), part(first.out), plse(part_lse);
    ops::attention_merge(out.data(), lse.data(), part.data(), plse.data(), c.B, c.Tq, c.nh, c.hd);
    merged.push_back(out.host());
    merged.push_back(lse.host());
  }
  test::expect_bitwise(merged[2], merged[0], "repeated merge out");
  test::expect_bitwise(merged[3], merged[1], "repeated merge lse");
}

TEST(CudaAttention, RepeatsBitForBitFloat) {
  LLAMA4D_REQUIRE_GPU();
  expect_repeatable<float>();
}

TEST(CudaAttention, RepeatsBitForBitDouble) {
  LLAMA4D_REQUIRE_GPU();
  expect_repeatable<double>();
}

// The hd outputs of row (b, i, h) of out [B, Tq, nh, hd], given its lse index (b * nh + h) * Tq + i.
template <class T>
std::vector<T> out_row(const std::vector<T>& out, int64_t l, int64_t Tq, int64_t nh, int64_t hd) {
  const int64_t i = l % Tq, h = (l / Tq) % nh, b = l / (Tq * nh);
  const auto row = out.begin() + ((b * Tq + i) * nh + h) * hd;
  return std::vector<T>(row, row + hd);
}

// Ring attention's step: attention over keys [0, 10) and over keys [10, 16), merged in either
// order, is attention over all 16 keys (and the CPU's merge of the CPU's parts). Queries sit at
// positions 6..15, so rows 6..9 see nothing of the second block; with documents (positions
// 0-4, 5-11, 12-15 in batch item 0 and 0-9, 10-15 in item 1) rows whose document starts at 10 or
// later see nothing of the first block. A row one side never saw is the other side's row, bit
// for bit.
template <class T>
void expect_merge_of_key_blocks(bool with_documents) {
  SCOPED_TRACE(with_documents ? "with documents" : "causal only");
  const Case c{.name = "merge", .B = 2, .Tq = 10, .Tk = 16, .nh = 4, .nkv = 2, .hd = 12, .q_start = 6};
  Problem<T> p = make_problem<T>(c, 300);
  const AttentionShape& s = p.base;
  if (with_documents) {
    auto id = [](int64_t b, int64_t pos) {
      return int32_t(b == 0 ? (pos < 5 ? 0 : pos < 12 ? 1 : 2) : (pos < 10 ? 3 : 4));
    };
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t i = 0; i < s.Tq; ++i) p.q_doc.push_back(id(b, s.q_start + i));
      for (int64_t j = 0; j < s.Tk; ++j) p.k_doc.push_back(id(b, s.k_start + j));
    }
  }
  const int64_t split = 10, nlse = int64_t(p.nlse());
  // Keys [lo, hi) read in place at their true positions (kv_batch_stride keeps the batch items
  // apart); document ids have no stride, so the block's are copied out.
  struct Block {
    AttentionShape shape;  // without ids
    int64_t offset;        // of the block's first key in k and v
    std::vector<int32_t> k_doc;
  };
  auto block = [&](int64_t lo, int64_t hi) {
    Block blk{s, lo * s.nkv * s.hd, {}};
    blk.shape.Tk = hi - lo, blk.shape.k_start = s.k_start + lo, blk.shape.kv_batch_stride = kv_stride(s);
    for (int64_t b = 0; b < s.B && with_documents; ++b)
      blk.k_doc.insert(blk.k_doc.end(), p.k_doc.begin() + b * s.Tk + lo, p.k_doc.begin() + b * s.Tk + hi);
    return blk;
  };
  const Block blocks[2] = {block(0, split), block(split, s.Tk)};
  auto with_ids = [&](AttentionShape shape, const int32_t* qd, const int32_t* kd) {
    if (with_documents) shape.q_doc = qd, shape.k_doc = kd;
    return shape;
  };

  // CPU: attention over all keys, and each block's part.
  const size_t nq = p.nq();
  std::vector<T> want(nq), want_lse(nlse);
  ops::attention_forward(want.data(), want_lse.data(), p.q.data(), p.k.data(), p.v.data(), p.host_shape());
  std::vector<T> cpu_out[2], cpu_lse[2];
  for (int x = 0; x < 2; ++x) {
    cpu_out[x].resize(nq), cpu_lse[x].resize(size_t(nlse));
    ops::attention_forward(cpu_out[x].data(), cpu_lse[x].data(), p.q.data(), p.k.data() + blocks[x].offset,
                           p.v.data() + blocks[x].offset,
                           with_ids(blocks[x].shape, p.q_doc.data(), blocks[x].k_doc.data()));
  }

  std::vector<T> gpu_out[2], gpu_lse[2], merged[2], merged_lse[2];
  {
    OnGpu gpu;
    DeviceBuffer<T> q(p.q), k(p.k), v(p.v);
    DeviceBuffer<int32_t> q_doc(p.q_doc);
    for (int x = 0; x < 2; ++x) {
      DeviceBuffer<int32_t> k_doc(blocks[x].k_doc);
      DeviceBuffer<T> out{int64_t(nq)}, lse{nlse};
      ops::attention_forward(out.data(), lse.data(), q.data(), k.data() + blocks[x].offset,
                             v.data() + blocks[x].offset, with_ids(blocks[x].shape, q_doc.data(), k_doc.data()));
      gpu_out[x] = out.host(), gpu_lse[x] = lse.host();
    }
    for (int first = 0; first < 2; ++first) {  // merge the other block into `first`
      DeviceBuffer<T> out(gpu_out[first]), lse(gpu_lse[first]), part(gpu_out[1 - first]), plse(gpu_lse[1 - first]);
      ops::attention_merge(out.data(), lse.data(), part.data(), plse.data(), s.B, s.Tq, s.nh, s.hd);
      merged[first] = out.host(), merged_lse[first] = lse.host();
    }
  }

  for (int x = 0; x < 2; ++x) {
    test::expect_close(gpu_out[x], cpu_out[x], "block " + std::to_string(x) + " out");
    expect_lse_close(gpu_lse[x], cpu_lse[x], "block " + std::to_string(x) + " lse");
  }
  int64_t only_first = 0, only_second = 0;
  for (int first = 0; first < 2; ++first) {
    SCOPED_TRACE(first == 0 ? "second block merged into the first" : "first block merged into the second");
    test::expect_close(merged[first], want, "merged out vs attention over all keys");
    expect_lse_close(merged_lse[first], want_lse, "merged lse vs attention over all keys");
    std::vector<T> cpu_merged = cpu_out[first], cpu_merged_lse = cpu_lse[first];
    ops::attention_merge(cpu_merged.data(), cpu_merged_lse.data(), cpu_out[1 - first].data(),
                         cpu_lse[1 - first].data(), s.B, s.Tq, s.nh, s.hd);
    test::expect_close(merged[first], cpu_merged, "merged out vs the CPU's merge");
    expect_lse_close(merged_lse[first], cpu_merged_lse, "merged lse vs the CPU's merge");
    for (int64_t l = 0; l < nlse; ++l) {
      const bool empty0 = is_neg_inf(gpu_lse[0][l]), empty1 = is_neg_inf(gpu_lse[1][l]);
      ASSERT_FALSE(empty0 && empty1) << "row " << l << ": every query sees its own position";
      if (!empty0 && !empty1) continue;
      const int seen = empty0 ? 1 : 0;
      test::expect_bitwise(out_row(merged[first], l, s.Tq, s.nh, s.hd), out_row(gpu_out[seen], l, s.Tq, s.nh, s.hd),
                           "row " + std::to_string(l) + " seen by one block only");
      test::expect_bitwise(std::vector<T>{merged_lse[first][l]}, std::vector<T>{gpu_lse[seen][l]},
                           "lse of row " + std::to_string(l) + " seen by one block only");
      ++(seen == 0 ? only_first : only_second);
    }
  }
  EXPECT_GT(only_first, 0);                       // rows 6..9, causally
  if (with_documents) {
    EXPECT_GT(only_second, 0);  // rows whose document starts at 10 or later
  }
}

TEST(CudaAttention, MergeOfKeyBlocksIsAttentionOverAllKeysFloat) {
  LLAMA4D_REQUIRE_GPU();
  expect_merge_of_key_blocks<float>(false);
  expect_merge_of_key_blocks<float>(true);
}

TEST(CudaAttention, MergeOfKeyBlocksIsAttentionOverAllKeysDouble) {
  LLAMA4D_REQUIRE_GPU();
  expect_merge_of_key_blocks<double>(false);
  expect_merge_of_key_blocks<double>(true);
}

// attention_merge on random partial rows, some with lse = -inf on one side or both (out = 0
// there, as the forward leaves such a row), against the CPU's merge; rows with an empty side are
// the CPU's bits (a kept or copied row).
template <class T>
void expect_merge_matches_cpu(int64_t B, int64_t Tq, int64_t nh, int64_t hd) {
  SCOPED_TRACE("hd " + std::to_string(hd));
  const int64_t rows = B * Tq * nh;
  std::vector<T> out = test::random_values<T>(size_t(rows * hd), 400);
  std::vector<T> part = test::random_values<T>(size_t(rows * hd), 401);
  std::vector<T> lse = test::random_values<T>(size_t(rows), 402, -5, 5);
  std::vector<T> part_lse = test::random_values<T>(size_t(rows), 403, -5, 5);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t l = 0; l < rows; ++l) {
    const int64_t i = l % Tq, h = (l / Tq) % nh, b = l / (Tq * nh);
    const int64_t at = ((b * Tq + i) * nh + h) * hd;
    if (l % 4 == 1 || l % 4 == 3) lse[l] = neg_inf, std::fill_n(out.begin() + at, hd, T(0));        // out empty
    if (l % 4 == 2 || l % 4 == 3) part_lse[l] = neg_inf, std::fill_n(part.begin() + at, hd, T(0));  // part empty
  }
  std::vector<T> want = out, want_lse = lse;
  ops::attention_merge(want.data(), want_lse.data(), part.data(), part_lse.data(), B, Tq, nh, hd);
  std::vector<T> got, got_lse;
  {
    OnGpu gpu;
    DeviceBuffer<T> o(out), l(lse), p(part), pl(part_lse);
    ops::attention_merge(o.data(), l.data(), p.data(), pl.data(), B, Tq, nh, hd);
    got = o.host(), got_lse = l.host();
  }
  test::expect_close(got, want, "merged out");
  expect_lse_close(got_lse, want_lse, "merged lse");
  for (int64_t l = 0; l < rows; ++l) {
    if (!is_neg_inf(lse[l]) && !is_neg_inf(part_lse[l])) continue;
    test::expect_bitwise(out_row(got, l, Tq, nh, hd), out_row(want, l, Tq, nh, hd),
                         "row " + std::to_string(l) + " with an empty side");
    test::expect_bitwise(std::vector<T>{got_lse[l]}, std::vector<T>{want_lse[l]},
                         "lse of row " + std::to_string(l) + " with an empty side");
  }
}

TEST(CudaAttention, MergeMatchesTheCpuFloat) {
  LLAMA4D_REQUIRE_GPU();
  expect_merge_matches_cpu<float>(2, 9, 3, 37);
  expect_merge_matches_cpu<float>(1, 5, 2, 5);
}

TEST(CudaAttention, MergeMatchesTheCpuDouble) {
  LLAMA4D_REQUIRE_GPU();
  expect_merge_matches_cpu<double>(2, 9, 3, 37);
  expect_merge_matches_cpu<double>(1, 5, 2, 5);
}

// The forwarder's checks hold on the GPU too; a head_dim past the kernels' 256 is refused with an
// InputError (the CPU backend has no such limit).
TEST(CudaAttention, RefusesBadShapesAndHeadDimsPast256) {
  LLAMA4D_REQUIRE_GPU();
  OnGpu gpu;
  DeviceBuffer<float> x(4096);
  AttentionShape s;
  s.B = 1, s.Tq = 2, s.Tk = 2, s.nh = 3, s.nkv = 2, s.hd = 4;  // 3 query heads over 2 KV heads
  EXPECT_THROW(ops::attention_forward(x.data(), x.data(), x.data(), x.data(), x.data(), s), InputError);
  s.Tq = 1, s.Tk = 1, s.nh = 1, s.nkv = 1, s.hd = 257;
  EXPECT_THROW(ops::attention_forward(x.data(), x.data(), x.data(), x.data(), x.data(), s), InputError);
  EXPECT_THROW(ops::attention_backward(x.data(), x.data(), x.data(), x.data(), x.data(), x.data(), x.data(), x.data(),
                                       x.data(), s),
               InputError);
}

}  // namespace
}  // namespace llama4d
