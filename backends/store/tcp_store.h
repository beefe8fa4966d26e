#pragma once
// A small TCP key-value store, the way torchrun-launched processes find each other (c10d's
// TCPStore plays this part in PyTorch): rank 0 hosts a StoreServer at MASTER_ADDR:MASTER_PORT,
// and every rank, rank 0 included, talks to it through a StoreClient.
//
//   StoreServer server(29500);                        // rank 0 only
//   StoreClient store("10.0.0.1", 29500, timeout);    // every rank
//   store.set("nccl_id", id_bytes);                   // rank 0
//   auto id = store.get("nccl_id");                   // any rank: waits until it is set
//
// Every wait is bounded by the client's timeout. A get that outlives it, a server that is gone or
// never came, a connection lost mid-answer: each throws CommError naming the key and the
// address, so one missing rank never hangs the others.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/store/socket_io.h"
#include "backends/store/wire.h"

namespace llama4d::store {

// Serves the store on one thread of this process until destroyed. Keys live as long as the
// server does.
class StoreServer {
 public:
  // Listens on every interface at `port` (0: a free port, see port()). PortInUseError if it is
  // taken. Requests past `limits` are refused, naming the cap (wire.h). A connection is served
  // only once its first request presents `token` (the job's, LaunchEnv::token).
  explicit StoreServer(int port, StoreLimits limits = {}, std::string token = {});
  // The same, listening only on the address `host` resolves to here (listen_on(host, port)).
  StoreServer(const std::string& host, int port, StoreLimits limits = {}, std::string token = {});
  ~StoreServer();  // stops serving; waiting clients see the connection close
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }

 private:
  StoreServer(Fd listener, StoreLimits limits, std::string token);
  struct State;
  Fd listener_;
  int port_ = 0;
  Fd wake_read_, wake_write_;  // a byte on this pipe stops the serving thread
  std::unique_ptr<State> state_;
  std::thread thread_;
};

// One connection to a store. Not shared between threads: give each thread its own client.
class StoreClient {
 public:
  // Connects, retrying until `timeout` passes (the server may come up after its clients), and
  // presents the job's token; CommError if the server refuses it.
  StoreClient(std::string host, int port, std::chrono::milliseconds timeout, const std::string& token = {});

  void set(const std::string& key, const std::vector<uint8_t>& value);
  // The value of key, waiting for it up to the timeout; CommError naming key if it never comes.
  std::vector<uint8_t> get(const std::string& key);
  // As get, but waits at most `wait` and returns false (the connection stays usable) if the key
  // is still missing then.
  bool try_get(const std::string& key, std::chrono::milliseconds wait, std::vector<uint8_t>& value);
  // key += delta as a 64-bit counter (absent keys start at 0); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::string& key);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& address() const { return address_; }

 private:
  // One round trip; returns the answer's status and fills `value`.
  uint8_t round_trip(Op op, const std::string& key, const std::vector<uint8_t>& value, std::chrono::milliseconds wait,
                     std::vector<uint8_t>& answer);

  std::string address_;
  std::chrono::milliseconds timeout_;
  Fd fd_;
  bool broken_ = false;  // a round trip failed half-way: the stream's framing is lost
};

}  // namespace llama4d::store
