#include "core/io/toml_file.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/regular_file.h"

namespace llama4d {

namespace {

// `key` is the dotted path of `node` (stages[2].lr.from), for errors.
nlohmann::json to_json(const toml::node& node, const std::string& key, const std::string& where) {
  if (const toml::table* t = node.as_table()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, v] : *t) {
      const std::string name(k.str());
      out[name] = to_json(v, key.empty() ? name : key + "." + name, where);
    }
    return out;
  }
  if (const toml::array* a = node.as_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < a->size(); ++i) out.push_back(to_json(*a->get(i), key + "[" + std::to_string(i) + "]", where));
    return out;
  }
  if (const auto* s = node.as_string()) return s->get();
  // As nlohmann's parser reads JSON: a whole number >= 0 is unsigned, so checks written for
  // JSON (is_number_unsigned) hold for the same number in TOML.
  if (const auto* i = node.as_integer()) return i->get() >= 0 ? nlohmann::json(uint64_t(i->get())) : nlohmann::json(i->get());
  if (const auto* b = node.as_boolean()) return b->get();
  if (const auto* f = node.as_floating_point()) {
    if (!std::isfinite(f->get()))
      throw InputError(where + ": key " + key + ": " + std::to_string(f->get()) + " is not a finite number");
    return f->get();
  }
  throw InputError(where + ": key " + key + ": a date or time, which no llama4d file has a meaning for");
}

}  // namespace

nlohmann::json parse_toml(const std::string& text, const std::string& where) {
  toml::table root;
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    const toml::source_position at = e.source().begin;
    throw InputError(where + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": " +
                     std::string(e.description()));
  }
  return to_json(root, "", where);
}

nlohmann::json read_toml_file(const std::string& path) {
  return parse_toml(read_regular_file(path, "TOML file", kMaxJsonFileBytes), "'" + path + "'");
}

}  // namespace llama4d
