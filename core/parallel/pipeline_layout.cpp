#include "core/parallel/pipeline_layout.h"

#include <numeric>

#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

int PipelineLayout::first_layer(int stage) const {
  return std::accumulate(layers_per_stage.begin(), layers_per_stage.begin() + stage, 0);
}

UnitRange PipelineLayout::stage_units(int stage, int num_layers) const {
  const int first = first_layer(stage), last = first + layers_per_stage[size_t(stage)];
  UnitRange r{block_unit(first), block_unit(last)};
  if (stage == 0) r.begin = embedding_unit();
  if (stage == virtual_stages() - 1) r.end = head_unit(num_layers) + 1;
  return r;
}

std::vector<UnitRange> PipelineLayout::rank_units(int rank, int num_layers) const {
  std::vector<UnitRange> out;
  for (int c = 0; c < chunks; ++c) out.push_back(stage_units(c * ranks + rank, num_layers));
  return out;
}

std::string PipelineLayout::describe() const {
  std::string s = "layers";
  for (int st = 0; st < virtual_stages(); ++st) {
    const int a = first_layer(st), n = layers_per_stage[size_t(st)];
    s += st ? " | " : " ";
    s += std::to_string(a);
    if (n > 1) s += '-' + std::to_string(a + n - 1);
  }
  return s + " (embedding on stage 0, head on stage " + std::to_string(virtual_stages() - 1) + ")";
}

PipelineLayout make_pipeline_layout(const LlamaConfig& cfg, int ranks, int chunks, const std::vector<int>& layers) {
  const int L = int(cfg.num_hidden_layers), S = ranks * chunks;
  PipelineLayout p;
  p.ranks = ranks, p.chunks = chunks;
  if (S > L)
    throw InputError("pipeline: " + std::to_string(S) + " stages (pp=" + std::to_string(ranks) + " x " +
                     std::to_string(chunks) + " chunks) for a model of " + std::to_string(L) +
                     " layers: every stage needs at least one layer");
  if (layers.empty()) {
    for (int s = 0; s < S; ++s) p.layers_per_stage.push_back(L * (s + 1) / S - L * s / S);
    return p;
  }
  if (int(layers.size()) != S)
    throw InputError("--pp-layers lists " + std::to_string(layers.size()) + " stages, the pipeline has " + std::to_string(S) +
                     " (pp=" + std::to_string(ranks) + " x " + std::to_string(chunks) + " chunks)");
  int sum = 0;
  for (int n : layers) {
    if (n < 1) throw InputError("--pp-layers: every stage needs at least one layer, got " + std::to_string(n));
    sum += n;
  }
  if (sum != L)
    throw InputError("--pp-layers adds up to " + std::to_string(sum) + " layers, the model has " + std::to_string(L));
  p.layers_per_stage = layers;
  return p;
}

std::vector<int> parse_pipeline_layers(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const int v = parse_number<int>(item, "--pp-layers " + text + ": layer count", 0);
    out.push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace llama4d
