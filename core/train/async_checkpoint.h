#pragma once
// Asynchronous checkpoints (`train --async-checkpoint`): at a checkpoint step the ranks copy
// their shares of the state into host memory (a TrainingStateImage, state_image.h: the step
// stalls only for this snapshot), and one background thread writes that image to the checkpoint
// directory while training goes on. The write is the synchronous one's: staged in a sibling
// directory, fsynced, renamed into place (core/io/atomic_dir.h), so a crash, a full disk or a
// failed write leaves the previous checkpoint whole. Llama 3 names the problem ("The Llama 3 Herd
// of Models", 2024, section 3.3.4: checkpoint stalls are part of what goodput loses);
// torch.distributed.checkpoint's async_save is the same idea (stage to CPU memory, then write).
//
//   snapshot   every rank: wait() for the previous write, then ParallelTrainer::save_state into
//              image() (collective), calling share_written() once its share is in: the last
//              rank to finish starts the write. (Not the lead rank after the closing collective:
//              a rank that fails right after its share is in aborts the peers still waiting in
//              that collective, and the complete snapshot would not be written);
//   write      the background thread: write_state_image(dir, image) — the bytes the synchronous
//              save writes, file for file;
//   wait()     the next checkpoint, and the end of the run, block until the write in flight has
//              committed; a write that failed throws there, on every rank that waits, naming
//              the directory and the step: the run fails, the previous checkpoint stays.
//
// One object serves every rank of a process (virtual GPUs are its threads): the image is shared
// as for in-memory copies, and wait() is safe from any thread. Training never touches the image
// between start() and the end of the write, so the writer and the ranks share no memory but it.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/train/state_image.h"

namespace llama4d {

// Writes `image` as a training checkpoint in `dir`, atomically: the files, bytes and layout a
// synchronous save of the same state writes (config.json, model.safetensors,
// optimizer.safetensors, trainer_state.json). `more_files`, if given, writes further files into
// the staging directory before it is committed (the tokenizer files beside a checkpoint).
// InputError / IoError as StagedDirectory and TrainingCheckpointWriter throw them.
template <class T>
void write_state_image(const std::string& dir, const TrainingStateImage<T>& image,
                       const std::function<void(const std::string& staging)>& more_files = {});

// What the asynchronous checkpoints of a run cost, in wall seconds of this process.
struct AsyncCheckpointStats {
  int64_t checkpoints = 0;  // writes started
  int64_t committed = 0;    // writes that committed
  double write_s = 0;       // background writes, summed (not a stall)
  double last_write_s = 0;  // the latest committed write
  int64_t last_committed_step = 0;
};

template <class T>
class AsyncCheckpointer {
 public:
  AsyncCheckpointer() = default;
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  // Waits for a write in flight (it commits or fails as it would have), dropping its error: a
  // run that is failing for another reason asks finish_quietly() first.
  ~AsyncCheckpointer();

  // Blocks until no write is in flight. If the latest write failed, throws IoError (on every
  // call until the next start()) naming its directory, step and cause. Any thread.
  void wait();
  // The image the ranks snapshot into. Only between a wait() that returned and start().
  TrainingStateImage<T>& image() { return image_; }
  // Starts the background write of image() to `dir`. The caller has waited, and every rank has
  // finished writing its share (save_state returned on the lead rank after its last collective).
  void start(const std::string& dir, std::function<void(const std::string& staging)> more_files = {});
  // Each of `ranks` ranks calls it once its share of a snapshot is in image(); the last call
  // start()s the write (the image is then whole: every share was written before its call).
  void share_written(int ranks, const std::string& dir, std::function<void(const std::string& staging)> more_files = {});
  // Waits, and returns the failed write's message instead of throwing ("": none failed): for a
  // run that is already failing for another reason.
  std::string finish_quietly();

  AsyncCheckpointStats stats() const;

 private:
  void write(std::string dir, std::function<void(const std::string&)> more_files);
  void join();  // the writer thread, once its write has ended
  void start_locked(const std::string& dir, std::function<void(const std::string&)> more_files);

  TrainingStateImage<T> image_;
  mutable std::mutex mu_;
  std::condition_variable done_;
  bool in_flight_ = false;
  int shares_ = 0;  // ranks whose share of the snapshot being taken is in
  std::string error_;  // the latest write's failure, "" if it committed
  AsyncCheckpointStats stats_;
  std::thread writer_;
};

extern template class AsyncCheckpointer<float>;
extern template class AsyncCheckpointer<double>;

}  // namespace llama4d
