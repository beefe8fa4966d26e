#include "core/dist/work.h"

namespace llama4d {

void Work::wait() {
  std::function<void()> hook;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
    hook = std::move(on_wait_);
    on_wait_ = nullptr;
  }
  if (hook) hook();
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
