#pragma once
// One Llama 3 model on one rank, as units (core/model/units.h) with a hand-written forward and
// backward, per-micro-batch activation state and activation checkpointing. KV-cache decoding is
// core/model/decode.h.
// T is float or double.
//
// Data flow of the training forward (B sequences of seq tokens, C hidden, V vocab):
//   unit 0      tokens[B,seq] -> embedding -> x_0[B,seq,C]
//   unit 1+l    x_{l+1} = h + ffn(rmsnorm(h)),  h = x_l + attn(rmsnorm(x_l))
//   unit L+1    rmsnorm(x_L) -> lm_head -> logits[B,seq,V] -> cross-entropy with targets[B,seq]
// Forward and backward run over any range of units, taking and returning the boundary tensor
// (x at the range's start, or its gradient at the end), so a pipeline stage runs its layers and
// keeps several micro-batches in flight, each in its own MicroBatchState.
//
// Storage. Every tensor (parameters, gradients, activations, scratch) is a Buffer charged to
// this model's MemoryTracker: on a virtual GPU, the rank's. Parameters and gradients are
// either `whole` (one flat buffer each, in params.h order: what one device and plain DP hold)
// or `per_unit` (each unit's segment allocated only while the rank needs it: ZeRO-3 gathers
// a unit's weights before it runs and frees them after; ZeRO-2 frees a unit's gradient once
// it is reduce-scattered). Nothing is allocated until it is first needed.
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/model/block.h"
#include "core/model/checkpointing.h"
#include "core/model/config.h"
#include "core/model/head.h"
#include "core/model/params.h"
#include "core/model/rope.h"
#include "core/model/tp_layout.h"
#include "core/model/units.h"
#include "core/model/vocabulary.h"
#include "core/tensor/buffer.h"
#include "core/tensor/memory_tracker.h"

namespace llama4d {

// Which part of a backward to run. Zero-bubble pipeline schedules (Qi et al. 2023, "Zero Bubble
// Pipeline Parallelism": "B" then "W") split it: `input` computes only what the input gradient
// needs (what the previous stage waits for) and keeps what the weight gradients are computed
// from; `weight`, run later, computes the weight gradients from that. input then weight gives
// the same bits as full.
enum class BackwardPass { full, input, weight };

// Everything one micro-batch's forward keeps for its backward, over the units it ran.
// Several can be alive at once (a pipeline's micro-batches in flight). Freed unit by unit as
// the backward consumes it; empty again when the backward returns (the weight pass, when split).
template <class T>
struct MicroBatchState {
  int64_t B = 0, seq = 0;                   // batch rows, tokens per row
  UnitRange units;                          // the units the forward ran
  Buffer<int32_t> tokens, targets;          // [B,T] when the embedding / head are in the range
  Buffer<int32_t> docs;                     // [B, cp·T] document ids of the whole rows (BlockDims::doc), until
                                            // the backward's last attention; empty: no document mask
  std::vector<Buffer<T>> x;                 // [L+1] x[l] = input of block l, x[L] = the head's input
  std::vector<Buffer<bf16>> x_parked;       // [L+1] bf16 mixed precision: x[l] waiting as bf16 (bf16_parking.h)
  std::vector<BlockActivations<T>> blocks;  // [L] per the checkpointing policy
  HeadActivations<T> head;
  Buffer<T> input_grad;  // after backward of a range that starts at a block: d(objective)/d(x at the range's start)
  LossSum loss;          // when the head is in the range
  // Mixture of experts: the sum over the range's blocks of their load-balancing losses (coef
  // included; 0 when not added to the objective), and [L, E] the tokens routed to each expert of
  // each layer (layers outside the range: 0). Empty for a dense model.
  double aux_loss = 0;
  std::vector<int64_t> expert_counts;
  bool forward_done = false;
  // Between an input pass and its weight pass: what each unit's weight gradients are computed
  // from (see BlockWeightGradInputs, HeadWeightGradInputs), and the embedding's output gradient
  // [rows, C] for its scatter-add (with the tokens, kept too).
  std::vector<BlockWeightGradInputs<T>> block_weight_inputs;  // [L]
  HeadWeightGradInputs<T> head_weight_inputs;
  Buffer<T> embedding_weight_input;
  bool weight_pass_pending = false;

  int64_t activation_bytes() const;  // what is held now
  void reset();
};

template <class T>
class Llama {
 public:
  enum class Residency { whole, per_unit };

  // memory: the rank's tracker; null means the model keeps its own (unlimited) one, so a single
  // device reports its memory too. layout: the tensor-parallel slice this rank holds (default:
  // the whole model); a sliced model needs set_block_comm and set_vocabulary before it runs.
  // held: the units this rank holds (a pipeline rank's stages); empty: all of them. The others
  // have no parameters here: their segments are empty, at the place they would be.
  // experts: the experts of every MoE layer this rank holds (expert parallelism; default: all of
  // them); the others have no parameters here, and the MoE layers need a BlockComm that
  // shards_experts. Allocates nothing yet.
  explicit Llama(const LlamaConfig& cfg, MemoryTracker* memory = nullptr, const TpLayout& layout = {},
                 const std::vector<UnitRange>& held = {}, const ExpertShard& experts = {});
  ~Llama();
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const { return cfg_; }
  const TpLayout& tp_layout() const { return tp_; }
  const ExpertShard& expert_shard() const { return experts_; }
  // This rank's tensors (slices of the whole ones under tensor parallelism), in flat order.
  const std::vector<ParamSpec>& param_specs() const { return specs_; }
  int64_t num_params() const { return total_; }
  int num_layers() const { return int(cfg_.num_hidden_layers); }
  int num_units() const { return llama4d::num_units(num_layers()); }
  UnitRange all_units() const { return {0, num_units()}; }
  // Flat [begin, end) of unit u's parameter segment (empty when this rank does not hold u).
  ParamRange unit_range(int u) const { return unit_ranges_[size_t(u)]; }
  // Unit u's segment is on this rank (its parameters, gradients and optimizer state).
  bool holds_unit(int u) const { return held_[size_t(u)] != 0; }
  // This rank runs unit u: it holds it, and not just as the tied head's copy of the embedding.
  bool runs_unit(int u) const;
  // A pipeline's last stage with tied embeddings: segment 0 is a copy of the first stage's,
  // read by the head; the two copies' gradients are summed by the strategy, and only the first
  // stage counts the segment (in the gradient norm, in checkpoints).
  bool holds_embedding_copy() const { return embedding_copy_; }
  // The segments whose gradients are final once unit u's backward has run: {u}, plus the
  // embedding copy after a last stage's tied head.
  std::vector<int> segments_final_after(int u) const;
  // Elements of unit u's segment on a rank that holds it (this rank's tensor-parallel slice),
  // whether or not this rank does.
  int64_t segment_numel(int u) const { return segment_numel_[size_t(u)]; }
  bool holds_all_units() const;
  // The segments unit u reads (and writes gradients of): {u}, plus {0} for a tied head.
  std::vector<int> segments_used_by(int u) const;
  MemoryTracker& memory() { return *memory_; }

  // ---- Parameter and gradient storage ------------------------------------------------------
  // Set before anything is allocated (InputError otherwise). Default: whole, whole.
  void set_residency(Residency params, Residency grads);
  Residency param_residency() const { return param_res_; }
  Residency grad_residency() const { return grad_res_; }
  // Whole residency only: the flat buffers (allocated on first call). Error for per_unit.
  T* params();
  T* grads();
  const T* params() const;  // Error unless allocated
  const T* grads() const;
  // A unit's segment, or nullptr when this rank does not hold it now.
  T* unit_params(int u);
  T* unit_grads(int u);
  // per_unit: allocate / free a segment (what = the reason, for out-of-memory messages).
  void allocate_unit_params(int u, std::string_view what);
  void free_unit_params(int u);
  void free_unit_grads(int u);
  // A named tensor inside a held segment.
  T* param(std::string_view name);
  T* grad(std::string_view name);

  // Deterministic initialisation from a seed (core/model/initialization.h): matrices ~ N(0, 0.02),
  // RMSNorm weights = 1. Allocates and fills every segment.
  void init_weights(uint64_t seed);
  // Zeroes every held gradient (whole: allocates the flat buffer first).
  void zero_grad();

  // ---- Training over a range of units --------------------------------------------------------
  // tokens[B,seq] when the range starts at the embedding, else hidden_in[B,seq,C] (copied);
  // targets[B,seq] when it ends with the head (null: inference, no loss). docs[B, cp·seq]: the
  // document of every position of each whole row (Batch::docs; ids never decrease along a row,
  // InputError otherwise), which masks attention to each token's own document; null: causal
  // attention over the whole row. Returns the range's loss (zero unless the head ran). The
  // range's output x is st.x[last block + 1].
  LossSum forward(MicroBatchState<T>& st, UnitRange range, const int32_t* tokens, const int32_t* targets,
                  const T* hidden_in, int64_t B, int64_t seq, const int32_t* docs = nullptr);
  // Backward of st's range, last unit first. grad_out[B,seq,C] = gradient of the range's output
  // (null when the range ends with the head, which starts from the loss). Gradients ACCUMULATE
  // into the unit gradients. Leaves the input's gradient in st.input_grad when the range starts
  // at a block; frees the rest of st.
  //
  // pass splits it (zero-bubble schedules): `input` takes loss_scale and grad_out, leaves
  // st.input_grad as full does, touches no unit gradient, and keeps in st what the weight
  // gradients are computed from (activations on the tracker); everything else is freed as full
  // frees it. `weight` (loss_scale and grad_out unused) then accumulates every weight gradient
  // with full's op calls in full's order, reading no parameter and recomputing nothing, and frees
  // st; Error unless st's input pass ran. Hooks: see UnitHooks. Under tensor/sequence parallelism
  // the activation communication points run in the input pass and the weight-gradient ones
  // (norm and replicated key/value weight gradients) in the weight pass.
  void backward(MicroBatchState<T>& st, T loss_scale, const T* grad_out = nullptr,
                BackwardPass pass = BackwardPass::full);

  // The whole model through one internal state (one device, data parallelism).
  LossSum forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t seq, const int32_t* docs = nullptr);
  void backward(T loss_scale);
  // Mixture of experts, of the last whole-model forward: the load-balancing losses summed over
  // the layers (MicroBatchState::aux_loss) and the tokens routed to each expert [L, E]. The
  // objective whose gradient backward(loss_scale) accumulates is
  //   loss_scale · loss_sum  +  loss_scale · B·seq · aux_loss
  // (the mean loss plus each micro-batch's aux weighted by its share of the tokens).
  double aux_loss() const { return state_.aux_loss; }
  const std::vector<int64_t>& expert_counts() const { return state_.expert_counts; }
  // logits[B, seq, V] of the last whole-model forward, until its backward.
  const T* logits() const { return state_.head.logits.data(); }

  // ---- Precision ---------------------------------------------------------------------------------
  // bf16 mixed precision, Llama 3's recipe ("The Llama 3 Herd of Models", 2024, on numerical
  // stability: bf16 compute, gradients accumulated and reduced in fp32). The parameters this model
  // holds stay the fp32 master weights the optimizer updates, and its ops read them rounded to
  // bf16 (a rounded copy of a unit's segment, made as the unit runs). Every activation and
  // activation gradient is rounded to bf16 when complete (BlockDims::bf16), and so are a range's
  // hidden input and output gradient as they come in; weight gradients accumulate in fp32. The
  // ops compute on bf16 values held in float containers; what the forward keeps for the backward
  // waits as bf16, 2 bytes an element (core/model/bf16_parking.h; the statistics stay fp32).
  // Float models only (InputError for double); set before a forward.
  void set_bf16_compute(bool on);
  bool bf16_compute() const { return bf16_; }
  // Whether kept activations wait as bf16 in bf16 mode (true by default). Off, they wait in the
  // float containers they were computed in: the same bits, twice the bytes (the tests compare).
  void set_bf16_parking(bool on) { park_bf16_ = on; }

  // ---- What strategies configure -------------------------------------------------------------
  void set_checkpointing(const Checkpointing& ac) { ac_ = ac; }
  const Checkpointing& checkpointing() const { return ac_; }
  void set_block_comm(BlockComm<T>* comm) { comm_ = comm; }  // not owned; null: no communication
  // Where the vocabulary's rows are (core/model/vocabulary.h): not owned; null, every row here.
  void set_vocabulary(Vocabulary<T>* vocabulary) { vocabulary_ = vocabulary; }
  // Context parallelism: forward and backward then take rank `rank`'s two chunks of each sequence
  // of cp·seq tokens (BlockDims::cp), seq tokens per row; the BlockComm computes attention.
  void set_context_split(int cp, int rank);
  UnitHooks* hooks() const { return hooks_; }

 private:
  template <class>
  friend class ScopedHooks;
  template <class>
  friend class Decoder;  // KV-cache decoding (core/model/decode.h) runs the blocks one position at a time

  BlockDims block_dims(int64_t B, int64_t seq, const int32_t* docs = nullptr) const;
  BlockDims block_dims(const MicroBatchState<T>& st) const;  // with st's document ids
  // Unit u's parameters as its ops read them: the segment, or under bf16 compute a copy of it
  // rounded to bf16, made in `rounded` (scratch), which the caller holds while the ops run.
  T* params_for_compute(int u, Buffer<T>& rounded);
  BlockWeights<T> block_params(int layer, Buffer<T>& rounded);
  BlockWeights<T> block_grads(int layer);
  // The final norm's gain and the LM head [V, C] as the head's ops read them (see params_for_compute).
  std::pair<const T*, const T*> head_params_for_compute(Buffer<T>& rounded_head, Buffer<T>& rounded_embedding);
  T* ensure_unit_grads(int u);  // allocates (zeroed) when absent
  void ensure_block_activations(MicroBatchState<T>& st, int layer, UnitHooks& h);
  // One unit of backward(st, ..., pass), pass full or input; dx [rows,C] the residual gradient.
  void backward_head(MicroBatchState<T>& st, T* dx, T loss_scale, BackwardPass pass);
  void backward_block(MicroBatchState<T>& st, int layer, T* dx, BlockScratch<T>& scratch, BackwardPass pass,
                      T loss_scale, UnitHooks& h);
  void record_routing(MicroBatchState<T>& st, int layer, const MoeActivations<T>& a);  // into st's aux_loss, counts
  void backward_embedding(MicroBatchState<T>& st, const T* dx, BackwardPass pass);
  void embedding_weight_grads(MicroBatchState<T>& st, const T* dx);  // the scatter-add of dx [rows,C]
  void backward_weight(MicroBatchState<T>& st, UnitHooks& h);
  void forward_block(MicroBatchState<T>& st, int layer, T* out);
  void check_ids(const int32_t* tokens, const int32_t* targets, int64_t n) const;
  static void check_documents(const int32_t* docs, int64_t B, int64_t row);
  Vocabulary<T>& vocabulary();  // Error when the model is sliced and none was set
  int64_t vocab_rows() const { return tp_.sliced() ? tp_.vocab_rows : cfg_.vocab_size; }

  // The RoPE tables, cos and sin [positions, hd/2] each, for the positions a forward or a KV cache
  // reads: made (or grown) by cover_positions before the first block computes, charged to the
  // rank's memory as `other`; a model used for its layout only (the TP replay's norm) makes none.
  // Grown, never shrunk: a smaller micro-batch reads the same values from a longer table.
  void cover_positions(int64_t positions);
  const RopeTables<T>& rope() const;

  LlamaConfig cfg_;
  TpLayout tp_;
  ExpertShard experts_;
  std::vector<ParamSpec> specs_;
  std::vector<ParamRange> unit_ranges_;
  std::vector<uint8_t> held_;  // [unit]
  bool embedding_copy_ = false;
  std::vector<int64_t> segment_numel_;  // [unit]
  int64_t total_ = 0;
  std::unique_ptr<MemoryTracker> own_memory_;
  MemoryTracker* memory_ = nullptr;
  Residency param_res_ = Residency::whole, grad_res_ = Residency::whole;
  Buffer<T> whole_params_, whole_grads_;
  std::vector<Buffer<T>> unit_params_, unit_grads_;  // per_unit residency
  RopeTables<T> rope_;             // rope()
  MemoryReservation rope_memory_;  // rope_'s bytes on memory_
  Checkpointing ac_;
  BlockComm<T>* comm_ = nullptr;
  int cp_ = 1, cp_rank_ = 0;
  Vocabulary<T>* vocabulary_ = nullptr;
  Vocabulary<T> whole_vocabulary_;  // every row on this rank
  UnitHooks* hooks_ = nullptr;
  bool bf16_ = false;
  bool park_bf16_ = true;
  MicroBatchState<T> state_;  // the whole-model forward/backward
};

// Installs hooks on a model for a scope and restores the previous ones when it ends, also when
// an exception (an out-of-memory error, a failed collective) unwinds through it.
template <class T>
class ScopedHooks {
 public:
  ScopedHooks(Llama<T>& model, UnitHooks* hooks) : model_(model), previous_(model.hooks_) { model.hooks_ = hooks; }
  ~ScopedHooks() { model_.hooks_ = previous_; }
  ScopedHooks(const ScopedHooks&) = delete;
  ScopedHooks& operator=(const ScopedHooks&) = delete;

 private:
  Llama<T>& model_;
  UnitHooks* previous_;
};

extern template class Llama<float>;
extern template class Llama<double>;

}  // namespace llama4d
