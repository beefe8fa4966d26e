#pragma once
// A rank's communication stream: one worker thread running communication tasks in the order
// they were issued, like the CUDA stream NCCL kernels run on. Synchronous operations are
// "submit, then wait"; asynchronous ones return the Work at once, so a rank can keep computing
// (say, the backward of the next layer) while its gradients are being reduced. Because every
// operation of a rank goes through one FIFO, an async all_reduce followed by a send of the same
// buffer sends the reduced values, exactly as stream order guarantees on a GPU.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/comm/work.h"

namespace llama4d {

class CommStream {
 public:
  // allow_inline: a synchronous task submitted while the stream is idle runs on the caller's
  // thread (same order, two thread hand-offs fewer). The MPI backend turns it off: all its MPI
  // calls must come from one thread.
  explicit CommStream(std::string name, bool allow_inline = true)
      : name_(std::move(name)), allow_inline_(allow_inline) {}
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `task`; the returned Work completes when it ran (with its exception if it threw).
  // The worker thread starts on the first queued task. `caller_waits`: the caller will wait
  // for the Work right away, so the task may run inline (see allow_inline).
  std::shared_ptr<Work> submit(std::string description, std::function<void()> task,
                               std::function<void()> on_wait = {}, bool caller_waits = false);
  // Blocks until every task submitted so far has run.
  void drain();
  // Runs what is queued, then joins the worker. Later submits throw CommError.
  void stop();

 private:
  struct Item {
    std::function<void()> task;
    std::shared_ptr<Work> work;
  };
  void loop();

  const std::string name_;
  const bool allow_inline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false, stopping_ = false, stopped_ = false;  // busy_: a task runs (worker or inline)
  std::thread thread_;
};

}  // namespace llama4d
