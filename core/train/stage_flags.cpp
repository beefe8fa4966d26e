#include "core/train/stage_flags.h"

#include <set>
#include <string_view>

#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

namespace {

using nlohmann::json;

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t next; (next = s.find(sep, at)) != std::string_view::npos; at = next + 1) parts.emplace_back(s.substr(at, next - at));
  parts.emplace_back(s.substr(at));
  return parts;
}

// A value as the recipe's JSON would hold it: a whole number, a real number, or text.
json scalar(const std::string& text) {
  int64_t i = 0;
  if (!read_number(text, i)) return i;
  double d = 0;
  if (!read_number(text, d)) return d;
  return text;
}

json lr_segment(const std::string& text, const std::string& where) {
  const std::vector<std::string> p = split(text, ':');
  if (p.size() != 3)
    throw InputError(where + " key \"lr\": '" + text + "' is not SHAPE:FROM:TO (e.g. warmup:0:3e-3, cosine:3e-3:3e-4)");
  return {{"shape", p[0]},
          {"from", parse_number<double>(p[1], where + " key \"lr\" FROM")},
          {"to", parse_number<double>(p[2], where + " key \"lr\" TO")}};
}

// PATH[:W]+...: the last ':' starts a weight only when a number follows it, so a path may hold ':'.
json data_mix(const std::string& text, const std::string& where) {
  json mix = json::object();
  for (const std::string& source : split(text, '+')) {
    std::string path = source;
    double weight = 1;
    const size_t colon = source.rfind(':');
    if (colon != std::string::npos && !read_number(source.substr(colon + 1), weight)) path = source.substr(0, colon);
    if (path.empty()) throw InputError(where + " key \"data\": '" + text + "' has a source with no path");
    if (mix.contains(path)) throw InputError(where + " key \"data\": " + path + " is given twice");
    mix[path] = weight;
  }
  return mix;
}

}  // namespace

json stage_flags_recipe(const std::vector<std::string>& stages, uint64_t seed, const std::string& default_data) {
  json list = json::array();
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string where = "--stage " + std::to_string(i + 1) + " ('" + stages[i] + "')";
    json stage = json::object();
    for (const std::string& item : split(stages[i], ',')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InputError(where + ": '" + item + "' is not KEY=VALUE (keys: name, steps, tokens, batch_size, seq_len, dp, "
                         "tp, cp, pp, lr, data)");
      const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
      if (stage.contains(key)) throw InputError(where + " key \"" + key + "\": given twice");
      stage[key] = key == "lr" ? lr_segment(value, where) : key == "data" ? data_mix(value, where)
                 : key == "name" ? json(value) : scalar(value);
    }
    if (!stage.contains("data")) stage["data"] = {{default_data, 1}};
    list.push_back(std::move(stage));
  }
  return {{"name", "stages"}, {"seed", seed}, {"stages", list}};
}

}  // namespace llama4d
