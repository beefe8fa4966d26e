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
#include "lessons/common/number_format.h"

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
  int64_t worst_run_begin = 0;              // where the backward's largest run starts
};

EveryTerms every_terms(const Sizes& d, int64_t k) {
  const int64_t L = d.L;
  EveryTerms t;
  // Forward of block l: the tokens, the kept inputs below x_l, x_l itself (kept or not, it is
  // read until the block is done), its output x_{l+1}, and all of the block's activations.
  for (int64_t l = 0; l < L; ++l) t.forward = std::max(t.forward, d.ids() + (kept_inputs(l - 1, k) + 2) * d.x() + d.block());
  t.head = 2 * d.ids() + (kept_inputs(L - 1, k) + 1) * d.x() + d.head();
  // Backward of run [a, e): after the head is done (targets, x_L and the head freed), the
  // run is rerun from its kept input x_a: the recomputed inputs x_{a+1} .. x_{e-1} and the
  // activations of all e - a blocks are live at once, on top of the kept inputs x_0 .. x_a.
  for (int64_t a = ((L - 1) / k) * k; a >= 0; a -= k) {
    const int64_t e = std::min(L, a + k);
    const int64_t bytes = d.ids() + (kept_inputs(a, k) + (e - a - 1)) * d.x() + (e - a) * d.block();
    if (bytes > t.backward) t.backward = bytes, t.worst_run_begin = a;
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
      // Every block's forward once more, except down_proj in each run's top block.
      const int64_t runs = (c.num_hidden_layers + ac.every - 1) / ac.every;
      return 2 * c.num_hidden_layers * block_matmul_weights(c) + attention_core_forward(c, T) -
             2 * c.hidden_size * c.intermediate_size * runs;
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
  m.loss = model.forward(b.tokens.data(), b.targets.data(), b.B, b.seq).loss_sum;
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
//   every:k    every block's forward once more, less each run's top down_proj
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
    model.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
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
    if (const std::string v = sheet.verdict_line(id); !v.empty()) out += "       " + v + "\n";
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

// What every phase reads: the model, the one micro-batch of B x T tokens every policy runs on a
// single device, and the policies (none among them: the reference of memory and gradients).
struct AcRun {
  LlamaConfig cfg;
  int L = 0;
  std::vector<Policy> policies;
  std::vector<std::string> labels;  // [policy] as the tables and the exercises name it
  size_t none_index = 0;            // policies[none_index] is none
  TrainOptions train;
  TextDataset data;
  Batch batch;
  int64_t B = 0, seq = 0;
  Sizes d;  // bytes of what the tokens, a block and the head store for this batch
};

AcRun ac_run(const LessonOptions& o, const AcArgs& a) {
  AcRun r;
  r.cfg = LlamaConfig::preset(o.preset);
  if (r.cfg.num_parameters() > 100'000'000)
    throw InputError("--preset " + o.preset + ": the lesson runs the model on this machine; use tiny, small or medium "
                     "(the README works the formulas out for Llama 3 405B)");
  if (o.seq_len > r.cfg.max_position_embeddings)
    throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds the preset's max_position_embeddings " +
                     std::to_string(r.cfg.max_position_embeddings));
  if (a.timing_steps < 1) throw InputError("--timing-steps must be >= 1");
  if (!(a.gemm_seconds > 0)) throw InputError("--gemm-seconds must be > 0");
  r.L = int(r.cfg.num_hidden_layers);
  r.policies = parse_policies(a.policies, r.L);
  for (const Policy& p : r.policies) r.labels.push_back(p.label());
  r.none_index = size_t(std::find_if(r.policies.begin(), r.policies.end(), [](const Policy& p) {
                          return p.ac.kind == Checkpointing::Kind::none;
                        }) - r.policies.begin());
  r.train = o.train_options();
  r.data = load_dataset(default_corpus_path(), r.train.seq_len);
  r.batch = sample_rows(r.data.train(), r.train.seq_len, r.train.seed, 0, 0, o.rows);
  r.B = r.batch.B, r.seq = r.batch.seq;
  r.d = sizes_of(r.cfg, r.B, r.seq);
  return r;
}

// The policy that checkpoints every block (full, every:1), if the run has one.
std::optional<size_t> full_index(const AcRun& r) {
  for (size_t i = 0; i < r.policies.size(); ++i)
    if (r.policies[i].ac.kind == Checkpointing::Kind::every && r.policies[i].ac.every == 1) return i;
  return std::nullopt;
}

// How many times its input a block's activations are.
double block_to_input(const Sizes& d) { return double(d.block()) / double(d.x()); }

// The exercise sheet with each exercise's column names (sheet_report prints them). Every
// exercise here is per column, none has a textbook value.
struct LabelledSheet {
  ExerciseSheet sheet;
  std::map<std::string, std::vector<std::string>> columns;

  void exact(const std::string& id, std::vector<std::string> names, std::string question, std::string formula,
             std::vector<int64_t> expected, std::vector<int64_t> measured, std::string note = "") {
    sheet.exact(id, std::move(question), std::move(formula), -1, std::move(expected), std::move(measured), std::move(note));
    columns[id] = std::move(names);
  }
  void range(const std::string& id, std::vector<std::string> names, std::string question, std::string formula,
             std::vector<int64_t> lower, std::vector<int64_t> upper, std::vector<int64_t> measured, std::string note) {
    sheet.range(id, std::move(question), std::move(formula), std::move(lower), std::move(upper), std::move(measured),
                std::move(note));
    columns[id] = std::move(names);
  }
};

// ---- (a) the model, the batch, and what a block stores ------------------------------------------

void show_block_storage(Narrator& say, const LessonOptions& o, const AcRun& r) {
  const LlamaConfig& cfg = r.cfg;
  const Sizes& d = r.d;
  const int64_t B = r.B, T = r.seq, C = cfg.hidden_size, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads,
                hd = cfg.head_dim, I = cfg.intermediate_size, V = cfg.vocab_size;
  say.phase("the model, the batch, and what a block stores");
  say.say("Model '" + o.preset + "': L = " + std::to_string(r.L) + " blocks, C = " + std::to_string(C) + ", nh = " +
          std::to_string(nh) + " query heads, nkv = " + std::to_string(nkv) + " key/value heads, hd = " +
          std::to_string(hd) + ", I = " + std::to_string(I) + ", V = " + std::to_string(V) + "; N = " +
          grouped(cfg.num_parameters()) + " parameters.\nOne micro-batch of B = " + std::to_string(B) +
          " rows x T = " + std::to_string(T) + " tokens, fp32 (s = 4 bytes), on a single device.\n\n"
          "What one block's forward writes for its backward (bytes for this batch):\n\n");
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
  say.say("\nA block writes " + fixed(block_to_input(d), 1) + "x its input: that is why keeping only inputs pays. Attention keeps\n"
          "only the log-sum-exp, never the T x T scores, so nothing here grows with T^2.\n");
  say.pause();
}

// ---- (b) activation memory per policy -------------------------------------------------------------

// [policy] one forward + backward each, and what the formulas say of it.
struct MemoryRuns {
  std::vector<Measured> runs;
  std::vector<int64_t> exp_forward, exp_peak, exp_left, m_forward, m_peak, m_left;
  int64_t none_peak = 0;
};

MemoryRuns show_memory_per_policy(Narrator& say, const AcRun& r) {
  say.phase("activation memory per policy: formula vs allocator");
  say.ask("A1", "Without checkpointing (none), how many bytes of activations does the forward leave for the backward?");
  MemoryRuns mem;
  for (const Policy& p : r.policies) mem.runs.push_back(measure(r.cfg, p.ac, r.batch, r.train.seed));
  mem.none_peak = mem.runs[r.none_index].peak;
  std::vector<std::vector<std::string>> rows = {{"policy", "keeps from forward to backward", "after forward", "formula",
                                                 "peak (high-water mark)", "formula", "of none", "scratch peak"}};
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const Measured& m = mem.runs[i];
    mem.exp_forward.push_back(end_of_forward(r.d, r.policies[i].ac));
    mem.exp_peak.push_back(peak_formula(r.d, r.policies[i].ac));
    mem.m_forward.push_back(m.after_forward);
    mem.m_peak.push_back(m.peak);
    mem.m_left.push_back(m.left);
    mem.exp_left.push_back(0);
    rows.push_back({r.labels[i], keeps(r.policies[i].ac, r.L), grouped(m.after_forward), grouped(mem.exp_forward.back()),
                    grouped(m.peak), grouped(mem.exp_peak.back()),
                    fixed(100.0 * double(m.peak) / double(mem.none_peak), 1) + "%", grouped(m.scratch_peak)});
  }
  say.say("Bytes of the 'activations' category on the model's tracker: live when the forward returns, and the\n"
          "highest value during forward + backward (the allocator's numbers; the formulas are the README's):\n\n");
  say.say(format_table(rows));
  say.say("\nselective drops the cheap half of each block; full and every:k drop whole blocks and pay with a\n"
          "transient: one block's activations while it runs forward, and in backward a whole run rebuilt.\n"
          "(A run's top block is recomputed only up to act: its output is never read again.)\n");
  say.pause();
  return mem;
}

// ---- (c) the price in time: MFU and HFU ---------------------------------------------------------

// [policy] wall-clock seconds and the FLOPs they bought, then the simulated clock's time.
struct Price {
  std::vector<std::vector<double>> seconds;
  std::vector<double> medians, mfu, hfu;
  double peak_flops = 0, train_per_token = 0;
  std::vector<int64_t> exp_recompute, m_recompute, sim_formula, sim_measured;
};

// The policies' median forward + backward on this machine, MFU and HFU against its peak GEMM.
void show_wall_clock(Narrator& say, const AcArgs& a, const AcRun& r, Price& price) {
  say.say("Timing " + std::to_string(a.timing_steps) + " forward + backward passes per policy after a warm-up (" +
          std::to_string(ops::backend_threads()) + " threads), then this machine's peak fp32 GEMM for " +
          fixed(a.gemm_seconds, 1) + " s ...\n");
  for (const Policy& p : r.policies) price.seconds.push_back(time_policy(r.cfg, p.ac, r.batch, r.train.seed, a.timing_steps));
  price.peak_flops = ops::measure_peak_gemm_flops(1024, a.gemm_seconds);
  price.train_per_token = training_flops_per_token(r.cfg, r.seq);
  const double peak_flops = price.peak_flops, train_per_token = price.train_per_token;
  const double tokens = double(r.B * r.seq), t_none = median(price.seconds[r.none_index]);
  std::vector<std::vector<std::string>> rows = {{"policy", "recompute FLOP/token", "+% FLOPs", "fwd+bwd ms (median)",
                                                 "+% time", "MFU", "HFU"}};
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const double re = recompute_flops_per_token(r.cfg, r.seq, r.policies[i].ac), t = median(price.seconds[i]);
    price.exp_recompute.push_back(recompute_formula(r.cfg, r.seq, r.policies[i].ac));
    price.m_recompute.push_back(std::llround(re));
    price.medians.push_back(t);
    price.mfu.push_back(tokens * train_per_token / t / peak_flops);
    price.hfu.push_back(tokens * (train_per_token + re) / t / peak_flops);
    rows.push_back({r.labels[i], grouped(price.m_recompute.back()), fixed(100.0 * re / train_per_token, 1),
                    fixed(1e3 * t, 2), fixed(100.0 * (t / t_none - 1), 1), fixed(100 * price.mfu.back(), 1) + "%",
                    fixed(100 * price.hfu.back(), 1) + "%"});
  }
  say.say("\nTraining FLOPs per token (forward + backward, 6 N_matmul + 12 L nh hd T): " + grouped(std::llround(train_per_token)) +
          ";\npeak fp32 GEMM here (1024^3): " + fixed(peak_flops / 1e9, 1) + " GFLOP/s.\n\n");
  say.say(format_table(rows));
  say.say("\nMFU counts only the model's FLOPs, so recomputation lowers it; HFU also counts the recomputed ones.\n"
          "Wall-clock times are this machine's and noisy (small matrices also run below the GEMM peak).\n");
}

// The same forward + backward on a modelled GPU's clock, against the README's FLOP count.
void show_simulated_clock(Narrator& say, const AcRun& r, const MemoryRuns& mem, Price& price) {
  const double tflops = ClusterSpec{}.gpu_tflops;
  std::vector<std::vector<std::string>> rows = {{"policy", "fwd+bwd us (simulated)", "+% time", "formula us"}};
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const double f = simulated_formula_us(r.cfg, r.policies[i].ac, r.B, r.seq, tflops);
    const double us = mem.runs[i].simulated_us;
    price.sim_formula.push_back(ns(f));
    price.sim_measured.push_back(ns(us));
    rows.push_back({r.labels[i], fixed(us, 3), fixed(100.0 * (us / mem.runs[r.none_index].simulated_us - 1), 1),
                    fixed(f, 3)});
  }
  say.say("\nThe same forward + backward on the simulated clock of a GPU computing " + fixed(tflops, 0) +
          " TFLOP/s (an H100's dense BF16 peak):\nevery op's FLOPs at that rate, so recomputation costs exactly "
          "its FLOPs (exercise C1).\n\n");
  say.say(format_table(rows));
}

Price show_price(Narrator& say, const AcArgs& a, const AcRun& r, const MemoryRuns& mem) {
  say.phase("the price: recomputation, MFU and HFU");
  say.ask("F1", "How many FLOPs does one training token cost, forward + backward, without recomputation?");
  if (full_index(r)) say.ask("F2", "How many FLOPs per token does full checkpointing add by recomputing?");
  Price price;
  show_wall_clock(say, a, r, price);
  show_simulated_clock(say, r, mem, price);
  say.pause();
  return price;
}

// ---- (d) where to put the checkpoints: every:k for k = 1..L --------------------------------------

// [k - 1] the every:k peak by formula and by the allocator; the k that need least (1-based).
struct Spacing {
  std::vector<int64_t> k_list, k_formula, k_measured, best_formula, best_measured;
  int sqrt_k = 0;  // what every:sqrt picks
};

// The positions (1-based) where v is least.
std::vector<int64_t> argmins(const std::vector<int64_t>& v) {
  std::vector<int64_t> ks;
  const int64_t best = *std::min_element(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == best) ks.push_back(int64_t(i) + 1);
  return ks;
}

Spacing show_checkpoint_spacing(Narrator& say, const AcRun& r) {
  const int L = r.L;
  const Sizes& d = r.d;
  say.phase("where to put the checkpoints: every:k for k = 1.." + std::to_string(L));
  say.ask("K2", "Which k of every:k needs the least activation memory (the smallest, if several tie)?");
  Spacing sp;
  std::vector<std::vector<std::string>> rows = {{"k", "kept inputs", "forward", "head", "backward (worst run)",
                                                 "peak formula", "peak measured", ""}};
  for (int k = 1; k <= L; ++k) {
    const EveryTerms t = every_terms(d, k);
    sp.k_list.push_back(k);
    sp.k_formula.push_back(std::max({t.forward, t.head, t.backward}));
    sp.k_measured.push_back(measure(r.cfg, {.kind = Checkpointing::Kind::every, .every = k}, r.batch, r.train.seed).peak);
    const int64_t seg_end = std::min<int64_t>(L, t.worst_run_begin + k);
    rows.push_back({std::to_string(k), std::to_string(kept_inputs(L - 1, k)), grouped(t.forward), grouped(t.head),
                    grouped(t.backward) + " [" + std::to_string(t.worst_run_begin) + ", " + std::to_string(seg_end) + ")",
                    grouped(sp.k_formula.back()), grouped(sp.k_measured.back()), ""});
  }
  sp.best_formula = argmins(sp.k_formula);
  sp.best_measured = argmins(sp.k_measured);
  for (int64_t k : sp.best_formula) rows[size_t(k)].back() = "<- least";
  say.say("The three moments that can set the peak: a block's forward, the head, and the backward's largest\n"
          "rebuilt run (bytes):\n\n");
  say.say(format_table(rows));
  sp.sqrt_k = Checkpointing::parse("every:sqrt", L).every;
  const double k_star = std::sqrt(double(L) * double(d.x()) / double(d.x() + d.block()));
  say.say("\nChen et al.'s sqrt(L) rule gives k = ceil(sqrt(" + std::to_string(L) + ")) = " + std::to_string(sp.sqrt_k) +
          ".\nIt assumes a layer stores as much as its input; a block here stores " + fixed(block_to_input(d), 1) +
          "x its input, so memory ~\n(L/k) x + k (x + block) is least near k = sqrt(L x / (x + block)) = " +
          fixed(k_star, 2) + ": the least peak is at k = " + std::to_string(sp.best_formula.front()) + ".\n");
  say.pause();
  return sp;
}

// ---- (e) equivalence: gradients per policy, and ZeRO-3 on virtual GPUs ----------------------------

struct Equivalence {
  std::vector<std::string> other_labels;  // [policy but none]
  std::vector<int64_t> bitwise_expected, bitwise_measured;
  RunSetup s;  // the ZeRO-3 + AC plan on --ranks virtual GPUs
  EquivalenceReport report;
  bool equivalent = false;
  std::vector<std::string> rank_labels;  // [rank]
  std::vector<int64_t> zero_expected, zero_measured;
};

// Every policy's loss and gradients against none's, with memcmp.
void compare_policies_bitwise(Narrator& say, const AcRun& r, const MemoryRuns& mem, Equivalence& e) {
  const Measured& ref = mem.runs[r.none_index];
  std::vector<std::vector<std::string>> rows = {{"policy", "loss (sum over tokens)", "loss bitwise", "gradients bitwise", "max |diff|"}};
  for (size_t i = 0; i < r.policies.size(); ++i) {
    if (i == r.none_index) continue;
    const Measured& m = mem.runs[i];
    const bool loss_same = std::memcmp(&m.loss, &ref.loss, sizeof(double)) == 0;
    const bool grads_same = m.grads.size() == ref.grads.size() &&
                            std::memcmp(m.grads.data(), ref.grads.data(), m.grads.size() * sizeof(float)) == 0;
    double worst = 0;
    for (size_t j = 0; j < std::min(m.grads.size(), ref.grads.size()); ++j)
      worst = std::max(worst, double(std::fabs(m.grads[j] - ref.grads[j])));
    e.other_labels.push_back(r.labels[i]);
    e.bitwise_expected.push_back(1);
    e.bitwise_measured.push_back(loss_same && grads_same ? 1 : 0);
    rows.push_back({r.labels[i], fixed(m.loss, 6), loss_same ? "yes" : "NO", grads_same ? "yes" : "NO", significant(worst)});
  }
  say.say("Every policy against none, all " + grouped(r.cfg.num_parameters()) +
          " gradient entries compared with memcmp\n(a recomputed tensor comes from the same ops on the same "
          "inputs, so from the same bits):\n\n");
  say.say(format_table(rows));
}

// ZeRO-3 with the --ac policy on --ranks virtual GPUs, replayed on one device without it; each
// rank's activation peak against the A2 formula for its micro-batch.
void run_zero3_with_ac(Narrator& say, const LessonOptions& o, const AcArgs& a, const AcRun& r, Equivalence& e) {
  RunSetup& s = e.s;
  s.model = r.cfg;
  s.train = r.train;
  s.plan = ParallelPlan::parse("dp=" + std::to_string(o.ranks));
  s.plan.zero = ZeroStage::zero3;
  s.plan.ac = Checkpointing::parse(a.verify_ac, r.L);
  s.plan.validate();
  s.cluster = o.cluster_options();
  say.say("\nAnd on " + std::to_string(o.ranks) + " virtual GPUs: " + s.plan.describe() + ",\n" +
          std::to_string(r.train.steps) + " AdamW step(s), each rank " + std::to_string(o.micro_batches) +
          " micro-batch(es) of " + std::to_string(o.rows) + " x " + std::to_string(r.seq) +
          ", replayed on one device without checkpointing ...\n");
  e.report = run_equivalence(s, r.data);
  e.equivalent = e.report.ok && (s.cluster.algo != ReduceAlgo::ordered || e.report.bitwise);
  const int64_t rank_peak = peak_formula(sizes_of(r.cfg, o.rows, r.seq), s.plan.ac);
  for (size_t k = 0; k < e.report.memory.size(); ++k) {
    e.rank_labels.push_back("rank " + std::to_string(k));
    e.zero_expected.push_back(rank_peak);
    e.zero_measured.push_back(e.report.memory[k].activations);
  }
}

Equivalence show_equivalence(Narrator& say, const LessonOptions& o, const AcArgs& a, const AcRun& r,
                             const MemoryRuns& mem) {
  say.phase("equivalence: the same gradients, bit for bit");
  Equivalence e;
  compare_policies_bitwise(say, r, mem, e);
  run_zero3_with_ac(say, o, a, r, e);
  say.pause();
  return e;
}

// ---- exercises ------------------------------------------------------------------------------------

// What the questions asked name: none's column of A1, full's of F2, the least k of K2.
void answer_questions(ExerciseSheet& sheet, const AcRun& r, const MemoryRuns& mem, const Price& price,
                      const Spacing& sp) {
  sheet.answer("A1", {.value = double(mem.m_forward[r.none_index]), .unit = "bytes", .of = "none"});
  sheet.answer("F1", {.value = double(std::llround(price.train_per_token)), .unit = "FLOPs", .of = "per token"});
  if (const std::optional<size_t> i = full_index(r))
    sheet.answer("F2", {.value = double(price.m_recompute[*i]), .unit = "FLOPs", .of = r.labels[*i]});
  sheet.answer("K2", {.value = double(sp.best_measured.front()), .unit = "k", .of = "every:k"});
}

LabelledSheet check_formulas(const LessonOptions& o, const AcRun& r, const MemoryRuns& mem, const Price& price,
                             const Spacing& sp, const Equivalence& e) {
  LabelledSheet x;
  x.exact("A1", r.labels, "How many bytes of activations does the forward leave for the backward, per policy?",
          "none: 2 ids + (L+1) x + L block + head; selective: 2 ids + (L+1) x + L kept + head; every:k: "
          "2 ids + (ceil(L/k) + 1) x + head",
          mem.exp_forward, mem.m_forward);
  x.exact("A2", r.labels, "What is the activation high-water mark of one forward + backward, per policy?",
          "none: the end of the forward; selective: max(end of forward, ids + (L+1) x + L kept + one block's "
          "recomputable half); every:k: max(forward of the last block, the head, the largest rebuilt run)",
          mem.exp_peak, mem.m_peak, "Exact to the byte: every tensor is a Buffer charged to the model's tracker when allocated.");
  x.exact("A3", r.labels, "How many bytes of activations are left when the backward returns?",
          "none: each unit's activations and input are freed by its backward", mem.exp_left, mem.m_left);
  x.exact("F1", {"per token"}, "How many FLOPs does one training token cost (forward + backward)?",
          "6 (L (2 C nh hd + 2 C nkv hd + 3 C I) + V C) + 12 L nh hd T", {training_formula(r.cfg, r.seq)},
          {std::llround(price.train_per_token)},
          "The MFU numerator; an embedding lookup is no matmul, RMSNorm and SwiGLU are O(C) per token.");
  x.exact("F2", r.labels, "How many FLOPs per token does each policy add by recomputing?",
          "none 0; selective the attention core's forward 4 L nh hd T; every:k (full = every:1) one forward of "
          "every block less each run's top down_proj: 2 L (2 C nh hd + 2 C nkv hd + 3 C I) + 4 L nh hd T "
          "- 2 C I ceil(L/k)",
          price.exp_recompute, price.m_recompute,
          "Measured = core/model/flops.h (recompute_flops_per_token), the HFU numerator's extra term.");
  std::vector<int64_t> sim_low, sim_high;
  for (int64_t f : price.sim_formula) sim_low.push_back(f - 1), sim_high.push_back(f + 1);
  x.range("C1", r.labels, "On the simulated clock, how long does one forward + backward take, per policy (ns)?",
          "(sum over units of forward + backward FLOPs + the policy's recomputed FLOPs) / GPU rate; attention "
          "counts the T(T+1)/2 causal pairs per head",
          sim_low, sim_high, price.sim_measured,
          "Measured: the clock the ops' FLOP reports advanced (core/comm/trace.h); within 1 ns of rounding.");
  std::vector<std::string> k_labels;
  for (int64_t k : sp.k_list) k_labels.push_back("k=" + std::to_string(k));
  x.exact("K1", k_labels, "What is the activation peak of every:k, for every k from 1 to L?",
          "max(forward of the last block, the head, the largest rebuilt run) as in A2", sp.k_formula, sp.k_measured);
  x.exact("K2", std::vector<std::string>(std::max(sp.best_formula.size(), sp.best_measured.size()), "least k"),
          "Which k needs least activation memory?",
          "the k minimising the K1 formula (about sqrt(L x / (x + block)), not sqrt(L), when a block stores much "
          "more than its input)",
          sp.best_formula, sp.best_measured,
          "Expected: the argmin of the formula over k = 1..L; measured: the argmin of the allocator's peaks. "
          "every:sqrt picks k = " + std::to_string(sp.sqrt_k) + ".");
  x.exact("E1", e.other_labels, "Does any policy change the loss or a single bit of the gradients?",
          "no: 1 = loss and every gradient entry bitwise equal to none (memcmp)", e.bitwise_expected, e.bitwise_measured);
  x.exact("Z1", e.rank_labels, "ZeRO-3 with AC " + e.s.plan.ac.describe() + ": what is each rank's activation peak?",
          "the A2 formula for one rank's micro-batch (B = " + std::to_string(o.rows) +
              "): sharding the state does not change what a rank's forward keeps",
          e.zero_expected, e.zero_measured);
  answer_questions(x.sheet, r, mem, price, sp);
  return x;
}

// The --json summary: the shape, every policy's memory, FLOPs and times, the every:k sweep, the
// exercises and the ZeRO-3 run's equivalence.
nlohmann::json summary_json(const LessonOptions& o, const AcRun& r, const MemoryRuns& mem, const Price& price,
                            const Spacing& sp, const Equivalence& e, const ExerciseSheet& sheet, bool passed) {
  const LlamaConfig& cfg = r.cfg;
  const Sizes& d = r.d;
  nlohmann::json per_policy = nlohmann::json::array();
  for (size_t i = 0; i < r.policies.size(); ++i)
    per_policy.push_back({{"spec", r.policies[i].spec},
                          {"policy", r.policies[i].ac.describe()},
                          {"after_forward_bytes", mem.m_forward[i]},
                          {"after_forward_formula", mem.exp_forward[i]},
                          {"peak_bytes", mem.m_peak[i]},
                          {"peak_formula", mem.exp_peak[i]},
                          {"fraction_of_none", double(mem.m_peak[i]) / double(mem.none_peak)},
                          {"scratch_peak_bytes", mem.runs[i].scratch_peak},
                          {"recompute_flops_per_token", price.m_recompute[i]},
                          {"recompute_flops_formula", price.exp_recompute[i]},
                          {"step_seconds", price.seconds[i]},
                          {"step_seconds_median", price.medians[i]},
                          {"mfu", price.mfu[i]},
                          {"hfu", price.hfu[i]},
                          {"loss_sum", mem.runs[i].loss}});
  nlohmann::json every_k = nlohmann::json::array();
  for (size_t i = 0; i < sp.k_list.size(); ++i)
    every_k.push_back({{"k", sp.k_list[i]}, {"peak_formula", sp.k_formula[i]}, {"peak_bytes", sp.k_measured[i]}});
  return {{"lesson", "03-activation-checkpointing"},
          {"preset", o.preset},
          {"parameters", cfg.num_parameters()},
          {"shape", {{"B", r.B}, {"T", r.seq}, {"C", cfg.hidden_size}, {"nh", cfg.num_attention_heads},
                     {"nkv", cfg.num_key_value_heads}, {"hd", cfg.head_dim}, {"I", cfg.intermediate_size},
                     {"V", cfg.vocab_size}, {"L", r.L}}},
          {"bytes", {{"x", d.x()}, {"block", d.block()}, {"kept", d.kept()}, {"recomputable", d.recomputable()},
                     {"head", d.head()}, {"ids", d.ids()}}},
          {"policies", per_policy},
          {"training_flops_per_token", price.train_per_token},
          {"peak_gemm_flops_per_s", price.peak_flops},
          {"threads", ops::backend_threads()},
          {"every_k", every_k},
          {"least_k_formula", sp.best_formula},
          {"least_k_measured", sp.best_measured},
          {"sqrt_k", sp.sqrt_k},
          {"plan", e.s.plan.to_json()},
          {"zero3_memory_peak", memory_json(e.report.memory)},
          {"exercises", sheet.to_json()},
          {"asked", sheet.asked_json()},
          {"equivalence", equivalence_json(e.report)},
          {"passed", passed}};
}

int run(const LessonOptions& o, const AcArgs& a) {
  Narrator say(o);
  const AcRun r = ac_run(o, a);
  show_block_storage(say, o, r);
  const MemoryRuns mem = show_memory_per_policy(say, r);
  const Price price = show_price(say, a, r, mem);
  const Spacing spacing = show_checkpoint_spacing(say, r);
  const Equivalence e = show_equivalence(say, o, a, r, mem);

  say.phase("exercises: formula vs measured");
  LabelledSheet x = check_formulas(o, r, mem, price, spacing, e);
  x.sheet.set_predictions(say.predictions());
  x.sheet.set_asked(say.asked());
  say.say(sheet_report(x.sheet, x.columns));
  say.pause();

  say.phase("equivalence with one device");
  say.say(e.report.table());
  say.say("\nPeak bytes per rank of the " + e.s.plan.describe() + " run:\n\n" + memory_table(e.report.memory));
  const bool passed = x.sheet.failed() == 0 && e.equivalent;
  if (o.json) std::printf("%s\n", summary_json(o, r, mem, price, spacing, e, x.sheet, passed).dump().c_str());
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
