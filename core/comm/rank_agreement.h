#pragma once
// Before a job's first collective, its ranks check that they were launched alike: every rank
// passes its settings (the options, the model config, a fingerprint of the data: whatever decides
// what the ranks compute together), and each must equal rank 0's. Processes started by mpirun
// each parse their own command line (`mpirun -np 2 llama4d train ... : -np 2 llama4d train ...
// --lr 0.01`), so without the check the ranks would train a mix of two runs and save weights that
// match neither.
//
//   check_ranks_agree(world, {{"--lr", "0.001"}, {"--seed", "1337"}, {"model config rope_theta", "500000"}});
//
// Collective over `group`, two all-gathers of fixed shape (the blobs' lengths, then every blob
// padded to the longest), so it honours the group's timeout and cannot itself mismatch. Every rank
// reaches the same verdict: InputError naming the first setting (in the order given) where the
// lowest disagreeing rank differs from rank 0, with both values. On virtual GPUs every rank is a
// thread of one process that parsed one command line, so there is nothing to disagree on.
#include <string>
#include <vector>

#include "core/comm/process_group.h"

namespace llama4d {

struct RankSetting {
  std::string name;   // how the user sets it: "--lr", "--mesh", "model config rope_theta"
  std::string value;  // as text; compared byte for byte
};

void check_ranks_agree(ProcessGroup& group, const std::vector<RankSetting>& settings);

// The two halves of the check, for launches that exchange the settings another way (the NCCL
// backend's rendezvous store: backends/store/store_agreement.h), so every route reaches the same
// verdict in the same words.
// The settings as the bytes the ranks exchange.
std::string settings_blob(const std::vector<RankSetting>& settings);
// Rank `rank`'s blob against rank 0's: "" when they agree, else the message of the InputError
// naming the first setting that differs and both values.
std::string rank_disagreement(const std::string& rank0_blob, const std::string& rank_blob, int rank);

}  // namespace llama4d
