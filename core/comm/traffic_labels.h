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
// Megatron's f and g in a block, and sequence parallelism's halves of them; each family's labels
// start with the first string (for counting), then name the tensor.
inline constexpr std::string_view kG = "g forward";  // the row-parallel outputs' all-reduce
inline constexpr std::string_view kGAttention = "g forward: o_proj partial sums";
inline constexpr std::string_view kGMlp = "g forward: down_proj partial sums";
inline constexpr std::string_view kFAttention = "f backward: attention input gradient";
inline constexpr std::string_view kFMlp = "f backward: MLP input gradient";
inline constexpr std::string_view kFHead = "f backward: head input gradient";
inline constexpr std::string_view kSpForward = "SP forward";
inline constexpr std::string_view kSpAttentionInput = "SP forward: attention input all-gather";
inline constexpr std::string_view kSpMlpInput = "SP forward: MLP input all-gather";
inline constexpr std::string_view kSpAttentionOutput = "SP forward: o_proj reduce-scatter";
inline constexpr std::string_view kSpMlpOutput = "SP forward: down_proj reduce-scatter";
inline constexpr std::string_view kSpBackward = "SP backward";
inline constexpr std::string_view kSpAttentionOutputGrad = "SP backward: o_proj output gradient all-gather";
inline constexpr std::string_view kSpMlpOutputGrad = "SP backward: down_proj output gradient all-gather";
inline constexpr std::string_view kSpAttentionInputGrad = "SP backward: attention input gradient reduce-scatter";
inline constexpr std::string_view kSpMlpInputGrad = "SP backward: MLP input gradient reduce-scatter";
// The vocabulary-parallel embedding and head (with sequence parallelism: their rows moved).
inline constexpr std::string_view kVocabEmbedding = "vocab-parallel embedding";  // both below
inline constexpr std::string_view kVocabEmbeddingSp = "vocab-parallel embedding: reduce-scatter";
inline constexpr std::string_view kSpEmbeddingGrad = "sequence-parallel embedding gradient: gather";
inline constexpr std::string_view kSpHeadInput = "sequence-parallel head input";  // both below
inline constexpr std::string_view kSpHeadInputGather = "sequence-parallel head input: gather";
inline constexpr std::string_view kSpHeadInputGrad = "sequence-parallel head input gradient: reduce-scatter";
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

// ---- Expert parallelism (expert_parallel.cpp) -----------------------------------------------------
inline constexpr std::string_view kExpertParallel = "expert parallelism";  // every one below
inline constexpr std::string_view kEpCounts = "expert parallelism: counts";
inline constexpr std::string_view kEpDispatch = "expert parallelism: tokens to their experts";
inline constexpr std::string_view kEpCombine = "expert parallelism: outputs back";
inline constexpr std::string_view kEpDispatchGrad = "expert parallelism: output gradients to the experts";
inline constexpr std::string_view kEpCombineGrad = "expert parallelism: input gradients back";

// ---- A job's start (rank_agreement.cpp): every rank's settings against rank 0's -----------------
inline constexpr std::string_view kRankAgreement = "rank agreement";

// ---- In-memory copies of the training state (core/parallel/memory_copies.cpp) --------------------
inline constexpr std::string_view kInMemoryCopy = "in-memory copy";  // a rank's shard sent to its partner
inline constexpr std::string_view kInMemoryCopyTaken = "in-memory copy taken";  // every rank has its copy

// ---- Straggler detection (core/parallel/straggler_detector.cpp) ----------------------------------
inline constexpr std::string_view kStepComputeTimes = "straggler check: step compute times";  // one double per rank

}  // namespace llama4d::label
