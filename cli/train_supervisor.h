#pragma once
// The supervisor of a parallel `train` run: the fault-tolerance flags checked, the failures it
// injects (--faults, or drawn by --fault-rate from Llama 3's Table 5), and the restarts
// (--max-restarts) from the latest checkpoint or the in-memory copies, with the run's goodput.
#include <nlohmann/json.hpp>

#include "cli/train_run.h"
#include "core/parallel/fault_rate.h"
#include "core/parallel/fault_schedule.h"
#include "core/parallel/plan.h"

namespace llama4d::cli::training {

// Checks the fault-tolerance flags against the run before anything is computed; returns the
// --faults schedule (empty without one, and for --fault-rate, which draws it later). `cfg`:
// the model, for the plans --on-lost-node shrink would go on with.
FaultSchedule check_fault_flags(const TrainArgs& a, const CLI::App& cmd, const ParallelPlan& plan, const LlamaConfig& cfg);

// Prints the schedule --fault-rate drew, each fault with its cause in Llama 3's Table 5, and writes
// it as a --faults file, so the same failures can be injected again.
void report_drawn_faults(const TrainArgs& a, const DrawnSchedule& d);

// The result's "fault_rate": the rate, seed, schedule and causes drawn.
nlohmann::json drawn_faults_json(const TrainArgs& a, const DrawnSchedule& d);

// Every parallel run: runs the job under the supervisor (with no restarts unless asked), in the
// run's precision, and reports its goodput. Null on an MPI rank that does not report.
nlohmann::json supervise_run(const Run& r, const ParallelPlan& plan, const TextDataset& data, const FaultSchedule& faults);

}  // namespace llama4d::cli::training
