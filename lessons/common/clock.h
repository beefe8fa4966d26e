#pragma once
// Time in the lessons. Each virtual GPU keeps a simulated clock (core/comm/trace.h): its ops'
// FLOPs at the modelled GPU's rate, its collectives by the alpha-beta link model, and the time
// its compute lane sat blocked on a result (exposed communication). Here: a table of one step
// per rank, and the collectives' times written from the READMEs' alpha-beta formulas
// (independent of core/comm/comm_model.cpp, which the clock uses: the exercises compare them).
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/cluster.h"
#include "core/comm/comm_types.h"
#include "core/comm/trace.h"
#include "core/comm/traffic_log.h"
#include "core/model/config.h"

namespace llama4d::lesson {

// The change of a rank's totals over one step (after - before).
TimelineTotals time_delta(const TimelineTotals& after, const TimelineTotals& before);

// Per rank: step time, compute (FLOPs / rate), exposed communication, comm-lane busy time and
// the share of it hidden behind compute; microseconds.
std::string time_table(const std::vector<TimelineTotals>& per_rank, double gpu_tflops);

// Alpha-beta time of one collective over the n ranks of one node (every hop over `link`), chunk
// i holding counts[i] elements of `elem` bytes, S = the sum:
//   ring    n-1 steps; every chunk moves one hop per step, so a step lasts alpha + max chunk / bw
//   direct  one phase: a reduce-scatter rank sends S - c_i and receives (n-1) c_i (an all-gather
//           the reverse); the phase lasts alpha + the busiest rank's bytes / bw
// all-reduce = reduce-scatter + all-gather over balanced chunks (the first count % n one longer).
// An empty collective or n = 1 costs nothing.
double reduce_scatter_us(const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo, const LinkParams& link);
double all_gather_us(const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo, const LinkParams& link);
double all_reduce_us(int64_t count, int n, int64_t elem, ReduceAlgo algo, const LinkParams& link);

// One recorded reduce-scatter, all-gather or all-reduce by the formulas above (balanced chunks
// of its count over its group); Error for any other operation.
double collective_us(const TrafficRecord& r, ReduceAlgo algo, const LinkParams& link);

// Data parallelism's bucket pipeline: bucket u is all-reduced on the comm stream as soon as its
// unit's backward ends and the previous bucket left the stream. backward_us[k] and
// all_reduce_us[k] are the k-th unit in backward order (head first). Returns how long the last
// bucket ends after the last backward: the part of the all-reduces nothing hides.
double bucket_pipeline_tail_us(const std::vector<double>& backward_us, const std::vector<double>& all_reduce_us);

// Parameters of each unit (embedding, blocks, head) from the config, as the README counts them:
// embedding V·C; block 2C + (q + 2kv)·C + q·C + 3·C·I; head C (+ V·C untied).
std::vector<int64_t> unit_parameters(const LlamaConfig& cfg);

// Microseconds as nanoseconds, for exercises that compare times to within 1 ns of rounding.
int64_t ns(double us);

}  // namespace llama4d::lesson
