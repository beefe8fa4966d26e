#include "lessons/common/lesson.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/tensor/memory_tracker.h"
#include "core/comm/text_table.h"
#include "core/error.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/parallel/dp_common.h"
#include "lessons/common/clock.h"

namespace llama4d::lesson {

// ---- Flags and narration ---------------------------------------------------------------------

void LessonOptions::add_options(CLI::App& app) {
  app.add_option("--preset", preset, "model shape (tiny: 2 layers, small: 6 layers, medium: 8 layers of 1024)")->capture_default_str();
  app.add_option("--ranks", ranks, "virtual GPUs")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--steps", steps, "AdamW steps")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--micro-batches", micro_batches, "micro-batches per rank and step (gradient accumulation)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--rows", rows, "sequences per micro-batch")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--seq-len", seq_len, "tokens per sequence")->check(CLI::Range(2, 4096))->capture_default_str();
  app.add_option("--algo", algo, "reduction order: ordered (bitwise reproducible) or ring (NCCL's)")
      ->check(CLI::IsMember({"ordered", "ring"}))
      ->capture_default_str();
  app.add_option("--gpus-per-node", gpus_per_node, "virtual GPUs per node: NVLink inside, InfiniBand across")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--step", step, "pause at every phase (press Enter; never blocks when stdin is not a terminal)");
  app.add_flag("--json", json, "print one JSON object (measured vs expected) on stdout; narration on stderr");
  app.add_option("--predict", predict,
                 "predictions as if typed at the questions, ID=NUMBER each (E1=16 E2=2,020,352); scored in the "
                 "exercise report");
}

TrainOptions LessonOptions::train_options() const {
  TrainOptions t;
  t.steps = steps;
  t.batch_size = int64_t(ranks) * micro_batches * rows;
  t.micro_batch_size = rows;
  t.seq_len = seq_len;
  t.warmup_steps = 1;
  return t;
}

VirtualClusterOptions LessonOptions::cluster_options() const {
  VirtualClusterOptions o;
  o.ranks = ranks;
  o.cluster = ClusterSpec::for_ranks(ranks, gpus_per_node);
  o.algo = reduce_algo();
  return o;
}

ReduceAlgo LessonOptions::reduce_algo() const { return parse_reduce_algo(algo); }

namespace {
constexpr const char* kNotATerminal =
    "(--step: stdin is not a terminal, so the lesson neither waits nor reads predictions)";
}  // namespace

Narrator::Narrator(const LessonOptions& o)
    : out_(o.json ? stderr : stdout), step_(o.step), interactive_(o.step && isatty(STDIN_FILENO)) {
  for (const std::string& item : o.predict) {
    const size_t eq = item.find('=');
    const std::optional<double> v = eq == std::string::npos ? std::nullopt : parse_prediction(item.substr(eq + 1));
    if (eq == 0 || !v) throw InputError("--predict " + item + ": expected ID=NUMBER (E1=16, E2=2,020,352)");
    given_[item.substr(0, eq)] = *v;
  }
}

void Narrator::phase(const std::string& title, const std::string& read) {
  std::fprintf(out_, "\n== phase %d: %s ==\n\n", ++phase_, title.c_str());
  if (!read.empty()) std::fprintf(out_, "read: %s\n\n", read.c_str());
  std::fflush(out_);
}

void Narrator::say(const std::string& text) {
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

void Narrator::pause() {
  if (!step_) return;
  if (!interactive_) {
    if (!noted_) say("\n" + std::string(kNotATerminal) + "\n");
    noted_ = true;
    return;
  }
  say("\n-- press Enter to continue --");
  std::string line;
  read_line(line);
}

bool Narrator::read_line(std::string& line) {
  if (!interactive_) return false;
  if (std::getline(std::cin, line)) return true;
  interactive_ = false;  // stdin closed: stop waiting
  return false;
}

void Narrator::ask(const std::string& id, const std::string& question) {
  asked_.emplace_back(id, question);
  const auto given = given_.find(id);
  if (given != given_.end()) predictions_[id] = given->second;
  if (!step_) return;
  say("Predict " + id + ": " + question + "\n");
  if (given != given_.end()) {
    say("  your number (--predict): " + std::to_string(given->second) + "\n");
    return;
  }
  if (!interactive_) {
    if (!noted_) say(std::string(kNotATerminal) + "\n");
    noted_ = true;
    return;
  }
  std::string line;
  for (;;) {
    say("  your number (Enter to skip): ");
    if (!read_line(line)) return;
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;  // skipped
    if (const std::optional<double> v = parse_prediction(line)) {
      predictions_[id] = *v;
      return;
    }
    say("  not a number: digits, commas allowed (757,632), or 5e6\n");
  }
}

std::optional<double> parse_prediction(const std::string& text) {
  std::string digits;
  for (char c : text)
    if (c != ',' && c != '_' && c != ' ' && c != '\t' && c != '\r' && c != '\n') digits += c;
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// ---- One training run, phase by phase -------------------------------------------------------

namespace {

}  // namespace

RunSetup mesh_run_setup(LessonOptions& o, const std::string& mesh, int zero, const std::string& ac) {
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  s.plan = ParallelPlan::parse(mesh);
  s.plan.zero = ZeroStage(zero);
  s.plan.ac = Checkpointing::parse(ac, int(s.model.num_hidden_layers));
  s.plan.algo = o.reduce_algo();
  s.plan.validate();
  s.train = o.train_options();
  s.train.batch_size = int64_t(s.plan.dp()) * o.micro_batches * o.rows;
  s.train.micro_batch_size = o.rows;
  s.plan.check_model(s.model, int(o.micro_batches));
  s.plan.check_sequence(o.seq_len);
  if (o.seq_len > s.model.max_position_embeddings)
    throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds preset '" + o.preset +
                     "''s max_position_embeddings " + std::to_string(s.model.max_position_embeddings));
  o.ranks = s.plan.world_size();
  s.cluster = o.cluster_options();
  s.cluster.ranks = s.plan.world_size();
  return s;
}

std::vector<PhaseView> run_phases(const RunSetup& s, const TextDataset& data,
                                  const std::function<void(const PhaseView&)>& on_phase) {
  if (s.cluster.ranks != s.plan.world_size()) throw Error("run_phases: cluster and mesh sizes differ");
  ParallelPlan plan = s.plan;
  plan.algo = s.cluster.algo;
  VirtualCluster cluster(s.cluster);
  std::vector<PhaseView> phases(size_t(s.train.steps + 1));
  for (PhaseView& p : phases) p.ranks.resize(size_t(plan.world_size()));
  std::mutex mu;
  cluster.run([&](ProcessGroup& world) {
    // One compute thread per virtual GPU: N ranks must not each start a full OpenMP team.
    ops::set_backend_threads(1);
    // With tensor parallelism each rank's model holds only its slice of every weight.
    Llama<float> model(s.model, &world.memory(), plan.tp_layout(s.model, world.rank()), plan.held_units(s.model, world.rank()));
    ParallelTrainer<float> trainer(world, model, data, s.train, plan);
    const size_t me = size_t(world.rank());

    // Every rank files its snapshot, then all meet; rank 0 shows the phase while the others
    // wait in a second barrier. The barriers run after the snapshot, so their (empty) records
    // never count as the step's traffic. A learner may take minutes at a pause: long timeout.
    auto publish = [&](int64_t step, const StepStats& st, size_t first_record, const TimelineTotals& before) {
      RankSnapshot snap;
      snap.time = time_delta(world.trace().totals(), before);
      const std::vector<TrafficRecord> all = world.traffic().records();
      snap.traffic.assign(all.begin() + std::ptrdiff_t(std::min(first_record, all.size())), all.end());
      snap.tokens = st.tokens;
      snap.live = memory_live(world.memory());
      snap.peak = trainer.strategy().peak_memory();
      {
        std::lock_guard<std::mutex> lock(mu);
        PhaseView& p = phases[size_t(step)];
        p.ranks[me] = std::move(snap);
        if (me == 0) {
          p.step = step;
          p.stats = st;
          p.strategy = trainer.describe();
          p.gpu_tflops = s.cluster.cluster.gpu_tflops;
        }
      }
      BarrierOptions o;
      o.label = "lesson pause";
      o.timeout = std::chrono::hours(1);
      world.barrier(o)->wait();
      if (me == 0 && on_phase) {
        PhaseView copy;
        {
          std::lock_guard<std::mutex> lock(mu);
          copy = phases[size_t(step)];
        }
        on_phase(copy);
      }
      world.barrier(o)->wait();
    };

    publish(0, StepStats{}, 0, TimelineTotals{});
    for (int64_t k = 1; k <= s.train.steps; ++k) {
      const size_t mark = world.traffic().records().size();
      const TimelineTotals before = world.trace().totals();
      const StepStats st = trainer.step();
      publish(k, st, mark, before);
    }
  });
  return phases;
}

namespace {

template <class T>
EquivalenceReport equivalence_in(const RunSetup& s, const TextDataset& data) {
  EquivalenceOptions o;
  o.model = s.model;
  o.train = s.train;
  o.plan = s.plan;
  o.plan.algo = s.cluster.algo;
  VirtualCluster cluster(s.cluster);
  return verify_plan<T>(o, data, [&](const std::function<void(ProcessGroup&)>& fn) {
    cluster.run([&](ProcessGroup& world) {
      ops::set_backend_threads(1);
      fn(world);
    });
  });
}

}  // namespace

EquivalenceReport run_equivalence(const RunSetup& s, const TextDataset& data) { return equivalence_in<float>(s, data); }

EquivalenceReport run_equivalence_fp64(const RunSetup& s, const TextDataset& data) {
  return equivalence_in<double>(s, data);
}

void StepReporter::show(const PhaseView& p, const std::function<void()>& before_tables) {
  say_.phase("step " + std::to_string(p.step) + ": what each rank sent and held", read_);
  if (before_tables) before_tables();
  char line[160];
  std::snprintf(line, sizeof line, "loss %.6f, gradient norm %.6f (before clipping)\n\n", p.stats.loss,
                p.stats.grad_norm);
  say_.say(line);
  const std::string traffic = traffic_table(p.ranks), memory = memory_table(peak_of(p));
  std::vector<TimelineTotals> times;
  for (const RankSnapshot& r : p.ranks) times.push_back(r.time);
  const std::string time = time_table(times, p.gpu_tflops);
  if (traffic == last_traffic_ && memory == last_memory_ && time == last_time_) {
    say_.say("Every rank sent and held exactly what it did in the previous step, in the same simulated time.\n");
  } else {
    say_.say("Bytes SENT by each rank during the step, per collective (labels 'layer k' folded):\n\n" + traffic);
    if (!traffic_note_.empty()) say_.say("\n" + traffic_note_ + "\n");
    say_.say("\nPeak bytes per rank so far" + memory_note_ + ":\n\n" + memory);
    say_.say("\n" + time);
  }
  if (timeline_) say_.say("\nRank 0's collectives in the order they started:\n\n" + timeline_table(p.ranks[0].traffic, 60));
  last_traffic_ = traffic;
  last_memory_ = memory;
  last_time_ = time;
  say_.pause();
}

// ---- Tables ----------------------------------------------------------------------------------

std::string grouped(int64_t n) {
  const bool neg = n < 0;
  std::string digits = std::to_string(neg ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return neg ? "-" + out : out;
}

std::string mesh_table(const ParallelPlan& mesh, const ClusterSpec& cluster) {
  std::vector<std::vector<std::string>> rows;
  const int n = mesh.dp_shard();
  if (mesh.size("tp") > 1) {
    // Innermost first: consecutive ranks form a tensor-parallel group (the same rows, one slice
    // each); ranks tp apart share a slice and form its data-parallel group.
    const int tp = mesh.size("tp"), dp = mesh.dp();
    rows.push_back({"rank", "node", "tp rank", "dp rank", "tp group (same rows, other slices)",
                    "dp group (same slice, other rows)"});
    for (int w = 0; w < mesh.world_size(); ++w) {
      std::string tp_group, dp_group;
      for (int i = 0; i < tp; ++i) tp_group += (i ? "," : "") + std::to_string(w / tp * tp + i);
      for (int i = 0; i < dp; ++i) dp_group += (i ? "," : "") + std::to_string(i * tp + w % tp);
      rows.push_back({std::to_string(w), std::to_string(cluster.node_of(w)), std::to_string(w % tp),
                      std::to_string(w / tp), "{" + tp_group + "}", "{" + dp_group + "}"});
    }
  } else if (mesh.hsdp()) {
    rows.push_back({"rank", "node", "shard index", "replica", "shard group (splits the state)",
                    "replica group (same shard)"});
    for (int w = 0; w < mesh.world_size(); ++w) {
      const int j = w % n, q = w / n;
      std::string shard_group, replica_group;
      for (int i = 0; i < n; ++i) shard_group += (i ? "," : "") + std::to_string(q * n + i);
      for (int i = 0; i < mesh.dp_replicate(); ++i) replica_group += (i ? "," : "") + std::to_string(i * n + j);
      rows.push_back({std::to_string(w), std::to_string(cluster.node_of(w)), std::to_string(j), std::to_string(q),
                      "{" + shard_group + "}", "{" + replica_group + "}"});
    }
  } else {
    rows.push_back({"rank", "node", "dp rank"});
    for (int w = 0; w < mesh.world_size(); ++w)
      rows.push_back({std::to_string(w), std::to_string(cluster.node_of(w)), std::to_string(w)});
  }
  return format_table(rows);
}

std::string batch_table(const TextDataset& data, const TrainOptions& train, int dp, int64_t step) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"rank", "micro-batch", "global row", "first characters of the row"});
  const int64_t per_rank = train.batch_size / dp;
  for (int d = 0; d < dp; ++d) {
    const std::vector<Batch> mbs = data_rank_micro_batches(data.train(), train, step, d, dp);
    int64_t row = d * per_rank;
    for (size_t m = 0; m < mbs.size(); ++m)
      for (int64_t b = 0; b < mbs[m].B; ++b, ++row) {
        std::string text;
        for (int64_t t = 0; t < std::min<int64_t>(mbs[m].seq, 40); ++t) {
          const int32_t tok = mbs[m].tokens[size_t(b * mbs[m].seq + t)];
          text += (tok >= 0x20 && tok < 0x7f) ? char(tok) : '.';  // newlines, UTF-8 bytes: '.'
        }
        rows.push_back({std::to_string(d), std::to_string(m), std::to_string(row), "\"" + text + "\""});
      }
  }
  return format_table(rows);
}

namespace {

// "grads layer 3" -> "grads layer *": one table row per kind of collective, not per layer.
std::string fold_label(const std::string& label) {
  const std::string key = "layer ";
  const size_t at = label.rfind(key);
  if (at == std::string::npos) return label;
  const std::string tail = label.substr(at + key.size());
  if (tail.empty() || !std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return label;
  return label.substr(0, at) + key + "*";
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

}  // namespace

std::string traffic_table(const std::vector<RankSnapshot>& ranks) {
  const size_t n = ranks.size();
  std::vector<std::string> keys;  // "op|label", in order of first appearance
  std::map<std::string, std::vector<int64_t>> bytes, calls;
  std::vector<int64_t> ib(n, 0), totals(n, 0);
  bool any_ib = false;
  for (size_t r = 0; r < n; ++r)
    for (const TrafficRecord& rec : ranks[r].traffic) {
      if (rec.op == "barrier") continue;  // no payload
      const std::string key = rec.op + "|" + fold_label(rec.label);
      if (!bytes.count(key)) {
        keys.push_back(key);
        bytes[key].assign(n, 0);
        calls[key].assign(n, 0);
      }
      bytes[key][r] += rec.bytes_sent;
      calls[key][r] += 1;
      totals[r] += rec.bytes_sent;
      ib[r] += rec.sent_ib;
      any_ib = any_ib || rec.sent_ib > 0;
    }
  std::vector<std::vector<std::string>> rows;
  // Calls per rank differ where a row is one rank's sends (a pipeline boundary, a ring hop): the
  // column shows the most any rank made, and "-" for a rank that made none of them.
  std::vector<std::string> head = {"op", "label", "calls (most on a rank)"};
  for (size_t r = 0; r < n; ++r) head.push_back("rank " + std::to_string(r));
  rows.push_back(head);
  for (const std::string& key : keys) {
    const size_t bar = key.find('|');
    const int64_t most = *std::max_element(calls[key].begin(), calls[key].end());
    std::vector<std::string> row = {key.substr(0, bar), key.substr(bar + 1), std::to_string(most)};
    for (size_t r = 0; r < n; ++r) row.push_back(calls[key][r] == 0 ? "-" : grouped(bytes[key][r]));
    rows.push_back(row);
  }
  std::vector<std::string> total = {"total", "bytes sent", ""};
  for (size_t r = 0; r < n; ++r) total.push_back(grouped(totals[r]));
  rows.push_back(total);
  if (any_ib) {
    std::vector<std::string> row = {"", "of which over InfiniBand", ""};
    for (size_t r = 0; r < n; ++r) row.push_back(grouped(ib[r]));
    rows.push_back(row);
  }
  return format_table(rows);
}

std::string timeline_table(const std::vector<TrafficRecord>& records, size_t max_rows) {
  std::vector<TrafficRecord> sorted = records;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TrafficRecord& a, const TrafficRecord& b) { return a.wall_start_us < b.wall_start_us; });
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"#", "op", "group", "label", "elements", "dtype", "bytes sent", "algorithm"});
  size_t i = 0;
  for (const TrafficRecord& r : sorted) {
    if (r.op == "barrier") continue;
    if (i == max_rows) {
      rows.push_back({"...", "(" + std::to_string(sorted.size() - i) + " more)", "", "", "", "", "", ""});
      break;
    }
    rows.push_back({std::to_string(++i), r.op, r.group, r.label, grouped(r.count), std::string(dtype_name(r.dtype)),
                    grouped(r.bytes_sent), r.algorithm});
  }
  return format_table(rows);
}

std::string memory_table(const std::vector<RankMemory>& per_rank) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"rank", "params", "grads", "optimizer", "activations", "scratch", "comm buffers", "other (RoPE)",
                  "total", ""});
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const RankMemory& m = per_rank[r];
    rows.push_back({std::to_string(r), grouped(m.params), grouped(m.grads), grouped(m.optimizer), grouped(m.activations), grouped(m.scratch),
                    grouped(m.comm_buffers), grouped(m.other), grouped(m.total), "(" + format_bytes(m.total) + ")"});
  }
  return format_table(rows);
}

bool finish_with_equivalence(Narrator& say, ExerciseSheet& sheet, const RunSetup& setup, const TextDataset& data,
                             EquivalenceReport& report) {
  sheet.set_predictions(say.predictions());
  sheet.set_asked(say.asked());
  say.say(sheet.report());
  say.pause();
  // The proof: the same steps on one device, compared bit by bit.
  say.phase("equivalence with one device",
            "core/verify/equivalence.cpp: verify_plan() runs the plan, replay_on_one_device() the one device");
  report = run_equivalence(setup, data);
  say.say(report.table());
  // Bitwise with ordered reductions (tensor parallelism against its rank-order replay), unless
  // the plan splits a sum the replay does not follow (context parallelism: dK, dV summed over
  // queries on other ranks): then the harness's measured bounds.
  const bool replayable = setup.cluster.algo == ReduceAlgo::ordered && setup.plan.size("cp") == 1;
  return report.ok && (!replayable || report.bitwise);
}

namespace {

// The fields every lesson's --json summary has (a lesson adds its own, e.g. the shard map).
nlohmann::json summary_json(const std::string& lesson, const std::string& preset, const RunSetup& setup,
                            const std::vector<PhaseView>& phases, const ExerciseSheet& sheet,
                            const EquivalenceReport& report, bool passed) {
  std::vector<double> losses;
  for (size_t k = 1; k < phases.size(); ++k) losses.push_back(phases[k].stats.loss);
  const PhaseView& last = phases.back();
  return {{"lesson", lesson},
          {"preset", preset},
          {"parameters", setup.model.num_parameters()},
          {"mesh", setup.plan.describe_mesh()},
          {"plan", setup.plan.to_json()},
          {"strategy", last.strategy},
          {"algo", std::string(reduce_algo_name(setup.cluster.algo))},
          {"steps", setup.train.steps},
          {"micro_batches", setup.train.batch_size / setup.plan.dp() / rank_micro_batch_rows(setup.train, setup.plan.dp())},
          {"losses", losses},
          {"memory_at_rest", memory_json(live_of(phases.front()))},
          {"memory_peak", memory_json(peak_of(last))},
          {"traffic_last_step", traffic_json_of(last)},
          {"exercises", sheet.to_json()},
          {"asked", sheet.asked_json()},
          {"equivalence", equivalence_json(report)},
          {"passed", passed}};
}

}  // namespace

int finish_lesson(const std::string& lesson, bool json, const std::string& preset, const RunSetup& setup,
                  const std::vector<PhaseView>& phases, const ExerciseSheet& sheet, const EquivalenceReport& report,
                  bool equivalent, const std::function<void(nlohmann::json&)>& add) {
  const bool passed = sheet.failed() == 0 && equivalent;
  if (json) {
    nlohmann::json j = summary_json(lesson, preset, setup, phases, sheet, report, passed);
    if (add) add(j);
    std::printf("%s\n", j.dump().c_str());
  }
  return passed ? 0 : 1;
}

nlohmann::json fp64_equivalence_json(const EquivalenceReport& report64) {
  nlohmann::json j = equivalence_json(report64);
  j["plain_max_rel_err"] = report64.plain_max_rel_err;
  return j;
}

std::vector<RankMemory> live_of(const PhaseView& p) {
  std::vector<RankMemory> out;
  for (const RankSnapshot& r : p.ranks) out.push_back(r.live);
  return out;
}

std::vector<RankMemory> peak_of(const PhaseView& p) {
  std::vector<RankMemory> out;
  for (const RankSnapshot& r : p.ranks) out.push_back(r.peak);
  return out;
}

// ---- Measured traffic ------------------------------------------------------------------------

int64_t sent_bytes(const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix) {
  int64_t n = 0;
  for (const TrafficRecord& r : records)
    if (r.op == op && starts_with(r.label, prefix)) n += r.bytes_sent;
  return n;
}

int64_t call_count(const std::vector<TrafficRecord>& records, std::string_view op, std::string_view prefix) {
  int64_t n = 0;
  for (const TrafficRecord& r : records)
    if (r.op == op && starts_with(r.label, prefix)) ++n;
  return n;
}

int64_t total_sent(const std::vector<TrafficRecord>& records) {
  int64_t n = 0;
  for (const TrafficRecord& r : records) n += r.bytes_sent;
  return n;
}

std::vector<int64_t> per_rank_sent(const PhaseView& p, std::string_view op, std::string_view prefix) {
  std::vector<int64_t> out;
  for (const RankSnapshot& r : p.ranks) out.push_back(sent_bytes(r.traffic, op, prefix));
  return out;
}

// ---- Wire volume per rank, from the README formulas ------------------------------------------

std::vector<int64_t> balanced_chunks(int64_t count, int n) {
  std::vector<int64_t> c(size_t(n), count / n);
  for (int64_t i = 0; i < count % n; ++i) ++c[size_t(i)];
  return c;
}

namespace {
int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}
}  // namespace

int64_t reduce_scatter_sent(const std::vector<int64_t>& counts, int rank, int64_t elem) {
  return (sum_of(counts) - counts[size_t(rank)]) * elem;
}

int64_t all_gather_sent(const std::vector<int64_t>& counts, int rank, int64_t elem, ReduceAlgo algo) {
  const int n = int(counts.size());
  if (algo == ReduceAlgo::ring) return (sum_of(counts) - counts[size_t((rank + 1) % n)]) * elem;
  return int64_t(n - 1) * counts[size_t(rank)] * elem;
}

int64_t all_reduce_sent(int64_t count, int n, int rank, int64_t elem, ReduceAlgo algo) {
  const std::vector<int64_t> c = balanced_chunks(count, n);
  return reduce_scatter_sent(c, rank, elem) + all_gather_sent(c, rank, elem, algo);
}

// ---- Exercises -------------------------------------------------------------------------------

namespace {

double mean_of(const std::vector<int64_t>& v) { return v.empty() ? 0.0 : double(sum_of(v)) / double(v.size()); }

std::string number(double v) {
  if (std::fabs(v) < 1e18 && std::fabs(v - std::round(v)) < 1e-9) return grouped(int64_t(std::llround(v)));
  char buf[64];
  std::snprintf(buf, sizeof buf, std::fabs(v) < 1e18 && std::fabs(v) >= 1 ? "%.2f" : "%.3g", v);
  return buf;
}

std::string prediction_verdict(double predicted, const Exercise& e) {
  const Answer a = answer_of(e);
  if (!std::isfinite(a.value)) return "you predicted " + number(predicted) + "; this exercise has no one number to score";
  std::string whose = a.of.empty() ? "" : " (" + a.of + ")";
  std::string unit = a.unit.empty() ? "" : " " + a.unit;
  return "you predicted " + number(predicted) + unit + "; the answer" + whose + " is " + number(a.value) + unit + ": " +
         score_prediction(predicted, a);
}

}  // namespace

std::string score_prediction(double predicted, const Answer& a) {
  const bool exact = a.tolerance < 0 ? number(predicted) == number(a.value)
                                     : std::fabs(predicted - a.value) <= a.tolerance;
  if (exact) return "exact";
  if (a.value == 0) return "the answer is 0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%% %s", 100.0 * std::fabs(predicted - a.value) / std::fabs(a.value),
                predicted > a.value ? "high" : "low");
  return buf;
}

Answer answer_of(const Exercise& e) {
  if (e.answer) return *e.answer;
  auto answer = [](double value, std::string of, double tolerance) {
    Answer a;
    a.value = value, a.of = std::move(of), a.tolerance = tolerance;
    return a;
  };
  if (e.value) return answer(*e.value, "", -1);
  if (e.measured.empty()) return answer(std::nan(""), "", 0);
  if (e.measured.size() == 1) return answer(double(e.measured[0]), "", 0.5);
  bool same = true;
  for (int64_t m : e.measured) same = same && m == e.measured[0];
  const std::string of = same ? "every rank" : "rank 0";
  if (!e.upper.empty() && !e.expected.empty()) {
    // A range: its middle, exact anywhere inside rank 0's range.
    const double lo = double(e.expected[0]), hi = double(e.upper[0]);
    return answer((lo + hi) / 2, of, std::max(0.5, (hi - lo) / 2));
  }
  return answer(double(e.measured[0]), of, 0.5);
}

void ExerciseSheet::exact(std::string id, std::string question, std::string formula, double textbook,
                          std::vector<int64_t> expected, std::vector<int64_t> measured, std::string note) {
  Exercise e{std::move(id), std::move(question), std::move(formula), textbook, std::move(expected),
             std::move(measured), {}, std::move(note), false, {}, {}};
  e.pass = e.expected == e.measured;
  if (textbook >= 0) e.pass = e.pass && std::fabs(mean_of(e.measured) - textbook) <= 1e-9 * std::max(1.0, textbook);
  items_.push_back(std::move(e));
}

void ExerciseSheet::range(std::string id, std::string question, std::string formula, std::vector<int64_t> lower,
                          std::vector<int64_t> upper, std::vector<int64_t> measured, std::string note) {
  Exercise e{std::move(id), std::move(question), std::move(formula), -1, std::move(lower), std::move(measured),
             std::move(upper), std::move(note), false, {}, {}};
  e.pass = e.expected.size() == e.measured.size() && e.upper.size() == e.measured.size();
  for (size_t r = 0; e.pass && r < e.measured.size(); ++r)
    e.pass = e.expected[r] <= e.measured[r] && e.measured[r] <= e.upper[r];
  items_.push_back(std::move(e));
}

void ExerciseSheet::add(Exercise e) { items_.push_back(std::move(e)); }

void ExerciseSheet::answer(const std::string& id, Answer a) {
  for (Exercise& e : items_)
    if (e.id == id) {
      e.answer = std::move(a);
      return;
    }
  throw Error("ExerciseSheet::answer: no exercise " + id);
}

std::string ExerciseSheet::verdict_line(const std::string& id) const {
  const auto it = predictions_.find(id);
  if (it == predictions_.end()) return "";
  for (const Exercise& e : items_)
    if (e.id == id) return prediction_verdict(it->second, e);
  return "";
}

nlohmann::json ExerciseSheet::asked_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& [id, question] : asked_) a.push_back({{"id", id}, {"question", question}});
  return a;
}

namespace {

// An exercise's expected (or range) and measured values, one column per rank.
std::string per_rank_rows(const Exercise& e) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"       ", ""};
  for (size_t r = 0; r < e.measured.size(); ++r) head.push_back("rank " + std::to_string(r));
  rows.push_back(head);
  std::vector<std::string> exp = {"       ", e.upper.empty() ? "expected" : "at least"}, up = {"       ", "at most"},
                           mea = {"       ", "measured"};
  for (size_t r = 0; r < e.measured.size(); ++r) {
    exp.push_back(r < e.expected.size() ? grouped(e.expected[r]) : "?");
    if (!e.upper.empty()) up.push_back(r < e.upper.size() ? grouped(e.upper[r]) : "?");
    mea.push_back(grouped(e.measured[r]));
  }
  rows.push_back(exp);
  if (!e.upper.empty()) rows.push_back(up);
  rows.push_back(mea);
  std::string table = format_table(rows);
  // Drop the underline format_table draws under the header: these are inline tables.
  const size_t first = table.find('\n'), second = table.find('\n', first + 1);
  table.erase(first + 1, second - first);
  return table;
}

}  // namespace

std::string ExerciseSheet::report() const {
  std::string out;
  for (const Exercise& e : items_) {
    out += std::string(e.pass ? "[PASS] " : "[FAIL] ") + e.id + ". " + e.question + "\n";
    out += "       answer: " + e.formula + "\n";
    if (e.textbook >= 0)
      out += "       formula gives " + number(e.textbook) + " per rank; measured mean " + number(mean_of(e.measured)) + "\n";
    // An exercise about one number (not per rank) says it in its note.
    if (!e.measured.empty()) out += per_rank_rows(e);
    if (!e.note.empty()) out += "       " + e.note + "\n";
    if (const std::string v = verdict_line(e.id); !v.empty()) out += "       " + v + "\n";
    out += "\n";
  }
  int passed = 0;
  for (const Exercise& e : items_) passed += e.pass ? 1 : 0;
  out += std::to_string(passed) + " of " + std::to_string(items_.size()) + " exercises PASS\n";
  return out;
}

nlohmann::json ExerciseSheet::to_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const Exercise& e : items_) {
    nlohmann::json j = {{"id", e.id},           {"question", e.question}, {"answer", e.formula},
                        {"expected", e.expected}, {"measured", e.measured}, {"pass", e.pass}};
    if (e.textbook >= 0) j["formula_per_rank"] = e.textbook, j["measured_mean"] = mean_of(e.measured);
    if (!e.upper.empty()) j["expected_at_most"] = e.upper;
    if (e.value) j["measured_value"] = *e.value;
    if (!e.note.empty()) j["note"] = e.note;
    const Answer ans = answer_of(e);
    if (std::isfinite(ans.value))
      j["scored_against"] = {{"value", ans.value}, {"unit", ans.unit}, {"of", ans.of}, {"tolerance", ans.tolerance}};
    if (const auto it = predictions_.find(e.id); it != predictions_.end()) {
      j["prediction"] = it->second;
      j["verdict"] = score_prediction(it->second, ans);
    }
    a.push_back(j);
  }
  return a;
}

int ExerciseSheet::failed() const {
  int n = 0;
  for (const Exercise& e : items_) n += e.pass ? 0 : 1;
  return n;
}

nlohmann::json equivalence_json(const EquivalenceReport& r) {
  return {{"strategy", r.strategy}, {"ranks", r.ranks},         {"steps", r.steps},
          {"algo", r.algo},         {"ok", r.ok},               {"bitwise", r.bitwise},
          {"max_abs_err", r.max_abs_err}, {"max_rel_err", r.max_rel_err}, {"worst_tensor", r.worst_tensor},
          {"losses_single", r.losses_single}, {"losses_parallel", r.losses_parallel}};
}

nlohmann::json traffic_json_of(const PhaseView& p) {
  nlohmann::json a = nlohmann::json::array();
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    nlohmann::json by = nlohmann::json::object();
    for (const TrafficRecord& rec : p.ranks[r].traffic) {
      if (rec.op == "barrier") continue;
      const std::string key = rec.op + " " + fold_label(rec.label);
      by[key] = by.value(key, int64_t(0)) + rec.bytes_sent;
    }
    a.push_back({{"rank", r}, {"bytes_sent", total_sent(p.ranks[r].traffic)}, {"by_collective", by}});
  }
  return a;
}

int lesson_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    return body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 1;
  }
}

}  // namespace llama4d::lesson
