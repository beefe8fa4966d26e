#pragma once
// Where a pipeline's stages lie in the model. The L layers are cut into S = p * v contiguous
// virtual stages (p pipeline ranks, v model chunks per rank); virtual stage s holds
// layers_per_stage[s] layers, and additionally the embedding (s = 0) or the final norm, LM
// head and loss (s = S - 1). Pipeline rank r holds virtual stages r, p + r, 2p + r, ...: its
// chunks 0, 1, ... (pipeline_schedule.h).
//
// Balance. By default the layers are spread evenly (stage s gets layers [L s / S, L (s+1) / S)).
// The first and last stages then do more than the others: the embedding lookup is cheap, but
// the LM head is a [V, C] matmul and the loss a softmax over V, and both stages keep extra
// activations. Llama 3 (Dubey et al. 2024, section 3.3.2) removed one transformer layer from
// the first and the last stage for that reason; `--pp-layers 1,2,2,1` does the same for 6
// layers on 4 stages.
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/units.h"

namespace llama4d {

struct PipelineLayout {
  int ranks = 1, chunks = 1;
  std::vector<int> layers_per_stage;  // [virtual stage]

  int virtual_stages() const { return ranks * chunks; }
  int first_layer(int stage) const;
  // The units of virtual stage s, in forward order.
  UnitRange stage_units(int stage, int num_layers) const;
  // Pipeline rank r's units: one range per chunk, chunk order.
  std::vector<UnitRange> rank_units(int rank, int num_layers) const;
  std::string describe() const;  // "layers 0-1 | 2-3 | 4 | 5 (embedding on stage 0, head on stage 3)"
};

// The layout of `cfg` over `ranks` x `chunks` virtual stages; `layers` gives each stage's
// layer count (empty: balanced). InputError naming the problem: a count list of the wrong
// length, counts that do not add up to the model's layers, or a stage left without a layer.
PipelineLayout make_pipeline_layout(const LlamaConfig& cfg, int ranks, int chunks, const std::vector<int>& layers = {});

// "1,2,2,1" -> {1, 2, 2, 1}; InputError on malformed text.
std::vector<int> parse_pipeline_layers(const std::string& text);

}  // namespace llama4d
