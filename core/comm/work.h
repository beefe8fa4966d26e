#pragma once
// The handle of one communication operation, as c10d's Work: wait() blocks until it finished
// and rethrows its failure; is_completed() polls. Backends guarantee every Work completes
// (with an error after the group timeout at worst), so wait() never hangs.
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace llama4d {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Blocks until the operation finished. Rethrows its failure: a CommError (peer failed, timed
  // out, mismatched call) or the error that stopped it (e.g. OutOfMemoryError for a comm buffer).
  void wait();
  bool is_completed() const;
  // For a handle is_completed() found finished: rethrows its failure as wait() does, but leaves
  // the rank's simulated compute clock alone, so what a poll finds (which follows this laptop's
  // threads) never moves the modelled GPU's time. Code that uses the result calls wait() too.
  void collect();
  const std::string& description() const { return description_; }

  // --- for backends ---
  // Marks the operation finished; `error` is null on success. Wakes every waiter.
  void complete(std::exception_ptr error = nullptr);
  // Runs once on the first thread whose wait() succeeds (backends use it to join the rank's
  // simulated compute clock with the end of the communication). Set before completion.
  void set_on_wait(std::function<void()> fn);
  // An already finished handle (synchronous operations that did no communication).
  static std::shared_ptr<Work> completed(std::string description);

 private:
  const std::string description_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> on_wait_;
};

}  // namespace llama4d
