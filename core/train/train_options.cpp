#include "core/train/train_options.h"

#include <cmath>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

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
  if (!(grad_clip >= 0) || !std::isfinite(grad_clip)) fail("--grad-clip must be a finite number >= 0 (0: off)");
  if (!nlohmann::json::parse(loop, nullptr, false).is_object()) fail("trainer state: \"loop\" must be an object");
  adamw.validate();
}

nlohmann::json TrainOptions::to_json() const {
  return {{"steps", steps},         {"batch_size", batch_size},
          {"micro_batch_size", micro_batch_size}, {"seq_len", seq_len},
          {"lr", lr},               {"min_lr", min_lr},
          {"warmup_steps", warmup_steps}, {"grad_clip", grad_clip},
          {"seed", seed},           {"doc_mask", doc_mask},
          {"bf16_compute", bf16_compute},
          {"adamw", {{"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps},
                     {"weight_decay", adamw.weight_decay}}},
          {"loop", nlohmann::json::parse(loop)}};
}

int64_t whole_number(const nlohmann::json& object, const char* key) {
  const nlohmann::json& v = object.at(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
    return v.get<int64_t>();
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  throw InputError(std::string("\"") + key + "\" must be a whole number (int64), got " + v.dump());
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  try {
    TrainOptions o;
    // Whole numbers are read strictly: nlohmann's get<int64_t>() would turn 1.5 into 1 and 1e300
    // into whatever the cast gives, a silent misread of a damaged file.
    o.steps = whole_number(j, "steps");
    o.batch_size = whole_number(j, "batch_size");
    o.micro_batch_size = whole_number(j, "micro_batch_size");
    o.seq_len = whole_number(j, "seq_len");
    o.lr = j.at("lr").get<double>();
    o.min_lr = j.at("min_lr").get<double>();
    o.warmup_steps = whole_number(j, "warmup_steps");
    o.grad_clip = j.at("grad_clip").get<double>();
    if (!j.at("seed").is_number_unsigned())
      throw InputError("\"seed\" must be a whole number >= 0, got " + j.at("seed").dump());
    o.seed = j.at("seed").get<uint64_t>();
    // Absent from files written before document masking existed: those runs had none.
    if (j.contains("doc_mask")) {
      if (!j.at("doc_mask").is_boolean()) throw InputError("\"doc_mask\" must be true or false, got " + j.at("doc_mask").dump());
      o.doc_mask = j.at("doc_mask").get<bool>();
    }
    // Absent from files written before bf16 mixed precision existed: those runs computed in f32/f64.
    if (j.contains("bf16_compute")) {
      if (!j.at("bf16_compute").is_boolean())
        throw InputError("\"bf16_compute\" must be true or false, got " + j.at("bf16_compute").dump());
      o.bf16_compute = j.at("bf16_compute").get<bool>();
    }
    const auto& a = j.at("adamw");
    o.adamw.beta1 = a.at("beta1").get<double>();
    o.adamw.beta2 = a.at("beta2").get<double>();
    o.adamw.eps = a.at("eps").get<double>();
    o.adamw.weight_decay = a.at("weight_decay").get<double>();
    if (j.contains("loop")) o.loop = j.at("loop").dump();
    o.validate();
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("trainer state: ") + e.what());
  }
}

const std::vector<TrainOptionField>& train_option_fields() {
  static const std::vector<TrainOptionField> fields = {
      {"--steps", "/steps", true},
      {"--batch-size", "/batch_size", false},
      {"--micro-batch-size", "/micro_batch_size", true},
      {"--seq-len", "/seq_len", false},
      {"--lr", "/lr", false},
      {"--min-lr", "/min_lr", false},
      {"--warmup-steps", "/warmup_steps", false},
      {"--grad-clip", "/grad_clip", false},
      {"--seed", "/seed", false},
      {"--doc-mask", "/doc_mask", false},
      {"bf16_compute", "/bf16_compute", false},  // --dtype bf16, which the CLI checks on resume itself
      {"adamw.beta1", "/adamw/beta1", false},
      {"adamw.beta2", "/adamw/beta2", false},
      {"adamw.eps", "/adamw/eps", false},
      {"--weight-decay", "/adamw/weight_decay", false},
  };
  return fields;
}

void check_resumable(const TrainOptions& saved, int64_t steps_done, const TrainOptions& requested) {
  if (requested.steps < steps_done)
    throw InputError("--steps " + std::to_string(requested.steps) + " is below the " + std::to_string(steps_done) +
                     " steps the checkpoint has already done");
  const nlohmann::json was = saved.to_json(), now = requested.to_json();
  for (const TrainOptionField& f : train_option_fields()) {
    const nlohmann::json::json_pointer at(f.pointer);
    if (f.may_change_on_resume || was.at(at) == now.at(at)) continue;
    throw InputError(std::string(f.flag) + " " + now.at(at).dump() + " differs from the checkpoint's " +
                     was.at(at).dump() + ": " + kResumeKeepsTheMath);
  }
}

}  // namespace llama4d
