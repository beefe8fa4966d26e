#pragma once
// --init on a parallel plan (train, verify): a model directory's weights as a training checkpoint
// of step 0, AdamW's moments zero (what a fresh optimizer holds, so training from it is training
// from the weights). A step-0 checkpoint is the one format every strategy already reads its own
// part of (the resume path), so no strategy needs a loader of its own for plain weights.
#include <string>

#include "core/data/dataset.h"
#include "core/model/config.h"
#include "core/train/train_options.h"

namespace llama4d::cli {

// Writes the checkpoint into `dir` (replacing one there) from model_dir's weights, for a run of
// `opt` on `data`. Returns `dir`.
template <class T>
std::string stage_init_checkpoint(const LlamaConfig& cfg, const std::string& model_dir, const TextDataset& data,
                                  const TrainOptions& opt, const std::string& dir);

}  // namespace llama4d::cli
