// Lesson 11: Llama 3's training recipe at laptop scale. Each phase runs the `llama4d` commands a
// learner types (the CLI beside this program) and reads their --json:
//   1. Llama 3's recipe in numbers: the batch and sequence ramps, the long-context stages, the
//      data mix, the annealing ("The Llama 3 Herd of Models", 2024, sections 3.1 and 3.4);
//   2. the lesson's recipe, stage by stage: the tokens each stage trains, its mesh and LR segment;
//   3. the run (`train --recipe`): what each stage boundary moved in memory, against the bytes
//      worked out by hand from the shard layout; a boundary on the same mesh moves nothing;
//   4. per stage: the loss, tokens/s on this machine and on the simulated clock, the FLOPs per
//      token that grow with the sequence, the share of rows each data source gave;
//   5. the bitwise check: the run stopped at every boundary, saved, and resumed on the next
//      stage's plan from disk, against the run whose state moved in memory.
//   lesson11_training_recipe [--preset tiny] [--recipe FILE] [--step] [--json]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/data/dataset.h"
#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/model/flops.h"
#include "core/train/recipe.h"
#include "lessons/common/cli_runner.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"

namespace fs = std::filesystem;

namespace llama4d::lesson {
namespace {

struct RecipeArgs {
  std::string preset = "tiny";
  std::string recipe;  // empty: the lesson's own (lesson_recipe), written into the work directory
  std::string work;
  int64_t eval_windows = 16;
};

// The paper's figures ("The Llama 3 Herd of Models", 2024): section 3.4.1 (the batch ramp),
// 3.4.2 (six long-context stages, about 800B tokens, to 128K), 3.4.3 (the last 40M tokens
// annealed, LR linear to 0, checkpoints averaged), 3.1.2 (the data mix), Table 4 (the 128K layout).
// "4M tokens" of 4,096 is 1,024 sequences: M here is 2^20.
constexpr double kM = 1 << 20;
constexpr double kFirstBatch = 4 * kM, kFirstSeq = 4096, kAnnealTokens = 40 * kM, kLastBatch = 16 * kM;

// The lesson's recipe for `tiny` (128 positions): a batch ramp (4 then 8 rows of 32 tokens, dp
// 2 then 4), a sequence ramp at a constant 256 tokens a step (8 x 32 -> 4 x 64 -> 2 x 128) with cp
// 1 -> 2 -> 4, and an annealing stage on the same mesh, LR linear to 0, that upsamples a
// high-quality subset of the corpus (one section, weighted 1 against the whole corpus's 3).
std::string lesson_recipe(const std::string& corpus, const std::string& subset) {
  const std::string c = nlohmann::json(corpus).dump(), s = nlohmann::json(subset).dump();
  return R"({
 "name": "lesson11",
 "seed": 1337,
 "stages": [
  {"name": "batch-4", "steps": 20, "batch_size": 4, "seq_len": 32, "dp": 2,
   "data": {)" + c + R"(: 1}, "lr": {"shape": "warmup", "from": 0, "to": 0.004}},
  {"name": "batch-8", "steps": 15, "batch_size": 8, "seq_len": 32, "dp": 4,
   "data": {)" + c + R"(: 1}, "lr": {"shape": "cosine", "from": 0.004, "to": 0.003}},
  {"name": "seq-64", "tokens": 3840, "batch_size": 4, "seq_len": 64, "dp": 2, "cp": 2,
   "data": {)" + c + R"(: 1}, "lr": {"shape": "cosine", "from": 0.003, "to": 0.002}},
  {"name": "seq-128", "tokens": 3840, "batch_size": 2, "seq_len": 128, "dp": 2, "cp": 4,
   "data": {)" + c + R"(: 1}, "lr": {"shape": "cosine", "from": 0.002, "to": 0.001}},
  {"name": "anneal", "tokens": 2560, "batch_size": 2, "seq_len": 128, "dp": 2, "cp": 4,
   "data": {)" + c + R"(: 3, )" + s + R"(: 1}, "lr": {"shape": "linear", "from": 0.001, "to": 0}}
 ]
}
)";
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error("cannot read " + p.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Bytes that differ between two files (a longer file's extra bytes count as differing).
int64_t differing_bytes(const fs::path& a, const fs::path& b) {
  const std::string x = read_bytes(a), y = read_bytes(b);
  int64_t n = int64_t(std::max(x.size(), y.size()) - std::min(x.size(), y.size()));
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) n += x[i] != y[i];
  return n;
}

int ranks_of(const RecipeStage& s) { return int(s.dp * s.tp * s.cp * s.pp); }

// What each rank of the next stage receives at a boundary, by hand, for stages without tensor
// or pipeline parallelism and without ZeRO (the lesson's recipes). Every rank holds the whole
// state: n weights and two AdamW moments of `elem` bytes each. Saving (here: into memory), rank d
// of stage A's W_A ranks writes elements [n d / W_A, n (d+1) / W_A) of each of the three; every
// rank of stage B reads all n of each. A rank receives what it reads and had not written itself:
//   moved(r) = 3 elem (n - [r < W_A] (floor(n (r+1) / W_A) - floor(n r / W_A)))
// On the same mesh nothing is read: the ranks go on with the state they hold.
std::vector<int64_t> hand_moved(int64_t n, int64_t elem, const RecipeStage& a, const RecipeStage& b) {
  const int wa = ranks_of(a), wb = ranks_of(b);
  if (a.mesh() == b.mesh()) return std::vector<int64_t>(size_t(wb), 0);
  std::vector<int64_t> out;
  for (int r = 0; r < wb; ++r) {
    const int64_t wrote = r < wa ? n * (r + 1) / wa - n * r / wa : 0;
    out.push_back(3 * elem * (n - wrote));
  }
  return out;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// 6 N_matmul + 12 L (nh hd) T per token, written from the shapes (core/model/flops.h states the
// same convention; the exercise compares the two).
double flops_per_token(const LlamaConfig& c, int64_t T) {
  const double C = double(c.hidden_size), q = double(c.num_attention_heads * c.head_dim),
               kv = double(c.num_key_value_heads * c.head_dim), I = double(c.intermediate_size);
  const double per_layer = C * q + 2 * C * kv + q * C + 3 * C * I;
  const double n_matmul = double(c.num_hidden_layers) * per_layer + double(c.vocab_size) * C;
  return 6 * n_matmul + 12 * double(c.num_hidden_layers) * q * double(T);
}

class Runs {
 public:
  Runs(Cli& cli, const RecipeArgs& a, std::string recipe, fs::path work)
      : cli_(cli), a_(a), recipe_(std::move(recipe)), work_(std::move(work)) {}
  // `train --recipe` of the lesson's run into work/NAME, with `extra` flags.
  nlohmann::json train(const std::string& name, const std::string& extra = "") {
    return cli_.run("train --preset " + a_.preset + " --recipe " + shell_word(recipe_) + " --eval-windows " +
                    std::to_string(a_.eval_windows) + extra + " --out " + shell_word(dir(name).string()));
  }
  fs::path dir(const std::string& name) const { return work_ / name; }

 private:
  Cli& cli_;
  const RecipeArgs& a_;
  std::string recipe_;
  fs::path work_;
};

// ---- Phase 1: Llama 3's recipe ---------------------------------------------------------------

nlohmann::json paper_recipe(Narrator& say, ExerciseSheet& sheet) {
  say.phase("Llama 3's recipe, in tokens", "core/train/recipe.h (the recipe as data), data/recipes/laptop.json");
  say.say(
      "Llama 3 405B did not train at one shape (\"The Llama 3 Herd of Models\", 2024, section 3.4):\n"
      "  - batches of 4M tokens in sequences of 4,096; after 252M tokens, 8M tokens of 8,192; after\n"
      "    2.87T tokens, 16M tokens (section 3.4.1);\n"
      "  - at the end of pre-training, the context grown from 8K to 128K in six stages over about 800B\n"
      "    tokens (3.4.2), on a layout with context parallelism: tp=8, cp=16, pp=16, dp=8 on 16,384\n"
      "    GPUs, 16M tokens a batch of 131,072-token sequences (Table 4);\n"
      "  - a data mix of about 50% general knowledge, 25% mathematics and reasoning, 17% code and 8%\n"
      "    multilingual tokens (3.1.2);\n"
      "  - the last 40M tokens annealed, the learning rate going linearly to 0 on upsampled very\n"
      "    high-quality data, and the checkpoints of the annealing averaged into the final model (3.4.3).\n\n");
  say.ask("P1", "How many sequences of 4,096 tokens make one of Llama 3's first batches of 4M tokens?");
  say.ask("P2", "How many optimizer steps is the annealing: the last 40M tokens, at 16M tokens a step?");
  const double p1 = kFirstBatch / kFirstSeq, p2 = kAnnealTokens / kLastBatch;
  say.say("4M / 4,096 = " + fixed(p1, 0) + " sequences a step; 40M / 16M = " + fixed(p2, 1) +
          " steps: the paper's annealing, as printed, is under three optimizer steps of its last batch.\n");
  Exercise e1;
  e1.id = "P1";
  e1.question = "Sequences of 4,096 tokens in a batch of 4M tokens?";
  e1.formula = "4 x 2^20 / 4,096 = 1,024 (M = 2^20: the paper's powers of two)";
  e1.value = p1;
  e1.pass = p1 == 1024;
  sheet.add(e1);
  sheet.answer("P1", {.value = p1, .unit = "sequences", .of = "the batch"});
  Exercise e2;
  e2.id = "P2";
  e2.question = "Optimizer steps in 40M tokens of annealing at 16M tokens a step?";
  e2.formula = "40M / 16M = 2.5";
  e2.value = p2;
  e2.pass = p2 == 2.5;
  sheet.add(e2);
  sheet.answer("P2", {.value = p2, .unit = "steps", .of = "the annealing", .tolerance = 0.05});
  say.pause();
  return {{"first_batch_tokens", kFirstBatch}, {"first_seq_len", kFirstSeq}, {"sequences_per_first_batch", p1},
          {"anneal_tokens", kAnnealTokens}, {"last_batch_tokens", kLastBatch}, {"anneal_steps", p2},
          {"data_mix", {{"general", 0.50}, {"math_reasoning", 0.25}, {"code", 0.17}, {"multilingual", 0.08}}},
          {"long_context", {{"stages", 6}, {"tokens", 800e9}, {"from", 8192}, {"to", 131072}}}};
}

// ---- Phase 2: the lesson's recipe ------------------------------------------------------------

void show_recipe(Narrator& say, ExerciseSheet& sheet, const Recipe& recipe, const std::string& file) {
  say.phase("the recipe, stage by stage: " + file, "core/train/recipe.cpp (parse_recipe, stage_options)");
  std::string t = "  #  stage      rows x seq  tok/step  steps  mesh        ranks  lr                      data\n";
  for (size_t i = 0; i < recipe.stages.size(); ++i) {
    const RecipeStage& s = recipe.stages[i];
    std::string data;
    for (const MixEntry& e : s.data)
      data += (data.empty() ? "" : ", ") + fs::path(e.path).filename().string() + "=" + number_text(e.weight);
    char line[320];
    std::snprintf(line, sizeof line, "  %zu  %-10s %4lld x %-5lld %8lld  %5lld  %-10s  %5d  %-7s %.3g -> %-9.3g  %s\n",
                  i + 1, s.name.c_str(), (long long)s.batch_size, (long long)s.seq_len,
                  (long long)(s.batch_size * s.seq_len), (long long)s.steps, s.mesh().c_str(), ranks_of(s),
                  s.lr.shape_name.c_str(), s.lr.from, s.lr.to, data.c_str());
    t += line;
  }
  say.say(t + "\nA stage's tokens are its steps x rows x seq; the LR segments join end to end.\n\n");
  say.ask("T1", "How many tokens does the whole recipe train (the stages' steps x rows x seq, summed)?");
  say.pause();
  (void)sheet;
}

// ---- Phase 3: the run, and what each boundary moved -------------------------------------------

nlohmann::json boundaries(Narrator& say, ExerciseSheet& sheet, const Recipe& recipe, const nlohmann::json& run,
                          const LlamaConfig& cfg) {
  say.phase("the run: what each stage boundary moved, in memory",
            "cli/train_command.cpp (run_recipe), core/parallel/reshard_in_memory.h (InMemoryReshard), "
            "core/train/state_image.h (moves), core/parallel/parallel_trainer.h (continue_with)");
  const int64_t n = cfg.num_parameters(), elem = 4;  // fp32 training state
  say.say("State: " + grouped(n) + " weights and two AdamW moments of 4 bytes, S = 3 x 4 x n = " +
          grouped(3 * elem * n) + " bytes, whole on every rank (no ZeRO).\n\n");
  int first_asked = -1, in_place_asked = -1;
  for (size_t i = 1; i < recipe.stages.size(); ++i) {
    if (first_asked < 0 && recipe.stages[i - 1].mesh() != recipe.stages[i].mesh()) first_asked = int(i);
    if (in_place_asked < 0 && recipe.stages[i - 1].mesh() == recipe.stages[i].mesh()) in_place_asked = int(i);
  }
  const auto id_of = [](size_t i) { return "R" + std::to_string(i); };
  if (first_asked > 0)
    say.ask(id_of(size_t(first_asked)),
            "How many bytes move at the boundary into stage " + std::to_string(first_asked + 1) + " (mesh " +
                recipe.stages[size_t(first_asked) - 1].mesh() + " -> " + recipe.stages[size_t(first_asked)].mesh() +
                "), summed over the ranks?");
  if (in_place_asked > 0)
    say.ask(id_of(size_t(in_place_asked)),
            "How many bytes move at the boundary into stage " + std::to_string(in_place_asked + 1) + ", on the same mesh " +
                recipe.stages[size_t(in_place_asked)].mesh() + " as the stage before, summed over the ranks?");
  const nlohmann::json& stages = run.at("stages");
  nlohmann::json out = nlohmann::json::array();
  bool kept_right = true;
  std::string t = "  into stage        from -> to              bytes read   bytes moved   by hand       seconds\n";
  for (size_t i = 1; i < recipe.stages.size(); ++i) {
    const nlohmann::json& r = stages.at(i).at("reshard");
    const std::vector<int64_t> measured = r.at("bytes_moved_per_rank").get<std::vector<int64_t>>();
    const std::vector<int64_t> expected = hand_moved(n, elem, recipe.stages[i - 1], recipe.stages[i]);
    const bool in_place = r.at("in_place").get<bool>();
    char line[256];
    std::snprintf(line, sizeof line, "  %zu %-14s  %-9s -> %-9s  %11s  %12s  %12s  %s\n", i + 1,
                  ("(" + recipe.stages[i].name + ")").c_str(), r.at("from_mesh").get<std::string>().c_str(),
                  r.at("to_mesh").get<std::string>().c_str(), grouped(r.at("bytes_read").get<int64_t>()).c_str(),
                  grouped(r.at("bytes_moved").get<int64_t>()).c_str(), grouped(sum(expected)).c_str(),
                  in_place ? "in place" : fixed(r.at("seconds"), 3).c_str());
    t += line;
    const bool same_mesh = recipe.stages[i - 1].mesh() == recipe.stages[i].mesh();
    sheet.exact(id_of(i),
                "Bytes each rank received at the boundary into stage " + std::to_string(i + 1) + " (" +
                    recipe.stages[i - 1].mesh() + " -> " + recipe.stages[i].mesh() + ")?",
                same_mesh ? "0: the same mesh and plan; every rank goes on with the state it holds"
                          : "3 x 4 x (n - what the same rank wrote): rank d of " +
                                std::to_string(ranks_of(recipe.stages[i - 1])) + " wrote [n d/W, n (d+1)/W) of each",
                -1, expected, measured);
    kept_right = kept_right && same_mesh == in_place;
    sheet.answer(id_of(i), {.value = double(sum(measured)), .unit = "bytes", .of = "the boundary"});
    out.push_back({{"into_stage", i + 1}, {"from_mesh", r.at("from_mesh")}, {"to_mesh", r.at("to_mesh")},
                   {"in_place", in_place}, {"bytes_read", r.at("bytes_read")}, {"bytes_moved", r.at("bytes_moved")},
                   {"bytes_moved_per_rank", measured}, {"expected_bytes_moved", sum(expected)},
                   {"expected_bytes_moved_per_rank", expected}, {"seconds", r.at("seconds")}});
  }
  say.say(t + "(seconds: this machine's wall clock, capture and restore; they vary run to run)\n");
  Exercise k1;
  k1.id = "K1";
  k1.question = "Which boundaries keep the state in place?";
  k1.formula = "exactly those between stages of the same mesh (and plan): there every rank already holds what it keeps";
  k1.pass = kept_right;
  k1.note = "train's \"in_place\" per boundary";
  sheet.add(k1);
  say.pause();
  return out;
}

// ---- Phase 4: per stage ------------------------------------------------------------------------

struct StageView {
  nlohmann::json table, curve;
};

StageView per_stage(Narrator& say, ExerciseSheet& sheet, const Recipe& recipe, const nlohmann::json& run,
                    const LlamaConfig& cfg, const fs::path& metrics) {
  say.phase("per stage: loss, tokens/s here and on the simulated clock, the data each source gave",
            "core/model/flops.h (training_flops_per_token), core/data/data_mix.h (DataMix), "
            "core/comm/trace.h (the simulated clock)");
  const int64_t T = recipe.stages.back().seq_len;
  say.ask("F1", "Training FLOPs per token at the last stage's sequence length of " + std::to_string(T) +
                    " (6 N_matmul + 12 L nh hd T)?");
  // The annealing stage: the last one drawing from several sources; the last source is the
  // upsampled one.
  int mixed = -1;
  for (size_t i = 0; i < recipe.stages.size(); ++i)
    if (recipe.stages[i].data.size() > 1) mixed = int(i);
  if (mixed >= 0)
    say.ask("D1", "What share of stage " + std::to_string(mixed + 1) + "'s rows should its last source, " +
                      fs::path(recipe.stages[size_t(mixed)].data.back().path).filename().string() +
                      ", get (its weight over the sum of the weights)?");
  // The loss curve, from metrics.jsonl: one row per step, named by stage.
  nlohmann::json curve = nlohmann::json::array();
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    curve.push_back({{"step", row.at("step")}, {"stage", row.at("stage")}, {"loss", row.at("loss")}, {"lr", row.at("lr")}});
  }
  const nlohmann::json& stages = run.at("stages");
  std::string t = "  #  stage      first loss  last loss  val loss  tok/s here  sim tok/s  sim us/step  FLOPs/token  "
                  "attention\n";
  nlohmann::json table = nlohmann::json::array();
  for (size_t i = 0; i < stages.size(); ++i) {
    const nlohmann::json& s = stages[i];
    const RecipeStage& st = recipe.stages[i];
    double first = NAN;
    for (const nlohmann::json& c : curve)
      if (c.at("stage") == st.name) {
        first = c.at("loss");
        break;
      }
    const double f = flops_per_token(cfg, st.seq_len);
    const double attention = 12.0 * double(cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * st.seq_len) / f;
    const double sim_tps = s.at("simulated").at("tokens_per_s"), step_us = s.at("simulated").at("step_us");
    char line[256];
    std::snprintf(line, sizeof line, "  %zu  %-10s %10.4f %10.4f %9s %11.0f %10.3g %12.1f %12s %8.1f%%\n", i + 1,
                  st.name.c_str(), first, s.at("final_loss").get<double>(),
                  s.at("val_loss").is_number() ? fixed(s.at("val_loss"), 4).c_str() : "-",
                  s.at("tokens_per_s").get<double>(), sim_tps, step_us, grouped(int64_t(f)).c_str(), 100 * attention);
    t += line;
    table.push_back({{"stage", st.name}, {"first_loss", first}, {"final_loss", s.at("final_loss")},
                     {"val_loss", s.at("val_loss")}, {"tokens_per_s", s.at("tokens_per_s")},
                     {"simulated_tokens_per_s", sim_tps}, {"simulated_step_us", step_us}, {"flops_per_token", f},
                     {"attention_share", attention}, {"data", s.at("data")}});
  }
  say.say(t + "(tok/s here: this machine's wall clock, which varies; sim: the slowest rank's simulated clock)\n"
              "Attention's FLOPs grow with the sequence, the weights' do not: at a constant number of tokens a\n"
              "step, each doubling of the sequence adds 12 L nh hd T FLOPs to every token.\n\n");
  std::string d = "  data per stage: source (weight share -> share of the rows drawn)\n";
  for (size_t i = 0; i < stages.size(); ++i) {
    d += "  " + std::to_string(i + 1) + "  " + recipe.stages[i].name + ":";
    for (const nlohmann::json& src : stages[i].at("data"))
      d += "  " + fs::path(src.at("source").get<std::string>()).filename().string() + " " +
           fixed(src.at("weight_share"), 3) + " -> " + fixed(src.at("share"), 3) + " (" +
           std::to_string(src.at("rows").get<int64_t>()) + " rows)";
    d += "\n";
  }
  say.say(d);
  const double library = training_flops_per_token(cfg, T), mine = flops_per_token(cfg, T);
  Exercise f1;
  f1.id = "F1";
  f1.question = "Training FLOPs per token at seq_len " + std::to_string(T) + "?";
  f1.formula = "6 N_matmul + 12 L nh hd T, N_matmul = L (C q + 2 C kv + q C + 3 C I) + V C";
  f1.value = library;
  f1.pass = std::abs(library - mine) < 1e-6 * mine;
  f1.note = "core/model/flops.h against the formula written in this lesson";
  sheet.add(f1);
  sheet.answer("F1", {.value = library, .unit = "FLOPs", .of = "a token", .tolerance = 0.5});
  if (mixed >= 0) {
    const nlohmann::json& last = stages[size_t(mixed)].at("data").back();
    const double w = last.at("weight_share"), got = last.at("share");
    const int64_t rows = stages[size_t(mixed)].at("steps").get<int64_t>() * recipe.stages[size_t(mixed)].batch_size;
    const double sigma = std::sqrt(w * (1 - w) / double(rows));
    Exercise d1;
    d1.id = "D1";
    d1.question = "Share of stage " + std::to_string(mixed + 1) + "'s rows from its upsampled source?";
    d1.formula = "its weight / the sum of the weights; drawn within 3 binomial sigmas, sqrt(w (1 - w) / rows)";
    d1.value = got;
    d1.pass = std::abs(got - w) <= 3 * sigma;
    d1.note = "drawn " + fixed(got, 3) + " of " + std::to_string(rows) + " rows, expected " + fixed(w, 3) + " +- " +
              fixed(3 * sigma, 3);
    sheet.add(d1);
    sheet.answer("D1", {.value = w, .unit = "share of the rows", .of = "the stage", .tolerance = 0.005});
  }
  say.pause();
  return {table, curve};
}

// ---- Phase 5: in memory or through the disk -------------------------------------------------

nlohmann::json bitwise(Narrator& say, ExerciseSheet& sheet, Runs& runs, const Recipe& recipe) {
  say.phase("the bitwise check: each boundary in memory against saving and resuming on the next plan",
            "core/io/checkpoint.h (save_checkpoint), core/parallel/parallel_trainer.cpp (load_checkpoint)");
  say.ask("B1", "Summed over every boundary, how many bytes of the final model.safetensors and "
                "optimizer.safetensors differ between the run that moved its state in memory and the runs "
                "stopped at the boundary (--stop-at), saved and resumed on the next stage's plan?");
  nlohmann::json per = nlohmann::json::object();
  int64_t total = 0;
  for (size_t i = 1; i < recipe.stages.size(); ++i) {
    const std::string stop = "stop" + std::to_string(i), resumed = "resumed" + std::to_string(i);
    runs.train(stop, " --stop-at " + std::to_string(recipe.first_step(i)));
    runs.train(resumed, " --resume " + shell_word((runs.dir(stop) / "checkpoint").string()));
    int64_t n = 0;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      n += differing_bytes(runs.dir(resumed) / "checkpoint" / file, runs.dir("run") / "checkpoint" / file);
    const std::string name = "into stage " + std::to_string(i + 1);
    per[name] = n;
    total += n;
    say.say("  " + name + " (" + recipe.stages[i - 1].mesh() + " -> " + recipe.stages[i].mesh() + "): " + grouped(n) +
            " bytes differ\n");
  }
  say.say("Moving the state in memory runs the code that writes and reads a checkpoint, without the files; on\n"
          "the same mesh each rank keeps what it holds, which is what it would read back: `cmp` prints nothing.\n");
  sheet.exact("B1", "Bytes of the final checkpoints that differ, in memory against save + resume?",
              "0: the in-memory boundary is the checkpoint's code path; kept in place, the state is what a resume reads",
              -1, {0}, {total});
  sheet.answer("B1", {.value = double(total), .unit = "bytes", .of = "the boundaries"});
  say.pause();
  return per;
}

int run(const LessonOptions& o, const RecipeArgs& a) {
  Narrator say(o);
  ExerciseSheet sheet;
  const LlamaConfig cfg = LlamaConfig::preset(a.preset);  // InputError naming an unknown preset
  if (cfg.moe())
    throw InputError("--preset " + a.preset + ": this lesson counts a dense model's FLOPs per token; use tiny or small");
  const WorkDirectory work_directory(a.work, "lesson11");
  const fs::path& work = work_directory.path();
  std::string file = a.recipe;
  if (file.empty()) {
    const fs::path corpus = default_corpus_path();
    file = (work / "recipe.json").string();
    write_text_file_atomically(file, lesson_recipe(corpus.string(), (corpus / "part-02-01.txt").string()));
  }
  const Recipe recipe = load_recipe(file, cfg.max_position_embeddings);
  for (size_t i = 0; i < recipe.stages.size(); ++i)
    if (recipe.stages[i].tp > 1 || recipe.stages[i].pp > 1)
      throw InputError("--recipe " + file + ": recipe stage " + std::to_string(i + 1) + " (\"" + recipe.stages[i].name +
                       "\") has mesh " + recipe.stages[i].mesh() +
                       ": this lesson's hand arithmetic covers stages of dp and cp only");
  Cli cli(say, (work / "llama4d.log").string());
  Runs runs(cli, a, file, work);

  const nlohmann::json paper = paper_recipe(say, sheet);
  show_recipe(say, sheet, recipe, a.recipe.empty() ? "the lesson's own (work/recipe.json)" : file);
  const nlohmann::json run = runs.train("run");
  int64_t expected_tokens = 0, measured_tokens = 0;
  for (const RecipeStage& s : recipe.stages) expected_tokens += s.tokens();
  for (const nlohmann::json& s : run.at("stages")) measured_tokens += s.at("tokens").get<int64_t>();
  sheet.exact("T1", "Tokens the whole recipe trains?", "the sum over the stages of steps x rows x seq_len", -1,
              {expected_tokens}, {measured_tokens}, "measured: the tokens train reports per stage");
  sheet.answer("T1", {.value = double(measured_tokens), .unit = "tokens", .of = "the recipe"});
  const nlohmann::json moved = boundaries(say, sheet, recipe, run, cfg);
  const StageView stages = per_stage(say, sheet, recipe, run, cfg, runs.dir("run") / "metrics.jsonl");
  const nlohmann::json compared = bitwise(say, sheet, runs, recipe);

  sheet.set_predictions(say.predictions());
  sheet.set_asked(say.asked());
  say.say("\n" + sheet.report());
  const bool passed = sheet.failed() == 0;
  if (o.json) {
    const nlohmann::json j = {{"lesson", "11-training-recipe"}, {"preset", a.preset},
                              {"recipe", recipe.to_json()},     {"paper", paper},
                              {"parameters", cfg.num_parameters()}, {"stages", stages.table},
                              {"boundaries", moved},            {"curve", stages.curve},
                              {"final_loss", run.at("final_loss")}, {"differing_bytes", compared},
                              {"exercises", sheet.to_json()},   {"asked", sheet.asked_json()},
                              {"passed", passed}};
    std::printf("%s\n", j.dump().c_str());
  }
  return passed ? 0 : 1;
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::RecipeArgs a;
  CLI::App app{"Lesson 11: Llama 3's training recipe: batch and sequence ramps with the mesh changing in memory, "
               "the data mix and the annealing, bit for bit against saving and resuming",
               "lesson11_training_recipe"};
  app.add_option("--preset", a.preset, "the model (the lesson's own recipe fits tiny's 128 positions)")
      ->capture_default_str();
  app.add_option("--recipe", a.recipe,
                 "run this recipe instead of the lesson's own (stages of dp and cp; e.g. data/recipes/laptop.json "
                 "with --preset small)");
  llama4d::cli::add_number(app, "--eval-windows", a.eval_windows, "validation windows at the end of each stage", 1,
                           1 << 20)
      ->capture_default_str();
  app.add_option("--work", a.work, "where to write (default: a temporary directory, removed at the end)");
  app.add_flag("--step", options.step, "pause at every phase (press Enter; never blocks when stdin is not a terminal)");
  app.add_flag("--json", options.json, "print one JSON object (measured vs expected) on stdout; narration on stderr");
  app.add_option("--predict", options.predict, "predictions as if typed at the questions, ID=NUMBER each (P1=1024)");
  return llama4d::lesson::lesson_main(app, argc, argv, [&] { return llama4d::lesson::run(options, a); });
}
