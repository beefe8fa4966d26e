#include "core/parallel/replica_checksum.h"

#include <cstring>
#include <map>
#include <vector>

#include "core/comm/work.h"
#include "core/error.h"

namespace llama4d {

uint64_t replica_checksum(std::span<const std::byte> bytes) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ uint64_t(bytes.size());
  const size_t words = bytes.size() / 8, tail = bytes.size() % 8;
  // Whole words, then the tail (if any) as a zero-padded word.
  for (size_t i = 0; i < words + (tail > 0); ++i) {
    uint64_t w = 0;
    std::memcpy(&w, bytes.data() + 8 * i, i < words ? 8 : tail);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

void check_replicas_agree(ProcessGroup& replicas, std::span<const std::byte> weights, int64_t step) {
  if (replicas.size() < 2) return;
  const uint64_t mine = replica_checksum(weights);
  std::vector<uint64_t> all(size_t(replicas.size()));
  replicas.all_gather(all.data(), &mine, 1, DType::i64)->wait();
  std::map<uint64_t, int> votes;
  for (const uint64_t c : all) ++votes[c];
  if (votes.size() == 1) return;
  uint64_t majority = all[0];
  for (const auto& [c, n] : votes)
    if (n > votes[majority]) majority = c;
  const bool tie = votes[majority] * 2 <= replicas.size();
  std::string odd, values;
  char hex[24];
  for (int r = 0; r < replicas.size(); ++r) {
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)all[size_t(r)]);
    values += (r ? ", " : "") + std::string(hex);
    if (tie || all[size_t(r)] != majority)
      odd += (odd.empty() ? "" : ", ") + std::to_string(replicas.world_ranks()[size_t(r)]);
  }
  throw CommError("silent data corruption after step " + std::to_string(step) + ": the weights of world rank" +
                  (odd.find(',') != std::string::npos ? "s " : " ") + odd + " differ from " +
                  (tie ? "each other" : "the other replicas'") + " in " + replicas.name() + " (checksums " + values +
                  ")");
}

}  // namespace llama4d
