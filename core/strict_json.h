#pragma once
// JSON a person or another program wrote (config.json, a safetensors header, an index,
// trainer_state.json, tokenizer files), read so that it cannot mean two things. nlohmann's parser
// alone would accept, silently:
//   - a key twice in one object: the last one wins (a tensor listed twice, with another dtype);
//   - a raw NUL byte: it ends the text there and the rest is ignored;
//   - "\u0000" in a key or a string: the C string of it (a shard's file name) ends early.
// Each is an InputError naming `where` and the key.
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llama4d {

inline nlohmann::json parse_strict_json(std::string_view text, const std::string& where) {
  using json = nlohmann::json;
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw InputError(where + " has a NUL byte at byte " + std::to_string(nul) + " (JSON text may not contain one)");
  std::vector<std::set<std::string>> keys;  // of each object being read, innermost last
  const auto shown = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == '\0' ? std::string("\\u0000") : std::string(1, c);
    return out;
  };
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (key.find('\0') != std::string::npos)
        throw InputError(where + ": key '" + shown(key) + "' contains a NUL character");
      if (!keys.empty() && !keys.back().insert(key).second)
        throw InputError(where + ": key '" + key + "' appears twice in one object");
    }
    if (event == json::parse_event_t::value && parsed.is_string() &&
        parsed.get_ref<const std::string&>().find('\0') != std::string::npos)
      throw InputError(where + ": string '" + shown(parsed.get<std::string>()) + "' contains a NUL character");
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    throw InputError(where + " is not valid JSON: " + e.what());
  }
}

}  // namespace llama4d
