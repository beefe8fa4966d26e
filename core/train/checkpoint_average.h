#pragma once
// Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one
// model shape. Llama 3 averages checkpoints taken during annealing to produce its final
// pre-trained model ("The Llama 3 Herd of Models", 2024, section 3.4.3, citing Polyak
// averaging). Only the weights are averaged: the result is a model checkpoint (config.json +
// model weights) for eval and generate, or a --checkpoint to train from. AdamW moments are
// left out, since a mean of moments describes no optimizer that ever ran.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llama4d {

struct AverageResult {
  int64_t checkpoints = 0;  // averaged
  int64_t parameters = 0;   // elements per checkpoint
  std::string dtype;        // config.json's torch_dtype, the storage of inputs and output
  nlohmann::json to_json() const;
};

// Writes to `out` (atomically: a staging directory renamed into place) the checkpoint whose
// every weight is (w_1 + ... + w_n) / n, summed in fp64 in the order given and stored in the
// inputs' dtype. InputError naming the checkpoint and what differs for fewer than 2 inputs, or
// an input whose config.json (shape or torch_dtype) differs from the first's; load_model's
// InputError for missing or misshapen tensors.
AverageResult average_checkpoints(const std::string& out, const std::vector<std::string>& inputs);

}  // namespace llama4d
