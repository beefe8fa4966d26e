// Lesson 03: activation checkpointing. A block's backward reads what its forward computed; keeping
// all of it for every block costs memory that grows with L x B x T, so a policy keeps only part of
// it and recomputes the rest inside the backward. The program runs one forward + backward per
// policy on a single device, reads the activation high-water mark from the allocator and checks it
// against the README's formulas, times each policy (MFU vs HFU), finds the checkpoint spacing k of
// every:k that needs least memory, and proves every policy gives the same gradients bit for bit,
// on one device and on ZeRO-3 virtual GPUs.
//   lesson03_checkpointing [--preset small] [--policies none,selective,full,every:2,every:sqrt]
//                          [--timing-steps 3] [--ac full] [--ranks 2] [--step] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/data/batch_sampler.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/model/flops.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/tensor/memory_tracker.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"
#include "lessons/common/numbers.h"

namespace llama4d::lesson {
namespace {

struct AcArgs {
  std::string policies = "none,selective,full,every:2,every:sqrt";
  std::string verify_ac = "full";  // the policy of the ZeRO-3 equivalence run
  int timing_steps = 3;
  double gemm_seconds = 0.3;
};

// ---- The README's formulas, written from the shapes (never read from the allocator) ----------

// Bytes of what the code stores for one micro-batch of BT = B x T tokens; s = bytes per element.
struct Sizes {
  int64_t s, BT, C, qd, kvd, nh, I, V, L;  // qd = nh hd, kvd = nkv hd
  int64_t x() const { return s * BT * C; }                                     // one residual x_l [B,T,C]
  int64_t kept() const { return s * BT * (qd + 2 * kvd + C + 2 * I); }         // q k v h gate up
  int64_t recomputable() const { return s * BT * (2 * C + 2 + qd + nh + I); }  // n1 rstd1 n2 rstd2 att lse act
  int64_t block() const { return kept() + recomputable(); }
  int64_t head() const { return s * BT * (C + 1 + V + 1); }  // n rstd logits losses
  int64_t ids() const { return 4 * BT; }                     // the int32 tokens, or the targets
};

Sizes sizes_of(const LlamaConfig& c, int64_t B, int64_t T) {
  return {4, B * T, c.hidden_size, c.q_dim(), c.kv_dim(), c.num_attention_heads, c.intermediate_size, c.vocab_size,
          c.num_hidden_layers};
}

// every:k keeps the inputs x_0, x_k, x_2k, ...: how many of them lie in x_0 .. x_l.
int64_t kept_inputs(int64_t l, int64_t k) { return l < 0 ? 0 : l / k + 1; }

// Live activations when the forward returns: what the policy keeps for the backward.
int64_t end_of_forward(const Sizes& d, const Checkpointing& ac) {
  const int64_t L = d.L;
  switch (ac.kind) {
    case Checkpointing::Kind::none: return 2 * d.ids() + (L + 1) * d.x() + L * d.block() + d.head();
    case Checkpointing::Kind::selective: return 2 * d.ids() + (L + 1) * d.x() + L * d.kept() + d.head();
    case Checkpointing::Kind::every: return 2 * d.ids() + (kept_inputs(L - 1, ac.every) + 1) * d.x() + d.head();
  }
  return -1;
}

// The three moments that can set an every:k peak (README, "The high-water mark").
struct EveryTerms {
  int64_t forward = 0, head = 0, backward = 0;  // the largest of each
  int64_t worst_segment_begin = 0;              // where the backward's largest segment starts
};

EveryTerms every_terms(const Sizes& d, int64_t k) {
  const int64_t L = d.L;
  EveryTerms t;
  // Forward of block l: the tokens, the kept inputs below x_l, x_l itself (kept or not, it is
  // read until the block is done), its output x_{l+1}, and all of the block's activations.
  for (int64_t l = 0; l < L; ++l) t.forward = std::max(t.forward, d.ids() + (kept_inputs(l - 1, k) + 2) * d.x() + d.block());
  t.head = 2 * d.ids() + (kept_inputs(L - 1, k) + 1) * d.x() + d.head();
  // Backward of segment [a, e): after the head is done (targets, x_L and the head freed), the
  // segment is rerun from its kept input x_a: the recomputed inputs x_{a+1} .. x_{e-1} and the
  // activations of all e - a blocks are live at once, on top of the kept inputs x_0 .. x_a.
  for (int64_t a = ((L - 1) / k) * k; a >= 0; a -= k) {
    const int64_t e = std::min(L, a + k);
    const int64_t bytes = d.ids() + (kept_inputs(a, k) + (e - a - 1)) * d.x() + (e - a) * d.block();
    if (bytes > t.backward) t.backward = bytes, t.worst_segment_begin = a;
  }
  return t;
}

int64_t peak_formula(const Sizes& d, const Checkpointing& ac) {
  switch (ac.kind) {
    case Checkpointing::Kind::none: return end_of_forward(d, ac);  // backward only frees
    case Checkpointing::Kind::selective: {
      // The last block's forward, before it drops its recomputable half (the targets arrive with
      // the head); the backward's rebuild of one block holds one x less (x_L left with the head).
      const int64_t last_block = d.ids() + (d.L + 1) * d.x() + d.L * d.kept() + d.recomputable();
      return std::max(end_of_forward(d, ac), last_block);
    }
    case Checkpointing::Kind::every: {
      const EveryTerms t = every_terms(d, ac.every);
      return std::max({t.forward, t.head, t.backward});
    }
  }
  return -1;
}

// FLOPs per token, the conventions of core/model/flops.h written out again: 2 per multiply-add
// of every weight of a matmul, attention over the full T x T square (PaLM, App. B).
int64_t block_matmul_weights(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size;
  return C * qd + 2 * C * kvd + qd * C + 3 * C * I;  // q, k, v, o; gate, up, down
}
int64_t attention_core_forward(const LlamaConfig& c, int64_t T) { return 4 * c.num_hidden_layers * c.q_dim() * T; }
int64_t training_formula(const LlamaConfig& c, int64_t T) {
  return 6 * (c.num_hidden_layers * block_matmul_weights(c) + c.vocab_size * c.hidden_size) + 3 * attention_core_forward(c, T);
}
int64_t recompute_formula(const LlamaConfig& c, int64_t T, const Checkpointing& ac) {
  switch (ac.kind) {
    case Checkpointing::Kind::none: return 0;
    case Checkpointing::Kind::selective: return attention_core_forward(c, T);
    case Checkpointing::Kind::every: {
      // Every block's forward once more, except down_proj in each segment's top block.
      const int64_t segments = (c.num_hidden_layers + ac.every - 1) / ac.every;
      return 2 * c.num_hidden_layers * block_matmul_weights(c) + attention_core_forward(c, T) -
             2 * c.hidden_size * c.intermediate_size * segments;
    }
  }
  return -1;
}

// ---- Measurements on one device ----------------------------------------------------------------

struct Measured {
  int64_t after_forward = 0, peak = 0, left = 0, scratch_peak = 0;
  double loss = 0;
  double simulated_us = 0;  // the forward + backward on a modelled H100's clock
  std::vector<float> grads;
};

// One forward + backward from fresh weights, reading the model's own (single-device) tracker, and
// the time a modelled GPU would take for it: the ops report their FLOPs to a simulated clock.
Measured measure(const LlamaConfig& cfg, const Checkpointing& ac, const Batch& b, uint64_t seed) {
  Llama<float> model(cfg);
  model.set_checkpointing(ac);
  model.init_weights(seed);
  model.zero_grad();
  model.memory().reset_peaks();  // from here on only this forward + backward counts
  RankTrace clock(0, RankTrace::Clock::now(), ClusterSpec{}.gpu_tflops);
  ops::ScopedFlopSink charge(&clock);
  Measured m;
  m.loss = model.forward(b.tokens.data(), b.targets.data(), b.B, b.T).loss_sum;
  m.after_forward = model.memory().live(MemoryCategory::activations);
  model.backward(float(1.0 / double(b.counted_targets())));
  m.simulated_us = clock.totals().clock_us;
  m.peak = model.memory().peak(MemoryCategory::activations);
  m.left = model.memory().live(MemoryCategory::activations);
  m.scratch_peak = model.memory().peak(MemoryCategory::scratch);
  m.grads.assign(model.grads(), model.grads() + model.num_params());
  return m;
}

// The README's answer for the simulated clock: every unit's forward and backward FLOPs
// (core/model/flops.h, causal attention) plus what the policy recomputes, at the GPU's rate.
//   selective  attention's forward once more per block
//   every:k    every block's forward once more, less each segment's top down_proj
double simulated_formula_us(const LlamaConfig& cfg, const Checkpointing& ac, int64_t B, int64_t T, double tflops) {
  const int L = int(cfg.num_hidden_layers);
  double flops = 0;
  for (int u = 0; u < num_units(L); ++u) {
    const UnitFlops f = unit_flops(cfg, B, T, u);
    flops += f.forward + f.backward;
    if (u == embedding_unit() || u == head_unit(L)) continue;
    if (ac.kind == Checkpointing::Kind::selective) flops += f.attention_forward;
    if (ac.kind == Checkpointing::Kind::every) {
      const int layer = u - 1;
      const bool top = (layer + 1) % ac.every == 0 || layer == L - 1;
      flops += f.forward - (top ? f.down_proj : 0);
    }
  }
  return flops / (tflops * 1e6);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Wall-clock seconds of `steps` forward + backward passes after one untimed warm-up. The optimizer
// is left out: it does the same work whatever the policy, and the FLOP counts are forward + backward.
std::vector<double> time_policy(const LlamaConfig& cfg, const Checkpointing& ac, const Batch& b, uint64_t seed, int steps) {
  Llama<float> model(cfg);
  model.set_checkpointing(ac);
  model.init_weights(seed);
  const float scale = float(1.0 / double(b.counted_targets()));
  std::vector<double> seconds;
  for (int i = 0; i <= steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    model.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
    model.backward(scale);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) seconds.push_back(s);
  }
  return seconds;
}

// ---- Printing ------------------------------------------------------------------------------------

// What each policy holds per block from forward to backward, in words.
std::string keeps(const Checkpointing& ac, int L) {
  switch (ac.kind) {
    case Checkpointing::Kind::none: return "x_l and every tensor of every block";
    case Checkpointing::Kind::selective: return "x_l, q k v h gate up of every block";
    case Checkpointing::Kind::every: {
      if (ac.every == 1) return "x_l of every block";
      std::string blocks;
      for (int l = 0; l < L; l += ac.every) blocks += (blocks.empty() ? "" : ", ") + std::to_string(l);
      return "x_l of block" + std::string(ac.every < L ? "s " : " ") + blocks;
    }
  }
  return "?";
}

// ExerciseSheet::report() names its columns "rank r"; here a column is a policy or a spacing k,
// so the sheet is printed from its JSON with this lesson's column names.
std::string sheet_report(const ExerciseSheet& sheet, const std::map<std::string, std::vector<std::string>>& columns) {
  std::string out;
  int passed = 0, total = 0;
  for (const nlohmann::json& e : sheet.to_json()) {
    const std::string id = e.at("id").get<std::string>();
    const bool pass = e.at("pass").get<bool>();
    passed += pass ? 1 : 0, ++total;
    out += std::string(pass ? "[PASS] " : "[FAIL] ") + id + ". " + e.at("question").get<std::string>() + "\n";
    out += "       answer: " + e.at("answer").get<std::string>() + "\n";
    const std::vector<int64_t> expected = e.at("expected"), measured = e.at("measured");
    const auto it = columns.find(id);
    std::vector<std::vector<std::string>> rows = {{"       ", ""}, {"       ", "expected"}, {"       ", "measured"}};
    for (size_t c = 0; c < std::max(expected.size(), measured.size()); ++c) {
      rows[0].push_back(it != columns.end() && c < it->second.size() ? it->second[c] : "#" + std::to_string(c + 1));
      rows[1].push_back(c < expected.size() ? grouped(expected[c]) : "-");
      rows[2].push_back(c < measured.size() ? grouped(measured[c]) : "-");
    }
    std::string table = format_table(rows);
    const size_t first = table.find('\n'), second = table.find('\n', first + 1);
    table.erase(first + 1, second - first);  // no underline under the header: an inline table
    out += table;
    if (e.contains("note")) out += "       " + e.at("note").get<std::string>() + "\n";
    out += "\n";
  }
  return out + std::to_string(passed) + " of " + std::to_string(total) + " exercises PASS\n";
}

// ---- The lesson ----------------------------------------------------------------------------------

struct Policy {
  std::string spec;  // as given: "every:sqrt"
  Checkpointing ac;  // resolved: every:3
  std::string label() const { return spec == ac.describe() ? spec : spec + " (" + ac.describe() + ")"; }
};

std::vector<Policy> parse_policies(const std::string& list, int L) {
  std::vector<Policy> out;
  std::stringstream in(list);
  std::string spec;
  while (std::getline(in, spec, ',')) {
    if (spec.empty()) continue;
    try {
      out.push_back({spec, Checkpointing::parse(spec, L)});
    } catch (const InputError&) {
      throw InputError("--policies " + list + ": '" + spec + "' is not none, selective, full, every:K (K >= 1) or every:sqrt");
    }
  }
  if (out.empty()) throw InputError("--policies: give at least one of none, selective, full, every:K, every:sqrt");
  // "none" is the reference every other policy is compared with (memory and gradients).
  if (std::none_of(out.begin(), out.end(), [](const Policy& p) { return p.ac.kind == Checkpointing::Kind::none; }))
    out.insert(out.begin(), Policy{"none", Checkpointing{}});
  return out;
}

int run(const LessonOptions& o, const AcArgs& a) {
  Narrator say(o);
  const LlamaConfig cfg = LlamaConfig::preset(o.preset);
  if (cfg.num_parameters() > 100'000'000)
    throw InputError("--preset " + o.preset + ": the lesson runs the model on this machine; use tiny, small or medium "
                     "(the README works the formulas out for Llama 3 405B)");
  if (o.seq_len > cfg.max_position_embeddings)
    throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds the preset's max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  if (a.timing_steps < 1) throw InputError("--timing-steps must be >= 1");
  if (!(a.gemm_seconds > 0)) throw InputError("--gemm-seconds must be > 0");
  const int L = int(cfg.num_hidden_layers);
  const std::vector<Policy> policies = parse_policies(a.policies, L);
  const TrainOptions train = o.train_options();
  const TextDataset data = load_dataset(default_corpus_path(), train.seq_len);
  const Batch batch = sample_rows(data.train(), train.seq_len, train.seed, 0, 0, o.rows);
  const int64_t B = batch.B, T = batch.T, C = cfg.hidden_size, nh = cfg.num_attention_heads,
                nkv = cfg.num_key_value_heads, hd = cfg.head_dim, I = cfg.intermediate_size, V = cfg.vocab_size;
  const Sizes d = sizes_of(cfg, B, T);
  std::vector<std::string> labels;
  for (const Policy& p : policies) labels.push_back(p.label());
  std::map<std::string, std::vector<std::string>> columns;

  // ---- (a) the model, the batch, and what a block stores ---------------------------------------
  say.phase("the model, the batch, and what a block stores");
  say.say("Model '" + o.preset + "': L = " + std::to_string(L) + " blocks, C = " + std::to_string(C) + ", nh = " +
          std::to_string(nh) + " query heads, nkv = " + std::to_string(nkv) + " key/value heads, hd = " +
          std::to_string(hd) + ", I = " + std::to_string(I) + ", V = " + std::to_string(V) + "; N = " +
          grouped(cfg.num_parameters()) + " parameters.\nOne micro-batch of B = " + std::to_string(B) +
          " rows x T = " + std::to_string(T) + " tokens, fp32 (s = 4 bytes), on a single device.\n\n"
          "What one block's forward writes for its backward (bytes for this batch):\n\n");
  {
    const int64_t s = 4, BT = B * T;
    std::vector<std::vector<std::string>> rows = {{"tensor", "shape", "elements per token", "bytes", "none", "selective", "full / every:k"}};
    auto row = [&](const std::string& name, const std::string& shape, int64_t per_token, bool selective_keeps) {
      rows.push_back({name, shape, grouped(per_token), grouped(s * BT * per_token), "kept",
                      selective_keeps ? "kept" : "recomputed", "recomputed"});
    };
    rows.push_back({"x_l (block input)", "[B,T,C]", grouped(C), grouped(s * BT * C), "kept", "kept", "kept every k-th"});
    row("q (after RoPE)", "[B,T,nh,hd]", nh * hd, true);
    row("k (after RoPE), v", "[B,T,nkv,hd] x2", 2 * nkv * hd, true);
    row("h (after attention)", "[B,T,C]", C, true);
    row("gate, up", "[B,T,I] x2", 2 * I, true);
    row("n1, n2 (RMSNorm out)", "[B,T,C] x2", 2 * C, false);
    row("rstd1, rstd2", "[B,T] x2", 2, false);
    row("att (attention out)", "[B,T,nh,hd]", nh * hd, false);
    row("lse (log-sum-exp)", "[B,nh,T]", nh, false);
    row("act = silu(gate) up", "[B,T,I]", I, false);
    rows.push_back({"block (without x_l)", "", grouped(d.block() / (s * BT)), grouped(d.block()), "", "", ""});
    rows.push_back({"  of which kept by selective", "", grouped(d.kept() / (s * BT)), grouped(d.kept()), "", "", ""});
    rows.push_back({"head: n, rstd, logits, losses", "[B,T,C+1+V+1]", grouped(C + 1 + V + 1), grouped(d.head()), "", "", ""});
    say.say(format_table(rows));
  }
  const double ratio = double(d.block()) / double(d.x());
  say.say("\nA block writes " + fixed(ratio, 1) + "x its input: that is why keeping only inputs pays. Attention keeps\n"
          "only the log-sum-exp, never the T x T scores, so nothing here grows with T^2.\n");
  say.pause();

  // ---- (b) activation memory per policy ----------------------------------------------------------
  say.phase("activation memory per policy: formula vs allocator");
  std::vector<Measured> runs;
  for (const Policy& p : policies) runs.push_back(measure(cfg, p.ac, batch, train.seed));
  const size_t none_index = size_t(std::find_if(policies.begin(), policies.end(), [](const Policy& p) {
                                     return p.ac.kind == Checkpointing::Kind::none;
                                   }) - policies.begin());
  const int64_t none_peak = runs[none_index].peak;
  std::vector<int64_t> exp_forward, exp_peak, m_forward, m_peak, m_left, exp_left;
  {
    std::vector<std::vector<std::string>> rows = {{"policy", "keeps from forward to backward", "after forward", "formula",
                                                   "peak (high-water mark)", "formula", "of none", "scratch peak"}};
    for (size_t i = 0; i < policies.size(); ++i) {
      const Measured& m = runs[i];
      exp_forward.push_back(end_of_forward(d, policies[i].ac));
      exp_peak.push_back(peak_formula(d, policies[i].ac));
      m_forward.push_back(m.after_forward);
      m_peak.push_back(m.peak);
      m_left.push_back(m.left);
      exp_left.push_back(0);
      rows.push_back({labels[i], keeps(policies[i].ac, L), grouped(m.after_forward), grouped(exp_forward.back()),
                      grouped(m.peak), grouped(exp_peak.back()),
                      fixed(100.0 * double(m.peak) / double(none_peak), 1) + "%", grouped(m.scratch_peak)});
    }
    say.say("Bytes of the 'activations' category on the model's tracker: live when the forward returns, and the\n"
            "highest value during forward + backward (the allocator's numbers; the formulas are the README's):\n\n");
    say.say(format_table(rows));
  }
  say.say("\nselective drops the cheap half of each block; full and every:k drop whole blocks and pay with a\n"
          "transient: one block's activations while it runs forward, and in backward a whole segment rebuilt.\n"
          "(A segment's top block is recomputed only up to act: its output is never read again.)\n");
  say.pause();

  // ---- (c) the price in time: MFU and HFU ----------------------------------------------------------
  say.phase("the price: recomputation, MFU and HFU");
  say.say("Timing " + std::to_string(a.timing_steps) + " forward + backward passes per policy after a warm-up (" +
          std::to_string(ops::backend_threads()) + " threads), then this machine's peak fp32 GEMM for " +
          fixed(a.gemm_seconds, 1) + " s ...\n");
  std::vector<std::vector<double>> seconds;
  for (const Policy& p : policies) seconds.push_back(time_policy(cfg, p.ac, batch, train.seed, a.timing_steps));
  const double peak_flops = ops::measure_peak_gemm_flops(1024, a.gemm_seconds);
  const double train_per_token = training_flops_per_token(cfg, T);
  const double tokens = double(B * T), t_none = median(seconds[none_index]);
  std::vector<int64_t> exp_recompute, m_recompute;
  std::vector<double> medians, mfu, hfu;
  {
    std::vector<std::vector<std::string>> rows = {{"policy", "recompute FLOP/token", "+% FLOPs", "fwd+bwd ms (median)",
                                                   "+% time", "MFU", "HFU"}};
    for (size_t i = 0; i < policies.size(); ++i) {
      const double re = recompute_flops_per_token(cfg, T, policies[i].ac), t = median(seconds[i]);
      exp_recompute.push_back(recompute_formula(cfg, T, policies[i].ac));
      m_recompute.push_back(std::llround(re));
      medians.push_back(t);
      mfu.push_back(tokens * train_per_token / t / peak_flops);
      hfu.push_back(tokens * (train_per_token + re) / t / peak_flops);
      rows.push_back({labels[i], grouped(m_recompute.back()), fixed(100.0 * re / train_per_token, 1),
                      fixed(1e3 * t, 2), fixed(100.0 * (t / t_none - 1), 1), fixed(100 * mfu.back(), 1) + "%",
                      fixed(100 * hfu.back(), 1) + "%"});
    }
    say.say("\nTraining FLOPs per token (forward + backward, 6 N_matmul + 12 L nh hd T): " + grouped(std::llround(train_per_token)) +
            ";\npeak fp32 GEMM here (1024^3): " + fixed(peak_flops / 1e9, 1) + " GFLOP/s.\n\n");
    say.say(format_table(rows));
  }
  say.say("\nMFU counts only the model's FLOPs, so recomputation lowers it; HFU also counts the recomputed ones.\n"
          "Wall-clock times are this machine's and noisy (small matrices also run below the GEMM peak).\n");
  const double tflops = ClusterSpec{}.gpu_tflops;
  std::vector<int64_t> sim_formula, sim_measured;
  {
    std::vector<std::vector<std::string>> rows = {{"policy", "fwd+bwd us (simulated)", "+% time", "formula us"}};
    for (size_t i = 0; i < policies.size(); ++i) {
      const double f = simulated_formula_us(cfg, policies[i].ac, B, T, tflops);
      sim_formula.push_back(ns(f));
      sim_measured.push_back(ns(runs[i].simulated_us));
      rows.push_back({labels[i], fixed(runs[i].simulated_us, 3),
                      fixed(100.0 * (runs[i].simulated_us / runs[none_index].simulated_us - 1), 1), fixed(f, 3)});
    }
    say.say("\nThe same forward + backward on the simulated clock of a GPU computing " + fixed(tflops, 0) +
            " TFLOP/s (an H100's dense BF16 peak):\nevery op's FLOPs at that rate, so recomputation costs exactly "
            "its FLOPs (exercise C1).\n\n");
    say.say(format_table(rows));
  }
  say.pause();

  // ---- (d) where to put the checkpoints: every:k for k = 1..L --------------------------------------
  say.phase("where to put the checkpoints: every:k for k = 1.." + std::to_string(L));
  std::vector<int64_t> k_formula, k_measured, k_list;
  {
    std::vector<std::vector<std::string>> rows = {{"k", "kept inputs", "forward", "head", "backward (worst segment)",
                                                   "peak formula", "peak measured", ""}};
    for (int k = 1; k <= L; ++k) {
      Checkpointing ac;
      ac.kind = Checkpointing::Kind::every;
      ac.every = k;
      const EveryTerms t = every_terms(d, k);
      k_list.push_back(k);
      k_formula.push_back(std::max({t.forward, t.head, t.backward}));
      k_measured.push_back(measure(cfg, ac, batch, train.seed).peak);
      const int64_t seg_end = std::min<int64_t>(L, t.worst_segment_begin + k);
      rows.push_back({std::to_string(k), std::to_string(kept_inputs(L - 1, k)), grouped(t.forward), grouped(t.head),
                      grouped(t.backward) + " [" + std::to_string(t.worst_segment_begin) + ", " + std::to_string(seg_end) + ")",
                      grouped(k_formula.back()), grouped(k_measured.back()), ""});
    }
    const int64_t best = *std::min_element(k_formula.begin(), k_formula.end());
    for (size_t i = 0; i < k_formula.size(); ++i)
      if (k_formula[i] == best) rows[i + 1].back() = "<- least";
    say.say("The three moments that can set the peak: a block's forward, the head, and the backward's largest\n"
            "rebuilt segment (bytes):\n\n");
    say.say(format_table(rows));
  }
  auto argmins = [](const std::vector<int64_t>& v) {
    std::vector<int64_t> ks;
    const int64_t best = *std::min_element(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] == best) ks.push_back(int64_t(i) + 1);
    return ks;
  };
  const std::vector<int64_t> best_formula = argmins(k_formula), best_measured = argmins(k_measured);
  const int sqrt_k = Checkpointing::parse("every:sqrt", L).every;
  const double k_star = std::sqrt(double(L) * double(d.x()) / double(d.x() + d.block()));
  say.say("\nChen et al.'s sqrt(L) rule gives k = ceil(sqrt(" + std::to_string(L) + ")) = " + std::to_string(sqrt_k) +
          ".\nIt assumes a layer stores as much as its input; a block here stores " + fixed(ratio, 1) +
          "x its input, so memory ~\n(L/k) x + k (x + block) is least near k = sqrt(L x / (x + block)) = " +
          fixed(k_star, 2) + ": the least peak is at k = " + std::to_string(best_formula.front()) + ".\n");
  say.pause();

  // ---- (e) equivalence: gradients per policy, and ZeRO-3 on virtual GPUs ---------------------------
  say.phase("equivalence: the same gradients, bit for bit");
  std::vector<int64_t> bitwise_expected, bitwise_measured;
  std::vector<std::string> other_labels;
  {
    const Measured& ref = runs[none_index];
    std::vector<std::vector<std::string>> rows = {{"policy", "loss (sum over tokens)", "loss bitwise", "gradients bitwise", "max |diff|"}};
    for (size_t i = 0; i < policies.size(); ++i) {
      if (i == none_index) continue;
      const Measured& m = runs[i];
      const bool loss_same = std::memcmp(&m.loss, &ref.loss, sizeof(double)) == 0;
      const bool grads_same = m.grads.size() == ref.grads.size() &&
                              std::memcmp(m.grads.data(), ref.grads.data(), m.grads.size() * sizeof(float)) == 0;
      double worst = 0;
      for (size_t j = 0; j < std::min(m.grads.size(), ref.grads.size()); ++j)
        worst = std::max(worst, double(std::fabs(m.grads[j] - ref.grads[j])));
      other_labels.push_back(labels[i]);
      bitwise_expected.push_back(1);
      bitwise_measured.push_back(loss_same && grads_same ? 1 : 0);
      rows.push_back({labels[i], fixed(m.loss, 6), loss_same ? "yes" : "NO", grads_same ? "yes" : "NO", sci(worst)});
    }
    say.say("Every policy against none, all " + grouped(cfg.num_parameters()) +
            " gradient entries compared with memcmp\n(a recomputed tensor comes from the same ops on the same "
            "inputs, so from the same bits):\n\n");
    say.say(format_table(rows));
  }
  RunSetup s;
  s.model = cfg;
  s.train = train;
  s.plan = ParallelPlan::parse("dp=" + std::to_string(o.ranks));
  s.plan.zero = ZeroStage::zero3;
  s.plan.ac = Checkpointing::parse(a.verify_ac, L);
  s.plan.validate();
  s.cluster = o.cluster_options();
  say.say("\nAnd on " + std::to_string(o.ranks) + " virtual GPUs: " + s.plan.describe() + ",\n" +
          std::to_string(train.steps) + " AdamW step(s), each rank " + std::to_string(o.micro_batches) +
          " micro-batch(es) of " + std::to_string(o.rows) + " x " + std::to_string(T) +
          ", replayed on one device without checkpointing ...\n");
  const EquivalenceReport report = run_equivalence(s, data);
  const bool equivalent = report.ok && (s.cluster.algo != ReduceAlgo::ordered || report.bitwise);
  const int64_t rank_peak = peak_formula(sizes_of(cfg, o.rows, T), s.plan.ac);
  std::vector<int64_t> zero_expected, zero_measured;
  std::vector<std::string> rank_labels;
  for (size_t r = 0; r < report.memory.size(); ++r) {
    rank_labels.push_back("rank " + std::to_string(r));
    zero_expected.push_back(rank_peak);
    zero_measured.push_back(report.memory[r].activations);
  }
  say.pause();

  // ---- exercises -------------------------------------------------------------------------------
  say.phase("exercises: formula vs measured");
  ExerciseSheet sheet;
  sheet.exact("A1", "How many bytes of activations does the forward leave for the backward, per policy?",
              "none: 2 ids + (L+1) x + L block + head; selective: 2 ids + (L+1) x + L kept + head; every:k: "
              "2 ids + (ceil(L/k) + 1) x + head",
              -1, exp_forward, m_forward);
  columns["A1"] = labels;
  sheet.exact("A2", "What is the activation high-water mark of one forward + backward, per policy?",
              "none: the end of the forward; selective: max(end of forward, ids + (L+1) x + L kept + one block's "
              "recomputable half); every:k: max(forward of the last block, the head, the largest rebuilt segment)",
              -1, exp_peak, m_peak,
              "Exact to the byte: every tensor is a Buffer charged to the model's tracker when allocated.");
  columns["A2"] = labels;
  sheet.exact("A3", "How many bytes of activations are left when the backward returns?",
              "none: each unit's activations and input are freed by its backward", -1, exp_left, m_left);
  columns["A3"] = labels;
  sheet.exact("F1", "How many FLOPs does one training token cost (forward + backward)?",
              "6 (L (2 C nh hd + 2 C nkv hd + 3 C I) + V C) + 12 L nh hd T", -1,
              {training_formula(cfg, T)}, {std::llround(train_per_token)},
              "The MFU numerator; an embedding lookup is no matmul, RMSNorm and SwiGLU are O(C) per token.");
  columns["F1"] = {"per token"};
  sheet.exact("F2", "How many FLOPs per token does each policy add by recomputing?",
              "none 0; selective the attention core's forward 4 L nh hd T; every:k (full = every:1) one forward of "
              "every block less each segment's top down_proj: 2 L (2 C nh hd + 2 C nkv hd + 3 C I) + 4 L nh hd T "
              "- 2 C I ceil(L/k)",
              -1, exp_recompute, m_recompute,
              "Measured = core/model/flops.h (recompute_flops_per_token), the HFU numerator's extra term.");
  columns["F2"] = labels;
  std::vector<int64_t> sim_low, sim_high;
  for (int64_t f : sim_formula) sim_low.push_back(f - 1), sim_high.push_back(f + 1);
  sheet.range("C1", "On the simulated clock, how long does one forward + backward take, per policy (ns)?",
              "(sum over units of forward + backward FLOPs + the policy's recomputed FLOPs) / GPU rate; attention "
              "counts the T(T+1)/2 causal pairs per head",
              sim_low, sim_high, sim_measured,
              "Measured: the clock the ops' FLOP reports advanced (core/comm/trace.h); within 1 ns of rounding.");
  columns["C1"] = labels;
  std::vector<std::string> k_labels;
  for (int64_t k : k_list) k_labels.push_back("k=" + std::to_string(k));
  sheet.exact("K1", "What is the activation peak of every:k, for every k from 1 to L?",
              "max(forward of the last block, the head, the largest rebuilt segment) as in A2", -1, k_formula,
              k_measured);
  columns["K1"] = k_labels;
  sheet.exact("K2", "Which k needs least activation memory?",
              "the k minimising the K1 formula (about sqrt(L x / (x + block)), not sqrt(L), when a block stores much "
              "more than its input)",
              -1, best_formula, best_measured,
              "Expected: the argmin of the formula over k = 1..L; measured: the argmin of the allocator's peaks. "
              "every:sqrt picks k = " + std::to_string(sqrt_k) + ".");
  columns["K2"] = std::vector<std::string>(std::max(best_formula.size(), best_measured.size()), "least k");
  sheet.exact("E1", "Does any policy change the loss or a single bit of the gradients?",
              "no: 1 = loss and every gradient entry bitwise equal to none (memcmp)", -1, bitwise_expected,
              bitwise_measured);
  columns["E1"] = other_labels;
  sheet.exact("Z1", "ZeRO-3 with AC " + s.plan.ac.describe() + ": what is each rank's activation peak?",
              "the A2 formula for one rank's micro-batch (B = " + std::to_string(o.rows) +
                  "): sharding the state does not change what a rank's forward keeps",
              -1, zero_expected, zero_measured);
  columns["Z1"] = rank_labels;
  say.say(sheet_report(sheet, columns));
  say.pause();

  say.phase("equivalence with one device");
  say.say(report.table());
  say.say("\nPeak bytes per rank of the " + s.plan.describe() + " run:\n\n" + memory_table(report.memory));
  const bool passed = sheet.failed() == 0 && equivalent;

  if (o.json) {
    nlohmann::json per_policy = nlohmann::json::array();
    for (size_t i = 0; i < policies.size(); ++i)
      per_policy.push_back({{"spec", policies[i].spec},
                            {"policy", policies[i].ac.describe()},
                            {"after_forward_bytes", m_forward[i]},
                            {"after_forward_formula", exp_forward[i]},
                            {"peak_bytes", m_peak[i]},
                            {"peak_formula", exp_peak[i]},
                            {"fraction_of_none", double(m_peak[i]) / double(none_peak)},
                            {"scratch_peak_bytes", runs[i].scratch_peak},
                            {"recompute_flops_per_token", m_recompute[i]},
                            {"recompute_flops_formula", exp_recompute[i]},
                            {"step_seconds", seconds[i]},
                            {"step_seconds_median", medians[i]},
                            {"mfu", mfu[i]},
                            {"hfu", hfu[i]},
                            {"loss_sum", runs[i].loss}});
    nlohmann::json every_k = nlohmann::json::array();
    for (size_t i = 0; i < k_list.size(); ++i)
      every_k.push_back({{"k", k_list[i]}, {"peak_formula", k_formula[i]}, {"peak_bytes", k_measured[i]}});
    const nlohmann::json j = {
        {"lesson", "03-activation-checkpointing"},
        {"preset", o.preset},
        {"parameters", cfg.num_parameters()},
        {"shape", {{"B", B}, {"T", T}, {"C", C}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"I", I}, {"V", V}, {"L", L}}},
        {"bytes", {{"x", d.x()}, {"block", d.block()}, {"kept", d.kept()}, {"recomputable", d.recomputable()},
                   {"head", d.head()}, {"ids", d.ids()}}},
        {"policies", per_policy},
        {"training_flops_per_token", train_per_token},
        {"peak_gemm_flops_per_s", peak_flops},
        {"threads", ops::backend_threads()},
        {"every_k", every_k},
        {"least_k_formula", best_formula},
        {"least_k_measured", best_measured},
        {"sqrt_k", sqrt_k},
        {"plan", s.plan.to_json()},
        {"zero3_memory_peak", memory_json(report.memory)},
        {"exercises", sheet.to_json()},
        {"equivalence", equivalence_json(report)},
        {"passed", passed}};
    std::printf("%s\n", j.dump().c_str());
  }
  return passed ? 0 : 1;
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  options.preset = "small";  // 6 layers: every:2, every:3 and full differ
  options.ranks = 2;         // the ZeRO-3 equivalence run at the end
  llama4d::lesson::AcArgs ac;
  CLI::App app{"Lesson 03: activation checkpointing (memory vs recomputation)", "lesson03_checkpointing"};
  options.add_options(app);
  app.add_option("--policies", ac.policies, "comma-separated: none, selective, full, every:K, every:sqrt")
      ->capture_default_str();
  app.add_option("--ac", ac.verify_ac, "the policy of the ZeRO-3 equivalence run on --ranks virtual GPUs")
      ->capture_default_str();
  app.add_option("--timing-steps", ac.timing_steps, "timed forward + backward passes per policy (median)")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  app.add_option("--gemm-seconds", ac.gemm_seconds, "time spent measuring this machine's peak GEMM")
      ->check(CLI::Range(0.01, 10.0))
      ->capture_default_str();
  return llama4d::lesson::lesson_main(app, argc, argv, [&] { return llama4d::lesson::run(options, ac); });
}
