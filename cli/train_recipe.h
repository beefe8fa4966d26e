#pragma once
// `train --recipe FILE`: a training recipe's stages (core/train/recipe.h) on virtual GPUs, the
// state moving between stages' meshes in memory.
#include <nlohmann/json.hpp>

#include "cli/train_run.h"

namespace llama4d::cli::training {

// The whole recipe run from the flags: checked, then run from its start or a --resume
// checkpoint's stage; the result of the last stage with every stage's row.
nlohmann::json train_recipe(const TrainArgs& asked, const CLI::App& cmd);

}  // namespace llama4d::cli::training
