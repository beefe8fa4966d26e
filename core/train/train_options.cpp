#include "core/train/train_options.h"

#include <cmath>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llama4d {

double RecipePosition::lr_at(int64_t update) const {
  const int64_t k = update - 1 - first_step;
  if (k < 0 || k >= steps)
    throw Error("update " + std::to_string(update) + " lies outside recipe stage " + std::to_string(stage + 1) + " (\"" +
                stage_name + "\", steps " + std::to_string(first_step + 1) + ".." + std::to_string(first_step + steps) + ")");
  return lr.at(k, steps);
}

double TrainOptions::lr_at(const LrSchedule& schedule, int64_t update) const {
  return recipe.active() ? recipe.lr_at(update) : lr_at_step(schedule, update);
}

namespace {

nlohmann::json recipe_json(const RecipePosition& p) {
  return {{"name", p.recipe},      {"fingerprint", p.fingerprint}, {"stage", p.stage},
          {"stage_name", p.stage_name}, {"first_step", p.first_step}, {"steps", p.steps},
          {"lr", {{"shape", p.lr.shape_name}, {"from", p.lr.from}, {"to", p.lr.to}}}};
}

RecipePosition recipe_from_json(const nlohmann::json& j) {
  RecipePosition p;
  p.recipe = j.at("name").get<std::string>();
  p.fingerprint = j.at("fingerprint").get<std::string>();
  p.stage = whole_number(j, "stage");
  p.stage_name = j.at("stage_name").get<std::string>();
  p.first_step = whole_number(j, "first_step");
  p.steps = whole_number(j, "steps");
  const nlohmann::json& lr = j.at("lr");
  p.lr.shape_name = lr.at("shape").get<std::string>();
  if (p.lr.shape_name == "warmup" || p.lr.shape_name == "linear")
    p.lr.shape = LrSegment::Shape::linear;
  else if (p.lr.shape_name == "cosine")
    p.lr.shape = LrSegment::Shape::cosine;
  else
    throw InputError("trainer state: recipe.lr.shape \"" + p.lr.shape_name + "\" is not warmup, linear or cosine");
  p.lr.from = lr.at("from").get<double>();
  p.lr.to = lr.at("to").get<double>();
  return p;
}

}  // namespace

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
  if (recipe.active()) {
    if (recipe.steps < 1 || recipe.first_step < 0 || steps != recipe.first_step + recipe.steps)
      fail("trainer state: recipe stage " + std::to_string(recipe.stage + 1) + " covers steps " +
           std::to_string(recipe.first_step + 1) + ".." + std::to_string(recipe.first_step + recipe.steps) +
           ", and --steps is " + std::to_string(steps));
    if (!(recipe.lr.from >= 0 && recipe.lr.to >= 0 && std::isfinite(recipe.lr.from) && std::isfinite(recipe.lr.to)))
      fail("trainer state: recipe stage " + std::to_string(recipe.stage + 1) + " lr must be finite and >= 0");
  }
  adamw.validate();
}

nlohmann::json TrainOptions::to_json() const {
  nlohmann::json j = {{"steps", steps},         {"batch_size", batch_size},
          {"micro_batch_size", micro_batch_size}, {"seq_len", seq_len},
          {"lr", lr},               {"min_lr", min_lr},
          {"warmup_steps", warmup_steps}, {"grad_clip", grad_clip},
          {"seed", seed},           {"doc_mask", doc_mask},
          {"bf16_compute", bf16_compute},
          {"adamw", {{"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps},
                     {"weight_decay", adamw.weight_decay}}},
          {"loop", nlohmann::json::parse(loop)}};
  if (recipe.active()) j["recipe"] = recipe_json(recipe);
  return j;
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
    if (j.contains("recipe")) o.recipe = recipe_from_json(j.at("recipe"));  // absent: a run of one shape
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
  const RecipePosition &from = saved.recipe, &to = requested.recipe;
  if (to.active() && !from.active())
    throw InputError("recipe \"" + to.recipe + "\": the checkpoint was saved by a run of one shape, not by a recipe: " +
                     kResumeKeepsTheMath);
  if (!to.active() && from.active())
    throw InputError("the checkpoint was saved by recipe \"" + from.recipe + "\" (stage " + std::to_string(from.stage + 1) +
                     ", \"" + from.stage_name + "\"): resume it with --recipe");
  if (to.active() && from.recipe != to.recipe)
    throw InputError("recipe \"" + to.recipe + "\" is not the checkpoint's recipe \"" + from.recipe + "\": " +
                     kResumeKeepsTheMath);
  if (to.active() && from.fingerprint != to.fingerprint)
    throw InputError("recipe \"" + to.recipe + "\" (" + to.fingerprint + ") has changed since the checkpoint was saved (" +
                     from.fingerprint + "): " + kResumeKeepsTheMath);
  const nlohmann::json was = saved.to_json(), now = requested.to_json();
  for (const TrainOptionField& f : train_option_fields()) {
    const nlohmann::json::json_pointer at(f.pointer);
    const std::string key = f.pointer;
    const bool stage_defined = to.active() && (key == "/batch_size" || key == "/seq_len" || key == "/lr" ||
                                               key == "/min_lr" || key == "/warmup_steps");
    if (f.may_change_on_resume || stage_defined || was.at(at) == now.at(at)) continue;
    throw InputError(std::string(f.flag) + " " + now.at(at).dump() + " differs from the checkpoint's " +
                     was.at(at).dump() + ": " + kResumeKeepsTheMath);
  }
}

}  // namespace llama4d
