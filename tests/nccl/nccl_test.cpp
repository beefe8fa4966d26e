#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "backends/nccl/device_reduce.h"
#include "backends/nccl/nccl_job.h"
#include "backends/nccl/nccl_library.h"
#include "backends/nccl/nccl_session.h"
#include "backends/store/launch_env.h"
#include "backends/store/rendezvous.h"
#include "backends/store/socket_io.h"
#include "backends/virtual/virtual_cluster.h"
#include "core/comm/reduce_kernels.h"
#include "core/error.h"
#include "tests/comm/test_util.h"
#include "tests/comm/collective_checks.h"

namespace llama4d::test {
namespace {

// The CLI these tests start: the build's (LLAMA4D_BIN), or $LLAMA4D_BIN where the binaries were
// copied to another machine (scripts/gpu_session.sh).
std::string llama4d_bin() {
  const char* moved = std::getenv("LLAMA4D_BIN");
  return moved != nullptr && *moved != '\0' ? moved : LLAMA4D_BIN;
}

using namespace std::chrono_literals;

// Why libnccl cannot be used here ("" when it can).
std::string library_missing() {
  try {
    nccl_detail::nccl();
    return "";
  } catch (const CommError& e) {
    return e.what();
  }
}

#define REQUIRE_LIBRARY()                                           \
  do {                                                              \
    const std::string why = library_missing();                      \
    if (!why.empty()) GTEST_SKIP() << "no NCCL library: " << why;   \
  } while (0)

#define REQUIRE_NCCL_GPU()                                                \
  do {                                                                    \
    const std::string why = nccl_unusable_reason();                       \
    if (!why.empty()) GTEST_SKIP() << "no GPU for NCCL here: " << why;    \
  } while (0)

// A one-process job: nobody else needs the ids.
NcclBootstrap alone(int size = 1) {
  NcclBootstrap b;
  b.size = size;
  b.broadcast = [](const std::vector<uint8_t>& ids) { return ids; };
  return b;
}


// ---- without a GPU ---------------------------------------------------------------------------

TEST(NcclLibrary, LoadsOrNamesWhatIsMissing) {
  const std::string why = library_missing();
  if (!why.empty()) {
    EXPECT_NE(why.find("libnccl.so.2"), std::string::npos) << why;
    return;
  }
  const nccl_detail::NcclLibrary& lib = nccl_detail::nccl();
  EXPECT_GE(lib.version, 21900);
  EXPECT_FALSE(lib.path.empty());
}

TEST(NcclUniqueId, IsFreshOnEveryCall) {
  REQUIRE_LIBRARY();
  const std::vector<uint8_t> a = make_nccl_unique_id(), b = make_nccl_unique_id();
  ASSERT_EQ(a.size(), sizeof(ncclUniqueId));
  EXPECT_NE(a, std::vector<uint8_t>(a.size(), 0));
  EXPECT_NE(a, b);
}

TEST(NcclBootstrap, TheStoreGivesEveryRankWhatRankZeroSent) {
  const int port = [] {
    store::Fd fd = store::listen_on(0);
    return store::bound_port(fd.get());
  }();
  constexpr int kRanks = 3;
  std::vector<uint8_t> sent(384);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = uint8_t(i * 7 + 1);
  std::vector<std::vector<uint8_t>> got(kRanks);
  std::vector<int> ranks(kRanks, -1), sizes(kRanks, -1), local(kRanks, -2);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      store::LaunchEnv env;
      env.rank = r, env.world_size = kRanks, env.master_addr = "127.0.0.1", env.master_port = port;
      store::Rendezvous rdzv(env, 20s);
      const NcclBootstrap b = bootstrap_from_store(rdzv, r == 2 ? std::optional<int>(1) : std::nullopt);
      ranks[size_t(r)] = b.rank, sizes[size_t(r)] = b.size, local[size_t(r)] = b.local_rank;
      got[size_t(r)] = b.broadcast(r == 0 ? sent : std::vector<uint8_t>{});
      rdzv.finish();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(got[size_t(r)], sent) << "rank " << r;
    EXPECT_EQ(ranks[size_t(r)], r);
    EXPECT_EQ(sizes[size_t(r)], kRanks);
  }
  EXPECT_EQ(local, (std::vector<int>{-1, -1, 1}));
}

TEST(NcclBootstrap, AHostGroupBroadcastsTheIds) {
  std::vector<uint8_t> sent(384);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = uint8_t(255 - i % 251);
  VirtualClusterOptions o;
  o.ranks = 4;
  VirtualCluster cluster(o);
  std::vector<std::vector<uint8_t>> got(4);
  cluster.run([&](ProcessGroup& world) {
    const NcclBootstrap b = bootstrap_from_group(world, world.rank());
    EXPECT_EQ(b.rank, world.rank());
    EXPECT_EQ(b.size, 4);
    EXPECT_EQ(b.local_rank, world.rank());
    got[size_t(world.rank())] = b.broadcast(world.rank() == 0 ? sent : std::vector<uint8_t>{});
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[size_t(r)], sent) << "rank " << r;
}

TEST(NcclSession, RefusesAnInconsistentBootstrap) {
  NcclBootstrap b = alone(2);
  b.rank = 2;
  EXPECT_NE(error_of([&] { NcclSession s({}, b); }).find("inconsistent bootstrap (rank 2 of 2)"), std::string::npos);
  b = alone();
  b.broadcast = nullptr;
  EXPECT_NE(error_of([&] { NcclSession s({}, b); }).find("inconsistent bootstrap"), std::string::npos);
  NcclOptions o;
  o.timeout = 0ms;
  EXPECT_NE(error_of([&] { NcclSession s(o, alone()); }).find("timeout must be positive"), std::string::npos);
}

TEST(NcclSession, WithoutAGpuFailsWithTheReason) {
  const std::string why = nccl_unusable_reason();
  if (why.empty()) GTEST_SKIP() << "a GPU is here: the tests below start real sessions";
  try {
    NcclSession s({}, alone());
    ADD_FAILURE() << "a session started without a usable GPU";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
  // And the failed start left nothing behind: a second attempt says the same.
  EXPECT_EQ(error_of([] { NcclSession s({}, alone()); }), why);
}

// ---- on a GPU --------------------------------------------------------------------------------

// Managed memory filled with random bytes that are valid values of `t` (floats: finite).
std::vector<unsigned char> random_values(DType t, int64_t count, std::mt19937& rng) {
  std::vector<unsigned char> v(size_t(count) * dtype_size(t));
  std::uniform_real_distribution<float> f(-100.f, 100.f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < count; ++i) {
    unsigned char* p = v.data() + size_t(i) * dtype_size(t);
    switch (t) {
      case DType::f32: { const float x = f(rng) * std::ldexp(1.f, byte(rng) % 20 - 10); std::memcpy(p, &x, 4); break; }
      case DType::f64: { const double x = double(f(rng)) / 3.0 * std::ldexp(1.0, byte(rng) % 40 - 20); std::memcpy(p, &x, 8); break; }
      case DType::bf16: { const bf16 x = float_to_bf16(f(rng)); std::memcpy(p, &x, 2); break; }
      default:
        for (size_t k = 0; k < dtype_size(t); ++k) p[k] = uint8_t(byte(rng));
    }
  }
  return v;
}

TEST(NcclReduceKernel, GivesTheHostReductionsBits) {
  REQUIRE_NCCL_GPU();
  std::mt19937 rng(7);
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::u8})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
      for (int n : {1, 2, 3, 5})
        for (bool step_rounding : {false, true}) {
          const int64_t count = 1000 + n, elem = int64_t(dtype_size(t));
          const std::vector<unsigned char> in = random_values(t, count * n, rng);
          std::vector<const void*> inputs;
          for (int j = 0; j < n; ++j) inputs.push_back(in.data() + size_t(j * count * elem));
          std::vector<unsigned char> want(size_t(count * elem));
          reduce_sequence(want.data(), inputs.data(), n, count, t, op, n + 1, step_rounding);
          void *d_in = nullptr, *d_out = nullptr;
          ASSERT_EQ(cudaMallocManaged(&d_in, in.size()), cudaSuccess);
          ASSERT_EQ(cudaMallocManaged(&d_out, want.size()), cudaSuccess);
          std::memcpy(d_in, in.data(), in.size());
          nccl_detail::reduce_sequence_on_device(d_out, d_in, count, n, count, t, op, n + 1, step_rounding, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(std::memcmp(d_out, want.data(), want.size()), 0)
              << dtype_name(t) << " " << reduce_op_name(op) << " n=" << n << " step_rounding=" << step_rounding;
          cudaFree(d_in);
          cudaFree(d_out);
        }
}

class NcclWorldOfOne : public ::testing::TestWithParam<ReduceAlgo> {};

TEST_P(NcclWorldOfOne, PassesTheCollectiveSuite) {
  REQUIRE_NCCL_GPU();
  NcclOptions o;
  o.algo = GetParam();
  o.timeout = 60s;
  NcclSession session(o, alone());
  ProcessGroup& world = session.world();
  EXPECT_EQ(world.backend(), "nccl");
  check_everything(world);  // host buffers: staged through the GPU
  // A sub-group of the world (its ids travel over the world's communicator).
  std::shared_ptr<ProcessGroup> sub = world.new_group({0}, "sub");
  check_all_reduce(*sub);
}

// GPU memory is used where it lies (no staging): what arrives in `out` came through the backend.
TEST_P(NcclWorldOfOne, MovesGpuMemoryWhereItLies) {
  REQUIRE_NCCL_GPU();
  NcclOptions o;
  o.algo = GetParam();
  NcclSession session(o, alone());
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMallocManaged(&in, 1000 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&out, 1000 * sizeof(float)), cudaSuccess);
  for (int i = 0; i < 1000; ++i) in[i] = float(i) * 0.5f, out[i] = -1.f;
  session.world().all_gather(out, in, 1000, DType::f32);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], float(i) * 0.5f) << i;
  for (int i = 0; i < 1000; ++i) out[i] = -1.f;
  session.world().all_reduce(out, in, 1000, DType::f32, ReduceOp::sum);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], float(i) * 0.5f) << i;
  cudaFree(in);
  cudaFree(out);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, NcclWorldOfOne, ::testing::Values(ReduceAlgo::ordered, ReduceAlgo::ring),
                         [](const ::testing::TestParamInfo<ReduceAlgo>& info) {
                           return std::string(reduce_algo_name(info.param));
                         });

// ---- two processes on two GPUs ---------------------------------------------------------------

int visible_gpus() {
  if (!nccl_unusable_reason().empty()) return 0;
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

struct RankRun {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Starts `command` twice, as ranks 0 and 1 of a torchrun-style job on this machine (one GPU
// each), and waits for both (each is killed after `seconds`).
std::vector<RankRun> run_two_ranks(const std::string& command, const std::string& extra_env = "", int seconds = 300) {
  static int jobs = 0;
  const int port = [] {
    store::Fd fd = store::listen_on(0);
    return store::bound_port(fd.get());
  }();
  const std::string base =
      ::testing::TempDir() + "/llama4d_nccl_" + std::to_string(getpid()) + "_" + std::to_string(++jobs);
  std::string script;
  for (int r = 0; r < 2; ++r) {
    const std::string f = base + "_" + std::to_string(r);
    script += "( env " + extra_env + " RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " timeout " + std::to_string(seconds) +
              " " + command + " >" + f + ".out 2>" + f + ".err; echo $? >" + f + ".code ) & ";
  }
  script += "wait";
  EXPECT_EQ(std::system(("/bin/sh -c '" + script + "'").c_str()), 0);
  std::vector<RankRun> runs(2);
  for (int r = 0; r < 2; ++r) {
    const std::string f = base + "_" + std::to_string(r);
    runs[size_t(r)].code = std::atoi(slurp(f + ".code").c_str());
    runs[size_t(r)].out = slurp(f + ".out");
    runs[size_t(r)].err = slurp(f + ".err");
    for (const char* ext : {".out", ".err", ".code"}) std::remove((f + ext).c_str());
  }
  return runs;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// One rank of the job NcclTwoProcesses.PassTheCollectiveSuite starts (this binary, again).
TEST(NcclTwoProcesses, OneRankOfTheSuite) {
  const char* algo = std::getenv("LLAMA4D_NCCL_TEST_ALGO");
  if (!algo) GTEST_SKIP() << "runs as a rank of NcclTwoProcesses.PassTheCollectiveSuite, which starts it";
  const std::optional<store::LaunchEnv> env = store::launch_env();
  ASSERT_TRUE(env.has_value());
  store::Rendezvous rdzv(*env, 60s);
  NcclOptions o;
  o.algo = parse_reduce_algo(algo);
  o.timeout = 60s;
  {
    NcclSession session(o, bootstrap_from_store(rdzv, env->local_rank));
    ProcessGroup& world = session.world();
    ASSERT_EQ(world.size(), 2);
    check_everything(world);  // host buffers, in place and not, uneven, tags out of order
    // A ring shift as context parallelism does it: a synchronous send to the next rank, then a
    // receive from the previous one, in GPU memory.
    const int me = world.rank(), other = 1 - me;
    int32_t *mine = nullptr, *got = nullptr;
    ASSERT_EQ(cudaMallocManaged(&mine, 64 * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMallocManaged(&got, 64 * sizeof(int32_t)), cudaSuccess);
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < 64; ++i) mine[i] = 1000 * me + 10 * step + i;
      world.send(mine, 64, DType::i32, other)->wait();
      world.recv(got, 64, DType::i32, other)->wait();
      for (int i = 0; i < 64; ++i) ASSERT_EQ(got[i], 1000 * other + 10 * step + i) << "step " << step;
    }
    // The same checks in a sub-group made after the world (its ids travel over the world).
    std::shared_ptr<ProcessGroup> pair = world.new_group({1, 0}, "reversed");
    check_all_reduce(*pair);
    check_send_recv(*pair);
    cudaFree(mine);
    cudaFree(got);
  }
  rdzv.finish();
}

// One rank of NcclJob.RanksLaunchedWithOtherSettingsAreRefusedBeforeNccl (this binary, again):
// rank 1 has another --lr. The launch must refuse it by name before it loads libnccl.
TEST(NcclJob, OneRankWithItsOwnLr) {
  if (!std::getenv("LLAMA4D_NCCL_AGREE_TEST")) GTEST_SKIP() << "a rank of NcclJob.RanksLaunchedWithOtherSettingsAreRefusedBeforeNccl";
  const bool rank1 = std::string(std::getenv("RANK")) == "1";
  NcclOptions o;
  o.timeout = 20s;
  const std::string msg = error_of([&] { NcclJob job(o, 2, {{"--mesh", "dp=2"}, {"--lr", rank1 ? "0.01" : "0.003"}}); });
  EXPECT_EQ(msg, "the ranks disagree on --lr: rank 0 has 0.003, rank 1 has 0.01 (every rank of a job must be launched "
                 "with the same options, model config and data)");
  const std::string maps = slurp("/proc/self/maps");
  EXPECT_EQ(maps.find("libnccl"), std::string::npos) << "libnccl was loaded before the ranks agreed";
}

// The NCCL launch path (NcclJob, which the CLI's --backend nccl builds) runs the settings
// agreement over the store before any NCCL call: two processes, torchrun-style variables.
TEST(NcclJob, RanksLaunchedWithOtherSettingsAreRefusedBeforeNccl) {
  const std::vector<RankRun> runs =
      run_two_ranks(self_exe() + " --gtest_filter=NcclJob.OneRankWithItsOwnLr", "LLAMA4D_NCCL_AGREE_TEST=1", 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[size_t(r)].code, 0) << "rank " << r << ":\n" << runs[size_t(r)].out << runs[size_t(r)].err;
    EXPECT_NE(runs[size_t(r)].out.find("[  PASSED  ] 1 test"), std::string::npos) << runs[size_t(r)].out;
  }
}

class NcclTwoProcesses : public ::testing::TestWithParam<ReduceAlgo> {};

TEST_P(NcclTwoProcesses, PassTheCollectiveSuite) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs (one per process)";
  const std::vector<RankRun> runs =
      run_two_ranks(self_exe() + " --gtest_filter=NcclTwoProcesses.OneRankOfTheSuite",
                    "LLAMA4D_NCCL_TEST_ALGO=" + std::string(reduce_algo_name(GetParam())));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(runs[size_t(r)].code, 0) << "rank " << r << ":\n" << runs[size_t(r)].out << runs[size_t(r)].err;
    EXPECT_NE(runs[size_t(r)].out.find("[  PASSED  ] 1 test"), std::string::npos) << runs[size_t(r)].out;
  }
}

// verify over NCCL: every strategy's plan on two GPUs gives one device's bits.
TEST_P(NcclTwoProcesses, VerifyEveryStrategy) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs (one per process)";
  for (const std::string mesh : {"dp=2", "dp=2 --zero 3", "tp=2", "pp=2", "cp=2"}) {
    const std::vector<RankRun> runs =
        run_two_ranks(llama4d_bin() + " verify --device cuda --backend nccl --algo " +
                      std::string(reduce_algo_name(GetParam())) + " --mesh " + mesh + " --steps 2 --seq-len 32");
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(runs[size_t(r)].code, 0) << mesh << ", rank " << r << ":\n" << runs[size_t(r)].err;
    EXPECT_NE(runs[0].out.find("bitwise identical"), std::string::npos) << mesh << ":\n" << runs[0].out;
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, NcclTwoProcesses, ::testing::Values(ReduceAlgo::ordered, ReduceAlgo::ring),
                         [](const ::testing::TestParamInfo<ReduceAlgo>& info) {
                           return std::string(reduce_algo_name(info.param));
                         });

// The CLI on one GPU: a world of one needs no launcher.
TEST(NcclCli, VerifyOnAWorldOfOne) {
  REQUIRE_NCCL_GPU();
  const std::string cmd =
      llama4d_bin() + " verify --device cuda --backend nccl --mesh dp=1 --steps 2 --seq-len 32";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("bitwise identical"), std::string::npos) << out;
}

TEST(NcclSession, APeerThatNeverComesIsATimeoutNotAHang) {
  REQUIRE_NCCL_GPU();
  NcclOptions o;
  o.timeout = 3s;
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 of 2; rank 1 is never started.
  const std::string msg = error_of([&] { NcclSession s(o, alone(2)); });
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

}  // namespace
}  // namespace llama4d::test
