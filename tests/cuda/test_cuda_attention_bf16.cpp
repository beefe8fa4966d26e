// Attention with bf16 operands (AttentionShape::operands, bf16 mixed precision) on the GPU's
// tensor cores (backends/cuda/attention_bf16.cu): forward and backward against the CPU's fp32
// attention on the same bf16 values, within what summing in another order and carrying
// probabilities and score gradients in two bf16 parts (about 16 significant bits) allow. A query
// row's out, lse and dq, and a key's dk and dv, have the same bits whichever rows share the call
// (what context and data parallelism rely on), and the GPU repeats a call bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {
// Its own names: the binary is built in batches of files (a unity build), beside the fp32 tests.
namespace attention_bf16 {

using ops::AttentionShape;
using ops::GemmOperands;
using test::DeviceBuffer;
using test::OnGpu;
using test::bf16_values;

// Probabilities carried to ~2^-17 and fp32 sums in another order: 1e-4 of the tensor's largest
// value (about 13 units of the probabilities' rounding); the lse within 1e-5 of max(1, |lse|).
constexpr double kOutTolerance = 1e-4, kLseTolerance = 1e-5;

struct Case {
  const char* name;
  int64_t B, Tq, Tk, nh, nkv, hd;
  int64_t q_start = 0, k_start = 0;
  int docs = 0;  // > 0: packed documents of this many positions
};
// head_dim 16..128 in 16s (what the tensor cores take), several 64-row tiles and a partial one,
// grouped-query heads, context-parallel offsets with rows that see nothing, packed documents.
const Case kCases[] = {
    {.name = "tiles_gqa_hd64", .B = 2, .Tq = 150, .Tk = 150, .nh = 4, .nkv = 2, .hd = 64},
    {.name = "hd128_one_kv_head", .B = 1, .Tq = 70, .Tk = 70, .nh = 2, .nkv = 1, .hd = 128},
    {.name = "cp_hd16_queries_after_keys", .B = 2, .Tq = 40, .Tk = 100, .nh = 4, .nkv = 2, .hd = 16, .q_start = 60},
    {.name = "cp_hd48_rows_see_nothing", .B = 1, .Tq = 80, .Tk = 50, .nh = 3, .nkv = 3, .hd = 48, .q_start = 10,
     .k_start = 40},
    {.name = "documents_hd32", .B = 2, .Tq = 130, .Tk = 130, .nh = 4, .nkv = 2, .hd = 32, .docs = 37},
    // Whole tiles, a group of 4 query heads, head_dim 80.
    {.name = "whole_tiles_group4_hd80", .B = 1, .Tq = 128, .Tk = 192, .nh = 8, .nkv = 2, .hd = 80, .q_start = 64},
    // Queries at 64..127 after keys at 0..63, documents of 50 positions: rows from position 100
    // have causal keys, but all of other documents (lse = -inf).
    {.name = "cp_documents_hd96", .B = 2, .Tq = 64, .Tk = 64, .nh = 2, .nkv = 1, .hd = 96, .q_start = 64, .docs = 50},
};

struct Inputs {
  AttentionShape shape;  // document ids in host memory
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> q_doc, k_doc;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  AttentionShape& s = in.shape;
  s.B = c.B, s.Tq = c.Tq, s.Tk = c.Tk, s.nh = c.nh, s.nkv = c.nkv, s.hd = c.hd, s.q_start = c.q_start,
  s.k_start = c.k_start;
  const size_t nq = size_t(c.B * c.Tq * c.nh * c.hd), nkv = size_t(c.B * c.Tk * c.nkv * c.hd);
  in.q = bf16_values(nq, seed, -2, 2);  // scores of a few units: rows far from uniform
  in.k = bf16_values(nkv, seed + 1, -2, 2);
  in.v = bf16_values(nkv, seed + 2, -1, 1);
  in.dout = bf16_values(nq, seed + 3, -1, 1);
  if (c.docs > 0) {
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t i = 0; i < c.Tq; ++i) in.q_doc.push_back(int32_t((c.q_start + i + 3 * b) / c.docs));
      for (int64_t j = 0; j < c.Tk; ++j) in.k_doc.push_back(int32_t((c.k_start + j + 3 * b) / c.docs));
    }
    s.q_doc = in.q_doc.data(), s.k_doc = in.k_doc.data();
  }
  return in;
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward then backward on the active backend (gradients start at zero). With `given` the
// backward reads its out and lse instead of the forward's, as ring attention's backward reads
// the final ones on each block of keys.
Result run(const Inputs& in, GemmOperands operands, const Result* given = nullptr) {
  AttentionShape s = in.shape;
  s.operands = operands;
  const size_t nq = in.q.size(), nkv = in.k.size(), nlse = size_t(s.B * s.nh * s.Tq);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> q(in.q), k(in.k), v(in.v), dout(in.dout), out(std::vector<float>(nq, nan)),
      lse(std::vector<float>(nlse, nan)), dq(static_cast<int64_t>(nq)), dk(static_cast<int64_t>(nkv)),
      dv(static_cast<int64_t>(nkv));
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  Result r{out.host(), lse.host(), {}, {}, {}};
  if (given) {
    ops::device_memcpy(out.data(), given->out.data(), int64_t(nq * sizeof(float)));
    ops::device_memcpy(lse.data(), given->lse.data(), int64_t(nlse * sizeof(float)));
  }
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                          lse.data(), s);
  r.dq = dq.host(), r.dk = dk.host(), r.dv = dv.host();
  return r;
}

void expect_lse_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    const bool want_none = std::isinf(want[r]) && want[r] < 0, got_none = std::isinf(got[r]) && got[r] < 0;
    const bool ok = want_none ? got_none
                              : std::abs(double(got[r]) - double(want[r])) <=
                                    kLseTolerance * std::max(1.0, std::abs(double(want[r])));
    if (!ok) {
      ADD_FAILURE() << what << ": row " << r << " is " << got[r] << ", the CPU backend gives " << want[r];
      return;
    }
  }
}

TEST(CudaAttentionBf16, TensorCoresAgreeWithTheCpu) {
  LLAMA4D_REQUIRE_GPU();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, 500);
    const Result want = run(in, GemmOperands::as_stored);  // the CPU: fp32 sums of the same values
    Result got;
    {
      OnGpu gpu;
      const cuda::UnitCalls before = cuda::attention_unit_calls();
      got = run(in, GemmOperands::bf16);
      // The forward and the backward, on the tensor cores where the shared memory their head
      // dimension needs is there: every case's on an H100 (sm_90), some on an A100.
      const cuda::UnitCalls after = cuda::attention_unit_calls();
      if (test::gpu_major() >= 9)
        test::expect_unit_calls(before, after, 2, true, "bf16");
      else
        EXPECT_EQ(after.tensor_cores + after.cuda_cores - before.tensor_cores - before.cuda_cores, 2);
    }
    test::expect_close(got.out, want.out, "out", kOutTolerance);
    expect_lse_close(got.lse, want.lse, "lse");
    test::expect_close(got.dq, want.dq, "dq", kOutTolerance);
    test::expect_close(got.dk, want.dk, "dk", kOutTolerance);
    test::expect_close(got.dv, want.dv, "dv", kOutTolerance);
  }
}

// Rows [lo, Tq) of a call, as a call of their own (queries moved by lo positions, the same keys),
// have the bits of those rows of the whole call; and a second run repeats the first.
TEST(CudaAttentionBf16, RowsDoNotDependOnTheirCall) {
  LLAMA4D_REQUIRE_GPU();
  const Case c{.name = "rows", .B = 2, .Tq = 150, .Tk = 150, .nh = 4, .nkv = 2, .hd = 64, .docs = 29};
  const Inputs whole = make_inputs(c, 600);
  const int64_t lo = 37, rows = c.Tq - lo, row = c.nh * c.hd;
  Inputs part = whole;
  part.shape.Tq = rows, part.shape.q_start = lo;
  part.q.clear(), part.dout.clear(), part.q_doc.clear();
  for (int64_t b = 0; b < c.B; ++b) {
    const auto at = [&](const std::vector<float>& x) { return x.begin() + (b * c.Tq + lo) * row; };
    part.q.insert(part.q.end(), at(whole.q), at(whole.q) + rows * row);
    part.dout.insert(part.dout.end(), at(whole.dout), at(whole.dout) + rows * row);
    part.q_doc.insert(part.q_doc.end(), whole.q_doc.begin() + b * c.Tq + lo, whole.q_doc.begin() + (b + 1) * c.Tq);
  }
  part.shape.q_doc = part.q_doc.data(), part.shape.k_doc = part.k_doc.data();
  OnGpu gpu;
  const Result a = run(whole, GemmOperands::bf16), again = run(whole, GemmOperands::bf16),
               p = run(part, GemmOperands::bf16);
  test::expect_bitwise(again.out, a.out, "repeated out");
  test::expect_bitwise(again.lse, a.lse, "repeated lse");
  test::expect_bitwise(again.dq, a.dq, "repeated dq");
  test::expect_bitwise(again.dk, a.dk, "repeated dk");
  test::expect_bitwise(again.dv, a.dv, "repeated dv");
  std::vector<float> out_rows, lse_rows;
  for (int64_t b = 0; b < c.B; ++b) {
    out_rows.insert(out_rows.end(), a.out.begin() + (b * c.Tq + lo) * row, a.out.begin() + (b + 1) * c.Tq * row);
    for (int64_t h = 0; h < c.nh; ++h)
      lse_rows.insert(lse_rows.end(), a.lse.begin() + (b * c.nh + h) * c.Tq + lo,
                      a.lse.begin() + (b * c.nh + h + 1) * c.Tq);
  }
  test::expect_bitwise(p.out, out_rows, "out of rows called apart");
  test::expect_bitwise(p.lse, lse_rows, "lse of rows called apart");
  std::vector<float> dq_rows;
  for (int64_t b = 0; b < c.B; ++b)
    dq_rows.insert(dq_rows.end(), a.dq.begin() + (b * c.Tq + lo) * row, a.dq.begin() + (b + 1) * c.Tq * row);
  test::expect_bitwise(p.dq, dq_rows, "dq of rows called apart");
}

// Keys [lo, Tk) as a call of their own (keys moved by lo positions, all the queries), its
// backward given the whole call's out and lse (ring attention's step): their dk and dv have the
// bits of those keys' rows of the whole call.
TEST(CudaAttentionBf16, KeysDoNotDependOnTheirCall) {
  LLAMA4D_REQUIRE_GPU();
  const Case c{.name = "keys", .B = 2, .Tq = 150, .Tk = 150, .nh = 4, .nkv = 2, .hd = 32, .docs = 41};
  const Inputs whole = make_inputs(c, 700);
  const int64_t lo = 53, keys = c.Tk - lo, row = c.nkv * c.hd;
  Inputs part = whole;
  part.shape.Tk = keys, part.shape.k_start = lo;
  part.k.clear(), part.v.clear(), part.k_doc.clear();
  for (int64_t b = 0; b < c.B; ++b) {
    const auto at = [&](const std::vector<float>& x) { return x.begin() + (b * c.Tk + lo) * row; };
    part.k.insert(part.k.end(), at(whole.k), at(whole.k) + keys * row);
    part.v.insert(part.v.end(), at(whole.v), at(whole.v) + keys * row);
    part.k_doc.insert(part.k_doc.end(), whole.k_doc.begin() + b * c.Tk + lo, whole.k_doc.begin() + (b + 1) * c.Tk);
  }
  part.shape.q_doc = part.q_doc.data(), part.shape.k_doc = part.k_doc.data();
  OnGpu gpu;
  const Result a = run(whole, GemmOperands::bf16), p = run(part, GemmOperands::bf16, &a);
  std::vector<float> dk_rows, dv_rows;
  for (int64_t b = 0; b < c.B; ++b) {
    dk_rows.insert(dk_rows.end(), a.dk.begin() + (b * c.Tk + lo) * row, a.dk.begin() + (b + 1) * c.Tk * row);
    dv_rows.insert(dv_rows.end(), a.dv.begin() + (b * c.Tk + lo) * row, a.dv.begin() + (b + 1) * c.Tk * row);
  }
  test::expect_bitwise(p.dk, dk_rows, "dk of keys called apart");
  test::expect_bitwise(p.dv, dv_rows, "dv of keys called apart");
}

}  // namespace attention_bf16
}  // namespace
}  // namespace llama4d
