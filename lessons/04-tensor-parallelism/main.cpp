// Lesson 04: tensor and sequence parallelism (Megatron-LM). The tp ranks of a group run every layer
// together on the SAME tokens, each holding a slice of every weight: q/k/v and gate/up split by
// output features (heads, SwiGLU columns: column-parallel), o_proj and down_proj by input features
// (row-parallel), the embedding and the LM head by vocabulary rows. Megatron's f and g operators
// join the slices (an all-reduce of B*T*C numbers, twice forward and twice backward per layer);
// sequence parallelism splits each all-reduce in its reduce-scatter and all-gather halves and
// keeps 1/tp of the residual stream's rows in between. The program shows who holds which slice,
// what each collective moved, per-rank memory by category, checks the README's formulas against
// the measurements, and compares with one device.
//   lesson04_tensor_parallel [--tp 2] [--sp on|off] [--dp 1] [--ac none|full] [--vocab-size 262] [--step] [--json]
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/model/params.h"
#include "core/model/tp_layout.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/tensor_parallel.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"

namespace llama4d::lesson {
namespace {

struct TpArgs {
  int tp = 2;
  std::string sp = "on";
  int dp = 1;
  std::string ac = "none";  // activation checkpointing: none or full
  int64_t vocab_size = 0;   // 0: the preset's
};

// ---- The README's slicing rules, written from the shapes (never read from TpLayout) -----------

// Alpha-beta time of one recorded collective. Sequence parallelism's all-gathers and
// reduce-scatters move rows: rank r's chunk is rows [BT r/n, BT (r+1)/n) of the B*T tokens, so
// they are uneven when n does not divide B*T; everything else splits its buffer evenly.
double tp_collective_us(const TrafficRecord& t, int64_t BT, ReduceAlgo algo, const LinkParams& link) {
  if ((t.op != "all_gather" && t.op != "reduce_scatter") || t.count % BT != 0) return collective_us(t, algo, link);
  const int n = t.group_size;
  std::vector<int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back((BT * (r + 1) / n - BT * r / n) * (t.count / BT));
  const int64_t elem = int64_t(dtype_size(t.dtype));
  return t.op == "all_gather" ? all_gather_us(counts, elem, algo, link) : reduce_scatter_us(counts, elem, algo, link);
}

// What tensor-parallel rank r holds of a model with nh query heads, nkv key/value heads, SwiGLU
// width I and vocabulary V, cut tp ways.
struct Slice {
  int64_t heads_begin, heads;        // query heads: nh/tp consecutive heads
  int64_t kv_begin, kv;              // the key/value heads those queries read (group g = nh/nkv)
  int64_t ffn;                       // I/tp SwiGLU columns
  int64_t vocab_begin, vocab;        // ceil(V/tp) rows, the last rank what is left
};

Slice slice_of(const LlamaConfig& c, int tp, int r) {
  const int64_t nh = c.num_attention_heads, g = nh / c.num_key_value_heads, V = c.vocab_size;
  Slice s{};
  s.heads = nh / tp;
  s.heads_begin = r * s.heads;
  s.kv_begin = s.heads_begin / g;
  s.kv = (s.heads_begin + s.heads - 1) / g - s.kv_begin + 1;
  s.ffn = c.intermediate_size / tp;
  const int64_t per = (V + tp - 1) / tp;
  s.vocab_begin = std::min(V, r * per);
  s.vocab = std::min(V, s.vocab_begin + per) - s.vocab_begin;
  return s;
}

// Elements of rank r's slice: embedding + L x (2 norms, q, k, v, o, gate, up, down) + norm + head.
int64_t slice_numel(const LlamaConfig& c, const Slice& s) {
  const int64_t C = c.hidden_size, hd = c.head_dim, L = c.num_hidden_layers, q = s.heads * hd, kv = s.kv * hd;
  const int64_t layer = 2 * C + q * C + 2 * kv * C + C * q + 3 * s.ffn * C;
  return s.vocab * C + L * layer + C + (c.tie_word_embeddings ? 0 : s.vocab * C);
}

// The key/value heads rank r holds that some other rank holds too.
bool holds_replica(const LlamaConfig& c, int tp, int r) {
  const Slice me = slice_of(c, tp, r);
  for (int o = 0; o < tp; ++o) {
    if (o == r) continue;
    const Slice other = slice_of(c, tp, o);
    if (std::max(me.kv_begin, other.kv_begin) < std::min(me.kv_begin + me.kv, other.kv_begin + other.kv)) return true;
  }
  return false;
}

std::string span(int64_t b, int64_t n) { return n == 1 ? std::to_string(b) : std::to_string(b) + "-" + std::to_string(b + n - 1); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "model.layers.0.self_attn.q_proj.weight" -> "layers.*.self_attn.q_proj"
std::string short_name(const std::string& name) {
  std::string n = name;
  if (n.rfind("model.", 0) == 0) n = n.substr(6);
  if (n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0) n = n.substr(0, n.size() - 7);
  if (n.rfind("layers.", 0) == 0) n = "layers.*" + n.substr(n.find('.', 7));
  return n;
}

std::string split_kind(const std::string& name) {
  for (const char* p : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"})
    if (name.find(p) != std::string::npos) return "column-parallel";
  for (const char* p : {"o_proj", "down_proj"})
    if (name.find(p) != std::string::npos) return "row-parallel";
  if (name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos)
    return "vocabulary rows";
  return "replicated";
}

// One row per tensor of the embedding, layer 0 (every layer is cut alike), the final norm and the
// head: its whole shape, how it is split, and each tensor-parallel rank's block of it.
std::string slice_table(const LlamaConfig& cfg, int tp) {
  std::vector<std::vector<ParamSpec>> per_rank;
  for (int r = 0; r < tp; ++r) per_rank.push_back(llama_param_specs(cfg, tp_layout(cfg, tp, r)));
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"tensor", "whole [out, in]", "split"};
  for (int r = 0; r < tp; ++r) head.push_back("tp rank " + std::to_string(r));
  rows.push_back(head);
  for (size_t i = 0; i < per_rank[0].size(); ++i) {
    const ParamSpec& p0 = per_rank[0][i];
    if (p0.layer > 0) continue;
    std::vector<std::string> row = {short_name(p0.name), shape_str(p0.full_shape()), split_kind(p0.name)};
    for (int r = 0; r < tp; ++r) {
      const ParamSpec& p = per_rank[size_t(r)][i];
      std::string cell = shape_str(p.shape);
      if (p.sliced() && p.shape[0] != p.whole_shape[0]) cell += " rows " + span(p.row_begin, p.shape[0]);
      if (p.sliced() && p.shape.size() > 1 && p.shape[1] != p.whole_shape[1])
        cell += " cols " + span(p.col_begin, p.shape[1]);
      row.push_back(cell);
    }
    rows.push_back(row);
  }
  std::vector<std::string> total = {"total elements", grouped(cfg.num_parameters()), ""};
  for (int r = 0; r < tp; ++r) total.push_back(grouped(flat_numel(per_rank[size_t(r)])));
  rows.push_back(total);
  return format_table(rows);
}

// Which query and key/value heads each tensor-parallel rank holds, and which ranks share a KV head.
std::string heads_table(const LlamaConfig& cfg, int tp) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"tp rank", "query heads", "KV heads", "held by (KV replicas)", "SwiGLU columns", "vocabulary rows"});
  for (int r = 0; r < tp; ++r) {
    const TpLayout t = tp_layout(cfg, tp, r);
    std::string holders;
    for (int64_t k = t.kv_heads_begin; k < t.kv_heads_begin + t.kv_heads; ++k) {
      std::string who;
      for (int o = 0; o < tp; ++o) {
        const TpLayout u = tp_layout(cfg, tp, o);
        if (k < u.kv_heads_begin || k >= u.kv_heads_begin + u.kv_heads) continue;
        if (!who.empty()) who += ",";
        who += std::to_string(o);
      }
      if (!holders.empty()) holders += "; ";
      holders += "head " + std::to_string(k) + ": ranks {" + who + "}";
    }
    rows.push_back({std::to_string(r), span(t.heads_begin, t.heads), span(t.kv_heads_begin, t.kv_heads), holders,
                    span(t.ffn_begin, t.ffn), span(t.vocab_begin, t.vocab_rows)});
  }
  return format_table(rows);
}

// ---- The README's memory and traffic per rank, for --sp on or off ------------------------------

struct Expected {
  std::vector<int64_t> params, state, block_calls, block, ends, loss_calls, loss, kv, gain, norm, dp, total, act, scratch;
};

Expected expected(const LlamaConfig& cfg, const ParallelPlan& plan, int64_t B, int64_t T, int64_t M, bool full,
                  ReduceAlgo algo, bool sp) {
  const int tp = plan.size("tp"), dp = plan.dp(), W = tp * dp;
  const int64_t C = cfg.hidden_size, hd = cfg.head_dim, L = cfg.num_hidden_layers, nkv = cfg.num_key_value_heads;
  const int64_t BT = B * T, s4 = 4;
  // SP: rank r holds token rows [BT r / tp, BT (r+1) / tp) of the residual stream (any BT splits;
  // a rank holds at most one row more than another). These are the chunks of SP's collectives.
  std::vector<int64_t> chunk(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) chunk[size_t(r)] = (BT * (r + 1) / tp - BT * r / tp) * C;
  Expected e;
  for (auto* v : {&e.params, &e.state, &e.block_calls, &e.block, &e.ends, &e.loss_calls, &e.loss, &e.kv, &e.gain,
                  &e.norm, &e.dp, &e.total, &e.act, &e.scratch})
    v->assign(size_t(W), 0);
  for (int w = 0; w < W; ++w) {
    const int r = w % tp, d = w / tp;
    const size_t i = size_t(w);
    const Slice sl = slice_of(cfg, tp, r);
    const int64_t n = slice_numel(cfg, sl);
    e.params[i] = s4 * n;
    e.state[i] = 16 * n;
    // g and f: an all-reduce of [BT, C], or (SP) a reduce-scatter or all-gather of its tp row blocks.
    const int64_t ar = all_reduce_sent(BT * C, tp, r, s4, algo);
    const int64_t rs = reduce_scatter_sent(chunk, r, s4), ag = all_gather_sent(chunk, r, s4, algo);
    const int64_t rows = sp ? chunk[size_t(r)] / C : BT;  // residual-stream rows this rank holds
    // Per layer and micro-batch: 4 all-reduces, or (SP) 4 reduce-scatters + 4 all-gathers; full
    // checkpointing's recompute repeats o_proj's (and with SP also gathers n1 and n2 again).
    e.block_calls[i] = (sp ? (full ? 11 : 8) : (full ? 5 : 4)) * L * M;
    e.block[i] = (sp ? (full ? 5 * rs + 6 * ag : 4 * rs + 4 * ag) : (full ? 5 : 4) * ar) * L * M;
    e.ends[i] = (sp ? 2 * rs + 2 * ag : 2 * ar) * M;  // embedding output, head input gradient
    e.loss_calls[i] = 3 * M;
    e.loss[i] = 3 * M * all_reduce_sent(BT, tp, r, s4, algo);
    e.kv[i] = nkv < tp ? L * M * all_reduce_sent(2 * nkv * hd * C, tp, r, s4, algo) : 0;
    e.gain[i] = sp ? (2 * L + 1) * M * all_reduce_sent(C, tp, r, s4, algo) : 0;
    e.norm[i] = all_reduce_sent(1, tp, r, 8, algo);
    if (dp > 1) {
      // The data-parallel all-reduce of lesson 01, over this rank's SLICE, one bucket per unit.
      for (const Segment& b : param_segments(llama_param_specs(cfg, plan.tp_layout(cfg, w))))
        e.dp[i] += all_reduce_sent(b.numel(), dp, d, s4, algo);
      e.dp[i] += all_reduce_sent(2, dp, d, 8, algo);  // the loss: (sum, tokens) in fp64
    }
    e.total[i] = e.block[i] + e.ends[i] + e.loss[i] + e.kv[i] + e.gain[i] + e.norm[i] + e.dp[i];
    // Activations kept for the backward (one micro-batch; README "Memory per rank").
    const int64_t q = sl.heads * hd, kv = sl.kv * hd, Ir = sl.ffn, Vr = sl.vocab;
    const int64_t block = (BT * (C + q + 2 * kv + q + sl.heads + C + 3 * Ir) + rows * (1 + C + 1)) * s4;
    const int64_t head = (BT * (C + Vr + 1 + 1) + rows) * s4;
    e.act[i] = 2 * BT * 4 + (L + 1) * rows * C * s4 + L * block + head;
    // Backward scratch: the residual gradient and one block's temporaries, plus the larger of the
    // head's dlogits and dn, or (replicated KV heads) a block's k/v gradients apart and the
    // [2, nkv hd, C] buffer their sum goes through; with SP a norm gain's gradient apart.
    const int64_t head_extra = BT * (Vr + C), kv_extra = nkv < tp ? 2 * kv * C + 2 * nkv * hd * C : 0;
    e.scratch[i] =
        (rows * C + BT * (2 * C + 2 * q + 2 * kv + 3 * Ir) + std::max(head_extra, kv_extra) + (sp ? C : 0)) * s4;
  }
  return e;
}

// The traffic labels of the blocks' f and g (and SP's halves), and of the embedding and head
// (core/comm/traffic_labels.h): op, label prefix.
const std::vector<std::pair<std::string_view, std::string_view>> kBlockLabels = {
    {"all_reduce", label::kG},          {"all_reduce", label::kFAttention},   {"all_reduce", label::kFMlp},
    {"all_gather", label::kSpForward},  {"reduce_scatter", label::kSpForward}, {"all_gather", label::kSpBackward},
    {"reduce_scatter", label::kSpBackward}};
const std::vector<std::pair<std::string_view, std::string_view>> kEndLabels = {
    {"all_reduce", label::kVocabEmbedding}, {"reduce_scatter", label::kVocabEmbedding}, {"all_reduce", label::kFHead},
    {"all_gather", label::kSpHeadInput},    {"reduce_scatter", label::kSpHeadInput},    {"all_gather", label::kSpEmbeddingGrad}};

int64_t sum_over(const std::vector<TrafficRecord>& records,
                 const std::vector<std::pair<std::string_view, std::string_view>>& labels,
                 int64_t (*of)(const std::vector<TrafficRecord>&, std::string_view, std::string_view)) {
  int64_t n = 0;
  for (const auto& [op, label] : labels) n += of(records, op, label);
  return n;
}

// ---- The run, phase by phase -------------------------------------------------------------------

// What every phase reads: the run, its rows and the README's notation (B rows of T tokens per
// micro-batch, M micro-batches per data rank, W = tp x dp ranks).
struct TpLesson {
  const LessonOptions& o;
  RunSetup s;
  TextDataset data;
  int tp, dp, W;
  bool sp, full;  // sequence parallelism; full activation checkpointing
  int64_t B, seq, BT, M;
  ReduceAlgo algo;
  const LlamaConfig& cfg() const { return s.model; }
};

TpLesson set_up(LessonOptions& o, const TpArgs& a) {
  const int tp = a.tp, dp = a.dp, W = tp * dp;
  o.ranks = W;
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  if (a.vocab_size > 0) s.model.vocab_size = a.vocab_size;
  s.model.validate();
  s.train = o.train_options();
  s.train.batch_size = int64_t(dp) * o.micro_batches * o.rows;  // the tp ranks of a group share rows
  s.plan = ParallelPlan::parse("tp=" + std::to_string(tp) + (dp > 1 ? ",dp=" + std::to_string(dp) : ""));
  s.plan.sequence_parallel = a.sp == "on";
  s.plan.ac = Checkpointing::parse(a.ac, int(s.model.num_hidden_layers));
  s.plan.validate();
  s.plan.check_model(s.model);
  s.cluster = o.cluster_options();
  TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  const bool sp = s.plan.sequence_parallel;
  const ReduceAlgo algo = s.cluster.algo;
  return {.o = o, .s = std::move(s), .data = std::move(data), .tp = tp, .dp = dp, .W = W, .sp = sp,
          .full = a.ac == "full", .B = o.rows, .seq = o.seq_len, .BT = o.rows * o.seq_len, .M = o.micro_batches,
          .algo = algo};
}

void show_mesh_and_batch(Narrator& say, const TpLesson& l) {
  const LlamaConfig& cfg = l.cfg();
  say.phase("the mesh and the batch");
  say.say("Model '" + l.o.preset + "': N = " + grouped(cfg.num_parameters()) + " parameters; C = " +
          std::to_string(cfg.hidden_size) + ", " + std::to_string(cfg.num_attention_heads) + " query heads and " +
          std::to_string(cfg.num_key_value_heads) + " key/value heads of " + std::to_string(cfg.head_dim) +
          ", SwiGLU I = " + std::to_string(cfg.intermediate_size) + ", vocabulary V = " + std::to_string(cfg.vocab_size) +
          ", " + std::to_string(cfg.num_hidden_layers) + " layers.\nMesh " + l.s.plan.describe_mesh() +
          (l.sp ? " with sequence parallelism" : " without sequence parallelism") + ", " +
          std::string(reduce_algo_name(l.algo)) + " reductions; " + l.s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(l.s.plan, l.s.cluster.cluster));
  say.say("\nThe ranks of a tensor-parallel group read the SAME rows (B*T = " + std::to_string(l.BT) +
          " tokens per micro-batch); data ranks read different ones. Rows of step 1 per data rank:\n\n");
  say.say(batch_table(l.data, l.s.train, l.dp, 0));
  say.pause();
}

// Right after construction: every tensor's slice, the heads, columns and rows per rank, and what
// each rank holds.
void show_slices(Narrator& say, const TpLesson& l, const PhaseView& p) {
  const LlamaConfig& cfg = l.cfg();
  const int tp = l.tp;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, V = cfg.vocab_size;
  say.phase("what each rank holds (" + p.strategy + ")");
  say.ask("T1", "How many bytes of parameters does rank 0 hold?");
  say.say("Every weight is cut " + std::to_string(tp) +
          " ways. Shapes are Hugging Face's [out, in]: a column-parallel layer (Megatron's Y = XA with A split by "
          "columns)\nholds a block of out-features, i.e. ROWS of the [out, in] tensor; a row-parallel layer holds "
          "a block of in-features (columns).\nLayer 0 stands for every layer.\n\n");
  say.say(slice_table(cfg, tp));
  say.say("\nHeads, SwiGLU columns and vocabulary rows per tensor-parallel rank (query head j reads KV head j / " +
          std::to_string(nh / nkv) + "):\n\n");
  say.say(heads_table(cfg, tp));
  if (nkv < tp)
    say.say("\ntp = " + std::to_string(tp) + " > " + std::to_string(nkv) +
            " key/value heads: a KV head is held by several ranks, each of which computes its gradient from its own\n"
            "query heads only; the replicas' gradients are summed every micro-batch (exercise T7).\n");
  if (V % tp != 0)
    say.say("\nV = " + std::to_string(V) + " is not a multiple of tp: each rank's share is ceil(V/tp) = " +
            std::to_string((V + tp - 1) / tp) + " rows and the last rank holds what is left (padding never stored).\n");
  say.say("\nBytes live on each virtual GPU right after construction (params, grads, AdamW of the slice only):\n\n");
  say.say(memory_table(live_of(p)));
  say.pause();
}

std::vector<PhaseView> train_and_show_steps(Narrator& say, const TpLesson& l) {
  StepReporter steps(say, l.o.step,
                     "g = the all-reduce after a row-parallel layer (forward), f = the one before a column-parallel "
                     "layer (backward);\nwith SP each becomes a reduce-scatter + an all-gather of the same bytes. "
                     "'grad bucket' and 'loss' are the data-parallel\nreductions of lesson 01" +
                         std::string(l.dp == 1 ? ": over a data-parallel group of one rank they move nothing." : "."),
                     " (scratch: the backward's temporaries)");
  return run_phases(l.s, l.data, [&](const PhaseView& p) {
    if (p.step > 0)
      return steps.show(p, [&] {
        if (p.step != 1) return;
        say.ask("T3", "How many collectives per step do the blocks' f and g operators make on rank 0?");
        say.ask("T4", "How many bytes does rank 0 send for them per step?");
        say.ask("T10", "How many bytes does rank 0 send in all, per step?");
      });
    show_slices(say, l, p);
  });
}

// The same steps with the other --sp setting, one step, for S3 and S4.
std::vector<PhaseView> run_other_sp(const TpLesson& l) {
  RunSetup flipped = l.s;
  flipped.plan.sequence_parallel = !l.sp;
  flipped.train.steps = 1;
  return run_phases(flipped, l.data, nullptr);
}

// What was measured, per world rank: memory at rest (params, state) and in the last step, and
// the last step's collectives by the labels of Expected.
struct Measured {
  std::vector<int64_t> params, state, act, scratch, total, block_calls, block, ends, loss_calls, loss, kv, gain, norm;
};

Measured measure(const PhaseView& rest, const PhaseView& last) {
  Measured m;
  for (size_t w = 0; w < last.ranks.size(); ++w) {
    const RankSnapshot& r0 = rest.ranks[w];
    const RankSnapshot& r1 = last.ranks[w];
    m.params.push_back(r0.live.params);
    m.state.push_back(r0.live.params + r0.live.grads + r0.live.optimizer);
    m.act.push_back(r1.peak.activations);
    m.scratch.push_back(r1.peak.scratch);
    m.total.push_back(total_sent(r1.traffic));
    m.block_calls.push_back(sum_over(r1.traffic, kBlockLabels, call_count));
    m.block.push_back(sum_over(r1.traffic, kBlockLabels, sent_bytes));
    m.ends.push_back(sum_over(r1.traffic, kEndLabels, sent_bytes));
    m.loss_calls.push_back(call_count(r1.traffic, "all_reduce", label::kVocabLoss));
  }
  m.loss = per_rank_sent(last, "all_reduce", label::kVocabLoss);
  m.kv = per_rank_sent(last, "all_reduce", label::kKeyValueReplicas);
  m.gain = per_rank_sent(last, "all_reduce", label::kNormGainGrad);
  m.norm = per_rank_sent(last, "all_reduce", label::kGradNormTensorSlices);
  return m;
}

// T1-T5: the slice each rank holds, and the bytes and calls of the blocks' f and g and of the
// embedding's and head's.
void check_slices_and_f_g(ExerciseSheet& sheet, const TpLesson& l, const Expected& e, const Measured& m) {
  const LlamaConfig& cfg = l.cfg();
  const int tp = l.tp;
  const bool sp = l.sp, full = l.full;
  const int64_t L = cfg.num_hidden_layers, N = cfg.num_parameters(), M = l.M;
  const double dtp = tp, ring = 2 * (dtp - 1) / dtp, BTC4 = 4.0 * double(l.BT * cfg.hidden_size);
  const int64_t per_layer = sp ? (full ? 11 : 8) : (full ? 5 : 4);
  const std::string ac_note =
      full ? sp ? " + full checkpointing's recompute: o_proj's reduce-scatter and the all-gathers of n1 and n2 again "
                  "(the recompute stops before down_proj): 11 L M"
                : " + full checkpointing's recompute repeats o_proj's g (it stops before down_proj): 5 L M"
           : "";
  sheet.exact("T1", "How many bytes of parameters does each rank hold?",
              "4 x its slice: embedding and LM head ceil(V/tp) rows (the last rank what is left), per layer nh/tp query "
              "heads, the KV heads they read, I/tp SwiGLU columns, and both RMSNorm gains whole",
              -1, e.params, m.params,
              "One device holds 4N = " + grouped(4 * N) + " bytes; 4N/tp would be " + grouped(4 * N / tp) +
                  ": the replicated norms" + std::string(cfg.num_key_value_heads < tp ? " and KV heads" : "") +
                  " make the slice larger.");
  sheet.exact("T2", "How much model state (params + grads + AdamW) does each rank keep between steps?",
              "16 bytes per element of its slice (fp32 weights and gradients, two AdamW moments)", -1, e.state, m.state);
  sheet.exact("T3", "How many collectives per step do the blocks' f and g operators make?",
              sp ? "each of the 4 all-reduces per layer and micro-batch (g after o_proj and down_proj in forward, f "
                   "before q/k/v and gate/up in backward) becomes a reduce-scatter + an all-gather: 8 L M" + ac_note
                 : "4 all-reduces per layer and micro-batch: g after o_proj and down_proj (forward), f before q/k/v and "
                   "gate/up (backward): 4 L M" + ac_note,
              double(per_layer * L * M), e.block_calls, m.block_calls);
  sheet.exact("T4", "How many bytes does each rank send for them per step?",
              "each all-reduce of B*T*C fp32 numbers sends 2 (tp-1)/tp of the buffer per rank" +
                  std::string(sp ? "; SP's reduce-scatters and all-gathers (tp-1)/tp each: the same bytes" : "") +
                  (full ? "; " + std::to_string(per_layer) + " per layer and micro-batch" : ": 4 L M x 2 (tp-1)/tp x 4 BTC"),
              double(per_layer * L * M) * (sp ? ring / 2 : ring) * BTC4, e.block, m.block);
  sheet.exact("T5", "And around the embedding and the head?",
              "the vocabulary-parallel embedding's partial lookups (a g) and the LM head's input gradient (an f): 2 M "
              "[B*T, C] sums" + std::string(sp ? ", as reduce-scatters and all-gathers" : ""),
              2.0 * double(M) * ring * BTC4, e.ends, m.ends);
  // The questions asked name rank 0.
  sheet.answer("T1", {.value = double(m.params[0]), .unit = "bytes", .of = "rank 0"});
  sheet.answer("T3", {.value = double(m.block_calls[0]), .unit = "collectives", .of = "rank 0"});
  sheet.answer("T4", {.value = double(m.block[0]), .unit = "bytes", .of = "rank 0"});
}

// T6-T10: the vocabulary-parallel loss, the replicated key/value heads, SP's norm gains, the
// gradient norm, and the step's total.
void check_loss_replicas_and_total(ExerciseSheet& sheet, const TpLesson& l, const Expected& e, const Measured& m) {
  const LlamaConfig& cfg = l.cfg();
  const int64_t C = cfg.hidden_size, hd = cfg.head_dim, L = cfg.num_hidden_layers, nkv = cfg.num_key_value_heads;
  const int64_t M = l.M;
  const double dtp = l.tp, ring = 2 * (dtp - 1) / dtp;
  sheet.exact("T6", "How many bytes does the vocabulary-parallel loss send per step?",
              "3 all-reduces of B*T numbers per micro-batch (max, sum of exp, target logit): 3 M x 2 (tp-1)/tp x 4 BT, "
              "never the [B*T, V] logits",
              3.0 * double(M) * ring * 4 * double(l.BT), e.loss, m.loss);
  sheet.exact("T6b", "How many all-reduces is that?", "3 per micro-batch", 3.0 * double(M), e.loss_calls, m.loss_calls);
  sheet.exact("T7", "What do the replicated key/value heads send?",
              nkv < l.tp ? "per layer and micro-batch one all-reduce of the k and v weight gradients of all heads, "
                           "2 nkv hd C numbers (non-holders add zeros): L M x 2 (tp-1)/tp x 4 (2 nkv hd C)"
                         : "nothing: tp <= num_key_value_heads, every KV head lives on exactly one rank",
              nkv < l.tp ? double(L * M) * ring * 4 * double(2 * nkv * hd * C) : 0.0, e.kv, m.kv);
  if (l.sp)
    sheet.exact("T8", "SP: what do the RMSNorm gains' gradients cost?",
                "each rank's rows give only part of a gain's gradient: (2L + 1) M all-reduces of C numbers",
                double((2 * L + 1) * M) * ring * 4 * double(C), e.gain, m.gain);
  sheet.exact("T9", "And the gradient norm for clipping?",
              "each rank's sum of squares over the elements it counts (replicas once), summed: 1 fp64 all-reduce", -1,
              e.norm, m.norm);
  sheet.exact("T10", "In total, per rank and step?",
              "the sum of the above" + std::string(l.dp > 1 ? " + the data-parallel all-reduce of the slice's gradients "
                                                              "and of the loss (lesson 01, over the dp group)"
                                                            : "") +
                  ": nothing else moves",
              -1, e.total, m.total);
  sheet.answer("T10", {.value = double(m.total[0]), .unit = "bytes", .of = "rank 0"});
}

// T11, T12: the collectives on the simulated clock (one node: every hop is NVLink).
void check_time(ExerciseSheet& sheet, const TpLesson& l, const PhaseView& last) {
  std::vector<int64_t> busy_low, busy_high, busy, hidden;
  for (const RankSnapshot& r1 : last.ranks) {
    double formula = 0;
    for (const TrafficRecord& t : r1.traffic) formula += tp_collective_us(t, l.BT, l.algo, l.s.cluster.cluster.nvlink);
    busy_low.push_back(ns(formula) - 1), busy_high.push_back(ns(formula) + 1);
    busy.push_back(ns(r1.time.comm_us));
    hidden.push_back(ns(std::max(0.0, r1.time.comm_us - r1.time.wait_us)));
  }
  sheet.range("T11", "On the simulated clock, how long do the step's collectives keep each rank's links busy (ns)?",
              "the sum over the step's collectives of the alpha-beta time: all-reduce = reduce-scatter + all-gather, "
              "each " + std::string(l.algo == ReduceAlgo::ring ? "(n-1) steps of alpha + chunk / bandwidth"
                                                               : "one phase of alpha + the busiest rank's bytes / bandwidth"),
              busy_low, busy_high, busy, "Within 1 ns of rounding; a group of one rank costs nothing.");
  if (l.dp == 1)
    sheet.exact("T12", "How much of that communication hides behind compute (ns)?",
                "none: every f and g is synchronous, the next matmul needs its result (measured: busy - exposed)",
                0.0, std::vector<int64_t>(size_t(l.W), 0), hidden,
                "Data parallelism's bucketed all-reduces (lesson 01) overlap; tensor parallelism's cannot, which is "
                "why Llama 3 keeps tp inside a node's NVLink.");
}

// S1, S2: activations kept for the backward and the backward's scratch (without recompute).
void check_activations(ExerciseSheet& sheet, const TpLesson& l, const Expected& e, const Measured& m) {
  const bool sp = l.sp;
  sheet.exact("S1", "How many bytes of activations does each rank keep for the backward?",
              "per micro-batch, with rows = " +
                  std::string(sp ? "this rank's rows [BT r/tp, BT (r+1)/tp) of the B*T tokens" : "B*T") +
                  ": tokens + targets 8 BT, residual stream 4 (L+1) rows C, per block 4 [BT (2C + 2q + 2kv + nh/tp "
                  "+ 3 I/tp) + rows (C + 2)], head 4 [BT (C + V/tp + 2) + rows]",
              -1, e.act, m.act,
              sp ? "The residual stream, h and the norms' statistics hold 1/tp of the rows; n1 and n2 are kept "
                   "gathered (all rows) for the weight gradients."
                 : "Without SP the residual stream [B*T, C] is the same on every rank: rerun with --sp on.");
  sheet.exact("S2", "What is the peak of backward scratch?",
              "the residual gradient (rows x C) + one block's temporaries BT (2C + 2q + 2kv + 3 I/tp) + the larger "
              "of the head's dlogits and dn, BT (V/tp + C), and" +
                  std::string(l.cfg().num_key_value_heads < l.tp
                                  ? " the replicated KV heads' gradients apart and summed, 2 kv C + 2 nkv hd C"
                                  : " nothing else (no KV replicas)") +
                  (sp ? "; + C for a norm gain's gradient apart" : ""),
              -1, e.scratch, m.scratch);
}

// S3, S4: SP against plain TP, one step each: the bytes it adds and the activations it saves.
void check_sp_against_plain(ExerciseSheet& sheet, const TpLesson& l, const PhaseView& this_run,
                            const PhaseView& other_run, const Expected& e) {
  const LlamaConfig& cfg = l.cfg();
  const int64_t C = cfg.hidden_size, L = cfg.num_hidden_layers, M = l.M, BT = l.BT;
  const double dtp = l.tp, ring = 2 * (dtp - 1) / dtp, BTC4 = 4.0 * double(BT * C);
  const bool sp = l.sp, full = l.full;
  const PhaseView& on = sp ? this_run : other_run;
  const PhaseView& off = sp ? other_run : this_run;
  const Expected e_on = sp ? e : expected(cfg, l.s.plan, l.B, l.seq, M, full, l.algo, true);
  const Expected e_off = sp ? expected(cfg, l.s.plan, l.B, l.seq, M, full, l.algo, false) : e;
  std::vector<int64_t> x_traffic, m_traffic, x_act, m_act_saved;
  for (size_t w = 0; w < size_t(l.W); ++w) {
    x_traffic.push_back(e_on.total[w] - e_off.total[w]);
    m_traffic.push_back(total_sent(on.ranks[w].traffic) - total_sent(off.ranks[w].traffic));
    x_act.push_back(e_off.act[w] - e_on.act[w]);
    m_act_saved.push_back(off.ranks[w].peak.activations - on.ranks[w].peak.activations);
  }
  sheet.exact("S3", "How many more bytes does SP send than plain TP (--sp on minus --sp off, one step)?",
              "only the RMSNorm gains' gradients, (2L + 1) M x 2 (tp-1)/tp x 4C: every all-reduce became a "
              "reduce-scatter + an all-gather of the same bytes" +
                  std::string(full ? "; + with full checkpointing one all-gather of n2 per layer and micro-batch "
                                     "(the recompute rebuilds n2 from h's rows and gathers it again)"
                                   : ""),
              double((2 * L + 1) * M) * ring * 4 * double(C) + (full ? double(L * M) * ring / 2 * BTC4 : 0.0),
              x_traffic, m_traffic, "Measured: this run and a one-step run with --sp " + std::string(sp ? "off" : "on") + ".");
  if (!full)
    sheet.exact("S4", "How many bytes of activations does SP save per rank?",
                "(tp-1)/tp of the rows of everything kept per row outside the tensor-parallel regions: the residual "
                "stream x_0..x_L, each block's h, rstd1 and rstd2, the final norm's rstd: 4 (tp-1)/tp BT [(L+1) C + "
                "L (C + 2) + 1]",
                4.0 * (dtp - 1) / dtp * double(BT) * double((L + 1) * C + L * (C + 2) + 1), x_act, m_act_saved,
                "n1, n2 and the final norm's output are kept gathered (all rows): Megatron-LM keeps only the rows and "
                "gathers them again in backward, saving 4 (tp-1)/tp BT C more per norm.");
}

// The exercise sheet, then the steps on one device: in fp32 within the harness's bounds, in fp64
// within 1e-12 of the plain single-device trainer.
bool check_equivalence(Narrator& say, ExerciseSheet& sheet, const TpLesson& l, EquivalenceReport& report,
                       EquivalenceReport& report64) {
  const bool equivalent = finish_with_equivalence(say, sheet, l.s, l.data, report);
  say.say("\nThe same steps in fp64, against the plain single-device trainer (its own order of additions):\n\n");
  report64 = run_equivalence_fp64(l.s, l.data);
  say.say(report64.table());
  return equivalent && report64.ok && report64.plain_checked && report64.plain_max_rel_err <= 1e-12;
}

// Per tensor-parallel rank: its heads, key/value heads, SwiGLU columns and vocabulary rows.
nlohmann::json slices_json(const LlamaConfig& cfg, int tp) {
  nlohmann::json slices = nlohmann::json::array();
  for (int r = 0; r < tp; ++r) {
    const TpLayout t = tp_layout(cfg, tp, r);
    slices.push_back({{"tp_rank", r},
                      {"heads", {t.heads_begin, t.heads}},
                      {"kv_heads", {t.kv_heads_begin, t.kv_heads}},
                      {"ffn", {t.ffn_begin, t.ffn}},
                      {"vocab", {t.vocab_begin, t.vocab_rows}},
                      {"replicated_kv", holds_replica(cfg, tp, r)},
                      {"elements", flat_numel(llama_param_specs(cfg, t))}});
  }
  return slices;
}

int run(LessonOptions o, const TpArgs& a) {
  Narrator say(o);
  const TpLesson l = set_up(o, a);
  show_mesh_and_batch(say, l);
  const std::vector<PhaseView> phases = train_and_show_steps(say, l);
  const std::vector<PhaseView> other = run_other_sp(l);

  say.phase("exercises: formula vs measured");
  const Expected e = expected(l.cfg(), l.s.plan, l.B, l.seq, l.M, l.full, l.algo, l.sp);
  const Measured m = measure(phases.front(), phases.back());
  ExerciseSheet sheet;
  check_slices_and_f_g(sheet, l, e, m);
  check_loss_replicas_and_total(sheet, l, e, m);
  if (l.s.cluster.cluster.nodes == 1) check_time(sheet, l, phases.back());
  if (!l.full) check_activations(sheet, l, e, m);
  check_sp_against_plain(sheet, l, phases[1], other[1], e);
  EquivalenceReport report, report64;
  const bool equivalent = check_equivalence(say, sheet, l, report, report64);
  return finish_lesson("04-tensor-parallelism", o.json, o.preset, l.s, phases, sheet, report, equivalent,
                       [&](nlohmann::json& j) {
                         j["slices"] = slices_json(l.cfg(), l.tp);
                         j["sequence_parallel"] = l.sp;
                         j["equivalence_fp64"] = fp64_equivalence_json(report64);
                       });
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::TpArgs tp;
  options.ranks = tp.tp * tp.dp;  // --ranks is tp x dp here (the default shown by --help)
  CLI::App app{"Lesson 04: tensor and sequence parallelism on virtual GPUs", "lesson04_tensor_parallel"};
  options.add_options(app);
  app.add_option("--tp", tp.tp, "tensor-parallel ranks (must divide the heads and the SwiGLU width)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--sp", tp.sp, "sequence parallelism between the tensor-parallel regions")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--dp", tp.dp, "data-parallel ranks (mesh tp=N,dp=M: tp x dp virtual GPUs)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--ac", tp.ac, "activation checkpointing: none, or full (every block recomputed in backward)")
      ->check(CLI::IsMember({"none", "full"}))
      ->capture_default_str();
  app.add_option("--vocab-size", tp.vocab_size, "override the preset's vocabulary (>= 258), e.g. 262 to see padding")
      ->check(CLI::Range(258, 1 << 20));
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    if (app.get_option("--ranks")->count() > 0 && options.ranks != tp.tp * tp.dp)
      throw llama4d::InputError("--ranks is tp x dp here (" + std::to_string(tp.tp * tp.dp) + "); use --tp and --dp");
    return llama4d::lesson::run(options, tp);
  });
}
