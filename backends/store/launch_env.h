#pragma once
// The torchrun-style launch: each process finds its place in the job from environment variables
// (the names torchrun and torch.distributed's env:// use), instead of from mpirun.
//
//   RANK          this process's rank, 0 .. WORLD_SIZE-1
//   WORLD_SIZE    processes in the job
//   LOCAL_RANK    its index among the processes on its node (which GPU it takes); optional
//   LOCAL_WORLD_SIZE  processes on its node; optional
//   MASTER_ADDR   host of rank 0, which serves the rendezvous store
//   MASTER_PORT   the store's TCP port
//
// Under torchrun itself, MASTER_PORT is taken: its agent already serves PyTorch's own store there
// and tells the workers so with TORCHELASTIC_USE_AGENT_STORE=True. Ours then listens on the next
// port, MASTER_PORT + 1. LLAMA4D_STORE_PORT names another port for it in either case.
#include <functional>
#include <optional>
#include <string>

namespace llama4d::store {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::string master_addr;
  int master_port = 0;
  int store_port = 0;  // where our store listens when not MASTER_PORT (see above); 0: MASTER_PORT
  // What every connection to the store presents: LLAMA4D_STORE_TOKEN where the launcher passes
  // one (a secret: the only token that keeps out someone who can reach the port), else derived
  // from the launch (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, TORCHELASTIC_RUN_ID), which keeps out
  // another job's processes on the same port but is no secret.
  std::string token;
};

using GetEnv = std::function<const char*(const char*)>;

// Reads the variables through `get` (getenv by default). nullopt when none of RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT is set: the process was not launched this way. InputError naming
// the variable when only some are set, or one is not a number in its range (RANK < WORLD_SIZE,
// LOCAL_RANK < LOCAL_WORLD_SIZE, a port in 1..65535, also for LLAMA4D_STORE_PORT).
std::optional<LaunchEnv> launch_env(const GetEnv& get = nullptr);

}  // namespace llama4d::store
