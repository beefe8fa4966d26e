#include "core/parallel/fault_schedule.h"

#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "core/strict_json.h"

namespace llama4d {

namespace {

constexpr std::pair<FaultKind, const char*> kKinds[] = {{FaultKind::crash, "crash"},
                                                        {FaultKind::hang, "hang"},
                                                        {FaultKind::slow, "slow"},
                                                        {FaultKind::collective, "collective"},
                                                        {FaultKind::sdc, "sdc"}};

// An integer a person wrote: a JSON integer (not 2.5, not "2"), within [lo, hi].
int64_t integer(const nlohmann::json& entry, const char* key, const std::string& at, int64_t lo, int64_t hi) {
  const nlohmann::json& v = entry.at(key);
  if (!v.is_number_integer()) throw InputError(at + ": \"" + key + "\" must be an integer, got " + v.dump());
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi)
    throw InputError(at + ": \"" + key + "\" " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  return x;
}

}  // namespace

std::string fault_kind_name(FaultKind kind) {
  for (const auto& [k, name] : kKinds)
    if (k == kind) return name;
  return "?";
}

std::string Fault::describe() const {
  std::string s = fault_kind_name(kind) + " on rank " + std::to_string(rank) + " at step " + std::to_string(step);
  if (kind == FaultKind::slow) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%gx slower for %lld step%s)", factor, (long long)steps, steps == 1 ? "" : "s");
    s += buf;
  }
  if (kind == FaultKind::hang && after_step) s += " (after its step)";
  if (kind == FaultKind::crash && permanent) s += " (permanent: its node is lost)";
  return s;
}

FaultSchedule FaultSchedule::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": a fault schedule is an object {\"seed\": N, \"faults\": [...]}");
  for (const auto& [key, value] : j.items())
    if (key != "seed" && key != "faults")
      throw InputError(where + ": unknown key \"" + key + "\" (a schedule has \"seed\" and \"faults\")");
  FaultSchedule s;
  if (j.contains("seed")) s.seed = uint64_t(integer(j, "seed", where, 0, INT64_MAX));
  if (!j.contains("faults") || !j.at("faults").is_array())
    throw InputError(where + ": \"faults\" must be a list of faults");
  const std::set<std::string> keys = {"kind", "rank", "step", "factor", "steps", "element", "bit", "phase", "permanent"};
  for (size_t i = 0; i < j.at("faults").size(); ++i) {
    const nlohmann::json& e = j.at("faults")[i];
    const std::string at = where + ": faults[" + std::to_string(i) + "]";
    if (!e.is_object()) throw InputError(at + " must be an object");
    for (const auto& [key, value] : e.items())
      if (!keys.count(key)) throw InputError(at + ": unknown key \"" + key + "\"");
    for (const char* key : {"kind", "rank", "step"})
      if (!e.contains(key)) throw InputError(at + ": missing \"" + std::string(key) + "\"");
    Fault f;
    const nlohmann::json& kind = e.at("kind");
    bool known = false;
    for (const auto& [k, name] : kKinds)
      if (kind.is_string() && kind.get<std::string>() == name) f.kind = k, known = true;
    if (!known)
      throw InputError(at + ": \"kind\" " + kind.dump() + " is not one of crash, hang, slow, collective, sdc");
    f.rank = int(integer(e, "rank", at, 0, INT32_MAX));
    f.step = integer(e, "step", at, 1, INT64_MAX);
    const auto only_for = [&](const char* key, FaultKind k) {
      if (e.contains(key) && f.kind != k)
        throw InputError(at + ": \"" + std::string(key) + "\" applies to " + fault_kind_name(k) + " faults only");
    };
    only_for("factor", FaultKind::slow);
    only_for("steps", FaultKind::slow);
    only_for("element", FaultKind::sdc);
    only_for("bit", FaultKind::sdc);
    only_for("phase", FaultKind::hang);
    only_for("permanent", FaultKind::crash);
    if (e.contains("permanent")) {
      if (!e.at("permanent").is_boolean()) throw InputError(at + ": \"permanent\" must be true or false");
      f.permanent = e.at("permanent").get<bool>();
    }
    if (e.contains("phase")) {
      const nlohmann::json& ph = e.at("phase");
      if (!ph.is_string() || (ph.get<std::string>() != "step" && ph.get<std::string>() != "after-step"))
        throw InputError(at + ": \"phase\" " + ph.dump() + " is not \"step\" or \"after-step\"");
      f.after_step = ph.get<std::string>() == "after-step";
    }
    if (f.kind == FaultKind::slow) {
      if (!e.contains("factor") || !e.at("factor").is_number())
        throw InputError(at + ": a slow fault needs a numeric \"factor\" (how many times slower)");
      f.factor = e.at("factor").get<double>();
      if (!(f.factor > 1) || !std::isfinite(f.factor) || f.factor > 1000)
        throw InputError(at + ": \"factor\" must be in (1, 1000], got " + e.at("factor").dump());
      if (e.contains("steps")) f.steps = integer(e, "steps", at, 1, INT64_MAX);
    }
    if (e.contains("element")) f.element = integer(e, "element", at, 0, INT64_MAX);
    if (e.contains("bit")) f.bit = int(integer(e, "bit", at, 0, 63));
    s.faults.push_back(f);
  }
  return s;
}

FaultSchedule FaultSchedule::read(const std::string& path) {
  const std::string text = read_regular_file(path, "--faults", kMaxJsonFileBytes);
  return from_json(parse_strict_json(text, "--faults " + path), "--faults " + path);
}

nlohmann::json FaultSchedule::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const Fault& f : faults) {
    nlohmann::json e = {{"kind", fault_kind_name(f.kind)}, {"rank", f.rank}, {"step", f.step}};
    if (f.kind == FaultKind::slow) e["factor"] = f.factor, e["steps"] = f.steps;
    if (f.element >= 0) e["element"] = f.element;
    if (f.bit >= 0) e["bit"] = f.bit;
    if (f.kind == FaultKind::hang && f.after_step) e["phase"] = "after-step";
    if (f.kind == FaultKind::crash && f.permanent) e["permanent"] = true;
    list.push_back(e);
  }
  return {{"seed", seed}, {"faults", list}};
}

void FaultSchedule::check_fits(int ranks, int64_t last_step) const {
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    const std::string at = "--faults: faults[" + std::to_string(i) + "] (" + f.describe() + ")";
    if (f.rank >= ranks)
      throw InputError(at + ": rank " + std::to_string(f.rank) + " does not exist: the mesh has ranks 0.." +
                       std::to_string(ranks - 1));
    if (f.step > last_step)
      throw InputError(at + ": step " + std::to_string(f.step) + " does not exist: the run trains steps 1.." +
                       std::to_string(last_step));
    if (f.kind == FaultKind::slow && f.steps > last_step - f.step + 1)
      throw InputError(at + ": \"steps\" " + std::to_string(f.steps) + " runs past the run's last step " +
                       std::to_string(last_step));
  }
}

}  // namespace llama4d
