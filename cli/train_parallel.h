#pragma once
// One launch of a parallel `train` run: every rank of the mesh (virtual GPUs, MPI processes or
// NCCL ranks) builds its part of the model and trainer, agrees with the others on the run, and
// goes through the loop, with the faults, replica checks, straggler detection and in-memory
// copies a supervised attempt asks for.
#include <string>

#include <nlohmann/json.hpp>

#include "cli/train_loop.h"
#include "core/parallel/fault_injector.h"
#include "core/parallel/heartbeat.h"
#include "core/parallel/memory_copies.h"
#include "core/parallel/plan.h"
#include "core/train/checkpoint_state.h"

namespace llama4d::cli::training {

// A supervised run's attempt: the faults to inject (null: none), the ledger, and the checkpoint
// a restarted attempt resumes (empty: the run's own start).
template <class T>
struct Attempt {
  FaultInjector* faults = nullptr;
  Supervision* sup = nullptr;
  std::string restart_from;
  MemoryCopies<T>* copies = nullptr;              // --memory-copy-every: taken every K steps
  const TrainingStateImage<T>* image = nullptr;  // restored from the copies: start from it, not disk
  HeartbeatMonitor* heartbeat = nullptr;          // --heartbeat-timeout: every rank beats into it
};

// Runs the launch; returns the lead rank's result (null on an MPI rank that does not report).
// A failure on any rank throws, after the flight recorders are written (virtual GPUs).
template <class T>
nlohmann::json run_parallel(const Run& r, const ParallelPlan& plan, const TextDataset& data, const Attempt<T>& at = {});

extern template nlohmann::json run_parallel<float>(const Run&, const ParallelPlan&, const TextDataset&, const Attempt<float>&);
extern template nlohmann::json run_parallel<double>(const Run&, const ParallelPlan&, const TextDataset&, const Attempt<double>&);

}  // namespace llama4d::cli::training
