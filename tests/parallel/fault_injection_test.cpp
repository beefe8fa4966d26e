// The fault schedule, its injector and the replica checksum, below the CLI: each kind fires once,
// on its rank and step; the bit an sdc fault flips is fixed by the seed; any single flipped bit
// changes the checksum, and a replica that differs is named by the others.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/virtual/virtual_cluster.h"
#include "core/error.h"
#include "core/comm/flight_recorder.h"
#include "core/parallel/fault_injector.h"
#include "core/parallel/fault_schedule.h"
#include "core/parallel/replica_checksum.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

FaultSchedule parse(const std::string& text) {
  return FaultSchedule::from_json(nlohmann::json::parse(text), "test");
}

TEST(FaultSchedule, RoundTripsAndChecksRanksAndSteps) {
  const FaultSchedule s = parse(R"({"seed": 5, "faults": [{"kind": "slow", "rank": 3, "step": 2, "factor": 2.5,
                                    "steps": 3}, {"kind": "sdc", "rank": 0, "step": 1, "bit": 7}]})");
  ASSERT_EQ(s.faults.size(), 2u);
  EXPECT_EQ(s.faults[0].describe(), "slow on rank 3 at step 2 (2.5x slower for 3 steps)");
  EXPECT_EQ(FaultSchedule::from_json(s.to_json(), "again").to_json(), s.to_json());
  EXPECT_NO_THROW(s.check_fits(4, 4));
  EXPECT_THROW(s.check_fits(3, 4), InputError);  // rank 3 of 3
  EXPECT_THROW(s.check_fits(4, 1), InputError);  // step 2 of 1
  EXPECT_THROW(s.check_fits(4, 3), InputError);  // slow for steps 2..4 of 3
  for (const char* bad : {R"({"faults": [{"kind": "crash", "rank": 0}]})", R"({"faults": [{"kind": "crash", "rank": 0, "step": 0}]})",
                          R"({"faults": [{"kind": "crash", "rank": 0, "step": 1.5}]})", R"({"faults": {}})",
                          R"({"faults": [], "rate": 3})", R"({"faults": [{"kind": "slow", "rank": 0, "step": 1, "factor": 1}]})",
                          R"({"faults": [{"kind": "sdc", "rank": 0, "step": 1, "bit": 64}]})"})
    EXPECT_THROW(parse(bad), InputError) << bad;
}

TEST(FaultInjector, EachFaultFiresOnceOnItsRankAndStep) {
  FaultInjector inj(parse(R"({"faults": [{"kind": "crash", "rank": 1, "step": 2},
                                         {"kind": "collective", "rank": 0, "step": 3}]})"),
                    std::chrono::milliseconds(1));
  EXPECT_NO_THROW(inj.before_step(1, 1));
  EXPECT_NO_THROW(inj.before_step(0, 2));
  EXPECT_THROW(inj.before_step(1, 2), InjectedFault);
  EXPECT_NO_THROW(inj.before_step(1, 2)) << "the restarted rank is healthy";
  EXPECT_NO_THROW(inj.on_collective(0, CommOp::all_reduce, 1)) << "not armed before step 3";
  inj.before_step(0, 3);
  EXPECT_NO_THROW(inj.on_collective(1, CommOp::all_reduce, 9)) << "another rank's link";
  EXPECT_THROW(inj.on_collective(0, CommOp::all_reduce, 9), InjectedFault);
  EXPECT_NO_THROW(inj.on_collective(0, CommOp::all_reduce, 10)) << "only the step's first collective";
  ASSERT_EQ(inj.fired().size(), 2u);
  EXPECT_EQ(inj.fired()[1].kind, FaultKind::collective);
}

TEST(FaultInjector, SdcFlipsOneSeededBitOfItsRanksWeights) {
  const FaultSchedule s = parse(R"({"seed": 9, "faults": [{"kind": "sdc", "rank": 2, "step": 4}]})");
  std::vector<float> w(100, 1.0f), before = w;
  FaultInjector inj(s, std::chrono::milliseconds(1));
  const auto bytes = std::as_writable_bytes(std::span<float>(w));
  inj.after_step(1, 4, 0, bytes, 4);
  inj.after_step(2, 3, 0, bytes, 4);
  EXPECT_EQ(w, before) << "another rank or step";
  inj.after_step(2, 4, 0, bytes, 4);
  const BitFlip b = sdc_target(s.faults[0], 9, 0, 100, 32);
  int differing_bits = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &w[i], 4);
    std::memcpy(&y, &before[i], 4);
    differing_bits += __builtin_popcount(x ^ y);
    if (x != y) {
      EXPECT_EQ(int64_t(i), b.element);
      EXPECT_EQ(x ^ y, 1u << b.bit);
    }
  }
  EXPECT_EQ(differing_bits, 1);
  EXPECT_NE(sdc_target(s.faults[0], 10, 0, 1 << 30, 32).element, b.element) << "another seed, another element";
  // A given element or bit the rank's weights do not have is named, never wrapped around.
  const FaultSchedule given = parse(R"({"faults": [{"kind": "sdc", "rank": 0, "step": 1, "element": 100, "bit": 40}]})");
  EXPECT_THROW(sdc_target(given.faults[0], 1, 0, 100, 64), InputError);  // element 100 of 100
  EXPECT_THROW(sdc_target(given.faults[0], 1, 0, 101, 32), InputError);  // bit 40 of an f32
  EXPECT_EQ(sdc_target(given.faults[0], 1, 0, 101, 64).element, 100);
  EXPECT_EQ(sdc_target(given.faults[0], 1, 0, 101, 64).bit, 40);
  const std::vector<float> flipped = w;
  inj.after_step(2, 4, 0, bytes, 4);
  EXPECT_EQ(w, flipped) << "fired once";
}

TEST(ReplicaChecksum, EverySingleBitFlipChangesIt) {
  std::vector<uint8_t> bytes(13);  // a tail shorter than a word
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 37);
  const uint64_t base = replica_checksum(std::as_bytes(std::span<uint8_t>(bytes)));
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int b = 0; b < 8; ++b) {
      bytes[i] ^= uint8_t(1 << b);
      EXPECT_NE(replica_checksum(std::as_bytes(std::span<uint8_t>(bytes))), base) << i << ":" << b;
      bytes[i] ^= uint8_t(1 << b);
    }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_NE(replica_checksum(std::as_bytes(std::span<uint8_t>(longer))), base) << "a zero appended";
}

TEST(ReplicaChecksum, TheReplicaThatDiffersIsNamedByEveryRank) {
  VirtualClusterOptions o;
  o.ranks = 4;
  o.timeout = std::chrono::milliseconds(5000);
  std::vector<std::string> errors(4);
  test::within_deadline(20, [&] {
    VirtualCluster cluster(o);
    cluster.run([&](ProcessGroup& world) {
      std::vector<float> w(50, 0.5f);
      check_replicas_agree(world, std::as_bytes(std::span<float>(w)), 1);  // all agree: no error
      if (world.rank() == 2) w[17] = std::nextafter(w[17], 1.0f);
      try {
        check_replicas_agree(world, std::as_bytes(std::span<float>(w)), 2);
      } catch (const CommError& e) {
        errors[size_t(world.rank())] = e.what();
      }
    });
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("after step 2: the weights of world rank 2 differ from the other replicas'"), std::string::npos) << e;
}

// Rank 2 of 3 stops answering before the world's call #4 (the fifth) that ranks 0 and 1 are waiting in: the
// recorders of a real virtual cluster name it, and name nobody when all finish.
TEST(FlightRecorder, NamesTheRankThatDidNotEnterTheCall) {
  VirtualClusterOptions o;
  o.ranks = 3;
  o.timeout = std::chrono::milliseconds(300);
  std::vector<std::vector<FlightEntry>> ranks;
  test::within_deadline(20, [&] {
    VirtualCluster cluster(o);
    const auto calls = [](ProcessGroup& world, int n) {
      std::vector<float> v(10, 1.0f);
      for (int i = 0; i < n; ++i) world.all_reduce(v.data(), 10, DType::f32, ReduceOp::sum);
    };
    cluster.run([&](ProcessGroup& world) { calls(world, 2); });
    std::vector<std::vector<FlightEntry>> clean;
    for (int r = 0; r < 3; ++r) clean.push_back(cluster.accounting(r).flight.entries());
    EXPECT_EQ(flight_diagnosis(clean), "");
    ASSERT_EQ(clean[1].size(), 2u);
    EXPECT_EQ(clean[1][1].seq, 1);
    EXPECT_EQ(clean[1][1].bytes, 40);
    EXPECT_EQ(clean[1][1].state, FlightEntry::State::completed);
    EXPECT_THROW(cluster.run([&](ProcessGroup& world) {
                   calls(world, 4);
                   if (world.rank() == 2) {  // hangs past its peers' timeout, then leaves
                     std::this_thread::sleep_for(std::chrono::milliseconds(600));
                     return;
                   }
                   calls(world, 1);
                 }),
                 CommError);
    for (int r = 0; r < 3; ++r) ranks.push_back(cluster.accounting(r).flight.entries());
  });
  EXPECT_EQ(flight_diagnosis(ranks).rfind("rank 2 did not enter all_reduce(count=10, F32, sum) #4 on group 'world' "
                                          "(its last: #3, completed)", 0),
            0u)
      << flight_diagnosis(ranks);
  EXPECT_EQ(ranks[0].back().state, FlightEntry::State::failed);
  EXPECT_NE(ranks[0].back().error.find("rank 2"), std::string::npos) << ranks[0].back().error;
  FlightRecorder small(2);
  for (int i = 0; i < 3; ++i) small.issued({});
  small.completed(0);  // dropped: no effect
  small.completed(2);
  ASSERT_EQ(small.entries().size(), 2u);
  EXPECT_EQ(small.entries()[0].id, 1);
  EXPECT_EQ(small.entries()[1].state, FlightEntry::State::completed);
}

// A rank whose full recorder holds only other groups' calls may have entered the lagging call
// before those pushed it out: it is named as not seen, after the ranks seen lagging.
TEST(FlightRecorder, ARankWhoseRecorderFilledWithOtherCallsIsNotSeenRatherThanBlamed) {
  const auto entry = [](const std::string& group, std::vector<int> members, int64_t seq) {
    FlightEntry e;
    e.group = group, e.members = std::move(members), e.seq = seq, e.call = "all_reduce(count=1, F32, sum)";
    e.state = FlightEntry::State::completed;
    return e;
  };
  std::vector<std::vector<FlightEntry>> ranks(2);
  ranks[0].push_back(entry("world", {0, 1}, 7));
  for (size_t i = 0; i < kFlightRecorderEntries; ++i) ranks[1].push_back(entry("tp", {1}, int64_t(i)));
  EXPECT_EQ(flight_diagnosis(ranks), "rank 1: no call on group 'world' among its last 32 recorded (the others reached "
                                     "all_reduce(count=1, F32, sum) #7)");
  ranks[1].pop_back();  // a recorder with room left kept every call: rank 1 never entered
  EXPECT_EQ(flight_diagnosis(ranks).rfind("rank 1 did not enter all_reduce(count=1, F32, sum) #7 on group 'world' "
                                          "(its last: none recorded)", 0),
            0u)
      << flight_diagnosis(ranks);
}

}  // namespace
}  // namespace llama4d
