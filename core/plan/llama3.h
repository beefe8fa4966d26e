#pragma once
// Llama 3 405B as it was trained, for the planner: the three layouts of the paper's Table 4
// (Dubey et al. 2024, "The Llama 3 Herd of Models"), each 16M tokens per step, with the MFU the
// paper reports. Used by `llama4d plan --llama3`, lesson 07 and the planner's tests.
#include <cstdint>
#include <string>
#include <vector>

#include "core/plan/planner.h"

namespace llama4d {

struct Llama3Layout {
  std::string mesh;       // innermost first
  int64_t seq_len = 0;
  int64_t batch_per_dp = 0;  // sequences per data-parallel group and step
  double reported_mfu = 0;   // BF16 MFU, Table 4
};
const std::vector<Llama3Layout>& llama3_405b_layouts();

// The step of one layout, with the assumptions that are ours named: bf16 mixed precision, ZeRO-3
// keeping parameters gathered from forward to backward and reducing gradients once per step (as
// Llama 3 did), an interleaved 1F1B
// pipeline of 4 chunks per rank with one layer on the first and last virtual stage (126 = 1 +
// 62 x 2 + 1: the paper's "one layer fewer at both ends"), micro-batches of one sequence, and
// the activation checkpointing policy `ac` (the paper does not say; "selective" by default).
StepShape llama3_405b_shape(const Llama3Layout& layout, const std::string& ac = "selective");

// 8B and 70B: the paper gives no training layout for them (Table 4's three rows are all 405B's;
// reading them as 8B, 70B and 405B is a mistake). These plans are ours, at 405B's 16M tokens per
// step of 8K sequences, bf16, ZeRO-3 keeping parameters and reducing once per step, and selective
// checkpointing:
//   8B   FSDP alone on 2,048 GPUs, one sequence each: the model fits a GPU, so no model split.
//   70B  tp=8 inside a node, pp=4 interleaved with 5 chunks (80 layers = 20 virtual stages of 4)
//        and dp=256: 8,192 GPUs, 8 micro-batches of one sequence per data rank.
struct Llama3OwnPlan {
  std::string model;  // the preset
  StepShape shape;
};
std::vector<Llama3OwnPlan> llama3_own_plans();

// The planner's cluster model with an H100's 80 GB of HBM and the defaults of ClusterModel.
ClusterModel h100_cluster();

}  // namespace llama4d
