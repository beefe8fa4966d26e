#pragma once
// `train --stage KEY=VALUE,...` (repeated, one per stage): a recipe (core/train/recipe.h) written
// on the command line for the simple cases, a batch or sequence ramp and an annealing stage,
// without a file. The keys are a recipe stage's, with the same meanings:
//   name=ramp                 the stage's name (default "stage N")
//   steps=20 | tokens=40960   its length (exactly one)
//   batch_size=8 seq_len=64   the global batch in rows and the row length (both required)
//   dp=2 tp=1 cp=1 pp=1       its mesh (default 1 each)
//   lr=SHAPE:FROM:TO          its LR segment: warmup, linear or cosine from FROM to TO (required)
//   data=PATH[:W][+PATH[:W]]  its sources and weights (default: `default_data` with weight 1;
//                             a weight left out is 1)
// e.g. the batch doubled on twice the replicas, then annealed to zero:
//   --stage steps=20,batch_size=8,seq_len=64,dp=2,lr=warmup:0:3e-3
//   --stage steps=20,batch_size=16,seq_len=64,dp=4,lr=linear:3e-3:0
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llama4d {

// The recipe JSON the flags spell (name "stages", the given seed), for parse_recipe to check as
// it checks a file. InputError naming the --stage (1-based) and its key for text that is not
// KEY=VALUE, a key given twice, an lr that is not SHAPE:FROM:TO, a data weight that is not a
// number; keys and values the recipe does not know are left to parse_recipe to name.
nlohmann::json stage_flags_recipe(const std::vector<std::string>& stages, uint64_t seed, const std::string& default_data);

}  // namespace llama4d
