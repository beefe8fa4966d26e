// embedding_forward / embedding_backward: row lookup and scatter-add by token.
#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int32_t V, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(gen);
  return t;
}

TEST(Embedding, ForwardCopiesRows) {
  const int64_t BT = 9, C = 7;
  const int32_t V = 5;
  auto wte = random_vector(V * C, 1);
  auto tokens = random_tokens(BT, V, 2);
  std::vector<double> out(BT * C);
  ops::embedding_forward(out.data(), tokens.data(), wte.data(), BT, C);
  for (int64_t r = 0; r < BT; ++r)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[r * C + c], wte[tokens[r] * C + c]);
}

TEST(Embedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t BT = 12, C = 6;
  const int32_t V = 4;  // far fewer tokens than rows: every token repeats
  auto wte = random_vector(V * C, 3), dout = random_vector(BT * C, 4);
  auto tokens = random_tokens(BT, V, 5);
  auto objective = [&] {
    std::vector<double> out(BT * C);
    ops::embedding_forward(out.data(), tokens.data(), wte.data(), BT, C);
    return dot(out, dout);
  };
  std::vector<double> dwte(V * C, 0.0);
  ops::embedding_backward(dwte.data(), dout.data(), tokens.data(), BT, C);
  EXPECT_LT(max_rel_error(dwte, fd_gradient(objective, wte)), 1e-6);

  // A second call adds the same rows again (in a new order of additions, hence the tolerance).
  auto twice = dwte;
  ops::embedding_backward(twice.data(), dout.data(), tokens.data(), BT, C);
  for (double& x : dwte) x *= 2;
  EXPECT_LT(max_rel_error(twice, dwte), 1e-14);
}

TEST(Embedding, BackwardAddsInRowOrderWhateverTheThreadCount) {
  const int64_t BT = 2048, C = 200;  // several 64-column slices, large enough to run in parallel
  const int32_t V = 37;
  auto dout = cast_to<float>(random_vector(BT * C, 6));
  auto tokens = random_tokens(BT, V, 7);
  // Reference: sequential scatter in row order, in float, i.e. exactly the promised order.
  std::vector<float> ref(V * C, 0.0f);
  for (int64_t r = 0; r < BT; ++r)
    for (int64_t c = 0; c < C; ++c) ref[tokens[r] * C + c] += dout[r * C + c];
  for (int threads : {1, 2}) {
    std::vector<float> dwte(V * C, 0.0f);
    with_threads(threads,
                 [&] { ops::embedding_backward(dwte.data(), dout.data(), tokens.data(), BT, C); });
    EXPECT_TRUE(bitwise_equal(dwte, ref)) << threads << " threads";
  }
}

}  // namespace
}  // namespace llama4d::test
