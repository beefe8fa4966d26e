#pragma once
// A TOML file (toml.io, v1.0) read as the JSON value it spells, so that what reads JSON files
// (a training recipe) reads TOML ones through the same checks: tables become objects, arrays
// arrays, and strings, integers, floats and booleans themselves. TOML has no null, and a key
// cannot appear twice in it (the parser refuses both, as parse_strict_json does for JSON).
// Parsed by toml++ (Debian's libtomlplusplus-dev).
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

// The file's value; InputError naming the file, line and column for a syntax error, and the key
// for a value JSON has no kind for (a date or time) or a float that is not finite.
nlohmann::json read_toml_file(const std::string& path);

// The same from text; `where` names it in errors.
nlohmann::json parse_toml(const std::string& text, const std::string& where);

}  // namespace llama4d
