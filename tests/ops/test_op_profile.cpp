// OpProfile (core/tensor/op_profile.h): every kernel call is tallied under its own name with the
// FLOPs core/ops.h counts, the results keep their bits, and the backend comes back afterwards.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/tensor/op_profile.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

std::map<std::string, ops::OpTime> by_name(const std::vector<ops::OpTime>& times) {
  std::map<std::string, ops::OpTime> m;
  for (const ops::OpTime& t : times) {
    EXPECT_EQ(m.count(t.op), 0u) << t.op << " listed twice";
    m[t.op] = t;
  }
  return m;
}

TEST(OpProfile, TalliesEveryCallWithItsFlops) {
  const int64_t BT = 5, C = 7, OC = 3;
  const std::vector<float> inp = cast_to<float>(random_vector(BT * C, 1)), w = cast_to<float>(random_vector(OC * C, 2));
  const std::vector<float> dout = cast_to<float>(random_vector(BT * OC, 3));
  std::vector<float> out(BT * OC), dinp(BT * C, 0.0f);
  // Attention: one item, 4 causal positions, 2 query heads over 1 kv head of width 8.
  ops::AttentionShape s;
  s.B = 1, s.Tq = 4, s.Tk = 4, s.nh = 2, s.nkv = 1, s.hd = 8;
  const std::vector<float> q = cast_to<float>(random_vector(4 * 2 * 8, 4)), kv = cast_to<float>(random_vector(4 * 8, 5));
  std::vector<float> att(4 * 2 * 8), lse(2 * 4);
  std::vector<double> fill64(10);

  const ops::ComputeBackend* before = &ops::compute_backend();
  std::vector<ops::OpTime> times;
  {
    ops::OpProfile profile;
    EXPECT_NE(&ops::compute_backend(), before);  // the timed table is active
    EXPECT_STREQ(ops::backend_name(), before->name);
    ops::matmul_forward(out.data(), inp.data(), w.data(), BT, C, OC);
    ops::matmul_forward(out.data(), inp.data(), w.data(), BT, C, OC);
    ops::matmul_backward(dinp.data(), static_cast<float*>(nullptr), dout.data(), inp.data(), w.data(), BT, C, OC);
    ops::attention_forward(att.data(), lse.data(), q.data(), kv.data(), kv.data(), s);
    ops::fill(fill64.data(), 1.0, 10);  // fp64 calls are tallied under the same names
    times = profile.take();
    EXPECT_TRUE(profile.take().empty());  // take() zeroes the totals
  }
  EXPECT_EQ(&ops::compute_backend(), before);

  const auto m = by_name(times);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m.at("matmul_forward").calls, 2);
  EXPECT_EQ(m.at("matmul_backward").calls, 1);
  EXPECT_EQ(m.at("attention_forward").calls, 1);
  EXPECT_EQ(m.at("fill").calls, 1);
  // 2 FLOPs per multiply-add: 2 products of 5 x 7 x 3; the backward's input gradient alone, one.
  EXPECT_EQ(m.at("matmul_forward").flops, 2 * 2.0 * 5 * 7 * 3);
  EXPECT_EQ(m.at("matmul_backward").flops, 2.0 * 5 * 7 * 3);
  // 4 * hd per (query, key) pair and head: 1 + 2 + 3 + 4 causal pairs, 2 heads, hd 8.
  EXPECT_EQ(m.at("attention_forward").flops, 4.0 * 8 * 2 * 10);
  EXPECT_EQ(m.at("fill").flops, 0.0);
  for (const ops::OpTime& t : times) EXPECT_GT(t.seconds, 0.0) << t.op;
  // Listed in ops::Kernels' order.
  ASSERT_EQ(times.size(), 4u);
  EXPECT_EQ(times[0].op, "matmul_forward");
  EXPECT_EQ(times[3].op, "fill");
}

TEST(OpProfile, ResultsKeepTheirBits) {
  const int64_t BT = 33, C = 40, OC = 24;
  const std::vector<float> inp = cast_to<float>(random_vector(BT * C, 6)), w = cast_to<float>(random_vector(OC * C, 7));
  std::vector<float> plain(BT * OC), profiled(BT * OC);
  ops::matmul_forward(plain.data(), inp.data(), w.data(), BT, C, OC);
  {
    ops::OpProfile profile;
    ops::matmul_forward(profiled.data(), inp.data(), w.data(), BT, C, OC);
  }
  EXPECT_EQ(std::memcmp(plain.data(), profiled.data(), plain.size() * sizeof(float)), 0);
}

TEST(OpProfile, OneAtATime) {
  ops::OpProfile profile;
  EXPECT_THROW(ops::OpProfile second, InputError);
}

}  // namespace
}  // namespace llama4d::test
