#include "core/model/checkpointing.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

Checkpointing Checkpointing::parse(std::string_view spec, int num_layers) {
  Checkpointing c;
  if (spec == "none" || spec.empty()) return c;
  if (spec == "selective") {
    c.kind = Kind::selective;
    return c;
  }
  if (spec == "full") {
    c.kind = Kind::every;
    return c;
  }
  const std::string s(spec);
  if (s.rfind("every:", 0) == 0) {
    const std::string k = s.substr(6);
    c.kind = Kind::every;
    if (k == "sqrt") {
      c.every = std::max(1, int(std::ceil(std::sqrt(double(std::max(1, num_layers))))));
      return c;
    }
    int v = 0;
    if (!k.empty() && !read_number(std::string_view(k), v) && v >= 1 && v <= 1000000) {
      c.every = v;
      return c;
    }
  }
  throw InputError("--ac " + s + ": expected none, selective, full, every:K (K >= 1) or every:sqrt");
}

std::string Checkpointing::describe() const {
  switch (kind) {
    case Kind::none: return "none";
    case Kind::selective: return "selective";
    case Kind::every: return every == 1 ? "full" : "every:" + std::to_string(every);
  }
  return "?";
}

}  // namespace llama4d
