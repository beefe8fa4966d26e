#pragma once
// Pipeline schedules as data: for each pipeline rank, the list of actions it runs in one
// optimizer step. One function per schedule builds the lists; one runtime
// (pipeline_parallel.cpp) executes any list over the ProcessGroup's send/recv; one simulator
// (below) replays a list with given action costs, for the formulas, the planner and the checks.
//
// Stages. The model's layers are cut into S = p * v contiguous VIRTUAL stages; pipeline rank r
// holds v of them, its model CHUNKS c = 0..v-1, chunk c being virtual stage c * p + r (the
// interleaving of Narayanan et al. 2021; v = 1 is the plain pipeline). Virtual stage 0 holds
// the embedding, stage S-1 the final norm, LM head and loss.
//
// Actions. F (forward), B (backward: input and weight gradients), and for zero-bubble
// schedules (Qi et al. 2023) B split into I (backward for the input gradient, which the
// previous stage waits for) and W (backward for the weight gradients, which nobody waits for
// and can fill a bubble), each of micro-batch m on chunk c. Around them the transfers: a
// forward receives its input activation from the previous virtual stage and sends its output
// to the next; a backward (or I) receives its output gradient from the next and sends its
// input gradient to the previous. A send never waits for its receiver (it is buffered); a
// receive waits for its send. Each message has its own tag, so the order of arrival is free.
//
// The schedules and their constraints (m = micro-batches per step, p = pipeline ranks):
//   gpipe        all forwards, then all backwards (Huang et al. 2019). Any m >= 1. Holds the
//                activations of all m micro-batches.
//   1f1b         p - 1 - r warm-up forwards on rank r, then one forward and one backward in
//                turn, then the remaining backwards (PipeDream-Flush, Narayanan et al. 2021).
//                Any m >= 1. Rank r holds at most min(m, p - r) micro-batches.
//   interleaved  1F1B over v >= 2 chunks per rank, micro-batches in groups of p (Megatron-LM's
//                interleaved schedule). m must be a multiple of p; the layers must split into
//                p * v stages. The bubble shrinks by v, the point-to-point traffic grows by v.
//   zb-h1        1F1B with B split into I and W; rank r runs the W of micro-batch k after the I
//                of micro-batch k + r, so the deferred W passes fill the cool-down where 1F1B
//                idles (Qi et al. 2023, "ZB-H1"). Any m >= 1. A micro-batch is held until its
//                W has run: rank r holds up to min(m, p), the peak of 1F1B's first rank.
// Bubble fractions of the whole step with uniform stages and free communication (the
// simulator below reproduces them; the tests hold it to them exactly):
//   gpipe, 1f1b   (p - 1) / (m + p - 1)            [(p - 1) / m of the ideal time m(F+B)]
//   interleaved   (p - 1) / (v m + p - 1)          with F, B the per-chunk times
//   zb-h1         (p - 1)(F + I - W) / (m (F + I + W) + (p - 1)(F + I - W)), given W <= F, I
//                 and m >= p (with fewer micro-batches there are too few W to fill the cool-down).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llama4d {

enum class PipelineScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };

// "gpipe", "1f1b", "interleaved", "zb-h1"; InputError naming the valid ones.
PipelineScheduleKind parse_pipeline_schedule(std::string_view name);
std::string_view pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineAction {
  enum class Op : uint8_t {
    forward,          // F
    backward,         // B (input and weight gradients)
    backward_input,   // I
    backward_weight,  // W
    recv_activation,  // from the previous virtual stage, before F
    send_activation,  // to the next, after F
    recv_gradient,    // from the next virtual stage, before B / I
    send_gradient,    // to the previous, after B / I
  };
  Op op = Op::forward;
  int micro_batch = 0;
  int chunk = 0;
  int peer = -1;  // transfers: the other pipeline rank

  bool is_compute() const { return op <= Op::backward_weight; }
  // "F3", "F3.1" (chunk 1 of an interleaved schedule), "recv act 3.1 from 2", ...
  std::string describe(bool show_chunk) const;
};

struct PipelineSchedule {
  PipelineScheduleKind kind = PipelineScheduleKind::one_f_one_b;
  int ranks = 1;          // p
  int chunks = 1;         // v: model chunks per rank
  int micro_batches = 1;  // m
  std::vector<std::vector<PipelineAction>> actions;  // [rank] in execution order

  int virtual_stages() const { return ranks * chunks; }
  int virtual_stage(int rank, int chunk) const { return chunk * ranks + rank; }
  int rank_of_stage(int stage) const { return stage % ranks; }
  int chunk_of_stage(int stage) const { return stage / ranks; }
  // The message tag of a transfer on `rank` (unique per direction, micro-batch and boundary;
  // the sender and the receiver compute the same one).
  int tag(int rank, const PipelineAction& a) const;
  std::string name() const;  // "1F1B, p=4, m=8", "interleaved 1F1B, p=4, v=2, m=8"
  // One line per rank: "rank 0: F0 F1 F2 B0 F3 B1 ..." (compute actions only).
  std::string describe() const;
};

// The schedule `kind` for p ranks, m micro-batches and v chunks per rank (v = 1 except for
// interleaved). InputError naming the constraint it violates.
PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int ranks, int micro_batches, int chunks = 1);

// What one step of a schedule costs on a uniform pipeline: time units per action of one chunk.
struct StageCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;  // B = I + W; transfers are free
};

struct ScheduleSimulation {
  double makespan = 0;               // the step's end: the last rank's last action
  std::vector<double> busy;          // [rank] time spent computing
  std::vector<int> peak_in_flight;   // [rank] most micro-batch chunks forwarded whose backward
                                     //        (W for zero-bubble) had not finished
  std::vector<int64_t> messages;     // [rank] point-to-point messages sent
  double bubble_fraction() const;    // 1 - sum(busy) / (p * makespan): idle share of the step
};

// Replays the lists with buffered sends and blocking receives, each action at the earliest
// time its rank and its input allow. Checks the schedule first: every rank runs F exactly once
// for each (micro-batch, chunk) and B once (or I then W), after its F, with the transfers
// each needs in the right places. InputError naming the rank and the action when it is
// malformed or deadlocks (some receive whose send never comes).
ScheduleSimulation simulate_pipeline_schedule(const PipelineSchedule& schedule, const StageCosts& costs = {});

// The formula for the bubble fraction above, for uniform stages and free communication.
double pipeline_bubble_formula(PipelineScheduleKind kind, int ranks, int micro_batches, int chunks,
                               const StageCosts& costs = {});

}  // namespace llama4d
