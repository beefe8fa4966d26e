#pragma once
// Failures drawn at a rate (`train --fault-rate P --fault-seed S`): every rank fails at every step
// with probability P, independently, and the cause of each failure is drawn from the mix of Llama
// 3's 419 unexpected interruptions ("The Llama 3 Herd of Models", 2024, section 3.3.4, Table 5),
// each cause injected as the kind of fault (fault_schedule.h) that fails the way it does:
//
//   cause (Table 5)                 count  kind        why
//   faulty GPU                        148  crash       the GPU falls off the bus: its process dies
//   GPU HBM3 memory                    72  crash       an uncorrectable ECC error kills the process
//   software bug                       54  crash       an exception
//   network switch / cable             35  collective  a link drops mid-collective
//   host maintenance                   32  crash       the host is taken away
//   GPU SRAM memory                    19  crash       uncorrectable, as HBM3
//   GPU system processor               17  hang        the GPU stops answering without dying
//   NIC                                 7  collective  a link
//   NCCL watchdog timeout               7  hang        a collective that never finishes
//   silent data corruption              6  sdc         a flipped bit nothing reports
//   GPU thermal interface + sensor      6  slow        a throttled GPU (2x slower for a step)
//   SSD, power supply, server chassis,
//   IO expansion board, dependency,
//   CPU, system memory                 16  crash       the host or its process dies
//
// The counts are the table's and sum to 419; its percentage column is not always count / 419
// (148 faulty GPUs are listed as 30.1%, where 148 / 419 is 35.3%; the GPU rows' percentages sum to
// the 58.7% the text quotes): the draw uses the counts. Of the drawn faults, then, 341 / 419
// (81.4%) crash, 42 (10.0%) are link failures, 24 (5.7%) hangs, 6 (1.4%) silent corruptions and
// 6 (1.4%) slowdowns.
//
// Why per rank and per step, not per hour: a job's failure rate grows with its GPUs (Llama 3 lost
// one job about every three hours on 16,384 GPUs: 419 / (54 days x 24 h x 16,384) = 1.97e-5 per
// GPU-hour), so the rate is per rank; and a run on virtual GPUs takes seconds whose length
// depends on this machine's load, so a rate per wall-clock hour would draw another schedule every
// run, where a rate per step draws the same one from the same seed, mesh and steps, and can be
// replayed with --faults. To model a real cluster: P = rate per GPU-hour x hours per step.
#include <cstdint>
#include <span>
#include <string>

#include "core/parallel/fault_schedule.h"

namespace llama4d {

struct FailureCause {
  const char* cause;  // Table 5's wording
  int count;          // its interruptions out of 419
  FaultKind kind;     // how it is injected here
};

// Table 5's rows, in its order, with the kind each is injected as.
std::span<const FailureCause> llama3_failure_causes();

struct DrawnFault {
  Fault fault;
  const FailureCause* cause = nullptr;
};

struct DrawnSchedule {
  FaultSchedule schedule;        // replayable: FaultSchedule::to_json is a --faults file
  std::vector<DrawnFault> drawn;  // the same faults with their causes
  int dropped_sdc = 0;           // silent corruptions drawn where the plan cannot inject one
};

// Every (rank, step) of ranks [0, ranks) and steps [1, last_step] fails with probability
// `per_rank_step` in (0, 1] (InputError naming --fault-rate otherwise), drawn from `seed` by a
// counter-based hash of (seed, step, rank), so the schedule does not depend on the order it is
// drawn in; the cause by Table 5's counts. A slow fault is 2x for one step; an sdc fault's element
// and bit come from the schedule's seed (fault_injector.h). `sdc_possible` false (ZeRO-3 holds no
// whole weights): a drawn silent corruption is dropped and counted.
DrawnSchedule draw_fault_schedule(double per_rank_step, uint64_t seed, int ranks, int64_t last_step,
                                  bool sdc_possible = true);

}  // namespace llama4d
