// Every collective, checked on groups of 1, 2, 3, 4 and 8 virtual ranks with both reduction
// algorithms. The same binary runs the same checks on real processes:
//   mpirun -np 4 comm_collectives_test --backend=mpi [--no-cross-memory-attach]
// where the groups are the MPI world (4 ranks) and its sub-groups of 1, 2 and 3 ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "backends/virtual/virtual_cluster.h"
#include "tests/comm/collective_checks.h"
#include "tests/comm/host_collective_reduce.h"
#include "tests/common/tier.h"
#include "tests/ops/operand_log.h"
#ifdef LLAMA4D_HAVE_MPI
#include "backends/mpi/mpi_session.h"
#endif

namespace llama4d::test {
namespace {

#ifdef LLAMA4D_HAVE_MPI
std::unique_ptr<MpiSession> g_mpi;  // set by main() for --backend=mpi
#endif

// Runs fn on every rank of groups of several sizes on the selected backend.
void on_groups(ReduceAlgo algo, const std::function<void(ProcessGroup&)>& fn) {
#ifdef LLAMA4D_HAVE_MPI
  if (g_mpi) {
    std::shared_ptr<ProcessGroup> world = g_mpi->new_world(algo);
    for (int n = 1; n <= world->size(); ++n) {
      if (world->rank() < n) {
        std::vector<int> ranks;
        for (int r = 0; r < n; ++r) ranks.push_back(r);
        std::shared_ptr<ProcessGroup> g = n == world->size() ? world : world->new_group(ranks, "first" + std::to_string(n));
        fn(*g);
      }
      world->barrier();
    }
    return;
  }
#endif
  for (int n : {1, 2, 3, 4, 8}) {
    VirtualClusterOptions o;
    o.ranks = n;
    o.algo = algo;
    VirtualCluster cluster(o);
    cluster.run(fn);
  }
}

class Collectives : public ::testing::TestWithParam<ReduceAlgo> {};

TEST_P(Collectives, AllReduce) { on_groups(GetParam(), check_all_reduce); }
TEST_P(Collectives, ReduceScatter) { on_groups(GetParam(), check_reduce_scatter); }
TEST_P(Collectives, AllGather) { on_groups(GetParam(), check_all_gather); }
TEST_P(Collectives, Broadcast) { on_groups(GetParam(), check_broadcast); }
TEST_P(Collectives, SendRecv) { on_groups(GetParam(), check_send_recv); }
TEST_P(Collectives, AllToAll) { on_groups(GetParam(), check_all_to_all); }
TEST_P(Collectives, BarrierAndAsync) { on_groups(GetParam(), check_barrier_and_async); }
TEST_P(Collectives, SymmetricMemory) {
  on_groups(GetParam(), [](ProcessGroup& pg) {
    check_symmetric_allocation(pg);
    with_symmetric_buffers(pg, check_all_reduce);
    with_symmetric_buffers(pg, check_reduce_scatter);
    with_symmetric_buffers(pg, check_all_gather);
    with_symmetric_buffers(pg, check_broadcast);
  });
}

// Virtual GPUs whose buffers are the compute backend's memory hand every reduction to the
// backend (ComputeBackend::collective_reduce: the CUDA backend reduces on the GPU) and every copy
// to its device_memcpy (device to device on a GPU), send payloads included. The logging backend
// (tests/ops/operand_log.h) takes the reductions, on the host, and logs what memory they and the
// copies touch: every buffer here is the backend's, and every collective still gives the values
// and bits the checks derive.
TEST_P(Collectives, ThroughTheComputeBackend) {
#ifdef LLAMA4D_HAVE_MPI
  if (g_mpi) GTEST_SKIP() << "virtual GPUs only";
#endif
  LoggingOperands logging(&host_collective_reduce);
  on_groups(GetParam(), [](ProcessGroup& pg) { with_backend_buffers(pg, check_everything); });
  const OperandLog log = logging.log();
  EXPECT_GT(log.copies_on_backend, 0);
  EXPECT_EQ(log.copies_touching_host, 0);
  EXPECT_GT(log.collective_reductions_on_backend, 0);
  for (const auto& x : log.collective_reductions_touching_host) ADD_FAILURE() << x.describe();
}

std::atomic<int> g_reductions{0};
int g_fail_at = 1;                        // which reduction call fails (counting from 0)
std::chrono::milliseconds g_fail_delay{0};  // how long it runs before it fails
// host_collective_reduce, but call g_fail_at fails, after g_fail_delay, as a GPU's could.
void reduce_failing_once(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, DType dtype,
                         ReduceOp op, int group_size, bool step_rounding) {
  if (g_reductions++ == g_fail_at) {
    std::this_thread::sleep_for(g_fail_delay);
    throw Error("collective_reduce: the device was lost");
  }
  host_collective_reduce(outs, n_outs, inputs, n, count, dtype, op, group_size, step_rounding);
}

// A member whose share of a collective fails in the backend (a GPU error, its memory) stops the
// world: the run ends with that error on every rank, no peer waits for the member, and none
// reads its buffers after it unwound (its peers' shares finish before it frees them).
// Returns how many reductions were called.
int expect_a_failed_reduction_stops_every_rank(int fail_at, std::chrono::milliseconds delay) {
  LoggingOperands logging(&reduce_failing_once);
  g_reductions = 0;
  g_fail_at = fail_at;
  g_fail_delay = delay;
  VirtualClusterOptions o;
  o.ranks = 4;
  VirtualCluster cluster(o);
  try {
    cluster.run([](ProcessGroup& pg) {
      const ops::ComputeBackend& backend = ops::compute_backend();
      std::unique_ptr<float, std::function<void(float*)>> x(static_cast<float*>(backend.device_alloc(1024 * 4)),
                                                            [&](float* p) { backend.device_free(p); });
      std::fill(x.get(), x.get() + 1024, 1.0f);
      pg.all_reduce(x.get(), 1024, DType::f32, ReduceOp::sum);
    });
    ADD_FAILURE() << "the run should have failed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the device was lost"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cluster.failures().size(), 4u);
  return g_reductions.load();
}

// The second share fails while the others may still be moving data.
TEST(VirtualCollectives, AFailedReductionStopsEveryRank) {
#ifdef LLAMA4D_HAVE_MPI
  if (g_mpi) GTEST_SKIP() << "virtual GPUs only";
#endif
  expect_a_failed_reduction_stops_every_rank(1, std::chrono::milliseconds(0));
}

// The last share fails after every other member finished its own (the pause lets them reach the
// wait for the rest): they must not return as if the collective had completed, with that
// member's chunk never reduced. Without the pause the order of the two is a race.
TEST(VirtualCollectives, AShareFailingAfterTheOthersFinishedStopsEveryRank) {
#ifdef LLAMA4D_HAVE_MPI
  if (g_mpi) GTEST_SKIP() << "virtual GPUs only";
#endif
  EXPECT_EQ(expect_a_failed_reduction_stops_every_rank(3, std::chrono::milliseconds(100)), 4)
      << "one reduction per member: the one that failed was the last";
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Collectives, ::testing::Values(ReduceAlgo::ordered, ReduceAlgo::ring),
                         [](const ::testing::TestParamInfo<ReduceAlgo>& info) {
                           return std::string(reduce_algo_name(info.param));
                         });
// Tiers: the sanitizer presets run every collective with both algorithms, and the two heaviest
// (symmetric memory, the compute backend's buffers) with the ordered one, whose code the ring's
// shares there.
[[maybe_unused]] const bool kCollectiveTiers =
    test::declare_tiers({{"Algorithms/Collectives.SymmetricMemory/ordered", test::Tier::sanitizer},
                         {"Algorithms/Collectives.SymmetricMemory/ring", test::Tier::full},
                         {"Algorithms/Collectives.ThroughTheComputeBackend/ordered", test::Tier::sanitizer},
                         {"Algorithms/Collectives.ThroughTheComputeBackend/ring", test::Tier::full}});

}  // namespace
}  // namespace llama4d::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const int listed = llama4d::test::list_tests_if_asked(argc, argv); listed >= 0) return listed;
  bool mpi = false, cma = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend=mpi") == 0) {
      mpi = true;
    } else if (std::strcmp(argv[i], "--no-cross-memory-attach") == 0) {
      cma = false;  // MPI: node-local collectives only through symmetric memory, the rest by messages
    } else if (std::strcmp(argv[i], "--backend=virtual") != 0) {
      std::fprintf(stderr, "unknown argument '%s' (expected --backend=virtual, --backend=mpi, --no-cross-memory-attach)\n",
                   argv[i]);
      return 2;
    }
  }
  if (mpi) {
#ifdef LLAMA4D_HAVE_MPI
    llama4d::MpiOptions options;
    options.cross_memory_attach = cma;
    llama4d::test::g_mpi = std::make_unique<llama4d::MpiSession>(options);
#else
    std::fprintf(stderr, "this build has no MPI backend\n");
    return 2;
#endif
  }
  const int result = RUN_ALL_TESTS();
#ifdef LLAMA4D_HAVE_MPI
  llama4d::test::g_mpi.reset();
#endif
  return result;
}
