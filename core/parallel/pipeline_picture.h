#pragma once
// The picture of a pipeline schedule, drawn from the simulated clock: one lane per rank, one box
// per schedule action, idle time left blank, like the schedule figures of Narayanan et al. 2021
// (1F1B, interleaved) and Qi et al. 2023 (zero bubble). Drawn from what the ranks' traces
// measured, not from the schedule's plan, so the bubble a learner sees is the one the run had.
//
// The pipeline runtime records one top-level compute span per action, named by
// pipeline_span_name(): "forward mb 3 chunk 0", "backward mb 3 chunk 0", "backward-input mb 3
// chunk 0", "backward-weight mb 3 chunk 0" (micro-batch and the model chunk on that rank, both
// from 0). Everything else on a trace (other spans, waits, the comm lane) is not an action.
#include <string>
#include <vector>

#include "core/comm/trace.h"

namespace llama4d {

// One action on one rank, in simulated microseconds.
struct PipelineBox {
  int rank = 0;
  double start_us = 0, end_us = 0;
  char op = 'F';  // F forward, B backward, I backward-input, W backward-weight
  int micro_batch = 0, chunk = 0;
};

struct PipelinePicture {
  std::string title;               // "1F1B, p=4, m=8"
  int ranks = 0;
  std::vector<PipelineBox> boxes;  // any order
  double end_us = 0;               // the step's end: the latest compute clock over the ranks

  // Per rank: the time spent in actions, and the fraction of [0, end_us] spent outside them.
  std::vector<double> busy_us() const;
  std::vector<double> bubble_fraction() const;
};

// The span name of an action, the one format the runtime writes and pipeline_picture() reads.
// op is one of F, B, I, W and the indices are >= 0 (InputError otherwise).
std::string pipeline_span_name(char op, int micro_batch, int chunk);

// Boxes from each rank's trace (rank r = index in `ranks`, each non-null), read from the
// top-level compute spans named as above; the trace should hold one step (clear() between
// steps), since time 0 is the left edge. A span whose name starts like an action ("forward mb
// ...") but is not one is an Error naming it, so a typo in the runtime cannot silently drop boxes.
PipelinePicture pipeline_picture(const std::vector<const RankTrace*>& ranks, std::string title);

// A terminal picture: the title, one row per rank with time cut into `columns` cells over
// [0, end_us], each box its op letter (lowercase for chunks >= 1) and micro-batch number as space
// allows, idle cells '.', the rank's bubble at the end of its row; then a time axis and a legend.
std::string pipeline_text(const PipelinePicture& p, int columns = 96);

// A standalone SVG document: rank 0's lane on top, a box per action with its micro-batch number
// inside, coloured by op (lighter for later chunks), idle time blank, a time axis in
// microseconds, the title and each rank's bubble.
std::string pipeline_svg(const PipelinePicture& p);

}  // namespace llama4d
