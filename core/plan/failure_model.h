#pragma once
// The failure model of a run: how often a job of N GPUs is interrupted, what checkpoint interval
// minimises the time lost, and the goodput (useful time / wall time) that interval gives.
//
//   M      mean time between the job's interruptions; with a per-GPU rate λ, M = 1 / (N λ)
//   δ      seconds one checkpoint stalls training
//   R      seconds from an interruption to training again (detect, restart, reload)
//   τ      seconds of training between checkpoints
//
// Young (1974): τ* = √(2δM). Daly (2006, "A higher order estimate of the optimum checkpoint
// interval for restart dumps"): τ* = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M;
// and the expected wall time of T seconds of work under exponential failures,
//   T_wall = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T / τ,
// so goodput(τ) = τ / (M e^{R/M} (e^{(τ+δ)/M} − 1)): too short an interval pays δ too often, too
// long loses more work per failure, and the curve is U-shaped in its overhead.
//
// The default rate is Llama 3's: 419 unexpected interruptions in 54 days of pre-training on
// 16,384 H100 GPUs ("The Llama 3 Herd of Models", 2024, section 3.3.4, Table 5), a job MTBF of
// 3.09 hours at that size.
#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

inline constexpr double kLlama3Interruptions = 419;
inline constexpr double kLlama3Days = 54;
inline constexpr double kLlama3Gpus = 16384;

// Interruptions per GPU-second at Llama 3's rate.
double llama3_failure_rate_per_gpu_s();

struct FailureModel {
  double gpus = kLlama3Gpus;
  double mtbf_s = 0;        // the job's M; 0: 1 / (gpus x Llama 3's per-GPU rate)
  double checkpoint_s = 0;  // δ
  double restart_s = 0;     // R

  double job_mtbf_s() const;
  double young_interval_s() const;
  double daly_interval_s() const;
  // Daly's expected goodput at interval τ (seconds of training between checkpoints).
  double goodput(double interval_s) const;
  // InputError naming the field for a non-finite or negative value, gpus < 1, or δ = 0.
  void validate() const;
  // {"job_mtbf_hours", "young_interval_s", "daly_interval_s", "goodput_at_daly", "expected_interruptions_per_day",
  //  "sweep": [{"interval_s", "goodput"}, ...]} over `points` intervals from τ*/8 to 8τ* (log-spaced).
  nlohmann::json to_json(int points = 13) const;
};

}  // namespace llama4d
