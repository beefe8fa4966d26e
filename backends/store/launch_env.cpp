#include "backends/store/launch_env.h"

#include <cstdlib>

#include "backends/store/wire.h"
#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d::store {

namespace {

const char* kRequired[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

// A whole decimal integer in [lo, hi], or InputError naming the variable.
int parse_int(const char* name, const char* text, int lo, int hi) {
  int v = 0;
  if (read_number(std::string_view(text), v) || outside(v, lo, hi))
    throw InputError(std::string(name) + "='" + text + "' is not a whole number in " + std::to_string(lo) + ".." +
                     std::to_string(hi));
  return v;
}

}  // namespace

std::optional<LaunchEnv> launch_env(const GetEnv& get_fn) {
  auto get = [&](const char* name) -> const char* { return get_fn ? get_fn(name) : std::getenv(name); };
  int present = 0;
  for (const char* name : kRequired) present += get(name) != nullptr;
  if (present == 0) return std::nullopt;
  for (const char* name : kRequired)
    if (!get(name))
      throw InputError(std::string(name) +
                       " is not set: a torchrun-style launch sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                       "(and LOCAL_RANK) for every process");

  LaunchEnv env;
  env.world_size = parse_int("WORLD_SIZE", get("WORLD_SIZE"), 1, 1 << 20);
  env.rank = parse_int("RANK", get("RANK"), 0, env.world_size - 1);
  env.master_addr = get("MASTER_ADDR");
  if (env.master_addr.empty()) throw InputError("MASTER_ADDR is empty");
  env.master_port = parse_int("MASTER_PORT", get("MASTER_PORT"), 1, 65535);
  const char* agent_store = get("TORCHELASTIC_USE_AGENT_STORE");
  if (const char* port = get("LLAMA4D_STORE_PORT"))
    env.store_port = parse_int("LLAMA4D_STORE_PORT", port, 1, 65535);
  else if (agent_store && std::string(agent_store) == "True")
    env.store_port = env.master_port == 65535
                         ? throw InputError("MASTER_PORT=65535 under torchrun leaves no port for llama4d's store: "
                                            "set LLAMA4D_STORE_PORT")
                         : env.master_port + 1;
  if (const char* t = get("LLAMA4D_STORE_TOKEN")) {
    env.token = t;
    if (env.token.empty()) throw InputError("LLAMA4D_STORE_TOKEN is empty");
  } else {
    const char* run_id = get("TORCHELASTIC_RUN_ID");
    env.token = "launch " + env.master_addr + ":" + std::to_string(env.master_port) + " world " +
                std::to_string(env.world_size) + " run " + (run_id ? run_id : "");
  }
  // The token travels as a key (the hello), under the store's key cap.
  if (env.token.size() > StoreLimits{}.max_key_bytes)
    throw InputError(std::string(get("LLAMA4D_STORE_TOKEN") ? "LLAMA4D_STORE_TOKEN" : "the job token from MASTER_ADDR and "
                                                                                       "TORCHELASTIC_RUN_ID") +
                     " is " + std::to_string(env.token.size()) + " bytes, over the store's " +
                     std::to_string(StoreLimits{}.max_key_bytes) + "-byte cap on a key");
  if (const char* lws = get("LOCAL_WORLD_SIZE")) env.local_world_size = parse_int("LOCAL_WORLD_SIZE", lws, 1, env.world_size);
  if (const char* lr = get("LOCAL_RANK"))
    env.local_rank = parse_int("LOCAL_RANK", lr, 0, (env.local_world_size ? *env.local_world_size : env.world_size) - 1);
  return env;
}

}  // namespace llama4d::store
