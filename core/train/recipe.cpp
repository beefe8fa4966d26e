#include "core/train/recipe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/toml_file.h"

namespace llama4d {

namespace {

using nlohmann::json;

// Errors say where: "recipe stage 2 (\"anneal\") key \"seq_len\": ...".
struct Where {
  std::string prefix;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(prefix + " key \"" + key + "\": " + why);
  }
};

void check_keys(const json& obj, const std::set<std::string>& known, const Where& w) {
  if (!obj.is_object()) throw InputError(w.prefix + ": expected a JSON object");
  for (const auto& [key, value] : obj.items()) {
    if (!known.count(key)) w.fail(key, "unknown key");
  }
}

int64_t whole(const json& obj, const std::string& key, int64_t lo, int64_t hi, const Where& w) {
  const json& v = obj.at(key);
  if (!v.is_number_integer()) w.fail(key, "must be a whole number, got " + v.dump());
  const bool unsigned_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  const int64_t x = unsigned_big ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
  if (unsigned_big || x < lo || x > hi) {
    w.fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  }
  return x;
}

double real(const json& obj, const std::string& key, const Where& w) {
  const json& v = obj.at(key);
  if (!v.is_number()) w.fail(key, "must be a number, got " + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0) w.fail(key, "must be finite and >= 0, got " + v.dump());
  return x;
}

LrSegment parse_lr(const json& j, const Where& stage) {
  const Where w{stage.prefix + " lr"};
  check_keys(j, {"shape", "from", "to"}, w);
  for (const char* key : {"shape", "from", "to"}) {
    if (!j.contains(key)) w.fail(key, "missing");
  }
  LrSegment s;
  if (!j["shape"].is_string()) w.fail("shape", "must be \"warmup\", \"linear\" or \"cosine\"");
  s.shape_name = j["shape"].get<std::string>();
  if (s.shape_name == "warmup" || s.shape_name == "linear") {
    s.shape = LrSegment::Shape::linear;
  } else if (s.shape_name == "cosine") {
    s.shape = LrSegment::Shape::cosine;
  } else {
    w.fail("shape", "must be \"warmup\", \"linear\" or \"cosine\", got \"" + s.shape_name + "\"");
  }
  s.from = real(j, "from", w);
  s.to = real(j, "to", w);
  return s;
}

RecipeStage parse_stage(const json& j, size_t index, int64_t max_positions) {
  std::string label = "recipe stage " + std::to_string(index + 1);
  if (j.is_object() && j.contains("name") && j["name"].is_string()) {
    label += " (\"" + j["name"].get<std::string>() + "\")";
  }
  const Where w{label};
  check_keys(j, {"name", "steps", "tokens", "batch_size", "seq_len", "dp", "tp", "cp", "pp", "data", "lr"}, w);
  for (const char* key : {"batch_size", "seq_len", "data", "lr"}) {
    if (!j.contains(key)) w.fail(key, "missing");
  }
  RecipeStage s;
  s.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : "stage " + std::to_string(index + 1);
  const int64_t big = int64_t(1) << 40;
  s.batch_size = whole(j, "batch_size", 1, big, w);
  s.seq_len = whole(j, "seq_len", 1, max_positions, w);
  for (auto [key, field] : {std::pair{"dp", &s.dp}, {"tp", &s.tp}, {"cp", &s.cp}, {"pp", &s.pp}}) {
    if (j.contains(key)) *field = whole(j, key, 1, 1 << 20, w);
  }
  if (s.batch_size % s.dp != 0) {
    w.fail("batch_size", std::to_string(s.batch_size) + " rows do not divide among dp = " + std::to_string(s.dp) + " replicas");
  }
  if (s.cp > 1 && s.seq_len % (2 * s.cp) != 0) {
    w.fail("seq_len", std::to_string(s.seq_len) + " is not a multiple of 2·cp = " + std::to_string(2 * s.cp) +
                          " (context parallelism cuts a row into 2·cp chunks)");
  }
  const bool by_steps = j.contains("steps"), by_tokens = j.contains("tokens");
  if (by_steps == by_tokens) w.fail("steps", "give exactly one of \"steps\" and \"tokens\"");
  if (by_steps) {
    s.steps = whole(j, "steps", 1, big, w);
  } else {
    const int64_t tokens = whole(j, "tokens", 1, std::numeric_limits<int64_t>::max(), w);
    const int64_t per_step = s.batch_size * s.seq_len;
    if (tokens % per_step != 0) {
      w.fail("tokens", std::to_string(tokens) + " is not a whole number of steps of batch_size x seq_len = " +
                           std::to_string(per_step) + " tokens");
    }
    s.steps = tokens / per_step;
  }
  const json& data = j["data"];
  if (!data.is_object() || data.empty()) w.fail("data", "must be an object of source path -> weight, with at least one source");
  for (const auto& [path, weight] : data.items()) {
    if (!weight.is_number() || !std::isfinite(weight.get<double>()) || !(weight.get<double>() > 0)) {
      w.fail("data", "weight of " + path + " must be a number > 0, got " + weight.dump());
    }
    s.data.push_back({path, weight.get<double>()});
  }
  s.lr = parse_lr(j["lr"], w);
  return s;
}

}  // namespace

json RecipeStage::to_json() const {
  json mix = json::object();
  for (const MixEntry& e : data) mix[e.path] = e.weight;
  return {{"name", name}, {"steps", steps}, {"tokens", tokens()}, {"batch_size", batch_size}, {"seq_len", seq_len},
          {"dp", dp}, {"tp", tp}, {"cp", cp}, {"pp", pp}, {"data", mix},
          {"lr", {{"shape", lr.shape_name}, {"from", lr.from}, {"to", lr.to}}}};
}

int64_t Recipe::total_steps() const {
  int64_t n = 0;
  for (const RecipeStage& s : stages) n += s.steps;
  return n;
}

std::pair<size_t, int64_t> Recipe::locate(int64_t step) const {
  if (step < 0) throw InputError("step " + std::to_string(step) + " is negative");
  int64_t first = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (step < first + stages[i].steps) return {i, step - first};
    first += stages[i].steps;
  }
  throw InputError("step " + std::to_string(step) + " is past the recipe's " + std::to_string(first) + " steps");
}

double Recipe::lr_at(int64_t step) const {
  const auto [i, k] = locate(step);
  return stages[i].lr.at(k, stages[i].steps);
}

json Recipe::to_json() const {
  json st = json::array();
  for (const RecipeStage& s : stages) st.push_back(s.to_json());
  return {{"name", name}, {"seed", seed}, {"total_steps", total_steps()}, {"stages", st}};
}

std::string RecipeStage::mesh() const {
  std::string m;
  for (auto [key, size] : {std::pair{"tp", tp}, {"cp", cp}, {"pp", pp}, {"dp", dp}})
    if (size > 1) m += (m.empty() ? "" : ",") + std::string(key) + "=" + std::to_string(size);
  return m.empty() ? "dp=1" : m;
}

int64_t Recipe::first_step(size_t i) const {
  int64_t n = 0;
  for (size_t k = 0; k < i && k < stages.size(); ++k) n += stages[k].steps;
  return n;
}

std::string Recipe::fingerprint() const {
  json j = to_json();
  j.erase("name");
  uint64_t h = 14695981039346656037ull;  // FNV-1a's offset basis and prime (Fowler, Noll, Vo)
  for (const unsigned char c : j.dump()) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return std::string("fnv1a64:") + hex;
}

TrainOptions Recipe::stage_options(const TrainOptions& base, size_t i) const {
  const RecipeStage& s = stages.at(i);
  TrainOptions o = base;
  o.batch_size = s.batch_size;
  o.seq_len = s.seq_len;
  o.seed = seed;
  o.recipe = RecipePosition{name, fingerprint(), int64_t(i), s.name, first_step(i), s.steps, s.lr};
  o.steps = o.recipe.first_step + s.steps;
  // Unused by the trainers while the stage's segment rules; kept consistent for validate().
  o.lr = std::max(s.lr.from, s.lr.to) > 0 ? std::max(s.lr.from, s.lr.to) : base.lr;
  o.min_lr = std::min({s.lr.from, s.lr.to, o.lr});
  o.warmup_steps = 0;
  return o;
}

Recipe parse_recipe(const json& j, int64_t max_positions) {
  const Where w{"recipe"};
  check_keys(j, {"name", "seed", "stages"}, w);
  Recipe r;
  if (j.contains("name")) {
    if (!j["name"].is_string() || j["name"].get<std::string>().empty()) w.fail("name", "must be a non-empty string");
    r.name = j["name"].get<std::string>();
  }
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) w.fail("seed", "must be a whole number >= 0, got " + j["seed"].dump());
    r.seed = j["seed"].get<uint64_t>();
  }
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    w.fail("stages", "must be a non-empty array of stages");
  }
  for (size_t i = 0; i < j["stages"].size(); ++i) r.stages.push_back(parse_stage(j["stages"][i], i, max_positions));
  return r;
}

Recipe load_recipe(const std::string& path, int64_t max_positions) {
  // A .toml file spells the same keys in TOML ([[stages]] tables); any other is JSON.
  const json j = std::filesystem::path(path).extension() == ".toml" ? read_toml_file(path) : read_json_file(path);
  try {
    Recipe r = parse_recipe(j, max_positions);
    if (r.name.empty()) r.name = std::filesystem::path(path).stem().string();
    return r;
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

}  // namespace llama4d
