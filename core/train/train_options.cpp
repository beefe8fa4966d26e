#include "core/train/train_options.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace llama4d {

void TrainOptions::validate() const {
  auto fail = [](const std::string& msg) { throw InputError(msg); };
  if (steps < 1) fail("--steps must be >= 1, got " + std::to_string(steps));
  if (batch_size < 1) fail("--batch-size must be >= 1, got " + std::to_string(batch_size));
  if (micro_batch_size < 0) fail("--micro-batch-size must be >= 0, got " + std::to_string(micro_batch_size));
  if (batch_size % micro() != 0)
    fail("--batch-size " + std::to_string(batch_size) + " is not divisible by --micro-batch-size " +
         std::to_string(micro()));
  if (seq_len < 1) fail("--seq-len must be >= 1, got " + std::to_string(seq_len));
  if (!(lr > 0) || !std::isfinite(lr)) fail("--lr must be a positive number");
  if (!(min_lr >= 0) || min_lr > lr) fail("--min-lr must lie in [0, --lr]");
  if (warmup_steps < 0) fail("--warmup-steps must be >= 0");
  if (!std::isfinite(grad_clip)) fail("--grad-clip must be finite");
  adamw.validate();
}

nlohmann::json TrainOptions::to_json() const {
  return {{"steps", steps},         {"batch_size", batch_size},
          {"micro_batch_size", micro()}, {"seq_len", seq_len},
          {"lr", lr},               {"min_lr", min_lr},
          {"warmup_steps", warmup_steps}, {"grad_clip", grad_clip},
          {"seed", seed},
          {"adamw", {{"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps},
                     {"weight_decay", adamw.weight_decay}}}};
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  try {
    TrainOptions o;
    o.steps = j.at("steps").get<int64_t>();
    o.batch_size = j.at("batch_size").get<int64_t>();
    o.micro_batch_size = j.at("micro_batch_size").get<int64_t>();
    o.seq_len = j.at("seq_len").get<int64_t>();
    o.lr = j.at("lr").get<double>();
    o.min_lr = j.at("min_lr").get<double>();
    o.warmup_steps = j.at("warmup_steps").get<int64_t>();
    o.grad_clip = j.at("grad_clip").get<double>();
    o.seed = j.at("seed").get<uint64_t>();
    const auto& a = j.at("adamw");
    o.adamw.beta1 = a.at("beta1").get<double>();
    o.adamw.beta2 = a.at("beta2").get<double>();
    o.adamw.eps = a.at("eps").get<double>();
    o.adamw.weight_decay = a.at("weight_decay").get<double>();
    o.validate();
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("trainer state: ") + e.what());
  }
}

}  // namespace llama4d
