#include "core/train/async_checkpoint.h"

#include <chrono>

#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/train/checkpoint_state.h"

namespace llama4d {

template <class T>
void write_state_image(const std::string& dir, const TrainingStateImage<T>& image,
                       const std::function<void(const std::string& staging)>& more_files) {
  if (!image.created()) throw Error("write_state_image: the image is empty (nothing was saved into it)");
  StagedDirectory staged(dir, kConfigFile);  // replaces only a checkpoint
  // One writer over the whole model: each tensor of the image is a whole Hugging Face tensor,
  // and the whole model's specs lay them out back to back in the flat order the files use.
  const std::vector<ParamSpec> whole = llama_param_specs(image.config());
  TrainingCheckpointWriter<T> writer(staged.staging(), image.config(), whole);
  writer.create(image.optimizer_steps(), image.steps_done(), image.options());
  for (const ParamSpec& s : whole) {
    const int64_t b = s.offset, e = s.offset + s.numel;
    writer.params(b, e, image.tensor(kModelBase, s.name).data());
    writer.exp_avg(b, e, image.tensor(kOptimizerBase, "exp_avg." + s.name).data());
    writer.exp_avg_sq(b, e, image.tensor(kOptimizerBase, "exp_avg_sq." + s.name).data());
  }
  writer.finish();
  if (more_files) more_files(staged.staging());
  staged.commit();
}

template <class T>
AsyncCheckpointer<T>::~AsyncCheckpointer() {
  finish_quietly();
  join();
}

template <class T>
void AsyncCheckpointer<T>::wait() {
  if (const std::string error = finish_quietly(); !error.empty()) throw IoError(error);
}

template <class T>
std::string AsyncCheckpointer<T>::finish_quietly() {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return !in_flight_; });
  return error_;
}

template <class T>
void AsyncCheckpointer<T>::join() {
  if (writer_.joinable()) writer_.join();
}

template <class T>
void AsyncCheckpointer<T>::start(const std::string& dir, std::function<void(const std::string& staging)> more_files) {
  std::lock_guard<std::mutex> lock(mu_);
  start_locked(dir, std::move(more_files));
}

template <class T>
void AsyncCheckpointer<T>::share_written(int ranks, const std::string& dir,
                                         std::function<void(const std::string& staging)> more_files) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++shares_ < ranks) return;
  shares_ = 0;
  start_locked(dir, std::move(more_files));
}

template <class T>
void AsyncCheckpointer<T>::start_locked(const std::string& dir, std::function<void(const std::string&)> more_files) {
  if (in_flight_) throw Error("AsyncCheckpointer::start: a write is already in flight (wait() first)");
  in_flight_ = true;
  error_.clear();
  ++stats_.checkpoints;
  // The previous writer has finished: clearing in_flight_ under the lock was its last act, so
  // joining it here, with the lock held, cannot wait on the lock.
  join();
  writer_ = std::thread([this, dir, more = std::move(more_files)]() mutable { write(dir, std::move(more)); });
}

template <class T>
void AsyncCheckpointer<T>::write(std::string dir, std::function<void(const std::string&)> more_files) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    write_state_image(dir, image_, more_files);
  } catch (const std::exception& e) {
    error = "the asynchronous checkpoint of step " + std::to_string(image_.steps_done()) + " to " + dir +
            " failed (the previous checkpoint there is kept): " + e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  error_ = error;
  if (error.empty()) {
    ++stats_.committed;
    stats_.write_s += seconds;
    stats_.last_write_s = seconds;
    stats_.last_committed_step = image_.steps_done();
  }
  in_flight_ = false;
  done_.notify_all();
}

template <class T>
AsyncCheckpointStats AsyncCheckpointer<T>::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

template void write_state_image<float>(const std::string&, const TrainingStateImage<float>&,
                                       const std::function<void(const std::string&)>&);
template void write_state_image<double>(const std::string&, const TrainingStateImage<double>&,
                                        const std::function<void(const std::string&)>&);
template class AsyncCheckpointer<float>;
template class AsyncCheckpointer<double>;

}  // namespace llama4d
