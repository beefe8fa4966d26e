#pragma once
// Goodput: the share of a run's wall time that trained steps it kept, and where the rest went.
// A supervised run (`train --max-restarts N`) is a sequence of attempts; each starts (builds the
// model, reads a checkpoint), trains steps, saves, and either finishes or fails. Of its time:
//
//   productive   steps whose result the run kept (in the final weights);
//   lost work    steps trained after the last checkpoint of an attempt that then failed: the
//                next attempt trains them again. lost_steps counts them from the step the next
//                attempt restores to the last step every rank of the failed one finished, so a
//                failure costs the same count however far the lead rank got before it heard;
//   checkpoint   stalls for checkpoints: a synchronous save's whole write; an asynchronous one's
//                snapshot to host memory and any wait for the previous write to commit (its
//                write runs beside training and is reported, not counted: checkpoints[].write_s);
//   startup      the first attempt's start (model, weights, checkpoint read);
//   restart      every later attempt's start;
//   memory copy  stalls taking in-memory copies of the state (train --memory-copy-every), a part
//                of the steps' time (a copy is taken inside the step it follows), not a share beside it;
//   detection    from the end of an attempt's last finished step or save until the failure stopped it
//                (the partial step, the timeout that named the rank);
//   other        evaluation and the rest of the loop.
//
// The lead rank records steps and saves as they happen; the supervisor records attempt starts
// and ends. Times are wall-clock seconds of this process.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

class GoodputLedger {
 public:
  // An attempt began (t seconds since the run started), resuming after `steps_done` steps.
  void attempt_started(double t, int64_t steps_done);
  // The attempt's training loop is ready for its first step.
  void loop_started(double t);
  // Step `step` took `seconds`, ending at t.
  void step_done(int64_t step, double seconds, double t);
  // A checkpoint holding every step up to `step` took `seconds` to write, ending at t.
  void saved(int64_t step, double seconds, double t);
  // An asynchronous checkpoint of `step`: the step stalled `wait_seconds` for the previous write
  // to commit, then `snapshot_seconds` copying the state to host memory, ending at t.
  void snapshot_taken(int64_t step, double wait_seconds, double snapshot_seconds, double t);
  // The background write of the checkpoint of `step` committed after `write_seconds`: the steps
  // up to it are kept.
  void write_committed(int64_t step, double write_seconds);
  // The attempt ended at t, by `cause` ("" when it finished). `saved_through`: the step the next
  // attempt restores (a checkpoint found complete on disk, which the lead rank may not have seen
  // finish, or the in-memory copies): steps up to it are kept. `every_rank_reached`: the last step
  // every rank finished (-1: unknown; lost_steps then counts the lead rank's unsaved steps).
  void attempt_ended(double t, const std::string& cause, int64_t saved_through = 0, int64_t every_rank_reached = -1);
  // An in-memory copy of the state took `seconds`, ending at t.
  void memory_copied(double seconds, double t);
  // The next attempt restores its state from the in-memory copies (true) or from disk (false).
  void recovered(bool from_memory);

  int attempts() const { return int(attempts_.size()); }
  // The last step a checkpoint of this run holds (0: none).
  int64_t last_saved_step() const { return last_saved_; }
  // {"wall_s", "productive_s", "goodput", "lost_work_s", "lost_steps", "checkpoint_s",
  //  "startup_s", "restart_s", "detection_s", "memory_copy_s", "other_s", "restarts",
  //  "recoveries": {"from_memory", "from_disk"}, "failures": [cause, ...],
  //  "checkpoints": [{"step", "async", "stall_s", and for async "wait_s", "snapshot_s",
  //  "write_s" (null until committed)}, ...]}
  nlohmann::json report() const;

 private:
  struct Attempt {
    double start = 0, loop = -1, last_progress = -1, end = -1;  // last_progress: a step or save ended
    std::string cause;
  };
  struct Checkpoint {
    int64_t step = 0;
    bool async = false;
    double stall = 0, wait = 0, snapshot = 0, write = -1;  // write: -1 until committed
  };
  std::vector<Attempt> attempts_;
  std::vector<Checkpoint> checkpoints_;
  void keep_through(int64_t step);  // this attempt's unsaved steps up to `step` become productive
  nlohmann::json checkpoint_rows() const;
  std::map<int64_t, double> unsaved_;  // this attempt's steps after its last save: seconds
  double productive_ = 0, lost_ = 0, checkpoint_ = 0, memory_copy_ = 0;
  int from_memory_ = 0, from_disk_ = 0;
  int64_t lost_steps_ = 0, last_saved_ = 0;
};

}  // namespace llama4d
