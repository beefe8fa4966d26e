// A job's ranks check, before their first collective, that they were launched alike
// (core/comm/rank_agreement.h, issue 52 item 1): here each virtual GPU passes settings of its own,
// as MPI processes with their own command lines would.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/rank_agreement.h"
#include "core/error.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

using test::contains;
using test::within_deadline;

// Runs check_ranks_agree on `ranks` virtual GPUs, rank r passing settings(r); returns each rank's
// InputError message ("" where it passed).
std::vector<std::string> agree(int ranks, const std::function<std::vector<RankSetting>(int)>& settings) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::mutex mu;
  within_deadline(20, [&] {
    VirtualClusterOptions o;
    o.ranks = ranks;
    o.timeout = std::chrono::seconds(5);
    VirtualCluster cluster(o);
    cluster.run([&](ProcessGroup& world) {
      try {
        check_ranks_agree(world, settings(world.rank()));
      } catch (const InputError& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors[size_t(world.rank())] = e.what();
      }
    });
  });
  return errors;
}

std::vector<RankSetting> launch(const std::string& lr, const std::string& mesh = "dp=4") {
  return {{"--mesh", mesh}, {"--seed", "1337"}, {"--lr", lr}, {"model config rope_theta", "500000"}};
}

TEST(RankAgreement, RanksLaunchedAlikePass) {
  for (const std::string& e : agree(4, [](int) { return launch("0.001"); })) EXPECT_EQ(e, "");
}

TEST(RankAgreement, EveryRankNamesTheSettingAndBothValues) {
  // Rank 2 alone has another --lr, and a longer blob than the others (the padding is not compared).
  const std::vector<std::string> errors = agree(4, [](int r) { return launch(r == 2 ? "0.0100000" : "0.001"); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(contains(errors[size_t(r)], "the ranks disagree on --lr: rank 0 has 0.001, rank 2 has 0.0100000"))
        << "rank " << r << ": " << errors[size_t(r)];
  }
}

TEST(RankAgreement, TheFirstSettingOfTheLowestRankThatDiffersIsNamed) {
  // Rank 1 differs in --lr, rank 3 in --mesh (which comes first): the lowest rank is reported,
  // so every rank says the same.
  const std::vector<std::string> errors = agree(4, [](int r) {
    return r == 1 ? launch("0.002") : r == 3 ? launch("0.001", "dp=2,tp=2") : launch("0.001");
  });
  for (const std::string& e : errors) EXPECT_TRUE(contains(e, "on --lr: rank 0 has 0.001, rank 1 has 0.002")) << e;
}

TEST(RankAgreement, AValueThatDiffersOnlyBeyondAnotherRanksLengthIsCaught) {
  // "0.001" against "0.0010": the same prefix, a longer value.
  const std::vector<std::string> errors = agree(2, [](int r) { return launch(r == 0 ? "0.001" : "0.0010"); });
  for (const std::string& e : errors) EXPECT_TRUE(contains(e, "rank 1 has 0.0010")) << e;
}

TEST(RankAgreement, OtherSettingsThanRankZerosAreRefused) {
  // Another build checks another list: named, not compared position by position as values.
  const std::vector<std::string> errors = agree(2, [](int r) {
    std::vector<RankSetting> s = launch("0.001");
    if (r == 1) s.push_back({"--new-flag", "1"});
    return s;
  });
  for (const std::string& e : errors) EXPECT_TRUE(contains(e, "rank 1 checks other settings than rank 0 (--new-flag")) << e;
}

TEST(RankAgreement, AnEmptyValueIsShownAsEmpty) {
  const std::vector<std::string> errors = agree(2, [](int r) { return launch(r == 0 ? "0.001" : ""); });
  for (const std::string& e : errors) EXPECT_TRUE(contains(e, "rank 1 has (empty)")) << e;
}

}  // namespace
}  // namespace llama4d
