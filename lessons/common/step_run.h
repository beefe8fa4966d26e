#pragma once
// One measured training step on a virtual cluster: what a lesson's side run (a plan beside the
// main one, a schedule, a cut) shows per rank. Every rank builds the plan's model and trainer,
// all stop once the set-up is done, the clock and the trace restart, and one step runs.
#include <string>
#include <vector>

#include "core/comm/traffic_log.h"
#include "core/data/dataset.h"
#include "core/model/config.h"
#include "core/parallel/pipeline_picture.h"
#include "core/parallel/plan.h"
#include "core/tensor/memory_tracker.h"
#include "core/train/train_options.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"

namespace llama4d::lesson {

struct StepRun {
  std::vector<RankMemory> rest, peak;               // [world rank] at rest after set-up; peaks in the step
  std::vector<std::vector<TrafficRecord>> traffic;  // [world rank] what the step sent
  std::vector<TimelineTotals> time;                 // [world rank] the step on the simulated clock
  std::vector<int> in_flight;                       // [world rank] micro-batches in flight at most (pipelines)
  std::vector<int> units_held;                      // [world rank] units of the model it holds
  PipelinePicture picture;                          // pure pipelines, when asked for
};

struct StepRunOptions {
  double gpu_tflops = 0;      // the modelled GPU's rate on the simulated clock; 0: the cluster's own
  std::string picture_title;  // non-empty: the pipeline picture of a pure pipeline (pp = all ranks)
};

// Trains one step of `plan` (any plan, one device included) on o's cluster shape and reduction
// algorithm. InputError for a plan the model or the sequence cannot be cut into.
StepRun measure_one_step(const LlamaConfig& cfg, const ParallelPlan& plan, const TrainOptions& train,
                         const LessonOptions& o, const TextDataset& data, const StepRunOptions& options = {});

}  // namespace llama4d::lesson
