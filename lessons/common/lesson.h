#pragma once
// What the lesson programs share, so each lesson's main.cpp holds only its own story:
//   - the flags every lesson takes and the narration (phase banners naming the code to read,
//     --step pauses, and "predict, then see": a question asked before the table that answers it);
//   - a training run on virtual GPUs that stops after construction and after every step, on
//     every rank at once, so rank 0 can show what each rank holds and what it sent;
//   - tables: the mesh, the rows of the batch, traffic per collective, memory per category;
//   - the per-rank wire volume of each collective, written from the lessons' README formulas
//     (independent of core/comm/comm_model.cpp: the exercises compare the two);
//   - an exercise sheet: expected vs measured per rank, PASS/FAIL, and a JSON summary.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "backends/virtual/virtual_cluster.h"
#include "core/data/dataset.h"
#include "core/comm/traffic_labels.h"
#include "core/comm/traffic_log.h"
#include "core/model/config.h"
#include "core/parallel/parallel_trainer.h"
#include "core/verify/equivalence.h"

namespace llama4d::lesson {

// ---- Flags and narration ---------------------------------------------------------------------

struct LessonOptions {
  std::string preset = "tiny";
  int ranks = 4;
  int64_t steps = 2;
  int64_t micro_batches = 1;  // per rank and step
  int64_t rows = 2;           // sequences per micro-batch
  int64_t seq_len = 64;
  std::string algo = "ordered";
  int gpus_per_node = 8;
  bool step = false;  // pause at every phase
  bool json = false;  // one JSON object on stdout; the narration goes to stderr
  // --predict ID=NUMBER ...: predictions given up front, as if typed at each question (scripts,
  // tests); with --step on a terminal the lesson asks only the questions not given here.
  std::vector<std::string> predict;

  void add_options(CLI::App& app);
  // Global batch = ranks x micro_batches x rows, so every rank gets micro_batches micro-batches.
  TrainOptions train_options() const;
  VirtualClusterOptions cluster_options() const;
  ReduceAlgo reduce_algo() const;
};

class Narrator {
 public:
  explicit Narrator(const LessonOptions& options);
  std::FILE* out() const { return out_; }
  // "== phase 3: ... ==", then "read: <read>" when given: the file and function that do what
  // the phase shows.
  void phase(const std::string& title, const std::string& read = "");
  void say(const std::string& text);  // as is (add your own newlines)
  // With --step: waits for Enter when stdin is a terminal; otherwise only notes the pause, so
  // CI and pipes never block.
  void pause();
  // Predict, then see. With --step, prints exercise `id`'s question; when stdin is a terminal it
  // reads a number (Enter skips; "1,234", "5e6" are numbers), which the exercise report later
  // scores against the exercise's answer (ExerciseSheet::answer). Call it before the table that
  // shows the answer. Without --step, or with stdin not a terminal, nothing waits; a number given
  // by --predict counts as typed.
  void ask(const std::string& id, const std::string& question);
  const std::map<std::string, double>& predictions() const { return predictions_; }
  // Every question asked, in order: (id, question).
  const std::vector<std::pair<std::string, std::string>>& asked() const { return asked_; }

 private:
  bool read_line(std::string& line);  // false (and no more waiting) once stdin is closed

  std::FILE* out_;
  bool step_, interactive_, noted_ = false;
  int phase_ = 0;
  std::map<std::string, double> predictions_, given_;
  std::vector<std::pair<std::string, std::string>> asked_;
};

// "2,020,352", " 1.5e6 ", "757_632" -> the number; "", "abc", "12x" -> nothing.
std::optional<double> parse_prediction(const std::string& text);

// ---- One training run, phase by phase -------------------------------------------------------

struct RankSnapshot {
  std::vector<TrafficRecord> traffic;  // what this rank sent and received during the step
  int64_t tokens = 0;                  // tokens of the whole step, as this rank's loss all-reduce summed them
  RankMemory live;             // bytes held now (between steps: "at rest")
  RankMemory peak;             // highest so far, per category
  TimelineTotals time;         // the step on the simulated clock (lessons/common/clock.h)
};

struct PhaseView {
  int64_t step = 0;       // 0: right after construction, before any step
  StepStats stats;        // rank 0's (loss, grad norm) for step >= 1
  std::string strategy;   // DataParallelStrategy::describe()
  double gpu_tflops = 0;  // the simulated clock's rate (RankSnapshot::time)
  std::vector<RankSnapshot> ranks;
};

struct RunSetup {
  LlamaConfig model;
  TrainOptions train;
  ParallelPlan plan;  // plan.algo follows cluster.algo
  VirtualClusterOptions cluster;
};

// The run of a lesson whose ranks follow from a mesh (07, 08): the preset, the mesh (innermost
// first) with its ZeRO stage and checkpointing policy, each data rank taking --micro-batches
// micro-batches of --rows rows. InputError for a mesh the model or the sequence cannot be cut
// into, or a sequence longer than the preset's positions. Sets o.ranks to the mesh's size.
RunSetup mesh_run_setup(LessonOptions& o, const std::string& mesh, int zero, const std::string& ac);

// Trains setup.train.steps steps on a VirtualCluster of setup.plan.world_size() ranks. After
// construction and after every step all ranks stop; on_phase runs on rank 0's thread with every
// rank's snapshot while the others wait (so it may print and pause). Returns every phase.
std::vector<PhaseView> run_phases(const RunSetup& setup, const TextDataset& data,
                                  const std::function<void(const PhaseView&)>& on_phase);

// The equivalence harness on a fresh VirtualCluster: the same steps on N ranks and on one device.
EquivalenceReport run_equivalence(const RunSetup& setup, const TextDataset& data);
// The same in fp64, where the harness also runs the plain single-device trainer (its own order of
// additions) and holds every tensor to 1e-12 of it.
EquivalenceReport run_equivalence_fp64(const RunSetup& setup, const TextDataset& data);

// Prints the phase of step k: loss, the traffic table, per-rank memory peaks and, with --step,
// rank 0's collectives in order. A later step that moved and held exactly what the previous one
// did gets one line instead of the same tables again.
class StepReporter {
 public:
  // read: the code a step phase runs (see Narrator::phase).
  StepReporter(Narrator& say, bool timeline, std::string traffic_note, std::string memory_note, std::string read = "")
      : say_(say),
        timeline_(timeline),
        traffic_note_(std::move(traffic_note)),
        memory_note_(std::move(memory_note)),
        read_(std::move(read)) {}
  // before_tables runs after the banner, before anything measured is shown (Narrator::ask).
  void show(const PhaseView& p, const std::function<void()>& before_tables = nullptr);

 private:
  Narrator& say_;
  bool timeline_;
  std::string traffic_note_, memory_note_, read_, last_traffic_, last_memory_, last_time_;
};

// ---- Tables ----------------------------------------------------------------------------------

std::string grouped(int64_t n);  // 1234567 -> "1,234,567"
// Rank, node, and each rank's coordinates (dp; shard index and replica for HSDP; tp and dp rank
// with tensor parallelism).
std::string mesh_table(const ParallelPlan& plan, const ClusterSpec& cluster);
// Which rows of the global batch of step `step` each data rank trains on, with a text preview.
std::string batch_table(const TextDataset& data, const TrainOptions& train, int dp, int64_t step);
// Bytes each rank SENT per (op, label) in one step; "layer 3" labels are folded into "layer *".
// The calls column is the most any rank made of a row; a rank that made none shows "-".
std::string traffic_table(const std::vector<RankSnapshot>& ranks);
// One rank's collectives in the order they started.
std::string timeline_table(const std::vector<TrafficRecord>& records, size_t max_rows);
// Bytes per category per rank (total: the peak of the sum, not the sum of the peaks).
std::string memory_table(const std::vector<RankMemory>& per_rank);
std::vector<RankMemory> live_of(const PhaseView& p);
std::vector<RankMemory> peak_of(const PhaseView& p);

// ---- Measured traffic ------------------------------------------------------------------------

// Bytes one rank sent in records of `op` ("all_reduce", ...) whose label starts with `prefix`
// (core/comm/traffic_labels.h names the labels).
int64_t sent_bytes(const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix);
int64_t call_count(const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix);
int64_t total_sent(const std::vector<TrafficRecord>& records);
// sent_bytes for every rank of a phase.
std::vector<int64_t> per_rank_sent(const PhaseView& p, std::string_view op, std::string_view prefix);

// ---- Wire volume per rank, from the README formulas ------------------------------------------
// A collective over n ranks where rank i owns chunk counts[i] (elements of `elem` bytes):
//   reduce-scatter (ring or direct): rank i sends everything but its own chunk: S - c_i
//   all-gather, direct: rank i sends its chunk to the n-1 others: (n-1) c_i
//   all-gather, ring: rank i forwards every chunk but the one of rank i+1: S - c_{i+1}
//   all-reduce = reduce-scatter + all-gather over balanced chunks (the first count % n ranks
//   get one element more).
// Summed over ranks every one of them moves exactly (n-1) S (twice that for an all-reduce).
std::vector<int64_t> balanced_chunks(int64_t count, int n);
int64_t reduce_scatter_sent(const std::vector<int64_t>& counts, int rank, int64_t elem);
int64_t all_gather_sent(const std::vector<int64_t>& counts, int rank, int64_t elem, ReduceAlgo algo);
int64_t all_reduce_sent(int64_t count, int n, int rank, int64_t elem, ReduceAlgo algo);

// ---- Exercises -------------------------------------------------------------------------------

// The one number a question asks for, in the question's unit, and how close a prediction must
// come to be scored "exact".
struct Answer {
  double value = 0;
  std::string unit;        // "bytes", "us", "ns", "micro-batches", ...: what the question counts in
  std::string of;          // whose number: "rank 0", "every rank", "the step", ...
  double tolerance = 0.5;  // |prediction - value| <= tolerance is exact; < 0: equal to the digits shown
};

// A prediction against its answer: "exact", or how far off ("6.2% low", "2.0x high").
std::string score_prediction(double predicted, const Answer& answer);

struct Exercise {
  std::string id, question, formula;  // formula: the README's answer, in words
  double textbook = -1;               // the formula's value per rank (mean over ranks); < 0: none
  std::vector<int64_t> expected, measured, upper;  // upper: non-empty for a range [expected, upper]
  std::string note;
  bool pass = false;
  std::optional<double> value;  // an exercise about one number (not per rank): what was measured
  std::optional<Answer> answer;  // what a prediction is scored against; unset: answer_of() decides
};

// The answer a prediction of `e` is scored against: e.answer when set; else the one number
// (e.value) to the digits shown; else rank 0's measured value (exact to the unit, or the middle of
// rank 0's range with its half-width as tolerance).
Answer answer_of(const Exercise& e);

class ExerciseSheet {
 public:
  // PASS when every rank's measured value equals its expected value and, if textbook >= 0, the
  // mean over ranks equals the textbook value (padding moves bytes between ranks, not in total).
  void exact(std::string id, std::string question, std::string formula, double textbook,
             std::vector<int64_t> expected, std::vector<int64_t> measured, std::string note = "");
  // PASS when lower[r] <= measured[r] <= upper[r] for every rank.
  void range(std::string id, std::string question, std::string formula, std::vector<int64_t> lower,
             std::vector<int64_t> upper, std::vector<int64_t> measured, std::string note = "");
  void add(Exercise e);  // an exercise with its own verdict
  // What question `id` asked for, when it is not rank 0's measured value in the exercise's unit
  // (another rank, another unit, one number derived from the measurements). Error if no exercise
  // `id` was added.
  void answer(const std::string& id, Answer a);

  // The learner's predictions (Narrator::predictions), scored against each exercise's answer,
  // and the questions that were asked (Narrator::asked).
  void set_predictions(std::map<std::string, double> predictions) { predictions_ = std::move(predictions); }
  void set_asked(std::vector<std::pair<std::string, std::string>> asked) { asked_ = std::move(asked); }
  // {"id", "question"} per question asked, in order.
  nlohmann::json asked_json() const;
  // "you predicted 15; the answer (every rank) is 16: 6.2% low" for exercise `id`, or "" when
  // there is no prediction for it.
  std::string verdict_line(const std::string& id) const;

  std::string report() const;
  nlohmann::json to_json() const;
  int failed() const;

 private:
  std::vector<Exercise> items_;
  std::map<std::string, double> predictions_;
  std::vector<std::pair<std::string, std::string>> asked_;
};

// The equivalence verdict for the JSON summary (the full per-tensor table is report.table()).
nlohmann::json equivalence_json(const EquivalenceReport& report);
// How every lesson ends: the exercise sheet (with the learner's predictions), then the
// equivalence check on one device, printed.
// Returns whether the check holds: bitwise with ordered reductions; within the harness's measured
// bounds with ring, with tensor parallelism (row-parallel partial sums add in another order) or with
// context parallelism (dK, dV add up over queries that sit on other ranks).
bool finish_with_equivalence(Narrator& say, ExerciseSheet& sheet, const RunSetup& setup, const TextDataset& data,
                             EquivalenceReport& report);
// A lesson's ending: with --json, its summary (summary_json, then what `add` puts in) as one JSON
// object on stdout. Returns the exit code: 0 when every exercise passed and the run is equivalent.
int finish_lesson(const std::string& lesson, bool json, const std::string& preset, const RunSetup& setup,
                  const std::vector<PhaseView>& phases, const ExerciseSheet& sheet, const EquivalenceReport& report,
                  bool equivalent, const std::function<void(nlohmann::json&)>& add = {});
// The fp64 check against the plain trainer: its report and its largest relative error.
nlohmann::json fp64_equivalence_json(const EquivalenceReport& report64);
// Per rank: bytes sent per "op label" of one step.
nlohmann::json traffic_json_of(const PhaseView& p);

// Parses flags, runs body, turns errors into messages and exit codes (2: bad input, 1: other).
int lesson_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace llama4d::lesson
