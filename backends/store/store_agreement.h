#pragma once
// The ranks' agreement on their settings (core/comm/rank_agreement.h) for a job whose processes
// meet through the rendezvous store (the NCCL backend's torchrun-style launch), before any NCCL
// call: rank 0 publishes its settings, every other rank compares its own with them and sends rank
// 0 its verdict, and rank 0 publishes the lowest disagreeing rank's verdict to all. Every rank
// then throws the same InputError, as check_ranks_agree over a process group does; the store
// holds rank 0's settings once and a verdict per rank (a few bytes each when they agree).
// A rank that does not come within the store's timeout: CommError naming it.
#include <vector>

#include "backends/store/rendezvous.h"
#include "core/comm/rank_agreement.h"

namespace llama4d::store {

void check_ranks_agree(Rendezvous& rdzv, const std::vector<RankSetting>& settings);

}  // namespace llama4d::store
