// cross_entropy_forward / cross_entropy_backward: fused softmax + negative log-likelihood.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

TEST(CrossEntropy, ForwardMatchesNaiveLogSumExp) {
  const int64_t BT = 6, V = 37;
  auto logits = random_vector(BT * V, 1, -10, 10);
  logits[5] = 500.0;  // a huge logit must not overflow
  const std::vector<int32_t> targets = {3, -1, 36, 0, -100, 17};
  std::vector<double> losses(BT, std::nan(""));
  ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V);
  for (int64_t r = 0; r < BT; ++r) {
    if (targets[r] < 0) {
      EXPECT_EQ(losses[r], 0.0) << "ignored row " << r;
      continue;
    }
    long double m = logits[r * V];
    for (int64_t j = 0; j < V; ++j) m = std::max<long double>(m, logits[r * V + j]);
    long double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[r * V + j] - m);
    const double ref = static_cast<double>(m + std::log(sum) - logits[r * V + targets[r]]);
    EXPECT_NEAR(losses[r], ref, 1e-13 * std::max(1.0, std::abs(ref))) << "row " << r;
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndIgnoresTargets) {
  const int64_t BT = 5, V = 11;
  auto logits = random_vector(BT * V, 2, -3, 3);
  const std::vector<int32_t> targets = {4, -1, 0, 10, -1};
  const double scale = 1.0 / 3.0;  // 1 / (non-ignored tokens)
  auto objective = [&] {
    std::vector<double> losses(BT);
    ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V);
    double total = 0;
    for (double l : losses) total += scale * l;
    return total;
  };
  std::vector<double> dlogits(BT * V, 0.0);
  ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), scale, BT, V);
  EXPECT_LT(max_rel_error(dlogits, fd_gradient(objective, logits)), 1e-6);
  for (int64_t r : {1, 4})
    for (int64_t j = 0; j < V; ++j) EXPECT_EQ(dlogits[r * V + j], 0.0) << "ignored row " << r;

  auto twice = dlogits;
  ops::cross_entropy_backward(twice.data(), logits.data(), targets.data(), scale, BT, V);
  for (double& x : dlogits) x *= 2;
  EXPECT_LT(max_rel_error(twice, dlogits), 1e-14);
}

TEST(CrossEntropy, FloatAgreesWithDoubleAndThreadCountDoesNotChangeBits) {
  const int64_t BT = 512, V = 264;
  auto logits = random_vector(BT * V, 3, -6, 6);
  std::vector<int32_t> targets(BT);
  for (int64_t r = 0; r < BT; ++r)
    targets[r] = r % 7 == 0 ? -1 : static_cast<int32_t>((r * 31) % V);
  std::vector<double> losses(BT), dlogits(BT * V, 0.0);
  ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V);
  ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0 / BT, BT, V);
  auto lf = cast_to<float>(logits);
  auto run = [&](int threads) {
    std::vector<float> loss_f(BT), dl_f(BT * V, 0.0f);
    with_threads(threads, [&] {
      ops::cross_entropy_forward(loss_f.data(), lf.data(), targets.data(), BT, V);
      ops::cross_entropy_backward(dl_f.data(), lf.data(), targets.data(), 1.0f / BT, BT, V);
    });
    return std::make_pair(loss_f, dl_f);
  };
  const auto one = run(1), two = run(2);
  EXPECT_LT(max_rel_error(one.first, losses), 1e-5);
  EXPECT_LT(max_rel_error(one.second, dlogits), 1e-5);
  EXPECT_TRUE(bitwise_equal(one.first, two.first));
  EXPECT_TRUE(bitwise_equal(one.second, two.second));
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  const std::vector<double> logits(2 * 4, 0.0);
  const std::vector<int32_t> targets = {1, 4};  // V = 4
  std::vector<double> losses(2), dlogits(8, 0.0);
  EXPECT_THROW(ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), 2, 4),
               InputError);
  EXPECT_THROW(
      ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0, 2, 4),
      InputError);
}

}  // namespace
}  // namespace llama4d::test
