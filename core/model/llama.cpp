#include "core/model/llama.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/model/bf16_parking.h"
#include "core/model/initialization.h"
#include "core/ops.h"

namespace llama4d {

std::string unit_name(int unit, int num_layers) {
  if (unit == embedding_unit()) return "embedding";
  if (unit == head_unit(num_layers)) return "head";
  return "layer " + std::to_string(unit - 1);
}


template <class T>
int64_t MicroBatchState<T>::activation_bytes() const {
  int64_t n = tokens.bytes() + targets.bytes() + docs.bytes() + head.bytes() + input_grad.bytes() + head_weight_inputs.bytes() +
              embedding_weight_input.bytes();
  for (const Buffer<T>& b : x) n += b.bytes();
  for (const Buffer<bf16>& b : x_parked) n += b.bytes();
  for (const BlockActivations<T>& a : blocks) n += a.bytes();
  for (const BlockWeightGradInputs<T>& w : block_weight_inputs) n += w.bytes();
  return n;
}

template <class T>
void MicroBatchState<T>::reset() {
  tokens.reset(), targets.reset(), docs.reset(), head.reset(), input_grad.reset();
  head_weight_inputs.reset(), embedding_weight_input.reset();
  for (Buffer<T>& b : x) b.reset();
  for (Buffer<bf16>& b : x_parked) b.reset();
  for (BlockActivations<T>& a : blocks) a.reset();
  for (BlockWeightGradInputs<T>& w : block_weight_inputs) w.reset();
  loss = {};
  aux_loss = 0;
  expert_counts.clear();
  forward_done = false;
  weight_pass_pending = false;
}

namespace {

// The unit whose segment holds spec p (core/model/units.h).
int unit_of_spec(const ParamSpec& p, int num_layers) {
  if (p.name == "model.embed_tokens.weight") return embedding_unit();
  return p.layer >= 0 ? block_unit(p.layer) : head_unit(num_layers);
}

}  // namespace

template <class T>
Llama<T>::Llama(const LlamaConfig& cfg, MemoryTracker* memory, const TpLayout& layout, const std::vector<UnitRange>& held,
                const ExpertShard& experts)
    : cfg_(cfg), tp_(layout), experts_(experts), memory_(memory) {
  cfg_.validate();
  if (!experts.all() && (!cfg_.moe() || experts.first < 0 || experts.count < 1 ||
                         experts.first + experts.count > cfg_.num_local_experts))
    throw InputError("Llama: experts [" + std::to_string(experts.first) + ", " +
                     std::to_string(experts.first + experts.count) + ") are not a shard of the model's " +
                     std::to_string(cfg_.num_local_experts) + " experts");
  if (cfg_.moe() && layout.sliced())
    throw InputError("tensor parallelism of mixture-of-experts layers is not supported: MoE models run under data and expert parallelism only so far");
  const int L = num_layers();
  held_.assign(size_t(num_units()), held.empty() ? 1 : 0);
  for (const UnitRange& r : held) {
    if (r.begin < 0 || r.end > num_units() || r.begin >= r.end)
      throw Error("Llama: held unit range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") is empty or outside the model");
    for (int u = r.begin; u < r.end; ++u) held_[size_t(u)] = 1;
  }
  // A tied LM head reads the embedding's weights: a rank with the head but not the embedding (a
  // pipeline's last stage) keeps its own copy of that segment, whose gradient holds only the
  // head's part until the strategy adds the two copies' parts (core/parallel/data_parallel.h).
  if (held_[size_t(head_unit(L))] && cfg_.tie_word_embeddings && !held_[size_t(embedding_unit())]) {
    held_[size_t(embedding_unit())] = 1;
    embedding_copy_ = true;
  }
  // This rank's tensors, packed in flat order; a unit it does not hold gets an empty segment.
  std::vector<int64_t> begin(size_t(num_units()), -1), end(size_t(num_units()), 0);
  segment_numel_.assign(size_t(num_units()), 0);
  for (ParamSpec p : llama_param_specs(cfg_, tp_)) {
    if (p.expert >= 0 && !experts_.holds(p.expert)) continue;  // another expert-parallel rank's
    const int u = unit_of_spec(p, L);
    segment_numel_[size_t(u)] += p.numel;
    if (!held_[size_t(u)]) continue;
    p.offset = total_;
    total_ += p.numel;
    if (begin[size_t(u)] < 0) begin[size_t(u)] = p.offset;
    end[size_t(u)] = total_;
    specs_.push_back(std::move(p));
  }
  int64_t at = 0;
  for (int u = 0; u < num_units(); ++u) {
    if (begin[size_t(u)] >= 0) at = end[size_t(u)];
    unit_ranges_.push_back(begin[size_t(u)] >= 0 ? ParamRange{begin[size_t(u)], end[size_t(u)]} : ParamRange{at, at});
  }
  if (!memory_) {
    own_memory_ = std::make_unique<MemoryTracker>(0, 0);
    memory_ = own_memory_.get();
  }
  unit_params_.resize(size_t(num_units()));
  unit_grads_.resize(size_t(num_units()));
}

template <class T>
void Llama<T>::cover_positions(int64_t positions) {
  if (positions <= rope_.max_pos) return;
  // Release first: the old and the new tables are never both live, so the peak is the new size.
  rope_ = RopeTables<T>{};
  rope_memory_.reset();
  const int64_t bytes = 2 * positions * (cfg_.head_dim / 2) * int64_t(sizeof(T));
  rope_memory_ = MemoryReservation(*memory_, MemoryCategory::other, bytes, "RoPE tables");
  rope_ = make_rope_tables<T>(cfg_, positions);
}

template <class T>
const RopeTables<T>& Llama<T>::rope() const {
  if (rope_.max_pos == 0) throw Error("Llama: a block computes before cover_positions made the RoPE tables");
  return rope_;
}

template <class T>
bool Llama<T>::holds_all_units() const {
  return std::all_of(held_.begin(), held_.end(), [](uint8_t h) { return h != 0; });
}

template <class T>
Llama<T>::~Llama() = default;

template <class T>
bool Llama<T>::runs_unit(int u) const {
  return holds_unit(u) && !(u == embedding_unit() && embedding_copy_);
}

template <class T>
std::vector<int> Llama<T>::segments_final_after(int u) const {
  if (u == head_unit(num_layers()) && embedding_copy_) return {u, embedding_unit()};
  return {u};
}

template <class T>
std::vector<int> Llama<T>::segments_used_by(int u) const {
  if (u == head_unit(num_layers()) && cfg_.tie_word_embeddings) return {u, embedding_unit()};
  return {u};
}

template <class T>
void Llama<T>::set_residency(Residency params, Residency grads) {
  bool allocated = !whole_params_.empty() || !whole_grads_.empty();
  for (size_t u = 0; u < unit_params_.size(); ++u) allocated = allocated || !unit_params_[u].empty() || !unit_grads_[u].empty();
  if (allocated && (params != param_res_ || grads != grad_res_))
    throw Error("Llama::set_residency: storage is already allocated; set residency before initialising");
  param_res_ = params, grad_res_ = grads;
}

template <class T>
T* Llama<T>::params() {
  if (param_res_ != Residency::whole) throw Error("Llama::params(): parameters are held per unit on this rank");
  if (whole_params_.empty()) whole_params_ = Buffer<T>(memory_, MemoryCategory::params, total_, "parameters");
  return whole_params_.data();
}

template <class T>
T* Llama<T>::grads() {
  if (grad_res_ != Residency::whole) throw Error("Llama::grads(): gradients are held per unit on this rank");
  if (whole_grads_.empty()) {
    whole_grads_ = Buffer<T>(memory_, MemoryCategory::grads, total_, "gradients");
    ops::fill(whole_grads_.data(), T(0), total_);
  }
  return whole_grads_.data();
}

template <class T>
const T* Llama<T>::params() const {
  if (param_res_ != Residency::whole || whole_params_.empty()) throw Error("Llama::params(): no flat parameter buffer");
  return whole_params_.data();
}

template <class T>
const T* Llama<T>::grads() const {
  if (grad_res_ != Residency::whole || whole_grads_.empty()) throw Error("Llama::grads(): no flat gradient buffer");
  return whole_grads_.data();
}

template <class T>
T* Llama<T>::unit_params(int u) {
  if (param_res_ == Residency::whole) return whole_params_.empty() ? nullptr : whole_params_.data() + unit_range(u).begin;
  return unit_params_[size_t(u)].data();
}

template <class T>
T* Llama<T>::unit_grads(int u) {
  if (grad_res_ == Residency::whole) return whole_grads_.empty() ? nullptr : whole_grads_.data() + unit_range(u).begin;
  return unit_grads_[size_t(u)].data();
}

template <class T>
void Llama<T>::allocate_unit_params(int u, std::string_view what) {
  if (param_res_ != Residency::per_unit) throw Error("Llama::allocate_unit_params needs per-unit residency");
  Buffer<T>& b = unit_params_[size_t(u)];
  const ParamRange r = unit_range(u);
  if (b.empty()) b = Buffer<T>(memory_, MemoryCategory::params, r.end - r.begin, what);
}

template <class T>
void Llama<T>::free_unit_params(int u) {
  if (param_res_ != Residency::per_unit) throw Error("Llama::free_unit_params needs per-unit residency");
  unit_params_[size_t(u)].reset();
}

template <class T>
void Llama<T>::free_unit_grads(int u) {
  if (grad_res_ != Residency::per_unit) throw Error("Llama::free_unit_grads needs per-unit residency");
  unit_grads_[size_t(u)].reset();
}

template <class T>
T* Llama<T>::ensure_unit_grads(int u) {
  if (grad_res_ == Residency::whole) return grads() + unit_range(u).begin;
  Buffer<T>& b = unit_grads_[size_t(u)];
  if (b.empty()) {
    const ParamRange r = unit_range(u);
    b = Buffer<T>(memory_, MemoryCategory::grads, r.end - r.begin, "gradients of " + unit_name(u, num_layers()));
    ops::fill(b.data(), T(0), r.end - r.begin);
  }
  return b.data();
}

template <class T>
T* Llama<T>::param(std::string_view name) {
  const ParamSpec& p = find_param(specs_, std::string(name));
  for (int u = 0; u < num_units(); ++u)
    if (p.offset >= unit_range(u).begin && p.offset < unit_range(u).end) {
      T* seg = unit_params(u);
      if (!seg) throw Error("parameter " + p.name + " is not held on this rank now");
      return seg + (p.offset - unit_range(u).begin);
    }
  throw Error("parameter " + p.name + " lies in no unit");
}

template <class T>
T* Llama<T>::grad(std::string_view name) {
  const ParamSpec& p = find_param(specs_, std::string(name));
  for (int u = 0; u < num_units(); ++u)
    if (p.offset >= unit_range(u).begin && p.offset < unit_range(u).end) return ensure_unit_grads(u) + (p.offset - unit_range(u).begin);
  throw Error("parameter " + p.name + " lies in no unit");
}

template <class T>
void Llama<T>::init_weights(uint64_t seed) {
  if (param_res_ == Residency::whole) {
    init_param_device_values(specs_, seed, 0, total_, params());
    return;
  }
  for (int u = 0; u < num_units(); ++u) {
    if (!holds_unit(u)) continue;
    allocate_unit_params(u, "parameters of " + unit_name(u, num_layers()));
    init_param_device_values(specs_, seed, unit_range(u).begin, unit_range(u).end, unit_params(u));
  }
}

template <class T>
void Llama<T>::zero_grad() {
  if (grad_res_ == Residency::whole) {
    ops::fill(grads(), T(0), total_);
    return;
  }
  for (Buffer<T>& b : unit_grads_)
    if (!b.empty()) ops::fill(b.data(), T(0), b.size());
}

template <class T>
BlockDims Llama<T>::block_dims(int64_t B, int64_t seq, const int32_t* docs) const {
  // Under tensor parallelism the block works on this rank's heads and SwiGLU columns only.
  const bool s = tp_.sliced();
  BlockDims d{.B = B, .seq = seq, .C = cfg_.hidden_size, .nh = s ? tp_.heads : cfg_.num_attention_heads,
          .nkv = s ? tp_.kv_heads : cfg_.num_key_value_heads, .hd = cfg_.head_dim,
          .I = s ? tp_.ffn : cfg_.intermediate_size, .eps = cfg_.rms_norm_eps,
          .sp = tp_.sequence_parallel ? tp_.tp : 1, .sp_rank = tp_.sequence_parallel ? tp_.rank : 0,
          .cp = cp_, .cp_rank = cp_rank_, .doc = docs, .bf16 = bf16_};
  d.E = cfg_.num_local_experts, d.k = cfg_.num_experts_per_tok, d.aux_coef = cfg_.moe_aux_coef();
  return d;
}

template <class T>
BlockDims Llama<T>::block_dims(const MicroBatchState<T>& st) const {
  return block_dims(st.B, st.seq, st.docs.empty() ? nullptr : st.docs.data());
}

template <class T>
void Llama<T>::set_context_split(int cp, int rank) {
  if (cp < 1 || rank < 0 || rank >= cp)
    throw Error("Llama::set_context_split: rank " + std::to_string(rank) + " of " + std::to_string(cp));
  // The load-balancing loss is over all of a micro-batch's tokens, which no rank holds alone.
  if (cp > 1 && cfg_.moe())
    throw InputError("context parallelism of mixture-of-experts models is not supported: they run under data and expert parallelism only so far");
  cp_ = cp, cp_rank_ = rank;
}

template <class T>
void Llama<T>::set_bf16_compute(bool on) {
  if (on && !std::is_same_v<T, float>)
    throw InputError("bf16 mixed precision keeps fp32 master weights: it runs on an f32 model, not f64");
  if (on && cfg_.moe())
    throw InputError("bf16 mixed precision of mixture-of-experts layers is not supported yet (--dtype f32 or f64)");
  bf16_ = on;
}

template <class T>
T* Llama<T>::params_for_compute(int u, Buffer<T>& rounded) {
  T* seg = unit_params(u);
  if (!seg) throw Error("parameters of " + unit_name(u, num_layers()) + " are not held on this rank now");
  if (!bf16_) return seg;
  const int64_t n = segment_numel(u);
  rounded = Buffer<T>(memory_, MemoryCategory::scratch, n, "bf16 copy of the parameters of " + unit_name(u, num_layers()));
  ops::copy(rounded.data(), seg, n);
  ops::round_to_bf16(rounded.data(), n);
  return rounded.data();
}

template <class T>
BlockWeights<T> Llama<T>::block_params(int layer, Buffer<T>& rounded) {
  return block_weights(params_for_compute(block_unit(layer), rounded), block_dims(0, 0));
}

template <class T>
BlockWeights<T> Llama<T>::block_grads(int layer) {
  return block_weights(ensure_unit_grads(block_unit(layer)), block_dims(0, 0));
}

template <class T>
std::pair<const T*, const T*> Llama<T>::head_params_for_compute(Buffer<T>& rounded_head, Buffer<T>& rounded_embedding) {
  const T* norm_w = params_for_compute(head_unit(num_layers()), rounded_head);
  // Untied: lm_head.weight follows model.norm.weight [C] inside the head's segment.
  if (!cfg_.tie_word_embeddings) return {norm_w, norm_w + cfg_.hidden_size};
  return {norm_w, params_for_compute(embedding_unit(), rounded_embedding)};
}

template <class T>
void Llama<T>::check_ids(const int32_t* tokens, const int32_t* targets, int64_t n) const {
  const int64_t V = cfg_.vocab_size;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens && (tokens[i] < 0 || tokens[i] >= V))
      throw InputError("token id " + std::to_string(tokens[i]) + " outside the vocabulary [0, " + std::to_string(V) + ")");
    if (targets && targets[i] >= V)
      throw InputError("target id " + std::to_string(targets[i]) + " outside the vocabulary [0, " + std::to_string(V) +
                       ") (use -1 to ignore a position)");
  }
}

template <class T>
void Llama<T>::check_documents(const int32_t* docs, int64_t B, int64_t row) {
  // Attention (and ring attention's skipping of whole blocks) reads a row's documents as runs.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < row; ++t)
      if (docs[b * row + t] < docs[b * row + t - 1])
        throw InputError("document ids must not decrease along a row: row " + std::to_string(b) + " goes from " +
                         std::to_string(docs[b * row + t - 1]) + " to " + std::to_string(docs[b * row + t]) +
                         " at position " + std::to_string(t));
}

template <class T>
Vocabulary<T>& Llama<T>::vocabulary() {
  if (vocabulary_) return *vocabulary_;
  if (tp_.sliced()) throw Error("Llama: a tensor-parallel slice (" + tp_.describe() + ") runs only with its Vocabulary");
  return whole_vocabulary_;
}

template <class T>
void Llama<T>::record_routing(MicroBatchState<T>& st, int layer, const MoeActivations<T>& a) {
  const int64_t E = cfg_.num_local_experts;
  if (st.expert_counts.empty()) st.expert_counts.assign(size_t(num_layers() * E), 0);
  st.aux_loss += a.aux_loss;
  for (int64_t e = 0; e < E; ++e) st.expert_counts[size_t(layer * E + e)] += a.dispatch.counts[size_t(e)];
}

template <class T>
void Llama<T>::forward_block(MicroBatchState<T>& st, int layer, T* out) {
  const BlockDims d = block_dims(st);
  BlockActivations<T>& a = st.blocks[size_t(layer)];
  a.allocate(memory_, d);
  Buffer<T> rounded;
  block_forward(out, a, block_params(layer, rounded), st.x[size_t(layer)].data(), d, rope(), 0, comm_);
}

template <class T>
LossSum Llama<T>::forward(MicroBatchState<T>& st, UnitRange r, const int32_t* tokens, const int32_t* targets,
                          const T* hidden_in, int64_t B, int64_t seq, const int32_t* docs) {
  const int L = num_layers(), head = head_unit(L);
  if (r.begin < 0 || r.end > num_units() || r.begin >= r.end)
    throw Error("Llama::forward: unit range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") is empty or outside the model");
  if (seq * cp_ > cfg_.max_position_embeddings)
    throw InputError("sequence length " + std::to_string(seq * cp_) + " exceeds max_position_embeddings " +
                     std::to_string(cfg_.max_position_embeddings));
  if (cp_ > 1 && (seq % 2 != 0 || !comm_))
    throw Error("Llama::forward: context parallelism needs an even number of tokens per row (two chunks) and a BlockComm");
  for (int u = r.begin; u < r.end; ++u)
    if (!runs_unit(u)) throw Error("Llama::forward: this rank does not hold " + unit_name(u, L));
  const bool has_embedding = r.contains(embedding_unit()), has_head = r.contains(head);
  if (has_embedding && !tokens) throw Error("Llama::forward: a range with the embedding needs tokens");
  if (!has_embedding && !hidden_in) throw Error("Llama::forward: a range without the embedding needs its input hidden state");
  // Validate before touching any state, so a rejected call leaves the model as it was.
  if (st.weight_pass_pending)
    throw Error("Llama::forward: this micro-batch's weight pass (BackwardPass::weight) is still pending; a forward "
                "over its state would drop those weight gradients");
  check_ids(has_embedding ? tokens : nullptr, has_head ? targets : nullptr, B * seq);
  if (docs) check_documents(docs, B, seq * cp_);

  st.reset();
  st.B = B, st.seq = seq, st.units = r;
  if (std::max(r.begin, 1) < std::min(r.end, L + 1)) cover_positions(seq * cp_);  // the range has a block
  st.x.resize(size_t(L + 1));
  st.x_parked.resize(size_t(L + 1));
  st.blocks.resize(size_t(L));
  st.block_weight_inputs.resize(size_t(L));
  const int64_t BT = B * seq, C = cfg_.hidden_size, V = vocab_rows();
  Vocabulary<T>& vocab = vocabulary();
  if (tp_.sliced() && !comm_) throw Error("Llama: a tensor-parallel slice runs only with a BlockComm");
  if (!experts_.all() && (!comm_ || !comm_->shards_experts()))
    throw Error("Llama: a shard of the experts runs only with an expert-parallel BlockComm");
  if (docs) {
    st.docs = Buffer<int32_t>(memory_, MemoryCategory::activations, B * seq * cp_, "document ids");
    ops::device_memcpy(st.docs.data(), docs, B * seq * cp_ * int64_t(sizeof(int32_t)));
  }
  const BlockDims d = block_dims(st);
  const int64_t rows = d.rows();  // residual-stream rows this rank holds
  UnitHooks none;
  UnitHooks& h = hooks_ ? *hooks_ : none;
  const int first_block = std::max(r.begin, 1) - 1;  // block index of the range's first block unit

  if (has_embedding) {
    st.tokens = Buffer<int32_t>(memory_, MemoryCategory::activations, BT, "tokens");
    ops::device_memcpy(st.tokens.data(), tokens, BT * int64_t(sizeof(int32_t)));
    h.before_forward(embedding_unit());
    st.x[0] = Buffer<T>(memory_, MemoryCategory::activations, rows * C, "x_0 (embedding output)");
    vocab.embed(st.x[0].data(), st.tokens.data(), unit_params(embedding_unit()), BT, C, V, memory_);
    // A lookup copies rows, so rounding them is reading a bf16 table (without rounding all of it).
    round_if_bf16(st.x[0].data(), rows * C, bf16_);
    h.after_forward(embedding_unit());
  } else {
    st.x[size_t(first_block)] = Buffer<T>(memory_, MemoryCategory::activations, rows * C, "range input");
    ops::copy(st.x[size_t(first_block)].data(), hidden_in, rows * C);
    // A previous stage sends bf16 values already; rounding again changes nothing there, and makes
    // any other caller's input what a bf16 tensor would hold.
    round_if_bf16(st.x[size_t(first_block)].data(), rows * C, bf16_);
  }

  for (int u = std::max(r.begin, 1); u < std::min(r.end, head); ++u) {
    const int l = u - 1;
    h.before_forward(u);
    st.x[size_t(l + 1)] = Buffer<T>(memory_, MemoryCategory::activations, rows * C, "x_" + std::to_string(l + 1));
    forward_block(st, l, st.x[size_t(l + 1)].data());
    // Keep what the policy keeps; the next block's input stays until that block has run.
    BlockActivations<T>& a = st.blocks[size_t(l)];
    if (cfg_.moe()) record_routing(st, l, a.moe);
    if (ac_.kind == Checkpointing::Kind::selective) a.release_recomputable();
    if (ac_.recomputes_blocks()) a.reset();
    if (!ac_.keeps_input(l, first_block)) st.x[size_t(l)].reset();
    if (bf16_ && park_bf16_) {  // what waits for the backward waits as bf16, as on a GPU
      a.park_bf16(memory_);
      park_bf16(st.x[size_t(l)], st.x_parked[size_t(l)], memory_, "x_" + std::to_string(l));
    }
    h.after_forward(u);
  }

  if (has_head) {
    h.before_forward(head);
    st.head.allocate(memory_, BT, C, V, vocab.split(), rows);
    if (targets) {
      st.targets = Buffer<int32_t>(memory_, MemoryCategory::activations, BT, "targets");
      ops::device_memcpy(st.targets.data(), targets, BT * int64_t(sizeof(int32_t)));
    }
    st.head.bf16 = bf16_;
    Buffer<T> rounded_head, rounded_embedding;
    const auto [norm_w, lm_w] = head_params_for_compute(rounded_head, rounded_embedding);
    st.loss = head_forward(st.head, st.x[size_t(L)].data(), norm_w, lm_w, targets ? st.targets.data() : nullptr, BT,
                           C, V, cfg_.rms_norm_eps, vocab);
    h.after_forward(head);
  }
  st.forward_done = true;
  return st.loss;
}

template <class T>
void Llama<T>::ensure_block_activations(MicroBatchState<T>& st, int layer, UnitHooks& h) {
  BlockActivations<T>& a = st.blocks[size_t(layer)];
  a.unpark_bf16(memory_);
  unpark_bf16(st.x[size_t(layer)], st.x_parked[size_t(layer)], memory_, "x_" + std::to_string(layer));
  if (a.complete()) return;
  const BlockDims d = block_dims(st);
  if (a.holds_anything()) {  // selective: rebuild the cheap tensors from the kept ones
    a.allocate_recomputable(memory_, d);
    Buffer<T> rounded;
    block_recompute_selective(a, block_params(layer, rounded), st.x[size_t(layer)].data(), d, rope(), 0, comm_);
    return;
  }
  // every:k: rerun the segment from the nearest kept input below, keeping every block's
  // activations; the blocks under this one then find theirs complete.
  int s = layer;
  while (st.x[size_t(s)].empty() && st.x_parked[size_t(s)].empty()) --s;
  unpark_bf16(st.x[size_t(s)], st.x_parked[size_t(s)], memory_, "x_" + std::to_string(s));
  for (int j = s; j <= layer; ++j) {
    h.before_recompute(block_unit(j));
    if (j < layer)
      st.x[size_t(j + 1)] = Buffer<T>(memory_, MemoryCategory::activations, d.rows() * d.C, "x_" + std::to_string(j + 1) + " (recomputed)");
    // The top block's own output is not needed again (its gradient arrives from above): it
    // stops before down_proj.
    forward_block(st, j, j < layer ? st.x[size_t(j + 1)].data() : nullptr);
    h.after_recompute(block_unit(j));
  }
}

template <class T>
void Llama<T>::backward_head(MicroBatchState<T>& st, T* dx, T loss_scale, BackwardPass pass) {
  const int L = num_layers(), head = head_unit(L);
  const int64_t BT = st.B * st.seq, C = cfg_.hidden_size, V = vocab_rows();
  const T* x = st.x[size_t(L)].data();
  Buffer<T> rounded_head, rounded_embedding;
  const auto [norm_w, lm_w] = head_params_for_compute(rounded_head, rounded_embedding);
  if (pass == BackwardPass::full) {
    T* g_head = ensure_unit_grads(head);
    T* g_lm = cfg_.tie_word_embeddings ? ensure_unit_grads(embedding_unit()) : g_head + C;
    head_backward(dx, g_head, g_lm, st.head, x, norm_w, lm_w, st.targets.data(), loss_scale, BT, C, V, memory_,
                  vocabulary());
  } else {
    HeadWeightGradInputs<T>& keep = st.head_weight_inputs;
    keep.allocate(memory_, BT, block_dims(st).rows(), C, V);
    head_backward_input(dx, keep, st.head, x, norm_w, lm_w, st.targets.data(), loss_scale, BT, C, V, vocabulary());
    keep.take_inputs(st.head, st.x[size_t(L)]);
    if (bf16_ && park_bf16_) keep.park_bf16(memory_);  // until the weight pass, as bf16
  }
  st.head.reset();
  st.targets.reset();
}

template <class T>
void Llama<T>::backward_block(MicroBatchState<T>& st, int l, T* dx, BlockScratch<T>& scratch, BackwardPass pass,
                              T loss_scale, UnitHooks& h) {
  BlockDims d = block_dims(st);
  if (d.moe() && pass != BackwardPass::full)
    throw InputError("a split (input/weight) backward of mixture-of-experts layers is not supported: "
                     "MoE models run under data and expert parallelism only so far");
  // Each micro-batch's load-balancing loss enters the objective weighted by its share of the
  // step's tokens (loss_scale = 1 / tokens per step): the mean over equal micro-batches.
  d.aux_scale = double(loss_scale) * double(d.BT());
  ensure_block_activations(st, l, h);
  BlockActivations<T>& a = st.blocks[size_t(l)];
  const T* x = st.x[size_t(l)].data();
  Buffer<T> rounded;
  const BlockWeights<T> w = block_params(l, rounded);
  if (pass == BackwardPass::full) {
    block_backward(dx, block_grads(l), dx, a, w, x, d, rope(), 0, scratch, comm_);
  } else {
    BlockWeightGradInputs<T>& keep = st.block_weight_inputs[size_t(l)];
    keep.allocate(memory_, d, unit_name(block_unit(l), num_layers()));
    block_backward_input(dx, keep, dx, a, w, x, d, rope(), 0, scratch, comm_);
    keep.take_inputs(a, st.x[size_t(l)]);
    if (bf16_ && park_bf16_) keep.park_bf16(memory_);  // until the weight pass, as bf16
  }
  a.reset();
}

template <class T>
void Llama<T>::embedding_weight_grads(MicroBatchState<T>& st, const T* dx) {
  const BlockDims d = block_dims(st);
  const int64_t BT = d.BT(), C = d.C, V = vocab_rows();
  T* g = ensure_unit_grads(embedding_unit());
  vocabulary().embed_backward(g, dx, st.tokens.data(), BT, C, V, memory_);
  st.tokens.reset();
}

template <class T>
void Llama<T>::backward_embedding(MicroBatchState<T>& st, const T* dx, BackwardPass pass) {
  if (pass == BackwardPass::full) {
    embedding_weight_grads(st, dx);
    return;
  }
  // The embedding has no input gradient: its whole backward is weight work. Keep dx x_0 [rows,C].
  const int64_t n = block_dims(st).rows() * cfg_.hidden_size;
  st.embedding_weight_input =
      Buffer<T>(memory_, MemoryCategory::activations, n, "weight-gradient inputs of the embedding: dx_0");
  ops::copy(st.embedding_weight_input.data(), dx, n);
}

template <class T>
void Llama<T>::backward(MicroBatchState<T>& st, T loss_scale, const T* grad_out, BackwardPass pass) {
  UnitHooks none;
  UnitHooks& h = hooks_ ? *hooks_ : none;
  if (pass == BackwardPass::weight) {
    backward_weight(st, h);
    return;
  }
  if (st.weight_pass_pending)
    throw Error("Llama::backward: this micro-batch's input pass ran; its weight pass is next");
  if (!st.forward_done) throw Error("Llama::backward called without a forward");
  const int L = num_layers(), head = head_unit(L);
  const UnitRange r = st.units;
  const bool has_head = r.contains(head);
  if (!has_head && !grad_out) throw Error("Llama::backward: a range without the head needs the gradient of its output");
  if (has_head && st.targets.empty()) throw Error("Llama::backward: the forward had no targets (inference), so there is no loss");
  const BlockDims d = block_dims(st);

  // dx [B,T,C]: the gradient flowing down the residual stream, unit by unit.
  Buffer<T> dx(memory_, MemoryCategory::scratch, d.rows() * d.C, "residual gradient");
  if (!has_head) {
    ops::copy(dx.data(), grad_out, d.rows() * d.C);
    round_if_bf16(dx.data(), d.rows() * d.C, bf16_);  // as the range's input, above
    st.x[size_t(r.end - 1)].reset();  // the range's output: sent on in forward, not read again
  }
  BlockScratch<T> scratch;
  if (r.end - 1 > 0 && r.begin < head) {
    if (pass == BackwardPass::full) scratch.allocate(memory_, d);
    else scratch.allocate_input_pass(memory_, d);
  }

  for (int u = r.end - 1; u >= r.begin; --u) {
    h.before_backward(u);
    if (u == head) backward_head(st, dx.data(), loss_scale, pass);
    else if (u == embedding_unit()) backward_embedding(st, dx.data(), pass);
    else backward_block(st, u - 1, dx.data(), scratch, pass, loss_scale, h);
    st.x[size_t(std::max(u - 1, 0))].reset();  // the unit's input: nothing reads it again (or the input pass kept it)
    if (pass == BackwardPass::full) h.after_backward(u);
    else h.after_backward_input(u);
  }
  if (!r.contains(embedding_unit())) st.input_grad = std::move(dx);
  st.docs.reset();  // the weight pass has no attention
  st.forward_done = false;
  st.weight_pass_pending = pass == BackwardPass::input;
}

// The weight pass: the units last to first, as full runs them, so gradients two units share (a
// tied embedding: the head's, then the lookup's) accumulate in full's order.
template <class T>
void Llama<T>::backward_weight(MicroBatchState<T>& st, UnitHooks& h) {
  if (!st.weight_pass_pending)
    throw Error("Llama::backward: a weight pass needs this micro-batch's input pass (BackwardPass::input) first");
  const int L = num_layers(), head = head_unit(L);
  const UnitRange r = st.units;
  const BlockDims d = block_dims(st);
  BlockScratch<T> scratch;  // only the lazily allocated weight-gradient temporaries
  scratch.memory = memory_;
  for (int u = r.end - 1; u >= r.begin; --u) {
    h.before_backward_weight(u);
    if (u == head) {
      T* g_head = ensure_unit_grads(head);
      T* g_lm = cfg_.tie_word_embeddings ? ensure_unit_grads(embedding_unit()) : g_head + d.C;
      st.head_weight_inputs.unpark_bf16(memory_);
      head_backward_weight(g_head, g_lm, st.head_weight_inputs, d.BT(), d.C, vocab_rows(), memory_, vocabulary());
      st.head_weight_inputs.reset();
    } else if (u == embedding_unit()) {
      embedding_weight_grads(st, st.embedding_weight_input.data());
      st.embedding_weight_input.reset();
    } else {
      st.block_weight_inputs[size_t(u - 1)].unpark_bf16(memory_);
      block_backward_weight(block_grads(u - 1), st.block_weight_inputs[size_t(u - 1)], d, scratch, comm_);
      st.block_weight_inputs[size_t(u - 1)].reset();
    }
    h.after_backward(u);
  }
  st.weight_pass_pending = false;
}

template <class T>
LossSum Llama<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t seq, const int32_t* docs) {
  return forward(state_, all_units(), tokens, targets, nullptr, B, seq, docs);
}

template <class T>
void Llama<T>::backward(T loss_scale) {
  backward(state_, loss_scale, nullptr);
}

template struct MicroBatchState<float>;
template struct MicroBatchState<double>;
template class Llama<float>;
template class Llama<double>;

}  // namespace llama4d
