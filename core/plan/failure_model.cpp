#include "core/plan/failure_model.h"

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llama4d {

double llama3_failure_rate_per_gpu_s() { return kLlama3Interruptions / (kLlama3Days * 86400.0 * kLlama3Gpus); }

double FailureModel::job_mtbf_s() const { return mtbf_s > 0 ? mtbf_s : 1.0 / (gpus * llama3_failure_rate_per_gpu_s()); }

double FailureModel::young_interval_s() const { return std::sqrt(2 * checkpoint_s * job_mtbf_s()); }

double FailureModel::daly_interval_s() const {
  const double m = job_mtbf_s(), d = checkpoint_s;
  if (d >= 2 * m) return m;
  const double x = d / (2 * m);
  return std::sqrt(2 * d * m) * (1 + std::sqrt(x) / 3 + x / 9) - d;
}

double FailureModel::goodput(double interval_s) const {
  const double m = job_mtbf_s();
  return interval_s / (m * std::exp(restart_s / m) * std::expm1((interval_s + checkpoint_s) / m));
}

void FailureModel::validate() const {
  const auto check = [](double v, const char* what) {
    if (!std::isfinite(v) || v < 0) throw InputError(std::string(what) + " must be a finite number >= 0");
  };
  check(gpus, "--failure-gpus");
  check(mtbf_s, "--mtbf-hours");
  check(checkpoint_s, "--checkpoint-s");
  check(restart_s, "--restart-s");
  if (gpus < 1) throw InputError("--failure-gpus must be >= 1");
  if (!(checkpoint_s > 0)) throw InputError("--checkpoint-s must be > 0 (the seconds one checkpoint stalls training)");
}

nlohmann::json FailureModel::to_json(int points) const {
  const double best = daly_interval_s();
  nlohmann::json sweep = nlohmann::json::array();
  for (int i = 0; i < points; ++i) {
    const double t = best * std::pow(8.0, 2.0 * i / (points - 1) - 1);
    sweep.push_back({{"interval_s", t}, {"goodput", goodput(t)}});
  }
  return {{"gpus", gpus},
          {"job_mtbf_hours", job_mtbf_s() / 3600},
          {"expected_interruptions_per_day", 86400 / job_mtbf_s()},
          {"checkpoint_s", checkpoint_s},
          {"restart_s", restart_s},
          {"young_interval_s", young_interval_s()},
          {"daly_interval_s", best},
          {"goodput_at_daly", goodput(best)},
          {"sweep", sweep}};
}

}  // namespace llama4d
