#include "core/parallel/fault_injector.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/data/batch_sampler.h"  // splitmix64

namespace llama4d {

BitFlip sdc_target(const Fault& f, uint64_t seed, size_t index, int64_t count, int bits) {
  const uint64_t draw = splitmix64(seed ^ splitmix64(uint64_t(index) + 1));
  BitFlip b;
  if (f.element >= count)
    throw InputError("--faults: " + f.describe() + ": \"element\" " + std::to_string(f.element) + " does not exist: rank " +
                     std::to_string(f.rank) + " holds " + std::to_string(count) + " weights");
  if (f.bit >= bits)
    throw InputError("--faults: " + f.describe() + ": \"bit\" " + std::to_string(f.bit) + " does not exist in a " +
                     std::to_string(bits) + "-bit weight");
  b.element = f.element >= 0 ? f.element : int64_t(draw % uint64_t(count));
  b.bit = f.bit >= 0 ? f.bit : int(splitmix64(draw) % uint64_t(bits));
  return b;
}

FaultInjector::FaultInjector(FaultSchedule schedule, std::chrono::milliseconds hang_for)
    : schedule_(std::move(schedule)), hang_for_(hang_for), fired_(schedule_.faults.size(), false) {
  int ranks = 0;
  for (const Fault& f : schedule_.faults) ranks = std::max(ranks, f.rank + 1);
  armed_.assign(size_t(ranks), 0);
  released_.assign(size_t(ranks), "");
  hanging_.assign(size_t(ranks), false);
}

void FaultInjector::hang(int rank, size_t fault) {
  std::unique_lock<std::mutex> lock(mu_);
  hanging_[size_t(rank)] = true;
  const bool stopped = release_cv_.wait_for(lock, hang_for_, [&] { return !released_[size_t(rank)].empty(); });
  const std::string why = std::exchange(released_[size_t(rank)], "");
  hanging_[size_t(rank)] = false;
  if (stopped) throw InjectedFault(why + "; stopped it (injected " + schedule_.faults[fault].describe() + ")");
  throw InjectedFault("injected " + schedule_.faults[fault].describe() + ": stopped after " +
                      std::to_string(hang_for_.count()) + " ms without answering");
}

void FaultInjector::release(int rank, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A rank not in an injected hang is left alone: nothing here can stop it.
    if (size_t(rank) >= released_.size() || !hanging_[size_t(rank)]) return;
    released_[size_t(rank)] = why;
  }
  release_cv_.notify_all();
}

int FaultInjector::take(FaultKind kind, int rank, int64_t step, bool after_step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < schedule_.faults.size(); ++i) {
    const Fault& f = schedule_.faults[i];
    if (fired_[i] || f.kind != kind || f.rank != rank || (kind == FaultKind::hang && f.after_step != after_step)) continue;
    const bool due = kind == FaultKind::slow ? step >= f.step && step < f.step + f.steps : step == f.step;
    if (!due) continue;
    // A slow fault stays in force for its steps; it counts as fired from its first.
    if (kind != FaultKind::slow || step == f.step + f.steps - 1) fired_[i] = true;
    if (std::find(order_.begin(), order_.end(), i) == order_.end()) order_.push_back(i);
    return int(i);
  }
  return -1;
}

void FaultInjector::before_step(int rank, int64_t step) {
  if (const int i = take(FaultKind::crash, rank, step); i >= 0)
    throw InjectedFault("injected " + schedule_.faults[size_t(i)].describe());
  if (const int i = take(FaultKind::collective, rank, step); i >= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_[size_t(rank)] = step;
  }
  if (const int i = take(FaultKind::hang, rank, step); i >= 0) hang(rank, size_t(i));
}

void FaultInjector::on_collective(int rank, CommOp op, int64_t seq) {
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size_t(rank) >= armed_.size() || armed_[size_t(rank)] == 0) return;
    step = std::exchange(armed_[size_t(rank)], 0);
  }
  throw InjectedFault("injected collective failure on rank " + std::to_string(rank) + " at step " +
                      std::to_string(step) + ": its link dropped during " + std::string(comm_op_name(op)) +
                      " #" + std::to_string(seq));
}

void FaultInjector::after_step(int rank, int64_t step, double step_seconds, std::span<std::byte> weights,
                               int element_bytes) {
  if (const int i = take(FaultKind::hang, rank, step, true); i >= 0) hang(rank, size_t(i));
  if (const int i = take(FaultKind::slow, rank, step); i >= 0)
    std::this_thread::sleep_for(
        std::chrono::duration<double>((schedule_.faults[size_t(i)].factor - 1) * step_seconds));
  if (const int i = take(FaultKind::sdc, rank, step); i >= 0 && !weights.empty()) {
    const int64_t count = int64_t(weights.size()) / element_bytes;
    const BitFlip b = sdc_target(schedule_.faults[size_t(i)], schedule_.seed, size_t(i), count, 8 * element_bytes);
    std::byte& byte = weights[size_t(b.element * element_bytes + b.bit / 8)];  // little-endian
    byte ^= std::byte(1u << (b.bit % 8));
  }
}

std::vector<Fault> FaultInjector::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Fault> out;
  for (const size_t i : order_) out.push_back(schedule_.faults[i]);
  return out;
}

}  // namespace llama4d
