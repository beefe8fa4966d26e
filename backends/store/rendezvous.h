#pragma once
// Rendezvous of a torchrun-style job over the TCP store: rank 0 serves the store, every rank is a
// client, and the job gets the two things a process group's bootstrap needs: a barrier that names
// the ranks that did not come, and a broadcast of a few bytes (the NCCL unique id) from one rank.
//
//   auto env = store::launch_env();                  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   store::Rendezvous rdzv(*env, std::chrono::seconds(60));
//   auto id = rdzv.broadcast("nccl_id/world", rank == 0 ? make_id() : std::vector<uint8_t>{});
//   ...
//   rdzv.finish();                                   // rank 0 keeps serving until all are done
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/store/launch_env.h"
#include "backends/store/tcp_store.h"

namespace llama4d::store {

class Rendezvous {
 public:
  // Rank 0 starts serving at env.master_port (PortInUseError if it is taken); every rank then
  // connects to env.master_addr:master_port, waiting up to `timeout` for the server.
  Rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout);
  // Without finish(), rank 0 stops serving at once (on an error path, waiting would only delay it).
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  StoreClient& store() { return *client_; }

  // Returns once every rank has called barrier(name). Each name is used once per job. CommError
  // naming the ranks that had not arrived when the timeout passed.
  void barrier(const std::string& name);
  // `root` publishes bytes under name; every rank (root included) returns them. Others pass {}.
  std::vector<uint8_t> broadcast(const std::string& name, const std::vector<uint8_t>& bytes_on_root, int root = 0);
  // The last call of a job: every rank says it is done, and rank 0 keeps the store up until all
  // have (bounded by the timeout; ranks that never say so are named in a CommError).
  void finish();

 private:
  LaunchEnv env_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only
  std::unique_ptr<StoreClient> client_;
};

}  // namespace llama4d::store
