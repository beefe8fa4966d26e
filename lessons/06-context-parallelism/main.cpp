// Lesson 06: context parallelism. The cp ranks of a group hold the same weights and the same rows
// of the batch, each a different part of every sequence. Everything but attention is per token;
// attention needs every earlier key. The program measures why Llama 3 cuts a sequence into 2 cp
// chunks (attention's FLOPs per rank, balanced vs a contiguous cut), what all-gather attention
// and ring attention send per layer and hold in scratch, why grouped-query attention makes the
// all-gather cheap, that activation memory falls by cp, what a document mask changes, and then
// checks the plan (also cp x dp under ZeRO-3) against one device.
//   lesson06_context_parallel [--cp 4] [--cp-algo allgather] [--seq-len 128] [--rows 2] [--step] [--json]
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string_view>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/model/params.h"
#include "core/ops.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/context_parallel.h"
#include "core/tensor/memory_tracker.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"
#include "lessons/common/step_run.h"

namespace llama4d::lesson {
namespace {

struct CpArgs {
  int cp = 4;
  std::string algo = "allgather";
};

int64_t as_int(double v) { return int64_t(std::llround(v)); }

std::string joined(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " / " : "") + grouped(v[i]);
  return s;
}

// Bytes a rank sent in records[from, end) whose label starts with `prefix`, whatever the
// operation (ring attention's sends and receives, all-gathers, reduce-scatters).
int64_t sent_with_prefix(const std::vector<TrafficRecord>& records, size_t from, std::string_view prefix) {
  int64_t n = 0;
  for (size_t i = from; i < records.size(); ++i)
    if (records[i].label.starts_with(prefix)) n += records[i].bytes_sent;
  return n;
}

// ---- One attention call per rank, alone: FLOPs, bytes and scratch of one layer and micro-batch --

struct FlopCount final : ops::FlopSink {
  double flops = 0;
  void add_flops(double f) override { flops += f; }
};

struct AttentionProbe {
  std::vector<double> fwd_flops, bwd_flops, contiguous_flops;  // [cp rank]
  std::vector<int64_t> fwd_sent, bwd_sent;                     // bytes, labels label::kContextParallel*
  std::vector<int64_t> fwd_scratch, bwd_scratch;               // peak scratch bytes during the call
};

// Runs ContextParallelComm's forward and backward once on every rank of a cp group, with q, k, v
// of the model's head shapes for B rows of S tokens, and measures what each call cost that rank.
// Also the contiguous cut's forward: rank r's S/cp queries [r T, (r+1) T) against every key up to
// its last, the attention op called directly (the library only implements the balanced split).
// The values are constants: FLOPs, bytes and buffers do not depend on them.
// docs: [B, S] document ids of the rows (a document mask), or null.
AttentionProbe probe_attention(int64_t nh, int64_t nkv, int64_t hd, int cp, ContextAlgo algo, int64_t B, int64_t S,
                               const int32_t* docs = nullptr) {
  const int64_t T = S / cp;
  AttentionProbe p;
  for (auto* v : {&p.fwd_flops, &p.bwd_flops, &p.contiguous_flops}) v->assign(size_t(cp), 0);
  for (auto* v : {&p.fwd_sent, &p.bwd_sent, &p.fwd_scratch, &p.bwd_scratch}) v->assign(size_t(cp), 0);
  VirtualClusterOptions vo;
  vo.ranks = cp;
  VirtualCluster cluster(vo);
  std::mutex mu;
  cluster.run([&](ProcessGroup& g) {
    ops::set_backend_threads(1);
    const size_t r = size_t(g.rank());
    ContextParallelComm<float> comm(g, algo);
    const BlockDims d{.B = B, .seq = T, .nh = nh, .nkv = nkv, .hd = hd, .cp = cp, .cp_rank = int64_t(r), .doc = docs};
    const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd;
    auto buffer = [](int64_t count) { return std::vector<float>(static_cast<size_t>(count)); };
    std::vector<float> q = buffer(nq), k = buffer(nk), v = buffer(nk), out = buffer(nq), lse = buffer(B * nh * T);
    std::vector<float> dout = buffer(nq), dq = buffer(nq), dk = buffer(nk), dv = buffer(nk);
    ops::fill(q.data(), 0.02f, nq), ops::fill(k.data(), 0.03f, nk), ops::fill(v.data(), 0.05f, nk);
    ops::fill(dout.data(), 0.01f, nq), ops::fill(dq.data(), 0.0f, nq), ops::fill(dk.data(), 0.0f, nk);
    ops::fill(dv.data(), 0.0f, nk);
    MemoryTracker& mem = g.memory();
    FlopCount f_fwd, f_bwd, f_naive;
    size_t mark = g.traffic().records().size();
    mem.reset_peaks();
    int64_t base = mem.live(MemoryCategory::scratch);
    {
      ops::ScopedFlopSink sink(&f_fwd);
      comm.attention(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
    }
    const int64_t fwd_scratch = mem.peak(MemoryCategory::scratch) - base;
    const int64_t fwd_sent = sent_with_prefix(g.traffic().records(), mark, label::kContextParallel);
    mark = g.traffic().records().size();
    mem.reset_peaks();
    base = mem.live(MemoryCategory::scratch);
    {
      ops::ScopedFlopSink sink(&f_bwd);
      comm.attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), d);
    }
    const int64_t bwd_scratch = mem.peak(MemoryCategory::scratch) - base;
    const int64_t bwd_sent = sent_with_prefix(g.traffic().records(), mark, label::kContextParallel);
    {
      // The contiguous cut, for comparison: the whole row's keys, this rank's queries.
      std::vector<float> kw = buffer(B * S * nkv * hd), vw = buffer(B * S * nkv * hd);
      ops::fill(kw.data(), 0.03f, int64_t(kw.size())), ops::fill(vw.data(), 0.05f, int64_t(vw.size()));
      ops::ScopedFlopSink sink(&f_naive);
      ops::attention_forward(out.data(), lse.data(), q.data(), kw.data(), vw.data(),
                             {.B = B, .Tq = T, .Tk = (int64_t(r) + 1) * T, .nh = nh, .nkv = nkv, .hd = hd,
                              .q_start = int64_t(r) * T, .k_start = 0, .kv_batch_stride = S * nkv * hd});
    }
    std::lock_guard<std::mutex> lock(mu);
    p.fwd_flops[r] = f_fwd.flops, p.bwd_flops[r] = f_bwd.flops, p.contiguous_flops[r] = f_naive.flops;
    p.fwd_sent[r] = fwd_sent, p.bwd_sent[r] = bwd_sent;
    p.fwd_scratch[r] = fwd_scratch, p.bwd_scratch[r] = bwd_scratch;
  });
  return p;
}

AttentionProbe probe_model(const LlamaConfig& cfg, int cp, ContextAlgo algo, int64_t B, int64_t S,
                           const int32_t* docs = nullptr) {
  return probe_attention(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cp, algo, B, S, docs);
}

// ---- The formulas (README), per rank, one layer and one micro-batch -------------------------------
//   c = S/(2cp) tokens per chunk, T = S/cp tokens per rank, n = B T nkv hd elements of K (or V)
//   pairs per head, balanced      (2cp-1) c^2 + c(c+1)          (the same on every rank)
//   pairs per head, contiguous    r T^2 + T(T+1)/2               (rank r)
//   all-gather, forward           (cp-1) 2n sent                 (K and V to every other rank)
//   all-gather, backward          (cp-1) 2n + (cp-1) 2n sent     (the all-gather again, dK dV reduce-scattered)
//   ring, forward                 (cp-1) 2n sent                 (K, V one hop per step, cp-1 steps)
//   ring, backward                (cp-1) 4n + 2n sent            (K, V and dK, dV around, dK dV one hop home)
//   all-gather scratch, backward  4 cp n elements               (whole-sequence K V and dK dV; reduce-scattered in place)
//   ring scratch, backward        8n elements                    (two blocks of K V with their dK dV)
int64_t balanced_pairs(int64_t c, int cp) { return (2 * cp - 1) * c * c + c * (c + 1); }
int64_t contiguous_pairs(int64_t T, int r) { return r * T * T + T * (T + 1) / 2; }

// ---- The lesson's shared state -------------------------------------------------------------------

// What the phases read (the run, the sizes of the split and of attention) and what they fill (the
// exercise sheet, the JSON summary's extra fields).
struct Lesson {
  LessonOptions o;
  CpArgs a;
  Narrator& say;
  RunSetup s{};  // the main run: cp ranks, one data rank
  ContextAlgo algo = ContextAlgo::allgather;
  int cp = 0, L = 0;  // context-parallel ranks, layers
  // Tokens per row, rows per micro-batch, micro-batches, tokens per chunk S/(2cp), tokens per rank S/cp.
  int64_t S = 0, B = 0, m = 0, c = 0, seq = 0;
  int64_t nh = 0, nkv = 0, hd = 0;  // query heads, key/value heads, head dimension
  int64_t n = 0, N = 0;             // elements of a rank's K (or V) per layer and micro-batch, B T nkv hd; parameters
  double per_pair = 0;              // forward FLOPs per (query, key) pair, all heads and rows: 4 hd nh B
  TextDataset data{};
  ExerciseSheet sheet{};
  nlohmann::json extra{};

  const LlamaConfig& cfg() const { return s.model; }
  // The main run's plan with K and V exchanged by `x`.
  ParallelPlan plan_with(ContextAlgo x) const {
    ParallelPlan p = s.plan;
    p.cp_algo = x;
    return p;
  }
};

// The main run from the flags. Bad input is one line and exit code 2, before anything runs.
Lesson set_up(const LessonOptions& o, const CpArgs& a, Narrator& say) {
  Lesson x{.o = o, .a = a, .say = say};
  x.cp = a.cp;
  x.algo = parse_context_algo(a.algo);
  x.o.ranks = x.cp;
  RunSetup& s = x.s;
  s.model = LlamaConfig::preset(o.preset);
  s.model.validate();
  const LlamaConfig& cfg = s.model;
  s.train = x.o.train_options();
  s.train.batch_size = o.micro_batches * o.rows;  // one data rank: the cp ranks share every row
  s.plan = ParallelPlan::parse("cp=" + std::to_string(x.cp));
  s.plan.cp_algo = x.algo;
  s.plan.validate();
  s.plan.check_sequence(o.seq_len);
  if (o.seq_len > cfg.max_position_embeddings)
    throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds preset '" + o.preset +
                     "''s max_position_embeddings " + std::to_string(cfg.max_position_embeddings));
  s.cluster = x.o.cluster_options();
  x.L = int(cfg.num_hidden_layers);
  x.S = o.seq_len, x.B = o.rows, x.m = o.micro_batches, x.c = x.S / (2 * x.cp), x.seq = x.S / x.cp;
  x.nh = cfg.num_attention_heads, x.nkv = cfg.num_key_value_heads, x.hd = cfg.head_dim;
  x.n = x.B * x.seq * x.nkv * x.hd, x.N = cfg.num_parameters();
  x.per_pair = 4.0 * double(x.hd) * double(x.nh) * double(x.B);
  x.data = load_dataset(default_corpus_path(), s.train.seq_len);
  return x;
}

// ---- 1. The split ----------------------------------------------------------------------------------

void show_split(Lesson& x) {
  const int cp = x.cp;
  const int64_t c = x.c, T = x.seq;
  x.say.phase("the split: 2 cp chunks, rank r holds chunks r and 2cp-1-r",
              "core/parallel/context_parallel.cpp (context_slice), core/model/block.h (BlockDims::cp_part_start)");
  x.say.say("Model '" + x.o.preset + "': " + std::to_string(x.L) + " layers, C = " + std::to_string(x.cfg().hidden_size) +
            ", nh = " + std::to_string(x.nh) + " query heads, nkv = " + std::to_string(x.nkv) +
            " key/value heads of hd = " + std::to_string(x.hd) + ", N = " + grouped(x.N) + " parameters.\nMesh " +
            x.s.plan.describe_mesh() + " (" + std::string(context_algo_name(x.algo)) + "), " + std::to_string(x.m) +
            " micro-batch(es) of B = " + std::to_string(x.B) + " rows x S = " + std::to_string(x.S) +
            " tokens per step. Every rank holds the whole model and the same rows;\neach row is cut into 2 cp = " +
            std::to_string(2 * cp) + " chunks of c = S/(2cp) = " + std::to_string(c) +
            " tokens, so a rank runs T = S/cp = " + std::to_string(T) + " tokens per row.\n\n");
  std::string picture;
  for (int g = 0; g < 2 * cp; ++g) picture += std::to_string(g < cp ? g : 2 * cp - 1 - g) + " ";
  x.say.say("Owner of each chunk along the sequence (position 0 on the left): " + picture + "\n\n");
  std::vector<std::vector<std::string>> rows = {{"rank", "chunks", "positions (balanced)", "positions (contiguous cut)"}};
  for (int r = 0; r < cp; ++r) {
    const int64_t g2 = 2 * cp - 1 - r;
    rows.push_back({std::to_string(r), std::to_string(r) + ", " + std::to_string(g2),
                    "[" + std::to_string(r * c) + ", " + std::to_string((r + 1) * c) + ") + [" + std::to_string(g2 * c) +
                        ", " + std::to_string((g2 + 1) * c) + ")",
                    "[" + std::to_string(r * T) + ", " + std::to_string((r + 1) * T) + ")"});
  }
  x.say.say(format_table(rows));
  x.say.say("\nRoPE and the causal mask use each token's true position (BlockDims::cp_part_start), so a rank's two "
            "chunks are\ntwo separate runs of positions, not one.\n");
  x.say.pause();
}

// ---- 2. Attention's work per rank ---------------------------------------------------------------------

// A1-A3: each rank's attention forward FLOPs under the 2 cp split and a contiguous cut. Returns
// the all-gather probe, which later phases compare against.
AttentionProbe compare_attention_work(Lesson& x) {
  const int cp = x.cp;
  const int64_t S = x.S, T = x.seq, c = x.c;
  x.say.phase("attention's work per rank: the 2 cp split vs a contiguous cut",
              "core/parallel/context_parallel.cpp (part_shape), core/ops.h (attention_visible_pairs, attention_forward_flops)");
  x.say.say("A causal query at position i scores i + 1 keys. One attention forward per rank, B = " + std::to_string(x.B) +
            " rows of S = " + std::to_string(S) + " tokens, FLOPs as the ops report them\n(4 hd FLOPs per (query, key) "
            "pair and head: q.k and p.v). Pairs per head and row = FLOPs / (4 hd nh B).\n\n");
  x.say.ask("A1", "With the 2 cp split, how many (query, key) pairs per head and row does each rank score?");
  x.say.ask("A3", "With a contiguous cut, the last rank's work over the mean, in per mille (1000 = the mean)?");
  const AttentionProbe ag = probe_model(x.cfg(), cp, ContextAlgo::allgather, x.B, S);
  std::vector<int64_t> e_bal, m_bal, e_con, m_con;
  std::vector<std::vector<std::string>> rows = {
      {"rank", "balanced: FLOPs", "pairs/head/row", "contiguous: FLOPs", "pairs/head/row", "contiguous / mean"}};
  double total_con = 0;
  for (double f : ag.contiguous_flops) total_con += f;
  for (int r = 0; r < cp; ++r) {
    e_bal.push_back(balanced_pairs(c, cp)), m_bal.push_back(as_int(ag.fwd_flops[size_t(r)] / x.per_pair));
    e_con.push_back(contiguous_pairs(T, r)), m_con.push_back(as_int(ag.contiguous_flops[size_t(r)] / x.per_pair));
    rows.push_back({std::to_string(r), grouped(as_int(ag.fwd_flops[size_t(r)])), grouped(m_bal.back()),
                    grouped(as_int(ag.contiguous_flops[size_t(r)])), grouped(m_con.back()),
                    fixed(ag.contiguous_flops[size_t(r)] / (total_con / cp), 3)});
  }
  rows.push_back({"one device", "", grouped(S * (S + 1) / 2), "", grouped(S * (S + 1) / 2), ""});
  x.say.say(format_table(rows));
  const double last_first = ag.contiguous_flops.back() / ag.contiguous_flops.front();
  x.say.say("\nContiguous: the last rank works " + fixed(last_first, 2) + "x as long as the first, " +
            fixed(ag.contiguous_flops.back() / (total_con / cp), 3) +
            "x the mean; the step waits for the slowest rank.\nBalanced: every rank scores S(S+1)/(2cp) = " +
            grouped(S * (S + 1) / (2 * cp)) + " pairs per head and row, exactly a cp-th of one device's.\n");
  x.sheet.exact("A1", "2 cp split: (query, key) pairs per head and row on each rank (FLOPs / 4 hd nh B)?",
                "(2cp-1) c^2 + c(c+1) with c = S/(2cp): chunks r and 2cp-1-r together see 2cp-1 full chunks of keys "
                "and two triangles; the same on every rank, S(S+1)/(2cp)",
                double(balanced_pairs(c, cp)), e_bal, m_bal);
  x.sheet.exact("A2", "Contiguous cut: pairs per head and row on rank r?",
                "r T^2 + T(T+1)/2 with T = S/cp: r full blocks of earlier keys and one triangle; the last rank "
                "1 + 2(cp-1) T/(T+1) times the first",
                -1, e_con, m_con);
  x.sheet.exact("A3", "Contiguous cut: the slowest rank's attention FLOPs over the mean, per mille?",
                "((cp-1) T^2 + T(T+1)/2) / (S(S+1)/(2cp)), about 2 - 1/cp for long sequences",
                -1, {as_int(1000.0 * double(contiguous_pairs(T, cp - 1)) / (double(S) * double(S + 1) / (2.0 * cp)))},
                {as_int(1000.0 * ag.contiguous_flops.back() / (total_con / cp))});
  x.extra["attention_flops"] = {{"balanced", ag.fwd_flops}, {"contiguous", ag.contiguous_flops},
                                {"pairs_balanced_formula", balanced_pairs(c, cp)},
                                {"flops_per_pair", x.per_pair}};
  x.say.pause();
  return ag;
}

// ---- 3. Training steps --------------------------------------------------------------------------------

// The main run's steps, each shown as it ends; after construction, what each rank holds.
std::vector<PhaseView> train_steps(Lesson& x) {
  const bool allgather = x.algo == ContextAlgo::allgather;
  StepReporter steps(x.say, x.o.step,
                     allgather
                         ? "'context parallelism': per layer and micro-batch, K and V all-gathered in forward, again in "
                           "backward, and dK, dV reduce-scattered.\n'grad bucket': the cp ranks hold the same weights and "
                           "saw different tokens, so they all-reduce their gradients like data-parallel replicas."
                         : "'context parallelism: ring': K and V (and in backward dK, dV) passed one hop around the ring "
                           "per step.\n'grad bucket': the cp ranks all-reduce their gradients like data-parallel replicas.",
                     " (activations: T = S/cp tokens of each row; scratch includes attention's whole-sequence K, V)",
                     "core/parallel/context_parallel.cpp (ContextParallelComm::attention, attention_backward)");
  return run_phases(x.s, x.data, [&](const PhaseView& pv) {
    if (pv.step == 0) {
      x.say.say("\nBytes live on each virtual GPU after construction: every cp rank holds the whole model (16 N = " +
                grouped(16 * x.N) + " bytes of model state).\n\n" + memory_table(live_of(pv)));
      x.say.pause();
      return;
    }
    steps.show(pv, [&] {
      if (pv.step == 1)
        x.say.ask(allgather ? "G1" : "G5",
                  allgather ? "How many bytes does each rank send per step in the forward all-gathers of K and V (all layers)?"
                            : "How many bytes does each rank send per step passing K, V (and dK, dV) around the ring?");
    });
  });
}

// G1-G3 (all-gather) or G5 (ring), and G4: what the last step sent, per rank, against the formulas.
void check_kv_traffic(Lesson& x, const PhaseView& last) {
  const int cp = x.cp, L = x.L;
  const int64_t m = x.m, n = x.n;
  const ReduceAlgo ralgo = x.s.cluster.algo;
  const std::vector<int64_t> kv_counts(size_t(cp), 2 * n);
  std::vector<int64_t> e_fwd, m_fwd, e_bwd, m_bwd, e_rs, m_rs, e_grad, m_grad, e_ring, m_ring;
  const std::vector<Segment> buckets = param_segments(llama_param_specs(x.cfg()));
  for (int r = 0; r < cp; ++r) {
    const auto& t = last.ranks[size_t(r)].traffic;
    e_fwd.push_back(L * m * all_gather_sent(kv_counts, r, 4, ralgo));
    // kCpAllGather starts kCpAllGatherBackward too: the forward's bytes are the difference.
    const int64_t gathered_backward = sent_bytes(t, "all_gather", label::kCpAllGatherBackward);
    m_fwd.push_back(sent_bytes(t, "all_gather", label::kCpAllGather) - gathered_backward);
    e_bwd.push_back(L * m * all_gather_sent(kv_counts, r, 4, ralgo));
    m_bwd.push_back(gathered_backward);
    e_rs.push_back(L * m * reduce_scatter_sent(kv_counts, r, 4));
    m_rs.push_back(sent_bytes(t, "reduce_scatter", label::kCpReduceScatter));
    e_ring.push_back(L * m * ((cp - 1) * 6 * n + 2 * n) * 4);
    m_ring.push_back(sent_with_prefix(t, 0, label::kCpRing));
    int64_t g = 0;
    for (const Segment& seg : buckets) g += all_reduce_sent(seg.numel(), cp, r, 4, ralgo);
    e_grad.push_back(g);
    m_grad.push_back(sent_bytes(t, "all_reduce", label::grad_bucket("")));
  }
  const std::string per = "; x L = " + std::to_string(L) + " layers x m = " + std::to_string(m) + " micro-batches x 4 bytes";
  if (x.algo == ContextAlgo::allgather) {
    x.sheet.exact("G1", "All-gather attention, forward: bytes each rank sends per step?",
                  "(cp-1) 2n per layer and micro-batch (its K and V, n = B T nkv hd each, to the cp-1 others)" + per,
                  double(L * m * (cp - 1) * 2 * n * 4), e_fwd, m_fwd);
    x.sheet.exact("G2", "Backward: the all-gather of K and V again (the forward kept only its own)?",
                  "(cp-1) 2n per layer and micro-batch" + per, double(L * m * (cp - 1) * 2 * n * 4), e_bwd, m_bwd);
    x.sheet.exact("G3", "Backward: the reduce-scatter of dK and dV (every rank's queries touched every key)?",
                  "(cp-1) 2n per layer and micro-batch: all of the whole sequence's 2 cp n but its own 2n" + per,
                  double(L * m * (cp - 1) * 2 * n * 4), e_rs, m_rs);
  } else {
    x.sheet.exact("G5", "Ring attention: bytes each rank sends per step (labels 'context parallelism: ring')?",
                  "(cp-1) 2n forward + (cp-1) 4n + 2n backward per layer and micro-batch" + per,
                  double(L * m * ((cp - 1) * 6 * n + 2 * n) * 4), e_ring, m_ring);
  }
  x.sheet.exact("G4", "The gradients: bytes each rank sends per step to sum them over the cp group?",
                "one all-reduce per unit (embedding, each layer, head), 2 (cp-1)/cp x 4 bytes per parameter: the cp "
                "ranks are replicas of the weights, like data parallelism",
                -1, e_grad, m_grad);
  x.extra["kv_traffic"] = {{"algo", std::string(context_algo_name(x.algo))},
                           {"n", n},
                           {"forward_measured", m_fwd}, {"forward_formula", e_fwd},
                           {"backward_allgather_measured", m_bwd}, {"backward_allgather_formula", e_bwd},
                           {"reduce_scatter_measured", m_rs}, {"reduce_scatter_formula", e_rs},
                           {"ring_measured", m_ring}, {"ring_formula", e_ring},
                           {"grad_measured", m_grad}, {"grad_formula", e_grad}};
}

// ---- 4. All-gather vs ring ------------------------------------------------------------------------------

// R7: one training step under each algorithm, its K/V bytes and memory peaks per rank.
void show_step_per_algorithm(Lesson& x, const StepRun& ag_step, const StepRun& ring_step) {
  const int cp = x.cp;
  std::vector<std::vector<std::string>> rows = {
      {"algorithm", "rank", "K/V bytes sent (step)", "activations (peak)", "scratch (peak)", "total (peak)"}};
  for (const auto& [name, st] : {std::pair<std::string, const StepRun*>{"allgather", &ag_step},
                                 std::pair<std::string, const StepRun*>{"ring", &ring_step}}) {
    for (int r = 0; r < cp; ++r)
      rows.push_back({name, std::to_string(r), grouped(sent_with_prefix(st->traffic[size_t(r)], 0, label::kContextParallel)),
                      grouped(st->peak[size_t(r)].activations), grouped(st->peak[size_t(r)].scratch),
                      grouped(st->peak[size_t(r)].total)});
  }
  x.say.say("One training step with plan.cp_algo = allgather, then ring:\n\n" + format_table(rows) + "\n");
  std::vector<int64_t> e, got;
  for (int r = 0; r < cp; ++r) {
    e.push_back(x.L * x.m * ((cp - 1) * 6 * x.n + 2 * x.n) * 4);
    got.push_back(sent_with_prefix(ring_step.traffic[size_t(r)], 0, label::kCpRing));
  }
  x.sheet.exact("R7", "Ring, one training step: K/V bytes each rank sends (labels 'context parallelism: ring')?",
                "L m ((cp-1) 6n + 2n) x 4: 2n more per layer and micro-batch than all-gather's (cp-1) 6n",
                double(e[0]), e, got);
}

// The sent bytes and scratch peaks of one probe, for the JSON summary.
nlohmann::json probe_json(const AttentionProbe& p) {
  return {{"forward_sent", p.fwd_sent}, {"backward_sent", p.bwd_sent},
          {"forward_scratch", p.fwd_scratch}, {"backward_scratch", p.bwd_scratch}};
}

// R1-R6: one layer's attention forward and backward called alone under each algorithm.
void show_call_per_algorithm(Lesson& x, const AttentionProbe& ag, const AttentionProbe& ring) {
  const int cp = x.cp;
  const int64_t n = x.n;
  x.say.say("One layer, one micro-batch: each rank's attention forward and backward called alone (n = B T nkv hd = " +
            grouped(n) + " elements of K, and as many of V).\nScratch: the highest the rank's allocator held during the "
            "call.\n\n");
  std::vector<std::vector<std::string>> rows = {{"algorithm", "rank", "forward: sent", "scratch peak", "backward: sent",
                                                 "scratch peak", "forward FLOPs", "backward FLOPs"}};
  for (const auto& [name, pr] : {std::pair<std::string, const AttentionProbe*>{"allgather", &ag},
                                 std::pair<std::string, const AttentionProbe*>{"ring", &ring}}) {
    for (int r = 0; r < cp; ++r)
      rows.push_back({name, std::to_string(r), grouped(pr->fwd_sent[size_t(r)]), grouped(pr->fwd_scratch[size_t(r)]),
                      grouped(pr->bwd_sent[size_t(r)]), grouped(pr->bwd_scratch[size_t(r)]),
                      grouped(as_int(pr->fwd_flops[size_t(r)])), grouped(as_int(pr->bwd_flops[size_t(r)]))});
  }
  x.say.say(format_table(rows));
  x.say.say("\nOne device's K and V of the whole sequence: 2 B S nkv hd x 4 = " + grouped(2 * cp * n * 4) +
            " bytes. All-gather holds them, their gradients and a copy in the ranks' order at once: O(S) per rank.\n"
            "Ring holds a block or two of S/cp tokens at a time: O(S/cp).\n");
  // Per rank, every rank alike.
  auto each = [&](int64_t bytes) { return std::vector<int64_t>(size_t(cp), bytes); };
  const std::vector<int64_t> e1 = each((cp - 1) * 2 * n * 4), e2 = each((cp - 1) * 4 * n * 4), e3 = each(4 * cp * n * 4);
  x.sheet.exact("R1", "All-gather, one layer and micro-batch: forward bytes sent per rank?", "(cp-1) 2n x 4 bytes",
                double(e1[0]), e1, ag.fwd_sent);
  x.sheet.exact("R2", "And the backward (all-gather again + reduce-scatter of dK, dV)?", "(cp-1) 4n x 4 bytes",
                double(e2[0]), e2, ag.bwd_sent);
  x.sheet.exact("R3", "All-gather's backward: peak scratch per rank?",
                "4 cp n x 4 bytes: the whole sequence's K and V (2 cp n) and their gradients (2 cp n); the gradients "
                "go into K and V's buffer in the ranks' order and are reduce-scattered in place",
                double(e3[0]), e3, ag.bwd_scratch);
  const std::vector<int64_t> r1 = each((cp - 1) * 2 * n * 4), r2 = each(((cp - 1) * 4 * n + 2 * n) * 4);
  x.sheet.exact("R4", "Ring, one layer and micro-batch: forward bytes sent per rank?",
                "(cp-1) 2n x 4 bytes: the same as the all-gather, one hop at a time", double(r1[0]), r1, ring.fwd_sent);
  x.sheet.exact("R5", "Ring backward?",
                "((cp-1) 4n + 2n) x 4 bytes: K, V around again, dK, dV travelling with them, and one last hop home",
                double(r2[0]), r2, ring.bwd_sent);
  const std::vector<int64_t> r6 = each(8 * n * 4);
  x.sheet.exact("R6", "Ring's backward: peak scratch per rank?",
                "8n x 4 bytes: two blocks of K and V (in hand, arriving), each with its dK, dV accumulator; against "
                "all-gather's 4 cp n the same at cp = 2, cp/2 times less beyond",
                double(r6[0]), r6, ring.bwd_scratch);
  x.say.say("\nOverlap: a real implementation posts the next transfer before computing on the block it has (ring) or "
            "gathers layer k+1's K and V\nduring layer k (all-gather). Here every call runs its steps one after another; "
            "the step table's 'exposed' column is the price.\n");
  x.extra["ring"] = probe_json(ring);
  x.extra["allgather_call"] = probe_json(ag);
}

// Both algorithms through the plan (plan.cp_algo), one training step each, and through one call.
void compare_allgather_and_ring(Lesson& x, const AttentionProbe& ag) {
  x.say.phase("all-gather (Llama 3) vs ring attention: bytes, scratch memory, overlap",
              "core/parallel/context_parallel.cpp (gather_key_values, ContextParallelComm::attention_backward)");
  x.say.say("All-gather moves each rank's K and V to every other rank at once; ring attention (Liu et al. 2023) passes "
            "them one hop per step\nwhile the ranks compute on the block they hold. Both run here through the same plan "
            "(plan.cp_algo).\n\n");
  x.say.ask("R3", "All-gather attention's backward: how many bytes of scratch does a rank hold at its peak?");
  const StepRun ag_step = measure_one_step(x.cfg(), x.plan_with(ContextAlgo::allgather), x.s.train, x.o, x.data);
  const AttentionProbe ring = probe_model(x.cfg(), x.cp, ContextAlgo::ring, x.B, x.S);
  const StepRun ring_step = measure_one_step(x.cfg(), x.plan_with(ContextAlgo::ring), x.s.train, x.o, x.data);
  show_step_per_algorithm(x, ag_step, ring_step);
  show_call_per_algorithm(x, ag, ring);
  x.say.pause();
}

// ---- 5. GQA ------------------------------------------------------------------------------------------

// Computed, not measured: Llama 3's forward all-gather per rank and layer at its long-context
// stage (S = 131,072, cp = 16, B = 1, bf16), with and without GQA, beside attention's FLOPs.
nlohmann::json show_llama3_all_gather(Lesson& x) {
  x.say.say("\nComputed, not measured: Llama 3 at its long-context stage (S = 131,072 tokens, cp = 16, B = 1 row, bf16), "
            "per rank, one layer's forward:\n\n");
  std::vector<std::vector<std::string>> big = {
      {"model", "nh / nkv", "K+V all-gather sent", "without GQA", "attention forward FLOPs"}};
  nlohmann::json llama = nlohmann::json::array();
  for (const char* name : {"llama3-8b", "llama3-70b", "llama3-405b"}) {
    const LlamaConfig b = LlamaConfig::preset(name);
    const int64_t bs = 131072, bcp = 16, bt = bs / bcp;
    const double sent = double(bcp - 1) * 2.0 * double(bt * b.num_key_value_heads * b.head_dim) * 2.0;
    const double mha_sent = sent * double(b.num_attention_heads / b.num_key_value_heads);
    const double flops = 4.0 * double(b.head_dim * b.num_attention_heads) * double(bs) * double(bs + 1) / (2.0 * bcp);
    big.push_back({name, std::to_string(b.num_attention_heads) + " / " + std::to_string(b.num_key_value_heads),
                   fixed(sent / 1e6, 1) + " MB", fixed(mha_sent / 1e9, 2) + " GB", fixed(flops / 1e12, 1) + " TFLOP"});
    llama.push_back({{"model", name}, {"sent_bytes", sent}, {"without_gqa_bytes", mha_sent}, {"attention_flops", flops}});
  }
  x.say.say(format_table(big));
  x.say.say("\nThe three models share nkv hd = 8 x 128 = 1,024, so they gather the same bytes; without GQA the 405B "
            "would gather 16x as much.\nAttention's work grows as S^2, the gathered bytes as S: at long sequences the "
            "all-gather is small next to the compute.\n");
  return llama;
}

// Q1: the forward all-gather of the model as it is and with K and V as wide as Q.
void show_gqa(Lesson& x, const AttentionProbe& ag) {
  const int cp = x.cp;
  const int64_t B = x.B, T = x.seq, nh = x.nh, nkv = x.nkv, hd = x.hd;
  x.say.phase("grouped-query attention: why gathering K and V is cheap",
              "core/model/block.h (BlockDims nh, nkv), core/ops.h (query head h reads key/value head h / (nh / nkv))");
  x.say.say("A rank gathers keys and values, never queries. Under GQA a key/value head serves nh/nkv query heads, so K "
            "and V are\nnh/nkv times smaller than Q. Here nh/nkv = " + std::to_string(nh / nkv) + ".\n\n");
  x.say.ask("Q1", "Without GQA (nkv = nh), how many bytes would a rank's forward all-gather send per layer and micro-batch?");
  const AttentionProbe mha = probe_attention(nh, nh, hd, cp, ContextAlgo::allgather, B, x.S);
  std::vector<std::vector<std::string>> rows = {{"", "nh", "nkv", "a rank's Q (bytes)", "a rank's K + V (bytes)",
                                                 "forward all-gather sent per rank (bytes)", "source"}};
  rows.push_back({x.o.preset, std::to_string(nh), std::to_string(nkv), grouped(B * T * nh * hd * 4),
                  grouped(2 * B * T * nkv * hd * 4), grouped(ag.fwd_sent[0]), "measured"});
  rows.push_back({x.o.preset + " with nkv = nh", std::to_string(nh), std::to_string(nh), grouped(B * T * nh * hd * 4),
                  grouped(2 * B * T * nh * hd * 4), grouped(mha.fwd_sent[0]),
                  "measured (the same call with K and V as wide as Q)"});
  x.say.say(format_table(rows));
  std::vector<int64_t> e(size_t(cp), (cp - 1) * 2 * B * T * nh * hd * 4);
  x.sheet.exact("Q1", "Without GQA (nkv = nh): forward all-gather bytes per rank, one layer and micro-batch?",
                "(cp-1) 2 B T nh hd x 4 bytes: nh/nkv times the GQA model's", double(e[0]), e, mha.fwd_sent);
  const nlohmann::json llama = show_llama3_all_gather(x);
  x.extra["gqa"] = {{"nh", nh}, {"nkv", nkv}, {"sent_gqa", ag.fwd_sent}, {"sent_without_gqa", mha.fwd_sent},
                    {"llama3_computed", llama}};
  x.say.pause();
}

// ---- 6. Memory and work per rank vs one device -----------------------------------------------------------

// M1, M2, F1: one device's activations and FLOPs on the same rows (and on rows of S/cp tokens)
// against the cp ranks' of the main run's first step.
void compare_with_one_device(Lesson& x, const PhaseView& first) {
  const int cp = x.cp;
  const int64_t S = x.S, T = x.seq;
  x.say.phase("activations and FLOPs per rank vs one device",
              "core/model/llama.cpp (set_context_split: T = S/cp tokens per row), core/parallel/parallel_trainer.cpp (local_tokens)");
  x.say.ask("M1", "A cp rank kept the activations shown in the step table. One device training the same rows: how many?");
  const ParallelPlan single = ParallelPlan::parse("dp=1");
  const StepRun dev = measure_one_step(x.cfg(), single, x.s.train, x.o, x.data);
  TrainOptions shorter = x.s.train;
  shorter.seq_len = T;
  const TextDataset data_short = load_dataset(default_corpus_path(), T);
  const StepRun dev_short = measure_one_step(x.cfg(), single, shorter, x.o, data_short);
  std::vector<std::vector<std::string>> rows = {{"", "activations (peak)", "scratch (peak)", "step FLOPs"}};
  rows.push_back({"one device, S = " + std::to_string(S), grouped(dev.peak[0].activations), grouped(dev.peak[0].scratch),
                  grouped(as_int(dev.time[0].flops))});
  for (int r = 0; r < cp; ++r)
    rows.push_back({"cp rank " + std::to_string(r) + " (T = " + std::to_string(T) + " of S)",
                    grouped(first.ranks[size_t(r)].peak.activations), grouped(first.ranks[size_t(r)].peak.scratch),
                    grouped(as_int(first.ranks[size_t(r)].time.flops))});
  rows.push_back({"one device, S = " + std::to_string(T), grouped(dev_short.peak[0].activations),
                  grouped(dev_short.peak[0].scratch), grouped(as_int(dev_short.time[0].flops))});
  x.say.say(format_table(rows));
  x.say.say("\nThe cp ranks' scratch is larger than one device's at S/cp: attention's call holds the whole sequence's K "
            "and V (phase 4).\n");
  std::vector<int64_t> e_act, m_act, e_short, e_fl, m_fl, m_rank;
  for (int r = 0; r < cp; ++r) {
    const RankSnapshot& rank = first.ranks[size_t(r)];
    e_act.push_back(rank.peak.activations * cp);
    m_act.push_back(dev.peak[0].activations);
    e_short.push_back(dev_short.peak[0].activations);
    e_fl.push_back(as_int(dev.time[0].flops / cp));
    m_fl.push_back(as_int(rank.time.flops));
    m_rank.push_back(rank.peak.activations);
  }
  x.sheet.exact("M1", "One device's peak activations (same rows, all S tokens), against cp x each rank's?",
                "cp x a rank's: every activation is kept per token (attention keeps its output and log-sum-exp, not the S x S "
                "scores), and a rank holds S/cp tokens of each row",
                -1, e_act, m_act);
  x.sheet.exact("M2", "One device trained on sequences of S/cp tokens: its peak activations against one cp rank's?",
                "equal: activations are linear in the tokens; a quadratic attention memory would make the short "
                "sequence cp times cheaper still",
                -1, e_short, m_rank);
  x.sheet.exact("F1", "FLOPs of one training step on each rank (the simulated clock's count), against one device's / cp?",
                "equal on every rank: the matmuls are per token and the attention pairs balanced, so the ranks split "
                "one device's work exactly",
                -1, e_fl, m_fl);
  x.extra["memory"] = {{"one_device_activations", dev.peak[0].activations},
                       {"one_device_short_activations", dev_short.peak[0].activations},
                       {"rank_activations", m_rank},
                       {"one_device_step_flops", dev.time[0].flops},
                       {"rank_step_flops", m_fl}};
  x.say.pause();
}

// ---- 7. Document masks -----------------------------------------------------------------------------------

// B rows of S tokens, marked with their documents. The corpus's documents are sections of about
// 1,500 tokens, so few random windows of S tokens cross a boundary. For the demonstration, row b
// is the window of S tokens that has the (b+1)-th <|end_of_text|> of the training split at
// position S (b+1)/(B+1).
Batch rows_across_documents(const TextDataset& data, int64_t B, int64_t S) {
  const TokenSpan train = data.train();
  Batch rows;
  rows.B = B, rows.seq = S;
  int64_t at = 0;
  for (int64_t b = 0; b < B; ++b) {
    at = std::find(train.begin() + at + 1, train.end(), kEndOfTextToken) - train.begin();
    const int64_t start = std::max<int64_t>(0, at - S * (b + 1) / (B + 1));
    if (at == int64_t(train.size()) || start + S + 1 > int64_t(train.size()))
      throw Error("lesson 06: the corpus has too few documents for the demonstration");
    rows.tokens.insert(rows.tokens.end(), train.begin() + start, train.begin() + start + S);
  }
  rows.targets.assign(rows.tokens.size(), 0);
  mark_documents(rows, kEndOfTextToken);
  return rows;
}

// [row] the tokens of each document in the row, in order.
std::vector<std::vector<int64_t>> document_lengths(const Batch& rows) {
  const int64_t B = rows.B, S = rows.seq;
  std::vector<std::vector<int64_t>> lengths(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      if (t == 0 || rows.docs[size_t(b * S + t)] != rows.docs[size_t(b * S + t - 1)]) lengths[size_t(b)].push_back(0);
      ++lengths[size_t(b)].back();
    }
  return lengths;
}

// K1, K2: the pairs a document mask leaves each rank, and the bytes it sends (unchanged).
void show_document_mask(Lesson& x, const AttentionProbe& ag) {
  const int cp = x.cp;
  const int64_t B = x.B, S = x.S, nh = x.nh, hd = x.hd;
  x.say.phase("document masks: attention within each document of a packed row",
              "core/data/batch_sampler.cpp (mark_documents), core/parallel/context_parallel.cpp (part_shape, chunk_pair)");
  const Batch rows = rows_across_documents(x.data, B, S);
  const std::vector<std::vector<int64_t>> lengths = document_lengths(rows);
  std::string pieces;
  int64_t masked_pairs = 0;
  for (int64_t b = 0; b < B; ++b) {
    pieces += "row " + std::to_string(b) + ":";
    for (const int64_t len : lengths[size_t(b)]) pieces += " " + std::to_string(len), masked_pairs += len * (len + 1) / 2;
    pieces += "\n";
  }
  x.say.say("The corpus is packed one document after another with <|end_of_text|> between them; Llama 3 masks "
            "attention so that a token\nsees only earlier tokens of its own document (--doc-mask). Rows placed across "
            "the first document boundaries of the\ntraining split hold documents (runs of tokens) of lengths\n" +
            pieces + "\n");
  x.say.ask("K1", "Summed over the cp ranks and the B rows, how many (query, key) pairs per head does the masked "
                  "attention score?");
  const AttentionProbe masked = probe_model(x.cfg(), cp, x.algo, B, S, rows.documents());
  std::vector<std::vector<std::string>> table = {{"rank", "pairs/head (causal)", "pairs/head (document mask)",
                                                  "forward bytes sent (causal)", "(document mask)"}};
  const AttentionProbe& causal = x.algo == ContextAlgo::allgather ? ag : probe_model(x.cfg(), cp, x.algo, B, S);
  double total = 0, most = 0;
  std::vector<int64_t> sent_causal, sent_masked;
  for (int r = 0; r < cp; ++r) {
    const double pairs = masked.fwd_flops[size_t(r)] / (4.0 * double(hd * nh));
    total += pairs, most = std::max(most, pairs);
    sent_causal.push_back(causal.fwd_sent[size_t(r)]), sent_masked.push_back(masked.fwd_sent[size_t(r)]);
    table.push_back({std::to_string(r), grouped(as_int(causal.fwd_flops[size_t(r)] / (4.0 * double(hd * nh)))),
                     grouped(as_int(pairs)), grouped(sent_causal.back()), grouped(sent_masked.back())});
  }
  x.say.say(format_table(table));
  x.say.say("\nThe mask removes every pair that crosses a boundary: " + grouped(as_int(total)) +
            " pairs instead of B S(S+1)/2 = " + grouped(B * S * (S + 1) / 2) + ". The keys and values sent do not "
            "change: they are the\nsame tensors, and each rank reads the documents of all positions from the batch "
            "(metadata, like the sequence lengths of\nvariable-length attention). The 2 cp split balances the causal "
            "triangle, not the documents: the busiest rank now does\n" + fixed(most / (total / cp), 3) + "x the mean.\n");
  x.sheet.exact("K1", "Document mask: (query, key) pairs per head over all cp ranks and the B rows?",
                "the sum over each row's documents of len (len + 1) / 2: causal pairs within a document only",
                -1, {masked_pairs}, {as_int(total)});
  x.sheet.exact("K2", "Document mask: bytes each rank sends in one layer's forward attention?",
                "unchanged: the mask changes which pairs are scored, not which keys and values a rank needs", -1,
                sent_causal, sent_masked);
  x.extra["document_mask"] = {{"lengths", lengths}, {"pairs_formula", masked_pairs}, {"rank_flops", masked.fwd_flops},
                              {"sent_causal", sent_causal}, {"sent_masked", sent_masked}};
  x.say.pause();
}

// ---- 8. cp x dp under ZeRO-3 -----------------------------------------------------------------------------

struct Zero3Check {
  std::string mesh;  // "cp=2, dp=2"-style, ParallelPlan::describe_mesh
  EquivalenceReport report;
};

// D1, D2: one step of cp=2,dp=2 under ZeRO-3, what each rank holds at rest and over how many
// ranks its gradients are reduce-scattered.
void check_zero3_shards(Lesson& x, const RunSetup& z) {
  const int W = z.plan.world_size();
  const std::string grads = label::grads("");
  TrainOptions zt = z.train;
  zt.steps = 1;
  const StepRun zr = measure_one_step(x.cfg(), z.plan, zt, x.o, x.data);
  std::vector<std::vector<std::string>> rows = {{"rank", "params at rest", "grads rs group size", "grads rs bytes sent"}};
  std::vector<int64_t> m_group, e_group, rest;
  int64_t sum = 0;
  for (int w = 0; w < W; ++w) {
    int group = 0;
    for (const TrafficRecord& t : zr.traffic[size_t(w)])
      if (t.op == "reduce_scatter" && t.label.starts_with(grads)) group = t.group_size;
    m_group.push_back(group), e_group.push_back(W);
    rest.push_back(zr.rest[size_t(w)].params);
    sum += zr.rest[size_t(w)].params;
    rows.push_back({std::to_string(w), grouped(zr.rest[size_t(w)].params), std::to_string(group),
                    grouped(sent_bytes(zr.traffic[size_t(w)], "reduce_scatter", grads))});
  }
  x.say.say(format_table(rows));
  x.sheet.exact("D1", "cp x dp, ZeRO-3: parameter bytes at rest summed over the 4 ranks?",
                "4N: each rank keeps about a quarter (every unit cut over cp x dp, pieces padded to 512 elements)",
                double(4 * x.N), {4 * x.N}, {sum}, "Per rank: " + joined(rest) + ".");
  x.sheet.exact("D2", "Over how many ranks is each unit's gradient reduce-scattered?",
                "cp x dp = 4: the cp ranks of a row and the data ranks all hold the same weights", 4.0, e_group, m_group);
}

Zero3Check check_cp_dp_zero3(Lesson& x) {
  x.say.phase("cp x dp with ZeRO-3: the shards span cp x dp",
              "core/parallel/parallel_trainer.cpp (gradient dims: cp, then dp), core/parallel/fsdp.cpp");
  const int cpz = 2;
  RunSetup z = x.s;
  z.plan = ParallelPlan::parse("cp=" + std::to_string(cpz) + ",dp=2");
  z.plan.zero = ZeroStage::zero3;
  z.plan.cp_algo = x.algo;
  z.plan.validate();
  z.plan.check_sequence(x.S);
  z.train.batch_size = 2 * x.m * x.B;  // m micro-batches of B rows on each data rank
  z.train.steps = std::min<int64_t>(x.o.steps, 2);
  z.cluster.ranks = z.plan.world_size();
  z.cluster.cluster = ClusterSpec::for_ranks(z.plan.world_size(), x.o.gpus_per_node);
  x.say.say("Mesh " + z.plan.describe_mesh() + ", ZeRO-3: ranks 0, 1 share rows (cp), ranks 0, 2 share a cp position "
            "(dp). All four hold the same weights\nand saw different tokens, so ZeRO shards the parameters, gradients and "
            "AdamW moments over all four (as Llama 3's FSDP spans cp x dp).\n\n");
  x.say.ask("D1", "Summed over the 4 ranks, how many bytes of parameters are held at rest?");
  check_zero3_shards(x, z);
  x.say.say("\nThe same steps on one device:\n\n");
  Zero3Check check{.mesh = z.plan.describe_mesh(), .report = run_equivalence(z, x.data)};
  x.say.say(check.report.table());
  x.say.pause();
  return check;
}

// ---- Exercises, then the equivalence check ----------------------------------------------------------------

int finish(Lesson& x, const std::vector<PhaseView>& phases, const Zero3Check& zero3) {
  x.say.phase("exercises: formula vs measured", "lessons/common/lesson.cpp (ExerciseSheet: expected vs measured per rank)");
  EquivalenceReport report;
  bool equivalent = finish_with_equivalence(x.say, x.sheet, x.s, x.data, report);
  x.say.say("\nThe same steps in fp64, against the plain single-device trainer (its own order of additions):\n\n");
  const EquivalenceReport report64 = run_equivalence_fp64(x.s, x.data);
  x.say.say(report64.table());
  equivalent = equivalent && zero3.report.ok && report64.ok && report64.plain_checked && report64.plain_max_rel_err <= 1e-12;
  return finish_lesson("06-context-parallelism", x.o.json, x.o.preset, x.s, phases, x.sheet, report, equivalent,
                       [&](nlohmann::json& j) {
                         for (auto& [k, val] : x.extra.items()) j[k] = val;
                         j["split"] = {{"cp", x.cp}, {"cp_algo", std::string(context_algo_name(x.algo))},
                                       {"seq_len", x.S}, {"chunk", x.c}, {"tokens_per_rank", x.seq}, {"rows", x.B},
                                       {"layers", x.L}, {"nh", x.nh}, {"nkv", x.nkv}, {"hd", x.hd}};
                         j["equivalence_fp64"] = fp64_equivalence_json(report64);
                         j["equivalence_cp_dp_zero3"] = equivalence_json(zero3.report);
                         j["equivalence_cp_dp_zero3"]["mesh"] = zero3.mesh;
                       });
}

int run(const LessonOptions& o, const CpArgs& a) {
  Narrator say(o);
  Lesson x = set_up(o, a, say);
  show_split(x);
  const AttentionProbe ag = compare_attention_work(x);
  const std::vector<PhaseView> phases = train_steps(x);
  check_kv_traffic(x, phases.back());
  compare_allgather_and_ring(x, ag);
  show_gqa(x, ag);
  compare_with_one_device(x, phases[1]);
  show_document_mask(x, ag);
  const Zero3Check zero3 = check_cp_dp_zero3(x);
  return finish(x, phases, zero3);
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::CpArgs cp;
  options.seq_len = 128;  // tiny's longest: 2 cp chunks of 16 tokens at cp = 4
  options.rows = 2;
  options.micro_batches = 1;
  options.ranks = cp.cp;  // --ranks is --cp here
  CLI::App app{"Lesson 06: context parallelism on virtual GPUs", "lesson06_context_parallel"};
  options.add_options(app);
  llama4d::cli::add_number(app, "--cp", cp.cp, "context-parallel ranks (the sequence is cut into 2 cp chunks)", 2, 16)
      ->capture_default_str();
  app.add_option("--cp-algo", cp.algo, "allgather (Llama 3's) or ring")->capture_default_str();
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    if (app.get_option("--ranks")->count() > 0 && options.ranks != cp.cp)
      throw llama4d::InputError("--ranks is --cp here (" + std::to_string(cp.cp) + "); use --cp");
    return llama4d::lesson::run(options, cp);
  });
}
