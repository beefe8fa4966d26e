#pragma once
// Learning-rate schedule: linear warm-up, then cosine decay, then constant.
//
//   step s (the 1-based number of the optimizer update about to be taken, i.e.
//   AdamW::step_count() + 1; s = 0 is "before training" and gives the warm-up's start value)
//
//   s <  W            lr = max_lr * (f0 + (1 - f0) * s / W)          linear warm-up from f0*max_lr
//   W <= s < S        lr = max_lr - (max_lr - min_lr) * (1 - cos(pi * (s - W) / (S - W))) / 2
//   s >= S            lr = min_lr
//   (W = warmup_steps, S = total_steps, f0 = warmup_start_fraction)
//
// So update 1 already has a non-zero rate max_lr / W (with f0 = 0), update W runs at exactly
// max_lr, and update S at exactly min_lr. Llama 3 405B used this shape: 8,000 linear warm-up
// steps, peak 8e-5, cosine decay to 8e-7 over 1.2M steps (The Llama 3 Herd of Models, 2024,
// Sec. 3.4.1); Llama 2 decayed to 10% of the peak (Touvron et al. 2023, Sec. 2.2).
#include <cstdint>
#include <string>

namespace llama4d {

struct LrSchedule {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;           // W; 0 starts at max_lr
  int64_t total_steps = 0;            // S >= W; the step at which min_lr is reached
  double warmup_start_fraction = 0.0; // f0 in [0, 1]

  // Throws InputError naming the first bad value (negative or non-finite lr, min_lr > max_lr,
  // negative steps, total_steps < warmup_steps, f0 outside [0, 1]).
  void validate() const;
};

// One stage's learning-rate segment of a training recipe (core/train/recipe.h): warm-up,
// a straight line, or half a cosine.
struct LrSegment {
  enum class Shape { linear, cosine };
  Shape shape = Shape::linear;  // "warmup" is a linear segment, named for what it is for
  std::string shape_name = "linear";
  double from = 0, to = 0;
  // The LR at step k of a stage of n steps: from + (to - from) * f, f = k / n (linear) or
  // (1 - cos(pi k / n)) / 2 (cosine), so step 0 has `from` and the stage ends just short of `to`.
  double at(int64_t k, int64_t n) const;
};

// The learning rate for step `step` (see the formula above). Pure function. Throws InputError
// for an invalid schedule or a negative step.
double lr_at_step(const LrSchedule& schedule, int64_t step);

}  // namespace llama4d
