// Lesson 10: fault tolerance as Llama 3 needed it. Each phase runs the `llama4d` commands a
// learner types (the CLI beside this program) and reads their --json:
//   1. the failure model: how many interruptions a run should expect, from Llama 3's rate;
//   2. each kind of failure injected into a 4D run on 16 virtual GPUs (`train --faults`), and what
//      named it: the injector's error, the peers' timeout and the flight recorder, the replicas'
//      checksums (--check-replicas); the supervisor (--max-restarts) restarts the run;
//   3. recovery from the disk checkpoint against recovery from in-memory copies on the partner
//      node (--memory-copy-every, Gemini's placement): the steps trained twice;
//   4. the goodput sweep over checkpoint intervals (`plan --checkpoint-s`): Young's τ = √(2δM),
//      Daly's refinement, the U-shaped curve;
//   5. the bitwise check: every recovered run's final checkpoint against an uninterrupted run's.
//   lesson10_fault_tolerance [--mesh tp=2,cp=2,pp=2,dp=2] [--rank 5] [--step] [--json]

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/plan/failure_model.h"
#include "lessons/common/cli_runner.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"

namespace fs = std::filesystem;

namespace llama4d::lesson {
namespace {

struct FaultArgs {
  std::string mesh = "tp=2,cp=2,pp=2,dp=2";
  int zero = 1;  // --check-replicas compares whole weights, which ZeRO-3 does not hold
  int64_t steps = 8, save_every = 3, kind_step = 5, crash_step = 6, batch_size = 4, micro_batch_size = 1, seq_len = 32;
  int rank = 5, gpus_per_node = 8;
  int timeout_s = 1;
  double checkpoint_s = 30, restart_s = 300;  // the 405B failure model's δ and R
  std::string work;
};

// Llama 3 405B's layout on 16,384 GPUs ("The Llama 3 Herd of Models", 2024, Table 4).
const char* kPaperPlan = "plan --preset llama3-405b --mesh tp=8,cp=1,pp=16,dp=128";

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

class Runs {
 public:
  Runs(Cli& cli, const FaultArgs& a, fs::path work) : cli_(cli), a_(a), work_(std::move(work)) {}
  // `train` of the lesson's run into work/NAME, with `extra` flags.
  nlohmann::json train(const std::string& name, const std::string& extra) {
    return cli_.run("train --preset tiny --mesh " + a_.mesh + " --zero " + std::to_string(a_.zero) + " --seq-len " +
                    std::to_string(a_.seq_len) + " --batch-size " + std::to_string(a_.batch_size) +
                    " --micro-batch-size " + std::to_string(a_.micro_batch_size) + " --steps " +
                    std::to_string(a_.steps) + " --eval-every 0 --timeout " + std::to_string(a_.timeout_s) + extra +
                    " --out " + shell_word(dir(name).string()));
  }
  fs::path dir(const std::string& name) const { return work_ / name; }
  // A fault schedule of one or more entries, written to work/NAME.json.
  std::string schedule(const std::string& name, const std::string& faults) const {
    const fs::path p = work_ / (name + ".json");
    std::ofstream(p, std::ios::trunc) << "{\"seed\": 1, \"faults\": [" << faults << "]}\n";
    return p.string();
  }

 private:
  Cli& cli_;
  const FaultArgs& a_;
  fs::path work_;
};

std::string fault(const std::string& kind, int rank, int64_t step, const std::string& more = "") {
  return "{\"kind\": \"" + kind + "\", \"rank\": " + std::to_string(rank) + ", \"step\": " + std::to_string(step) + more +
         "}";
}

// ---- Phase 1: how many failures to expect ---------------------------------------------------

nlohmann::json expected_failures(Narrator& say, ExerciseSheet& sheet, Cli& cli, const FaultArgs& a, int ranks) {
  say.phase("how many interruptions a run should expect", "core/plan/failure_model.h (FailureModel), cli/plan_command.cpp");
  say.say(
      "Llama 3 405B's pre-training: 466 job interruptions in 54 days on 16,384 H100s, 47 planned and 419\n"
      "unexpected; 58.7% of the unexpected were GPU issues (faulty GPUs 30.1%, HBM3 memory 17.2%), then\n"
      "software bugs 12.9%, network 8.4%, host maintenance 7.6%, and NCCL watchdog timeouts and silent data\n"
      "corruption among the rest (\"The Llama 3 Herd of Models\", 2024, section 3.3.4, Table 5).\n"
      "Failures are independent per GPU, so the job's rate is the GPUs times one GPU's rate.\n\n");
  say.ask("E1", "At that rate, how many interruptions a day should a job on 16,384 GPUs expect?");
  say.ask("E2", "And a 54-day run on this lesson's " + std::to_string(ranks) +
                    " GPUs: how many interruptions should it expect?");
  const std::string model = " --checkpoint-s " + number_text(a.checkpoint_s) + " --restart-s " + number_text(a.restart_s);
  const nlohmann::json paper = cli.run(std::string(kPaperPlan) + model).at("failure_model");
  const nlohmann::json small = cli.run("plan --preset tiny --mesh " + a.mesh + " --zero " + std::to_string(a.zero) + model)
                                   .at("failure_model");
  const double per_day = paper.at("expected_interruptions_per_day"), small_run = 54 * small.at("expected_interruptions_per_day").get<double>();
  say.say("16,384 GPUs: job MTBF " + fixed(paper.at("job_mtbf_hours"), 2) + " h, " + fixed(per_day, 2) +
          " interruptions a day\n" + std::to_string(ranks) + " GPUs: job MTBF " + fixed(small.at("job_mtbf_hours"), 0) +
          " h, " + fixed(small_run, 3) + " interruptions in 54 days\n");
  Exercise e1;
  e1.id = "E1";
  e1.question = "Interruptions a day on 16,384 GPUs at Llama 3's rate?";
  e1.formula = "419 / 54 = " + fixed(419.0 / 54, 2) + ": the paper's run was that size";
  e1.value = per_day;
  e1.pass = std::abs(per_day - 419.0 / 54) < 1e-9;
  sheet.add(e1);
  sheet.answer("E1", {.value = per_day, .unit = "interruptions", .of = "the job", .tolerance = 0.05});
  Exercise e2;
  e2.id = "E2";
  e2.question = "Interruptions in 54 days on " + std::to_string(ranks) + " GPUs?";
  e2.formula = "419 x " + std::to_string(ranks) + " / 16,384 = " + fixed(419.0 * ranks / 16384, 3) +
               ": a failure is rare on a few GPUs; scale makes it constant";
  e2.value = small_run;
  e2.pass = std::abs(small_run - 419.0 * ranks / 16384) < 1e-9;
  sheet.add(e2);
  sheet.answer("E2", {.value = small_run, .unit = "interruptions", .of = "the run", .tolerance = 0.005});
  say.pause();
  return {{"paper", paper}, {"lesson", small}};
}

// ---- Phase 2: each kind, injected and named ---------------------------------------------------

struct Kind {
  std::string kind, extra, named, why;  // named: what the first failure's cause must contain ("" : no failure)
};

nlohmann::json each_kind(Narrator& say, ExerciseSheet& sheet, Runs& runs, Cli& cli, const FaultArgs& a, int ranks) {
  say.phase("each kind of failure, injected into " + std::to_string(ranks) + " virtual GPUs (" + a.mesh + ") and named",
            "core/parallel/fault_schedule.h, core/parallel/fault_injector.h, core/comm/flight_recorder.h "
            "(flight_diagnosis), cli/train_command.cpp (supervise)");
  const std::string r = std::to_string(a.rank), s = std::to_string(a.kind_step);
  const std::vector<Kind> kinds = {
      {"crash", "", "injected crash on rank " + r + " at step " + s, "a faulty GPU: the rank throws"},
      {"hang", "", "timeout after " + std::to_string(a.timeout_s * 1000) + " ms",
       "an NCCL watchdog timeout: the rank stops answering without dying"},
      {"slow", ", \"factor\": 3, \"steps\": 2", "", "a throttled GPU: 3 times slower for 2 steps"},
      {"collective", "", "injected collective failure on rank " + r + " at step " + s,
       "a network link: the rank's first collective of the step fails mid-call"},
      {"sdc", "", "the weights of world rank " + r + " differ", "silent data corruption: one bit of its weights flips"},
  };
  say.say("Each run: " + std::to_string(a.steps) + " steps, a checkpoint every " + std::to_string(a.save_every) +
          " (--save-every), --check-replicas, --max-restarts 1, peers time out after " + std::to_string(a.timeout_s) +
          " s (--timeout); one fault on rank " + r + " at step " + s + ".\n\n");
  say.ask("K1", "Of the five kinds (crash, hang, slow, collective, sdc), how many kinds stop the run, so that the "
                "supervisor restarts it?");
  nlohmann::json out = nlohmann::json::array();
  int stopped = 0;
  bool all_named = true;
  for (const Kind& k : kinds) {
    say.say("\n-- " + k.kind + ": " + k.why + "\n");
    const nlohmann::json j = runs.train(k.kind, " --save-every " + std::to_string(a.save_every) +
                                                    " --check-replicas --max-restarts 1 --json --faults " +
                                                    runs.schedule(k.kind, fault(k.kind, a.rank, a.kind_step, k.extra)));
    const nlohmann::json& g = j.at("goodput");
    const int restarts = g.at("restarts");
    const std::string cause = g.at("failures").empty() ? "" : g.at("failures")[0].get<std::string>();
    std::string diagnosis;
    const fs::path fr = runs.dir(k.kind) / "flight_recorder.json";
    if (fs::exists(fr)) diagnosis = nlohmann::json::parse(read_bytes(fr)).at("diagnosis");
    std::string restart_line;
    for (size_t at = 0; (at = cli.last_stderr().find("train: restarting", at)) != std::string::npos; ++at)
      restart_line = cli.last_stderr().substr(at, cli.last_stderr().find('\n', at) - at);
    say.say(cause.empty() ? "no failure: the run finished without a restart\n" : "failed: " + cause + "\n");
    if (!diagnosis.empty()) say.say("flight recorder, first line: " + diagnosis.substr(0, diagnosis.find('\n')) + "\n");
    if (!restart_line.empty()) say.say(restart_line.substr(7) + "\n");
    // The straggler check (core/parallel/straggler_detector.h) reports a slow rank and stops nothing.
    if (k.kind == "slow" && j.contains("stragglers"))
      for (const nlohmann::json& st : j.at("stragglers"))
        say.say("straggler: rank " + std::to_string(st.at("rank").get<int>()) + ", steps " +
                std::to_string(st.at("first_step").get<int64_t>()) + "-" + std::to_string(st.at("last_step").get<int64_t>()) +
                ", worst " + (st.at("worst_ratio").is_null() ? std::string("inf") : std::to_string(st.at("worst_ratio").get<double>())) +
                "x the median\n");
    // What named it: the failure's cause; for a hang, the flight recorder, which looks at every
    // rank's last calls (the timeout names whichever peer a waiting rank waited on).
    const bool named = k.named.empty() ? restarts == 0
                       : k.kind == "hang" ? restarts == 1 && cause.find(k.named) != std::string::npos &&
                                                diagnosis.rfind("rank " + r + " did not enter", 0) == 0
                                          : restarts == 1 && cause.find(k.named) != std::string::npos;
    all_named = all_named && named;
    stopped += restarts > 0 ? 1 : 0;
    out.push_back({{"kind", k.kind}, {"fault", fault(k.kind, a.rank, a.kind_step, k.extra)}, {"restarts", restarts},
                   {"cause", cause}, {"diagnosis", diagnosis}, {"lost_steps", g.at("lost_steps")},
                   {"goodput", g}, {"named", named}});
  }
  Exercise k1;
  k1.id = "K1";
  k1.question = "How many of the five kinds stop the run (a restart)?";
  k1.formula = "4: crash, hang, collective and sdc (found by --check-replicas); a straggler only costs time: the "
               "straggler check names it (--straggler-factor) and the run goes on";
  k1.value = stopped;
  k1.pass = stopped == 4 && all_named;
  k1.note = "and each stopping one was named: the rank and what it did (the hang by the flight recorder)";
  sheet.add(k1);
  sheet.answer("K1", {.value = double(stopped), .unit = "kinds", .of = "the five runs"});
  say.pause();
  return out;
}

// ---- Phase 3: from memory or from disk --------------------------------------------------------

// N of the supervisor's last "train: restarting (i of n) from ... (step N)" line; -1 if none.
int64_t restarted_from(const std::string& err) {
  const size_t at = err.rfind("train: restarting");
  if (at == std::string::npos) return -1;
  const size_t step = err.find("(step ", at), end = err.find('\n', at);
  if (step == std::string::npos || step > end) return -1;
  return std::stoll(err.substr(step + 6));
}

nlohmann::json memory_or_disk(Narrator& say, ExerciseSheet& sheet, Runs& runs, Cli& cli, const FaultArgs& a, int ranks) {
  say.phase("recovery from disk, and from the in-memory copies on the partner node",
            "core/parallel/memory_copies.h (MemoryCopies), core/train/goodput.h (GoodputLedger)");
  const int64_t f = a.crash_step, K = a.save_every;
  const int nodes = ranks / a.gpus_per_node;
  say.say("A crash on rank " + std::to_string(a.rank) + " at step " + std::to_string(f) + ".\nFrom disk: a checkpoint every " +
          std::to_string(K) + " steps (--save-every).\nFrom memory: after every step each rank keeps its shard of "
          "the state and a copy of its partner's,\nthe same GPU on the next node (" + std::to_string(nodes) + " nodes of " +
          std::to_string(a.gpus_per_node) + "; Gemini, Wang et al., SOSP 2023). A crashed rank takes its\n"
          "node's memory with it; its partner's copy survives.\n\n");
  say.ask("L1", "From disk: after how many steps does the restarted run pick up (the step it restarts from)?");
  say.ask("L2", "From the in-memory copies (taken every step): after how many steps does it pick up?");
  const std::string crash = runs.schedule("crash", fault("crash", a.rank, f));
  const std::string common = " --save-every " + std::to_string(K) + " --max-restarts 2 --json --faults ";
  const nlohmann::json disk = runs.train("disk", common + crash).at("goodput");
  const int64_t disk_from = restarted_from(cli.last_stderr());
  const nlohmann::json memory = runs.train("memory", " --gpus-per-node " + std::to_string(a.gpus_per_node) +
                                                         " --memory-copy-every 1" + common + crash)
                                    .at("goodput");
  const int64_t memory_from = restarted_from(cli.last_stderr());
  const bool memory_said = cli.last_stderr().find("from the in-memory copies (step") != std::string::npos;
  // Both holders of a shard lost: a crash on each node.
  const int other = (a.rank + a.gpus_per_node) % ranks;
  const nlohmann::json both = runs.train("both_nodes", " --gpus-per-node " + std::to_string(a.gpus_per_node) +
                                                           " --memory-copy-every 1" + common +
                                                           runs.schedule("both_nodes", fault("crash", a.rank, f) + ", " +
                                                                                           fault("crash", other, f)))
                                  .at("goodput");
  const std::string& err = cli.last_stderr();
  const size_t why = err.find("cannot recover from memory");
  const std::string fallback = why == std::string::npos ? "" : err.substr(why, err.find('\n', why) - why);
  const auto row = [](const std::string& name, int64_t from, const nlohmann::json& g) {
    return "  " + name + std::string(12 - name.size(), ' ') + "restarts after step " + std::to_string(from) +
           "; lost work " + fixed(g.at("lost_work_s"), 3) + " s, restart " + fixed(g.at("restart_s"), 3) +
           " s, copies " + fixed(g.at("memory_copy_s"), 3) + " s, goodput " +
           fixed(100 * g.at("goodput").get<double>(), 1) + "%\n";
  };
  say.say("\n" + row("from disk", disk_from, disk) + row("from memory", memory_from, memory) +
          "  (seconds: this machine's wall clock, which varies run to run)\nboth nodes: " +
          (fallback.empty() ? "no fallback was reported" : fallback) + "\n");
  sheet.exact("L1", "The step the run restarts from, recovering from disk?",
              "K floor((f - 1) / K): the last checkpoint before the crash; the f - 1 - that steps after it are "
              "trained again",
              -1, {K * ((f - 1) / K)}, {disk_from}, "read from train's 'restarting (1 of 2) from ... (step N)'");
  sheet.answer("L1", {.value = double(disk_from), .unit = "steps", .of = "the run"});
  sheet.exact("L2", "The step the run restarts from, recovering from memory?",
              "f - 1: a copy was taken after every step, and the partner node holds the crashed node's shards; "
              "nothing is trained again",
              -1, {f - 1}, {memory_said ? memory_from : -1}, "and train says it restarts from the in-memory copies");
  sheet.answer("L2", {.value = double(memory_from), .unit = "steps", .of = "the run"});
  Exercise m1;
  m1.id = "M1";
  m1.question = "Both holders of a shard lost (a crash on each node): where does the run recover from?";
  m1.formula = "disk: the copies refuse to pretend, and say which shard and holders were lost";
  m1.pass = both.at("recoveries").at("from_disk") == 1 && !fallback.empty();
  m1.note = "recoveries.from_disk = 1 and the fallback named";
  sheet.add(m1);
  say.pause();
  return {{"disk", disk}, {"memory", memory}, {"both_nodes", both}, {"fallback", fallback}};
}

// ---- Phase 4: the goodput sweep -------------------------------------------------------------

nlohmann::json goodput_sweep(Narrator& say, ExerciseSheet& sheet, const FaultArgs& a, const nlohmann::json& paper) {
  say.phase("goodput against the checkpoint interval, on Llama 3's 16,384 GPUs",
            "core/plan/failure_model.cpp (young_interval_s, daly_interval_s, goodput)");
  const double M = paper.at("job_mtbf_hours").get<double>() * 3600, d = a.checkpoint_s, R = a.restart_s;
  say.say("A checkpoint stalls training for δ = " + fixed(d, 0) + " s; a restart costs R = " + fixed(R, 0) +
          " s; the job's MTBF is M = " + fixed(M, 0) + " s.\nCheckpoint often and the stalls add up; seldom, and each "
          "failure loses more work.\n\n");
  say.ask("Y1", "Young's optimal interval, the square root of 2 δ M: how many seconds?");
  say.ask("G1", "The goodput at Daly's interval, in percent?");
  // Daly (2006): the expected wall time of τ seconds of work between checkpoints, under
  // exponential failures: M e^{R/M} (e^{(τ+δ)/M} - 1).
  const auto daly_goodput = [&](double t) { return t / (M * std::exp(R / M) * (std::exp((t + d) / M) - 1)); };
  std::string table = "  interval s   goodput\n";
  const nlohmann::json& sweep = paper.at("sweep");
  size_t best = 0;
  bool formula_holds = true;
  for (size_t i = 0; i < sweep.size(); ++i) {
    const double t = sweep[i].at("interval_s"), g = sweep[i].at("goodput");
    formula_holds = formula_holds && std::abs(g - daly_goodput(t)) < 1e-12;
    if (g > sweep[best].at("goodput").get<double>()) best = i;
    char line[96];
    std::snprintf(line, sizeof line, "  %10.0f   %5.1f%%  %s\n", t, 100 * g, std::string(size_t(std::max(0.0, (g - 0.7) * 200)), '#').c_str());
    table += line;
  }
  const double young = std::sqrt(2 * d * M), daly = paper.at("daly_interval_s"), at_daly = paper.at("goodput_at_daly");
  say.say(table + "Young: " + fixed(paper.at("young_interval_s"), 0) + " s; Daly: " + fixed(daly, 0) + " s, goodput " +
          fixed(100 * at_daly, 1) + "%; the paper reports more than 90% effective training time.\n");
  Exercise y1;
  y1.id = "Y1";
  y1.question = "Young's interval √(2 δ M), in seconds?";
  y1.formula = "√(2 x " + fixed(d, 0) + " x " + fixed(M, 0) + ") = " + fixed(young, 0) + " s (Young, 1974)";
  y1.value = paper.at("young_interval_s").get<double>();
  y1.pass = std::abs(*y1.value - young) < 1e-6;
  sheet.add(y1);
  sheet.answer("Y1", {.value = *y1.value, .unit = "seconds", .of = "the job", .tolerance = 5});
  Exercise g1;
  g1.id = "G1";
  g1.question = "Goodput at Daly's interval (percent)?";
  g1.formula = "τ / (M e^{R/M} (e^{(τ+δ)/M} - 1)) at Daly's τ (2006); the sweep's largest, in the middle of the U";
  g1.value = 100 * at_daly;
  g1.pass = formula_holds && std::abs(at_daly - daly_goodput(daly)) < 1e-12 && best == sweep.size() / 2 &&
            sweep.front().at("goodput").get<double>() < at_daly && sweep.back().at("goodput").get<double>() < at_daly;
  g1.note = "every point of the sweep equals Daly's formula, and the curve rises to Daly's interval and falls after it";
  sheet.add(g1);
  sheet.answer("G1", {.value = 100 * at_daly, .unit = "percent", .of = "the job", .tolerance = 0.05});
  say.pause();
  return {{"young_interval_s", young}, {"daly_interval_s", daly}, {"goodput_at_daly", at_daly}, {"sweep", sweep}};
}

// ---- Phase 5: recovery changed nothing ------------------------------------------------------

nlohmann::json bitwise(Narrator& say, ExerciseSheet& sheet, Runs& runs, const std::vector<std::string>& recovered) {
  say.phase("the bitwise check: every recovered run against one without failures",
            "core/io/checkpoint.h (save_checkpoint), core/parallel/parallel_trainer.cpp (load_checkpoint)");
  say.ask("B1", "Summed over the recovered runs, how many bytes of their final model.safetensors and "
                "optimizer.safetensors differ from the uninterrupted run's?");
  runs.train("straight", " --json");
  int64_t total = 0;
  nlohmann::json per = nlohmann::json::object();
  for (const std::string& name : recovered) {
    int64_t n = 0;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      n += differing_bytes(runs.dir(name) / "checkpoint" / file, runs.dir("straight") / "checkpoint" / file);
    per[name] = n;
    total += n;
    say.say("  " + name + std::string(12 - std::min<size_t>(12, name.size()), ' ') + grouped(n) + " bytes differ\n");
  }
  say.say("Batches are a function of the step, and every reduction adds in a fixed order, so the replayed\n"
          "steps compute the same bits: `cmp` of the files prints nothing.\n");
  sheet.exact("B1", "Bytes of the final checkpoints that differ from the uninterrupted run's?",
              "0: recovery replays the same steps on the same data from the same state", -1, {0}, {total});
  sheet.answer("B1", {.value = double(total), .unit = "bytes", .of = "the recovered runs"});
  say.pause();
  return per;
}

int run(const LessonOptions& o, const FaultArgs& a) {
  Narrator say(o);
  ExerciseSheet sheet;
  const WorkDirectory work_directory(a.work, "lesson10");
  const fs::path& work = work_directory.path();
  Cli cli(say, (work / "llama4d.log").string());
  Runs runs(cli, a, work);
  const int ranks = cli.run("plan --preset tiny --mesh " + a.mesh + " --zero " + std::to_string(a.zero))
                        .at("plan").at("world_size");

  const nlohmann::json expected = expected_failures(say, sheet, cli, a, ranks);
  const nlohmann::json kinds = each_kind(say, sheet, runs, cli, a, ranks);
  const nlohmann::json recovery = memory_or_disk(say, sheet, runs, cli, a, ranks);
  const nlohmann::json sweep = goodput_sweep(say, sheet, a, expected.at("paper"));
  const nlohmann::json compared =
      bitwise(say, sheet, runs, {"crash", "hang", "slow", "collective", "sdc", "disk", "memory", "both_nodes"});

  sheet.set_predictions(say.predictions());
  sheet.set_asked(say.asked());
  say.say("\n" + sheet.report());
  const bool passed = sheet.failed() == 0;
  if (o.json) {
    const nlohmann::json j = {{"lesson", "10-fault-tolerance"}, {"mesh", a.mesh},         {"ranks", ranks},
                              {"failure_model", expected},      {"kinds", kinds},         {"recovery", recovery},
                              {"goodput_sweep", sweep},         {"differing_bytes", compared},
                              {"exercises", sheet.to_json()},   {"asked", sheet.asked_json()}, {"passed", passed}};
    std::printf("%s\n", j.dump().c_str());
  }
  return passed ? 0 : 1;
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::FaultArgs a;
  CLI::App app{"Lesson 10: fault tolerance: failures injected into a 4D run, named, recovered from memory and disk "
               "bit for bit, and goodput",
               "lesson10_fault_tolerance"};
  app.add_option("--mesh", a.mesh, "the runs' mesh, innermost first")->capture_default_str();
  llama4d::cli::add_number(app, "--zero", a.zero, "the runs' ZeRO stage (--check-replicas needs 0-2)", 0, 2)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--rank", a.rank, "the rank every fault hits", 0, 1 << 20)->capture_default_str();
  llama4d::cli::add_number(app, "--steps", a.steps, "steps of every run", 2, 100000)->capture_default_str();
  llama4d::cli::add_number(app, "--save-every", a.save_every, "disk checkpoints every K steps", 1, 100000)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--kind-step", a.kind_step, "the step each kind of fault hits (phase 2)", 1, 100000)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--crash-step", a.crash_step, "the step of the crash recovered from (phase 3)", 1, 100000)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--gpus-per-node", a.gpus_per_node, "GPUs per node: where the in-memory copies go", 1,
                           1 << 20)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--timeout", a.timeout_s, "seconds a peer waits before naming a hung rank", 1, 600)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--batch-size", a.batch_size, "the global batch (sequences)", 1, 4096)->capture_default_str();
  llama4d::cli::add_number(app, "--micro-batch-size", a.micro_batch_size, "sequences per micro-batch", 1, 4096)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--seq-len", a.seq_len, "tokens per sequence", 2, 128)->capture_default_str();
  llama4d::cli::add_number(app, "--checkpoint-s", a.checkpoint_s, "the failure model's checkpoint stall δ (seconds)")
      ->capture_default_str();
  llama4d::cli::add_number(app, "--restart-s", a.restart_s, "the failure model's restart time R (seconds)")
      ->capture_default_str();
  app.add_option("--work", a.work, "where to write (default: a temporary directory, removed at the end)");
  app.add_flag("--step", options.step, "pause at every phase (press Enter; never blocks when stdin is not a terminal)");
  app.add_flag("--json", options.json, "print one JSON object (measured vs expected) on stdout; narration on stderr");
  app.add_option("--predict", options.predict, "predictions as if typed at the questions, ID=NUMBER each (E1=8)");
  return llama4d::lesson::lesson_main(app, argc, argv, [&] { return llama4d::lesson::run(options, a); });
}
