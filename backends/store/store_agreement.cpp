#include "backends/store/store_agreement.h"

#include "core/error.h"

namespace llama4d::store {

void check_ranks_agree(Rendezvous& rdzv, const std::vector<RankSetting>& settings) {
  const std::string mine = settings_blob(settings);
  const std::vector<uint8_t> lead_bytes =
      rdzv.broadcast("agree/settings", rdzv.rank() == 0 ? std::vector<uint8_t>(mine.begin(), mine.end()) : std::vector<uint8_t>{});
  const std::string verdict =
      rdzv.rank() == 0 ? "" : rank_disagreement(std::string(lead_bytes.begin(), lead_bytes.end()), mine, rdzv.rank());
  rdzv.store().set("agree/verdict/" + std::to_string(rdzv.rank()), std::vector<uint8_t>(verdict.begin(), verdict.end()));
  std::string first;  // rank 0: the lowest disagreeing rank's verdict
  if (rdzv.rank() == 0)
    for (int r = 1; r < rdzv.world_size() && first.empty(); ++r) {
      const std::vector<uint8_t> v = rdzv.store().get("agree/verdict/" + std::to_string(r));
      first.assign(v.begin(), v.end());
    }
  const std::vector<uint8_t> outcome =
      rdzv.broadcast("agree/outcome", rdzv.rank() == 0 ? std::vector<uint8_t>(first.begin(), first.end()) : std::vector<uint8_t>{});
  // Rank 0's store must outlive every rank's read of the outcome: each says it has it, and rank 0
  // waits for all before it may throw (and its server stop).
  if (rdzv.rank() != 0) rdzv.store().set("agree/read/" + std::to_string(rdzv.rank()), {1});
  for (int r = 1; rdzv.rank() == 0 && r < rdzv.world_size(); ++r) rdzv.store().get("agree/read/" + std::to_string(r));
  if (!outcome.empty()) throw InputError(std::string(outcome.begin(), outcome.end()));
}

}  // namespace llama4d::store
