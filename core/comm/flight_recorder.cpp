#include "core/comm/flight_recorder.h"

#include <map>

#include <nlohmann/json.hpp>

namespace llama4d {

namespace {

const char* state_name(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::State::issued: return "in flight";
    case FlightEntry::State::completed: return "completed";
    default: return "failed";
  }
}

}  // namespace

int64_t FlightRecorder::issued(FlightEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  entry.id = next_id_++;
  entries_.push_back(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_front();
  return entries_.back().id;
}

FlightEntry* FlightRecorder::find(int64_t id) {
  if (entries_.empty() || id < entries_.front().id) return nullptr;  // dropped off the end
  return &entries_[size_t(id - entries_.front().id)];
}

void FlightRecorder::completed(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = find(id)) e->state = FlightEntry::State::completed;
}

void FlightRecorder::failed(int64_t id, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightEntry* e = find(id)) e->state = FlightEntry::State::failed, e->error = error;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {entries_.begin(), entries_.end()};
}

nlohmann::json flight_json(const std::vector<std::vector<FlightEntry>>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    nlohmann::json list = nlohmann::json::array();
    for (const FlightEntry& e : ranks[r]) {
      nlohmann::json j = {{"id", e.id},     {"group", e.group}, {"members", e.members}, {"seq", e.seq},
                          {"call", e.call}, {"bytes", e.bytes}, {"state", state_name(e.state)}};
      if (!e.error.empty()) j["error"] = e.error;
      list.push_back(j);
    }
    out.push_back({{"rank", r}, {"entries", list}});
  }
  return {{"ranks", out}, {"diagnosis", flight_diagnosis(ranks)}};
}

std::string flight_diagnosis(const std::vector<std::vector<FlightEntry>>& ranks) {
  // Per group (name and members: the world and a tp group may have the same members, each with
  // its own sequence numbers): each member's last collective entry; per rank: a call it is blocked in.
  std::map<std::pair<std::string, std::vector<int>>, std::map<int, const FlightEntry*>> last;
  std::vector<const FlightEntry*> blocked(ranks.size(), nullptr);
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const FlightEntry& e : ranks[r]) {
      if (e.seq >= 0) last[{e.group, e.members}][int(r)] = &e;
      if (e.state != FlightEntry::State::completed) blocked[r] = &e;
    }
  // A lagging rank blocked in another call is held up by someone else: the ranks that lag while
  // blocked in nothing (hung, crashed or slow outside communication) come first.
  std::string first, then;
  for (const auto& [key, by_rank] : last) {
    const std::vector<int>& members = key.second;
    const FlightEntry* ahead = nullptr;
    for (const auto& [r, e] : by_rank)
      if (!ahead || e->seq > ahead->seq) ahead = e;
    for (const int m : members) {
      const auto it = by_rank.find(m);
      if (size_t(m) >= ranks.size() || (it != by_rank.end() && it->second->seq >= ahead->seq)) continue;
      std::string line = "rank " + std::to_string(m);
      if (it == by_rank.end() && ranks[size_t(m)].size() >= kFlightRecorderEntries) {
        // Its last entries are all on other groups: the call may be older than they are.
        if (!then.empty()) then += "\n";
        then += line + ": no call on group '" + ahead->group + "' among its last " +
                std::to_string(ranks[size_t(m)].size()) + " recorded (the others reached " + ahead->call + " #" +
                std::to_string(ahead->seq) + ")";
        continue;
      }
      line += " did not enter " + ahead->call;
      line += " #" + std::to_string(ahead->seq);
      line += " on group '" + ahead->group;
      line += "' (its last: ";
      if (it == by_rank.end()) {
        line += "none recorded)";
      } else {
        line += '#';
        line += std::to_string(it->second->seq);
        line += std::string(", ") + state_name(it->second->state) + ")";
      }
      const FlightEntry* b = blocked[size_t(m)];
      if (b) line += "; it is blocked in " + b->call + " on group '" + b->group + "'";
      std::string& to = b ? then : first;
      if (!to.empty()) to += "\n";
      to += line;
    }
  }
  return first.empty() || then.empty() ? first + then : first + "\n" + then;
}

}  // namespace llama4d
