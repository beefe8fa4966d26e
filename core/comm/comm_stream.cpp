#include "core/comm/comm_stream.h"

#include <chrono>

#include "core/comm/blocked_time.h"
#include "core/error.h"

namespace llama4d {

CommStream::~CommStream() { stop(); }

namespace {

void run_task(const std::function<void()>& task, Work& work) {
  std::exception_ptr error;
  try {
    task();
  } catch (...) {
    error = std::current_exception();
  }
  work.complete(error);
}

}  // namespace

std::shared_ptr<Work> CommStream::submit(std::string description, std::function<void()> task,
                                         std::function<void()> on_wait, bool caller_waits) {
  auto work = std::make_shared<Work>(std::move(description));
  if (on_wait) work->set_on_wait(std::move(on_wait));
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) throw CommError(name_ + ": communication stream already stopped");
    if (caller_waits && allow_inline_ && queue_.empty() && !busy_) {
      busy_ = true;  // the worker stays idle until we are done: order is kept
      lock.unlock();
      // A blocking call run here, on the caller's thread: its whole time (peers included) is
      // the caller's time in communication.
      const auto t0 = std::chrono::steady_clock::now();
      run_task(task, *work);
      add_blocked_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      task = nullptr;
      lock.lock();
      busy_ = false;
      lock.unlock();
      cv_.notify_all();
      return work;
    }
    queue_.push_back({std::move(task), work});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
  return work;
}

void CommStream::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void CommStream::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void CommStream::loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stopping_ && queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::function<void()> task = std::move(item.task);
    run_task(task, *item.work);
    task = nullptr;  // captured state is released before the stream reports idle
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace llama4d
