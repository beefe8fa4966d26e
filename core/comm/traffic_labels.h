#pragma once
// The labels the strategies give their collectives: the names the traffic log, the trace and the
// lessons' tables show. Named once here, so the code that sends and the code that counts bytes by
// label (the lessons, the tests) read the same words. `unit` is a unit's name (unit_name():
// "embedding", "layer 3", "head"), or the start of one when counting ("layer": every layer).
#include <string>
#include <string_view>

namespace llama4d::label {

inline std::string with(std::string_view what, std::string_view unit) { return std::string(what) + std::string(unit); }

// ---- Data parallelism (data_parallel.cpp, zero*.cpp, fsdp.cpp) ----------------------------------
inline std::string grad_bucket(std::string_view unit) { return with("grad bucket ", unit); }  // DP: a unit's all-reduce
inline std::string grads(std::string_view unit) { return with("grads ", unit); }  // ZeRO: its reduce-scatter
// HSDP: the rank's piece all-reduced over the replicas, behind the reduce-scatter.
inline std::string grads_across_replicas(std::string_view unit) { return with("grads across replicas ", unit); }
inline std::string params(std::string_view unit) { return with("params ", unit); }  // ZeRO-3: a unit's all-gather
inline constexpr std::string_view kUpdatedParameters = "updated parameters";  // ZeRO-1/2: AdamW's pieces gathered
inline constexpr std::string_view kGradNormPartials = "grad-norm partials";   // ZeRO: the norm's chunk partials
inline constexpr std::string_view kGradNormTensorSlices = "grad-norm (tensor-parallel slices)";

// ---- Tensor parallelism (tensor_parallel.cpp) ----------------------------------------------------
inline constexpr std::string_view kVocabLoss = "vocab-parallel loss";  // the three below
inline constexpr std::string_view kVocabLossMax = "vocab-parallel loss: max";
inline constexpr std::string_view kVocabLossSumExp = "vocab-parallel loss: sum of exp";
inline constexpr std::string_view kVocabLossTarget = "vocab-parallel loss: target logit";
inline constexpr std::string_view kNormGainGrad = "sequence-parallel norm gain gradient";
inline constexpr std::string_view kKeyValueReplicas = "key/value replicas: weight gradient sum";

// ---- Context parallelism (context_parallel.cpp) --------------------------------------------------
inline constexpr std::string_view kContextParallel = "context parallelism";  // every one below
inline constexpr std::string_view kCpAllGather = "context parallelism: all-gather keys and values";
inline constexpr std::string_view kCpAllGatherBackward = "context parallelism: all-gather keys and values (backward)";
inline constexpr std::string_view kCpReduceScatter = "context parallelism: reduce-scatter key/value gradients";
inline constexpr std::string_view kCpRing = "context parallelism: ring";  // the three below
inline constexpr std::string_view kCpRingKeysValues = "context parallelism: ring keys and values";
inline constexpr std::string_view kCpRingWithGradients = "context parallelism: ring keys, values and gradients";
inline constexpr std::string_view kCpRingGradientsHome = "context parallelism: ring key/value gradients home";

// ---- Pipeline parallelism (pipeline_parallel.cpp): "pipeline: " + the action --------------------
inline constexpr std::string_view kPipeline = "pipeline: ";
inline constexpr std::string_view kPipelineSend = "pipeline: send";
inline constexpr std::string_view kPipelineSendActivation = "pipeline: send activation";
inline constexpr std::string_view kPipelineSendGradient = "pipeline: send gradient";

}  // namespace llama4d::label
