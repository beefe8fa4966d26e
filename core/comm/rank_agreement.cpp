#include "core/comm/rank_agreement.h"

#include <algorithm>
#include <cstdint>

#include "core/comm/traffic_labels.h"
#include "core/comm/work.h"
#include "core/error.h"

namespace llama4d {

namespace {

std::vector<RankSetting> parse(const std::string& blob) {
  std::vector<RankSetting> out;
  size_t at = 0;
  while (at < blob.size()) {
    const size_t name_end = blob.find('\0', at);
    const size_t value_end = name_end == std::string::npos ? name_end : blob.find('\0', name_end + 1);
    if (value_end == std::string::npos) break;  // cut short: compared as a missing setting
    out.push_back({blob.substr(at, name_end - at), blob.substr(name_end + 1, value_end - name_end - 1)});
    at = value_end + 1;
  }
  return out;
}

std::string shown(const std::string& value) { return value.empty() ? "(empty)" : value; }

}  // namespace

// name '\0' value '\0', for every setting in order. Names and values hold no NUL (command-line
// text and JSON dumps cannot).
std::string settings_blob(const std::vector<RankSetting>& settings) {
  std::string blob;
  for (const RankSetting& s : settings) {
    blob += s.name;
    blob += '\0';
    blob += s.value;
    blob += '\0';
  }
  return blob;
}

std::string rank_disagreement(const std::string& rank0_blob, const std::string& rank_blob, int rank) {
  const std::vector<RankSetting> lead = parse(rank0_blob), theirs = parse(rank_blob);
  const std::string r = std::to_string(rank);
  for (size_t i = 0; i < std::max(lead.size(), theirs.size()); ++i) {
    if (i >= lead.size() || i >= theirs.size() || lead[i].name != theirs[i].name)
      return "rank " + r + " checks other settings than rank 0 (" + (i < theirs.size() ? theirs[i].name : "none") +
             " where rank 0 has " + (i < lead.size() ? lead[i].name : "none") +
             "): every rank of a job must run the same llama4d build and command";
    if (lead[i].value != theirs[i].value)
      return "the ranks disagree on " + lead[i].name + ": rank 0 has " + shown(lead[i].value) + ", rank " + r +
             " has " + shown(theirs[i].value) +
             " (every rank of a job must be launched with the same options, model config and data)";
  }
  return "";
}

void check_ranks_agree(ProcessGroup& group, const std::vector<RankSetting>& settings) {
  const std::string mine = settings_blob(settings);
  const int n = group.size();
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  const int64_t length = int64_t(mine.size());
  AllGatherOptions o;
  o.label = std::string(label::kRankAgreement);
  group.all_gather(lengths.data(), &length, 1, DType::i64, o)->wait();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::string padded = mine;
  padded.resize(size_t(longest), '\0');
  std::string all(size_t(longest) * size_t(n), '\0');
  group.all_gather(all.data(), padded.data(), longest, DType::u8, o)->wait();

  const std::string lead = all.substr(0, size_t(lengths[0]));
  for (int r = 1; r < n; ++r) {
    const std::string why = rank_disagreement(lead, all.substr(size_t(r) * size_t(longest), size_t(lengths[size_t(r)])), r);
    if (!why.empty()) throw InputError(why);
  }
}

}  // namespace llama4d
