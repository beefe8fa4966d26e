#include "backends/virtual/virtual_world.h"

#include "core/error.h"

namespace llama4d::virt {

World::World(const VirtualClusterOptions& options, std::vector<RankAccounting*> accounting_)
    : size(options.ranks),
      cluster(options.cluster),
      algo(options.algo),
      timeout(options.timeout),
      fault_hook(options.fault_hook),
      accounting(std::move(accounting_)),
      device(ops::compute_backend_if_linked()),
      exited(size_t(options.ranks), 0),
      creations(size_t(options.ranks)) {
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[size_t(r)] = r;
  world_group = std::make_shared<GroupState>(0, "world", all);
}

void World::abort_locked(const std::string& reason, std::exception_ptr error) {
  if (aborted) return;
  aborted = true;
  abort_reason = reason;
  first_error = error ? error : std::make_exception_ptr(CommError(reason));
  cv.notify_all();
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

namespace {

bool is_llama4d_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

void World::rank_failed(int rank, std::exception_ptr error) {
  const std::string what = what_of(error);
  std::lock_guard<std::mutex> lock(mu);
  failures.push_back({rank, what});
  if (aborted) return;
  const std::string reason = "rank " + std::to_string(rank) + " failed: " + what;
  abort_locked(reason, is_llama4d_error(error) ? error : std::make_exception_ptr(CommError(reason)));
}

void World::rank_exited(int rank) {
  std::lock_guard<std::mutex> lock(mu);
  exited[size_t(rank)] = 1;
  cv.notify_all();
}

}  // namespace llama4d::virt
