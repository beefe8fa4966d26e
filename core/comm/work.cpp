#include "core/comm/work.h"

#include <chrono>

#include "core/comm/blocked_time.h"
#include "core/error.h"

namespace llama4d {

namespace {

// Rethrows a stored failure as a NEW exception object of the same llama4d type. Several ranks
// may wait on failures that share one exception object, and the thread that drops the last
// reference destroys it; libstdc++'s exception_ptr reference count is invisible to
// ThreadSanitizer, so handing every waiter its own copy keeps the shared object's lifetime simple.
[[noreturn]] void rethrow_copy(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    throw CommError(e.what());
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.what());
  } catch (const InputError& e) {
    throw InputError(e.what());
  } catch (const IoError& e) {
    throw IoError(e.what());
  } catch (const Error& e) {
    throw Error(e.what());
  }
}

thread_local double t_blocked_seconds = 0;

}  // namespace

double blocked_seconds_on_this_thread() { return t_blocked_seconds; }
void add_blocked_seconds(double s) { t_blocked_seconds += s; }

void Work::wait() {
  std::function<void()> hook;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_) {
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait(lock, [&] { return done_; });
      t_blocked_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (error_) rethrow_copy(error_);
    hook = std::move(on_wait_);
    on_wait_ = nullptr;
  }
  if (hook) hook();
}

void Work::collect() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) throw Error("Work::collect on an operation still running: " + description_);
  if (error_) rethrow_copy(error_);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void Work::set_on_wait(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_wait_ = std::move(fn);
}

std::shared_ptr<Work> Work::completed(std::string description) {
  auto w = std::make_shared<Work>(std::move(description));
  w->complete();
  return w;
}

}  // namespace llama4d
