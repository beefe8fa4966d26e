#include "backends/store/rendezvous.h"

#include "core/error.h"

namespace llama4d::store {

namespace {

// "ranks 2, 5" / "rank 3"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Waits for key/<r> of every rank r until one shared deadline; CommError naming the missing ranks.
void wait_for_every_rank(StoreClient& store, const std::string& key, int world, const std::string& what) {
  auto deadline = Clock::now() + store.timeout();
  std::vector<int> missing;
  std::vector<uint8_t> ignored;
  for (int r = 0; r < world; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!store.try_get(key + "/" + std::to_string(r), std::max(left, std::chrono::milliseconds(0)), ignored))
      missing.push_back(r);
  }
  if (!missing.empty())
    throw CommError(rank_list(missing) + " of " + std::to_string(world) + " did not reach " + what + " within " +
                    std::to_string(store.timeout().count()) + " ms (store at " + store.address() + ")");
}

}  // namespace

Rendezvous::Rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout) : env_(env) {
  const int port = env.store_port > 0 ? env.store_port : env.master_port;
  // Rank 0 listens only where MASTER_ADDR names it, not on every interface of its node.
  if (env.rank == 0) {
    try {
      server_ = std::make_unique<StoreServer>(env.master_addr, port, StoreLimits{}, env.token);
    } catch (const InputError& e) {
      throw InputError("MASTER_ADDR=" + env.master_addr + ": " + e.what());
    }
  }
  client_ = std::make_unique<StoreClient>(env.master_addr, port, timeout, env.token);
}

Rendezvous::~Rendezvous() = default;

void Rendezvous::barrier(const std::string& name) {
  const std::string key = "barrier/" + name;
  client_->set(key + "/" + std::to_string(env_.rank), {1});
  wait_for_every_rank(*client_, key, env_.world_size, "barrier '" + name + "'");
}

std::vector<uint8_t> Rendezvous::broadcast(const std::string& name, const std::vector<uint8_t>& bytes_on_root, int root) {
  if (root < 0 || root >= env_.world_size)
    throw InputError("broadcast root " + std::to_string(root) + " is not a rank of " + std::to_string(env_.world_size));
  const std::string key = "broadcast/" + name;
  if (env_.rank == root) {
    client_->set(key, bytes_on_root);
    return bytes_on_root;
  }
  std::vector<uint8_t> value;
  if (!client_->try_get(key, client_->timeout(), value))
    throw CommError("rank " + std::to_string(root) + " did not publish '" + name + "' within " +
                    std::to_string(client_->timeout().count()) + " ms (store at " + client_->address() + ")");
  return value;
}

void Rendezvous::finish() {
  const std::string key = "finished";
  client_->set(key + "/" + std::to_string(env_.rank), {1});
  if (env_.rank == 0) wait_for_every_rank(*client_, key, env_.world_size, "the end of the job");
}

}  // namespace llama4d::store
