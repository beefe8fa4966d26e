// The rendezvous store (backends/store): its key-value semantics, every bounded wait (a key never
// set, a server never started or gone, a rank that never arrives), the torchrun-style variables,
// and a whole rendezvous across real processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "backends/store/launch_env.h"
#include "backends/store/rendezvous.h"
#include "backends/store/store_agreement.h"
#include "backends/store/tcp_store.h"
#include "core/error.h"
#include "tests/comm/test_util.h"

namespace llama4d::store {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// A port nobody listens on right now (bound by the kernel, then released).
int free_port() {
  Fd fd = listen_on(0);
  return bound_port(fd.get());
}

using test::error_of;

TEST(Store, SetGetAddAndCheck) {
  StoreServer server(0);
  StoreClient a("127.0.0.1", server.port(), 5s), b("localhost", server.port(), 5s);
  EXPECT_FALSE(a.check("x"));
  a.set("x", bytes("hello"));
  EXPECT_TRUE(b.check("x"));
  EXPECT_EQ(b.get("x"), bytes("hello"));
  a.set("x", bytes(""));  // overwrite, and an empty value is a value
  EXPECT_EQ(b.get("x"), Bytes{});
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -7), -2);
  EXPECT_EQ(a.add("n", 0), -2);
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 2654435761u >> 13);
  a.set("big", big);
  EXPECT_EQ(b.get("big"), big);
  // add on a value that is not a counter is refused, and breaks only that connection
  EXPECT_NE(error_of([&] { b.add("x", 1); }).find("refused"), std::string::npos);
  EXPECT_EQ(a.get("n").size(), 8u);
}

// A taken port is its own error, which a launcher can retry on another port, and it names the port.
TEST(Store, ATakenPortIsAPortInUseErrorNamingIt) {
  StoreServer first(0);
  try {
    StoreServer second(first.port());
    FAIL() << "two stores listened on port " << first.port();
  } catch (const PortInUseError& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(first.port()) + ": it is in use"), std::string::npos)
        << e.what();
  }
}

TEST(Store, GetWaitsForALaterSet) {
  StoreServer server(0);
  StoreClient waiter("127.0.0.1", server.port(), 10s);
  std::thread setter([&] {
    StoreClient s("127.0.0.1", server.port(), 10s);
    std::this_thread::sleep_for(100ms);
    s.set("late", bytes("v"));
  });
  auto t0 = Clock::now();
  Bytes got;
  std::string err = error_of([&] { got = waiter.get("late"); });
  setter.join();
  EXPECT_EQ(got, bytes("v")) << err;
  EXPECT_GE(Clock::now() - t0, 90ms);
}

TEST(Store, AKeyNeverSetTimesOutNamingIt) {
  StoreServer server(0);
  StoreClient c("127.0.0.1", server.port(), 200ms);
  auto t0 = Clock::now();
  std::string msg = error_of([&] { c.get("never"); });
  EXPECT_NE(msg.find("'never' was not set within 200 ms"), std::string::npos) << msg;
  EXPECT_LT(Clock::now() - t0, 3s);
  // The server answered the wait itself, so the connection still works.
  Bytes v;
  EXPECT_FALSE(c.try_get("never", 10ms, v));
  c.set("never", bytes("now"));
  EXPECT_EQ(c.get("never"), bytes("now"));
}

TEST(Store, ClientsMayStartBeforeTheServer) {
  int port = free_port();
  Bytes got;
  std::thread client([&] {
    StoreClient c("127.0.0.1", port, 10s);  // refused at first: retries
    got = c.get("k");
  });
  std::this_thread::sleep_for(200ms);
  StoreServer server(port);
  StoreClient("127.0.0.1", port, 5s).set("k", bytes("up"));
  client.join();
  EXPECT_EQ(got, bytes("up"));
}

TEST(Store, NoServerIsACommErrorNamingTheAddress) {
  int port = free_port();
  auto t0 = Clock::now();
  std::string msg = error_of([&] { StoreClient("127.0.0.1", port, 300ms); });
  EXPECT_NE(msg.find("no store answered at 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_LT(Clock::now() - t0, 3s);
}

TEST(Store, AServerThatGoesAwayEndsTheWaitAtOnce) {
  auto server = std::make_unique<StoreServer>(0);
  StoreClient c("127.0.0.1", server->port(), 30s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  auto t0 = Clock::now();
  std::string msg = error_of([&] { c.get("k"); });
  stopper.join();
  EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
  EXPECT_LT(Clock::now() - t0, 5s);  // not the 30 s timeout
  EXPECT_NE(error_of([&] { c.check("k"); }).find("broke in an earlier request"), std::string::npos);
}

TEST(Store, AMalformedRequestDropsOnlyItsConnection) {
  StoreServer server(0);
  Fd raw = connect_to("127.0.0.1", server.port(), Clock::now() + 5s);
  uint8_t hello[17] = {uint8_t(Op::hello)};  // the server's token: empty
  send_all(raw.get(), hello, sizeof hello, Clock::now() + 5s, "server");
  uint8_t answer[9];
  recv_all(raw.get(), answer, sizeof answer, Clock::now() + 5s, "server", "the hello's answer");
  ASSERT_EQ(answer[0], uint8_t(Status::ok));
  uint8_t garbage[17] = {99};  // unknown op 99, empty key and value
  send_all(raw.get(), garbage, sizeof garbage, Clock::now() + 5s, "server");
  recv_all(raw.get(), answer, sizeof answer, Clock::now() + 5s, "server", "the answer");
  EXPECT_EQ(answer[0], uint8_t(Status::bad_request));
  std::string closed = error_of([&] {
    char more;
    recv_all(raw.get(), &more, 1, Clock::now() + 5s, "server", "more");
  });
  EXPECT_NE(closed.find("server closed the connection"), std::string::npos) << closed;
  StoreClient good("127.0.0.1", server.port(), 5s);
  good.set("still", bytes("serving"));
  EXPECT_EQ(good.get("still"), bytes("serving"));
}

// The store has no authentication (README: its exposure), so what a client can make rank 0 hold is
// capped, and each refusal names its cap (issue 52, item 7).
TEST(Store, EveryCapRefusesByName) {
  StoreLimits caps;
  caps.max_key_bytes = 8;
  caps.max_value_bytes = 16;
  caps.max_keys = 3;
  caps.max_total_bytes = 40;
  StoreServer server(0, caps);
  StoreClient c("127.0.0.1", server.port(), 5s);
  c.set("a", bytes("0123456789"));  // 11 bytes held
  c.set("b", bytes("0123456789"));  // 22
  // Replacing a key's value frees its old bytes: 22 - 11 + 17 = 28, not 39.
  c.set("a", bytes("0123456789abcdef"));
  EXPECT_EQ(c.get("a"), bytes("0123456789abcdef"));
  const std::string total = error_of([&] { c.set("c", bytes("0123456789abc")); });  // 28 + 14 = 42 > 40
  EXPECT_NE(total.find("refused 'c': the store would hold more than its cap of 40 bytes"), std::string::npos) << total;
  EXPECT_FALSE(c.check("c"));  // refused, not half-stored; the connection still serves
  c.set("c", bytes("x"));       // 30
  const std::string keys = error_of([&] { c.add("d", 1); });
  EXPECT_NE(keys.find("refused 'd': the store holds its cap of 3 keys"), std::string::npos) << keys;
}

TEST(Store, AnOversizedKeyOrValueIsRefusedByName) {
  StoreLimits caps;
  caps.max_key_bytes = 8;
  caps.max_value_bytes = 16;
  StoreServer server(0, caps);
  const std::string key = error_of([&] {
    StoreClient c("127.0.0.1", server.port(), 5s);
    c.set("123456789", bytes("v"));
  });
  EXPECT_NE(key.find("a key of 9 bytes is over the cap of 8"), std::string::npos) << key;
  const std::string value = error_of([&] {
    StoreClient c("127.0.0.1", server.port(), 5s);
    c.set("k", Bytes(17, 1));
  });
  EXPECT_NE(value.find("refused 'k': a value of 17 bytes is over the cap of 16"), std::string::npos) << value;
  StoreClient c("127.0.0.1", server.port(), 5s);  // others are still served
  c.set("k", Bytes(16, 1));
  EXPECT_EQ(c.get("k"), Bytes(16, 1));
}

// Every connection presents the job's token first (issue 52, item 7): a forged barrier key from
// outside the job is refused, and nothing is served before the token.
TEST(Store, OnlyConnectionsWithTheJobsTokenAreServed) {
  StoreServer server(0, {}, "job-secret");
  const std::string wrong = error_of([&] { StoreClient c("127.0.0.1", server.port(), 5s, "guess"); });
  EXPECT_NE(wrong.find("refused this process: another job's token"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find("guess"), std::string::npos) << "the token is not shown: " << wrong;
  // A raw connection that skips the hello: its set is refused, not stored.
  Fd raw = connect_to("127.0.0.1", server.port(), Clock::now() + 5s);
  std::vector<uint8_t> set{uint8_t(Op::set)};
  put_le(set, 15, 4), put_le(set, 0, 4), put_le(set, 1, 8);
  const std::string key = "barrier/start/1";
  set.insert(set.end(), key.begin(), key.end());
  set.push_back(1);
  send_all(raw.get(), set.data(), set.size(), Clock::now() + 5s, "server");
  uint8_t answer[9];
  recv_all(raw.get(), answer, sizeof answer, Clock::now() + 5s, "server", "the answer");
  EXPECT_EQ(answer[0], uint8_t(Status::refused));
  StoreClient job("127.0.0.1", server.port(), 5s, "job-secret");
  EXPECT_FALSE(job.check(key));
  job.set(key, bytes("1"));
  EXPECT_TRUE(job.check(key));
}

// ---- torchrun-style variables -----------------------------------------------------------------

GetEnv env_of(std::map<std::string, std::string> vars) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [owned](const char* name) -> const char* {
    auto it = owned->find(name);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, TheStoreTokenIsTheLaunchersOrDerivedFromTheLaunch) {
  std::map<std::string, std::string> vars{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  const std::string derived = launch_env(env_of(vars))->token;
  auto other = vars;
  other["MASTER_PORT"] = "29501";
  EXPECT_NE(launch_env(env_of(other))->token, derived) << "another job's launch, the same token";
  other = vars;
  other["WORLD_SIZE"] = "4";
  EXPECT_NE(launch_env(env_of(other))->token, derived);
  other = vars;
  other["RANK"] = "1";
  EXPECT_EQ(launch_env(env_of(other))->token, derived) << "every rank of one launch derives the same token";
  vars["LLAMA4D_STORE_TOKEN"] = "s3cret";
  EXPECT_EQ(launch_env(env_of(vars))->token, "s3cret");
  vars["LLAMA4D_STORE_TOKEN"] = "";
  EXPECT_NE(error_of([&] { launch_env(env_of(vars)); }).find("LLAMA4D_STORE_TOKEN is empty"), std::string::npos);
  vars["LLAMA4D_STORE_TOKEN"] = std::string(1025, 'x');  // sent as a key: over the store's cap
  EXPECT_NE(error_of([&] { launch_env(env_of(vars)); }).find("LLAMA4D_STORE_TOKEN is 1025 bytes"), std::string::npos);
}

TEST(LaunchEnv, ReadsTorchrunsVariables) {
  EXPECT_FALSE(launch_env(env_of({})).has_value());
  auto env = launch_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_addr, "node0");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->store_port, 0);  // ours listens on MASTER_PORT
  auto bare = launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "::1"}, {"MASTER_PORT", "1"}}));
  ASSERT_TRUE(bare.has_value());
  EXPECT_FALSE(bare->local_rank.has_value());
}

// torchrun's agent holds MASTER_PORT with PyTorch's own store: ours takes the next port, or the
// one LLAMA4D_STORE_PORT names.
TEST(LaunchEnv, UnderTorchrunTheStoreMovesOffMasterPort) {
  std::map<std::string, std::string> vars = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                             {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(launch_env(env_of(vars))->store_port, 29501);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(launch_env(env_of(vars))->store_port, 0);
  vars["LLAMA4D_STORE_PORT"] = "40000";
  EXPECT_EQ(launch_env(env_of(vars))->store_port, 40000);
  vars["LLAMA4D_STORE_PORT"] = "0";
  EXPECT_THROW(launch_env(env_of(vars)), InputError);
  vars.erase("LLAMA4D_STORE_PORT");
  vars["MASTER_PORT"] = "65535";
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_THROW(launch_env(env_of(vars)), InputError);
}

// The rendezvous listens and connects where store_port says.
TEST(Rendezvous, MeetsOnTheStorePortWhenOneIsGiven) {
  const int port = free_port();
  std::vector<std::vector<uint8_t>> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r, e.world_size = 2, e.master_addr = "127.0.0.1";
      e.master_port = 1;  // nobody may listen here: only store_port is used
      e.store_port = port;
      Rendezvous rdzv(e, 20s);
      got[size_t(r)] = rdzv.broadcast("x", r == 0 ? bytes("id") : Bytes{});
      rdzv.finish();
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(got[0], bytes("id"));
  EXPECT_EQ(got[1], bytes("id"));
}

TEST(LaunchEnv, NamesTheVariableThatIsMissingOrWrong) {
  std::map<std::string, std::string> good = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const std::string& v) {
    auto m = good;
    m[k] = v;
    return m;
  };
  auto without = [&](const std::string& k) {
    auto m = good;
    m.erase(k);
    return m;
  };
  struct Case {
    std::map<std::string, std::string> vars;
    std::string message;
  } cases[] = {
      {without("MASTER_PORT"), "MASTER_PORT is not set"},
      {without("RANK"), "RANK is not set"},
      {with("RANK", "2"), "RANK='2' is not a whole number in 0..1"},
      {with("RANK", "-1"), "RANK='-1'"},
      {with("RANK", "1x"), "RANK='1x'"},
      {with("WORLD_SIZE", "0"), "WORLD_SIZE='0'"},
      {with("MASTER_PORT", "65536"), "MASTER_PORT='65536' is not a whole number in 1..65535"},
      {with("MASTER_PORT", ""), "MASTER_PORT=''"},
      {with("MASTER_ADDR", ""), "MASTER_ADDR is empty"},
      {with("LOCAL_RANK", "2"), "LOCAL_RANK='2' is not a whole number in 0..1"},
      {with("LOCAL_WORLD_SIZE", "3"), "LOCAL_WORLD_SIZE='3' is not a whole number in 1..2"},
  };
  for (const Case& c : cases) {
    std::string msg;
    try {
      launch_env(env_of(c.vars));
    } catch (const InputError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.message), std::string::npos) << "expected '" << c.message << "', got '" << msg << "'";
  }
}

// ---- rendezvous ---------------------------------------------------------------------------------

LaunchEnv env_for(int rank, int world, int port) {
  LaunchEnv e;
  e.rank = rank;
  e.world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

TEST(Rendezvous, ARankThatNeverArrivesIsNamedAndNobodyHangs) {
  int port = free_port();
  const int world = 4;  // ranks 0, 1 and 3 come; rank 2 does not
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r : {0, 1, 3})
    ranks.emplace_back([&, r] {
      errors[r] = error_of([&] {
        Rendezvous rdzv(env_for(r, world, port), 500ms);
        rdzv.barrier("start");
      });
    });
  for (auto& t : ranks) t.join();
  for (int r : {0, 1, 3}) {
    // rank 0's server may stop before a slower rank's wait ends: then that rank hears it closed
    bool named = errors[r].find("rank 2 of 4 did not reach barrier 'start'") != std::string::npos;
    bool closed = r != 0 && errors[r].find("closed the connection") != std::string::npos;
    EXPECT_TRUE(named || closed) << "rank " << r << ": " << errors[r];
  }
  EXPECT_NE(errors[0].find("rank 2 of 4"), std::string::npos);
}

// Rank 0's store listens only on MASTER_ADDR's address (issue 52, item 7): bound to 127.0.0.1,
// another address of this machine (127.0.0.2, on Linux's loopback) does not reach it; a
// MASTER_ADDR that does not resolve, or is not this machine's, is an InputError naming it.
TEST(Rendezvous, TheStoreListensOnlyWhereMasterAddrNamesIt) {
  const int port = free_port();
  Rendezvous rdzv(env_for(0, 1, port), 5s);
  EXPECT_NE(error_of([&] { StoreClient c("127.0.0.2", port, 300ms); }).find("127.0.0.2:" + std::to_string(port)),
            std::string::npos);
  StoreClient ok("127.0.0.1", port, 5s, env_for(0, 1, port).token);
  LaunchEnv bad = env_for(0, 1, free_port());
  bad.master_addr = "no-such-host.invalid";
  EXPECT_TRUE(test::contains(error_of([&] { Rendezvous r(bad, 1s); }), "MASTER_ADDR=no-such-host.invalid: cannot resolve"));
  bad.master_addr = "192.0.2.1";  // TEST-NET-1 (RFC 5737): no machine's own address
  EXPECT_TRUE(test::contains(error_of([&] { Rendezvous r(bad, 1s); }), "MASTER_ADDR=192.0.2.1: the store cannot listen"));
}

// The whole path as a torchrun job runs it: separate processes, each reading its variables,
// rank 0 serving, a 128-byte id (NCCL's ncclUniqueId size) broadcast, barriers, and finish.
TEST(Rendezvous, ProcessesExchangeAnIdThroughTheirVariables) {
  const int world = 4;
  int port = free_port();
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 3;
      try {
        auto env = launch_env(env_of({{"RANK", std::to_string(r)},
                                      {"WORLD_SIZE", std::to_string(world)},
                                      {"LOCAL_RANK", std::to_string(r)},
                                      {"MASTER_ADDR", "localhost"},
                                      {"MASTER_PORT", std::to_string(port)}}));
        Rendezvous rdzv(*env, 20s);
        Bytes id(128);
        for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(i * 37 + 11);
        rdzv.barrier("up");
        Bytes got = rdzv.broadcast("id", rdzv.rank() == 0 ? id : Bytes{});
        Bytes from3 = rdzv.broadcast("from3", rdzv.rank() == 3 ? bytes("three") : Bytes{}, 3);
        int64_t arrivals = rdzv.store().add("arrivals", 1);
        rdzv.barrier("counted");
        bool ok = got == id && from3 == bytes("three") && arrivals >= 1 && arrivals <= world &&
                  rdzv.store().add("arrivals", 0) == world;
        rdzv.finish();
        code = ok ? 0 : 1;
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[r], &status, 0), children[r]);
    ASSERT_TRUE(WIFEXITED(status)) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r << " (1: wrong bytes, 2: an error)";
  }
}

// The settings agreement over the store, as the NCCL backend's torchrun-style launch runs it
// before any NCCL call (issue 52, item 1): 3 ranks, rank 1 with another --lr and rank 2 with
// another --mesh (then rank 2 alone); every rank throws the lowest disagreeing rank's verdict, in the words of
// check_ranks_agree over a process group (the message is written out here by hand).
TEST(StoreAgreement, EveryRankNamesTheLowestRankThatDiffers) {
  const std::string tail = " (every rank of a job must be launched with the same options, model config and data)";
  for (const int differ : {0, 1, 2}) {
    const int port = free_port();
    std::vector<std::string> errors(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        errors[size_t(r)] = error_of([&] {
          Rendezvous rdzv(env_for(r, 3, port), 10s);
          const std::string lr = differ == 1 && r == 1 ? "0.01" : "0.003", mesh = differ && r == 2 ? "pp=3" : "dp=3";
          check_ranks_agree(rdzv, {{"--mesh", mesh}, {"--lr", lr}});
          rdzv.finish();
        });
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(errors[size_t(r)], differ == 0   ? "(no error)"
                                   : differ == 1 ? "the ranks disagree on --lr: rank 0 has 0.003, rank 1 has 0.01" + tail
                                                 : "the ranks disagree on --mesh: rank 0 has dp=3, rank 2 has pp=3" + tail)
          << "rank " << r;
  }
}

}  // namespace
}  // namespace llama4d::store
