// The schedule at its key steps against the formula written out here, its shape, and its checks.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/optim/lr_schedule.h"

namespace llama4d {
namespace {

// The textbook cosine form: min + (max - min) * (1 + cos(pi * progress)) / 2.
double cosine(double max_lr, double min_lr, double progress) {
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

LrSchedule example() {
  LrSchedule s;
  s.max_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 110;
  return s;
}

TEST(LrSchedule, KeyStepsMatchFormula) {
  const LrSchedule s = example();
  EXPECT_EQ(lr_at_step(s, 0), 0.0);
  EXPECT_NEAR(lr_at_step(s, 1), 1e-4, 1e-18);
  EXPECT_NEAR(lr_at_step(s, 5), 5e-4, 1e-18);
  EXPECT_EQ(lr_at_step(s, 10), 1e-3);  // end of warm-up: exactly the peak
  EXPECT_NEAR(lr_at_step(s, 35), cosine(1e-3, 1e-4, 0.25), 1e-17);
  EXPECT_NEAR(lr_at_step(s, 60), 5.5e-4, 1e-17);  // halfway through the decay: the mean
  EXPECT_NEAR(lr_at_step(s, 109), cosine(1e-3, 1e-4, 0.99), 1e-17);
  EXPECT_EQ(lr_at_step(s, 110), 1e-4);  // exactly min_lr from total_steps on
  EXPECT_EQ(lr_at_step(s, 100000), 1e-4);
}

TEST(LrSchedule, WarmupStartFraction) {
  LrSchedule s = example();
  s.warmup_start_fraction = 0.1;
  EXPECT_NEAR(lr_at_step(s, 0), 1e-4, 1e-18);
  EXPECT_NEAR(lr_at_step(s, 5), 1e-3 * (0.1 + 0.9 * 0.5), 1e-18);
  EXPECT_EQ(lr_at_step(s, 10), 1e-3);
  s.warmup_start_fraction = 1.0;  // no ramp: constant peak during "warm-up"
  EXPECT_EQ(lr_at_step(s, 3), 1e-3);
}

TEST(LrSchedule, NoWarmupAndDegenerateDecay) {
  LrSchedule s = example();
  s.warmup_steps = 0;
  EXPECT_EQ(lr_at_step(s, 0), 1e-3);
  EXPECT_NEAR(lr_at_step(s, 55), 5.5e-4, 1e-17);
  s.warmup_steps = 10;
  s.total_steps = 10;  // decay over zero steps: straight to min_lr
  EXPECT_NEAR(lr_at_step(s, 9), 9e-4, 1e-18);
  EXPECT_EQ(lr_at_step(s, 10), 1e-4);
  s.min_lr = s.max_lr;  // constant after warm-up
  s.total_steps = 50;
  EXPECT_EQ(lr_at_step(s, 30), 1e-3);
}

TEST(LrSchedule, ShapeIsRampThenNonIncreasing) {
  const LrSchedule s = example();
  for (int64_t t = 1; t <= 10; ++t) EXPECT_GT(lr_at_step(s, t), lr_at_step(s, t - 1)) << t;
  for (int64_t t = 11; t <= 120; ++t) EXPECT_LE(lr_at_step(s, t), lr_at_step(s, t - 1)) << t;
  for (int64_t t = 0; t <= 120; ++t) {
    EXPECT_GE(lr_at_step(s, t), 0.0);
    EXPECT_LE(lr_at_step(s, t), s.max_lr);
  }
}

TEST(LrSchedule, RejectsBadArguments) {
  EXPECT_THROW(lr_at_step(example(), -1), InputError);
  LrSchedule s = example();
  s.min_lr = 2e-3;  // above max
  EXPECT_THROW(lr_at_step(s, 1), InputError);
  s = example();
  s.max_lr = -1e-3;
  EXPECT_THROW(s.validate(), InputError);
  s = example();
  s.max_lr = std::nan("");
  EXPECT_THROW(s.validate(), InputError);
  s = example();
  s.warmup_steps = -1;
  EXPECT_THROW(s.validate(), InputError);
  s = example();
  s.total_steps = 5;  // shorter than the warm-up
  EXPECT_THROW(s.validate(), InputError);
  s = example();
  s.warmup_start_fraction = 1.5;
  EXPECT_THROW(s.validate(), InputError);
  EXPECT_NO_THROW(example().validate());
}

}  // namespace
}  // namespace llama4d
