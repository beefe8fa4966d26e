// Lesson 05: pipeline parallelism. The model's layers are cut into stages, one (or v) per rank;
// a step's micro-batches flow through them, activations forward and their gradients back over
// point-to-point sends. The ORDER in which a rank runs its forwards and backwards is the schedule
// (GPipe, 1F1B, interleaved 1F1B, ZB-H1), and the price of any order is the bubble: time a rank
// waits for its neighbours. The program draws every schedule from the simulated clock, measures
// its bubble against the formulas, the micro-batches each rank holds, the bytes per stage
// boundary, Llama 3's stage balancing and the all-gathers of pp x ZeRO-3, then checks the plan
// bit for bit against one device.
//   lesson05_pipeline [--pp 4] [--micro-batches 8] [--schedule 1f1b] [--pp-chunks 2] [--layers 6] [--step] [--json]
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <regex>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/parallel/pipeline_parallel.h"
#include "core/parallel/pipeline_picture.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"
#include "lessons/common/step_run.h"

namespace llama4d::lesson {
namespace {

using Kind = PipelineScheduleKind;
const Kind kAllSchedules[] = {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zb_h1};

struct PpArgs {
  int pp = 4;
  std::string schedule = "1f1b";
  int chunks = 2;  // v, for the interleaved schedule
  int layers = 6;  // 0: the preset's depth
};

// ---- The schedules on a uniform pipeline (modelled costs, free transfers) ----------------------

// The costs every modelled drawing uses, in microseconds of the simulated clock: F = I = W, so
// B = I + W = 2F (the usual rule of thumb: a backward costs two forwards). The interleaved
// schedule's chunk holds 1/v of a stage, so each of its actions costs 1/v as much.
StageCosts modelled_costs(Kind k, int v) {
  const double f = 12.0 / (k == Kind::interleaved ? v : 1);
  return {f, f, f};
}

// One step of `s` on p virtual GPUs, every action its modelled cost: the picture of the clock.
PipelinePicture run_modelled(const PipelineSchedule& s, const StageCosts& c) {
  VirtualClusterOptions vo;
  vo.ranks = s.ranks;
  VirtualCluster cluster(vo);
  cluster.run([&](ProcessGroup& world) { run_modelled_pipeline(world, s, c); });
  return pipeline_picture(cluster.traces(), s.name());
}

double bubble_of(const PipelinePicture& pic) {
  double busy = 0;
  for (double b : pic.busy_us()) busy += b;
  return pic.end_us > 0 ? 1.0 - busy / (double(pic.ranks) * pic.end_us) : 0.0;
}

// The README's idle time per rank and step, for uniform stages: the bubble in time, not in share.
//   GPipe, 1F1B  (p-1)(F+B)      interleaved  (p-1)(F+B) of one CHUNK      ZB-H1  (p-1)(F+I-W), m >= p
double idle_formula_us(Kind k, int p, const StageCosts& c) {
  const double F = c.forward, I = c.backward_input, W = c.backward_weight;
  return k == Kind::zb_h1 ? (p - 1) * (F + I - W) : (p - 1) * (F + I + W);
}

// "pipeline: send activation 3.1 to rank 2" -> "pipeline: send activation * to rank 2": one row
// per direction and neighbour in the traffic table, instead of one per micro-batch.
PhaseView fold_micro_batches(PhaseView p) {
  static const std::regex number("^(" + std::string(label::kPipeline) +
                                 R"((send|recv) (activation|gradient)) \d+(\.\d+)? )");
  for (RankSnapshot& r : p.ranks)
    for (TrafficRecord& t : r.traffic) t.label = std::regex_replace(t.label, number, "$1 * ");
  return p;
}

// ---- One training step of a real model on virtual GPUs ------------------------------------------

// The modelled GPU of the side runs, in TFLOP/s. On an H100's 989 the lesson's tiny stages
// compute an action in tens of nanoseconds, far below one message's 1 us of latency, so the
// clock would show latency, not stages. At Llama 3 405B's scale an action takes ~100 ms and a
// transfer ~1 ms: slowing the modelled GPU puts compute back in charge by about that ratio.
constexpr double kSlowGpuTflops = 0.1;

// One step of `plan` on the slow modelled GPU, the clock restarted after set-up, so the timeline
// holds the step alone; a pure pipeline's picture is titled `title`.
StepRun train_one_step(const LlamaConfig& cfg, const ParallelPlan& plan, const TrainOptions& train,
                       const LessonOptions& o, const TextDataset& data, const std::string& title) {
  return measure_one_step(cfg, plan, train, o, data, {.gpu_tflops = kSlowGpuTflops, .picture_title = title});
}

ParallelPlan pipeline_plan(int pp, Kind k, int chunks, const std::vector<int>& layers = {}) {
  ParallelPlan plan = ParallelPlan::parse("pp=" + std::to_string(pp));
  plan.schedule = k;
  plan.pp_chunks = k == Kind::interleaved ? chunks : 1;
  plan.pp_layers = layers;
  return plan;
}

// The README's peak number of (micro-batch, chunk) pairs rank r holds: forwarded, backward (W
// for ZB-H1) not yet done.
int in_flight_formula(Kind k, int p, int m, int v, int r) {
  switch (k) {
    case Kind::gpipe: return m;
    case Kind::one_f_one_b: return std::min(m, p - r);
    case Kind::zb_h1: return std::min(m, p);
    case Kind::interleaved: {
      // Warm-up 2(p-r-1) + (v-1)p forwards, then one more before the first backward; with m = p
      // every forward comes first.
      const int total = m * v, warmup = m == p ? total : std::min(2 * (p - r - 1) + (v - 1) * p, total);
      return std::min(warmup + 1, total);
    }
  }
  return 0;
}

// The step on the simulated clock: its slowest rank's time, in microseconds.
double step_us(const StepRun& r) {
  double t = 0;
  for (const TimelineTotals& x : r.time) t = std::max(t, x.clock_us);
  return t;
}

// The rank that computes longest (the first of equals).
int slowest_rank(const StepRun& r) {
  int w = 0;
  for (size_t i = 1; i < r.time.size(); ++i)
    if (r.time[i].compute_us > r.time[size_t(w)].compute_us) w = int(i);
  return w;
}

// "1,2,1,2"
std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// "1,234 5,678 ": each number grouped, a space after each.
std::string spaced(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += grouped(x) + " ";
  return s;
}

// Llama 3's balancing (Dubey et al. 2024, section 3.3.2): the same stage sizes as the balanced
// cut, but the smallest stages at the two ends, where the embedding and the head already add
// work (and, under 1F1B, the first stage holds the most micro-batches); 126 layers on 16 stages
// is 7 on the ends and 8 elsewhere. The balanced cut gives its last stage ceil(L/S) layers, so
// whenever the sizes differ this moves the head off a fullest stage. A cut that divides evenly
// has nothing to move (returned as is).
std::vector<int> llama3_layers(std::vector<int> balanced) {
  const size_t S = balanced.size();
  if (S < 3) return balanced;
  std::sort(balanced.begin(), balanced.end());
  std::vector<int> out(S);
  out.front() = balanced[0], out.back() = balanced[1];
  for (size_t i = 2; i < S; ++i) out[i - 1] = balanced[i];
  return out;
}

// Units (embedding, blocks, head) rank r holds and its parameters, as the README counts them.
int64_t params_of(const LlamaConfig& cfg, const std::vector<UnitRange>& units) {
  const std::vector<int64_t> per_unit = unit_parameters(cfg);
  int64_t n = 0;
  for (const UnitRange& u : units)
    for (int k = u.begin; k < u.end; ++k) n += per_unit[size_t(k)];
  return n;
}

std::string units_str(const LlamaConfig& cfg, const std::vector<UnitRange>& units) {
  std::string s;
  const int L = int(cfg.num_hidden_layers);
  for (const UnitRange& u : units) {
    if (!s.empty()) s += " + ";
    std::string part;
    for (int k = u.begin; k < u.end; ++k) {
      if (k == embedding_unit()) part += "embedding, ";
      if (k == head_unit(L)) part += "norm + head, ";
    }
    const int first = std::max(u.begin, 1) - 1, last = std::min(u.end - 1, L) - 1;
    if (last >= first) part += "layers " + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "") + ", ";
    s += part.substr(0, part.size() - 2);
  }
  return s;
}

// ---- The lesson's shared state -------------------------------------------------------------------

// What the phases read (the run, the model's sizes, the cut) and what they fill (the exercise
// sheet, the JSON summary's extra fields).
struct Lesson {
  LessonOptions o;
  PpArgs a;
  Narrator& say;
  RunSetup s{};                    // the main run: p pipeline ranks, one data rank
  Kind kind = Kind::one_f_one_b;   // --schedule
  int p = 0, m = 0, v = 1, L = 0;  // stages, micro-batches per step, chunks per rank (1 unless interleaved), layers
  int64_t C = 0, B = 0, seq = 0, N = 0;  // hidden size, rows per micro-batch, tokens per row, parameters
  TextDataset data{};
  PipelineLayout layout{};  // the main run's stages
  TrainOptions one{};       // s.train for one step: the side runs
  ExerciseSheet sheet{};
  nlohmann::json extra{};

  const LlamaConfig& cfg() const { return s.model; }
};

// The main run from the flags: InputError (exit 2) for a cut the model does not allow, before
// anything runs.
Lesson set_up(LessonOptions o, const PpArgs& a, Narrator& say) {
  Lesson x{.o = o, .a = a, .say = say};
  x.p = a.pp, x.m = int(o.micro_batches);
  x.kind = parse_pipeline_schedule(a.schedule);
  x.v = x.kind == Kind::interleaved ? a.chunks : 1;
  x.o.ranks = x.p;
  RunSetup& s = x.s;
  s.model = LlamaConfig::preset(o.preset);
  if (a.layers > 0) s.model.num_hidden_layers = a.layers;
  s.model.validate();
  s.train = x.o.train_options();
  s.train.batch_size = int64_t(x.m) * o.rows;  // one data rank: the p stages share every row
  s.plan = pipeline_plan(x.p, x.kind, a.chunks);
  s.plan.validate();
  s.plan.check_model(s.model, x.m);  // stages vs layers, m vs the schedule
  s.cluster = x.o.cluster_options();
  x.L = int(s.model.num_hidden_layers);
  x.C = s.model.hidden_size, x.B = o.rows, x.seq = o.seq_len, x.N = s.model.num_parameters();
  x.data = load_dataset(default_corpus_path(), s.train.seq_len);
  x.layout = s.plan.pipeline_layout(s.model);
  x.one = s.train;
  x.one.steps = 1;
  return x;
}

// ---- 1. Stages: each rank allocates only its own -------------------------------------------------

void show_stages(Lesson& x) {
  const LlamaConfig& cfg = x.cfg();
  const int p = x.p, v = x.v, L = x.L;
  x.say.phase("stages: which rank holds which layers", "core/parallel/pipeline_layout.h (make_pipeline_layout)");
  x.say.say("Model '" + x.o.preset + "' with " + std::to_string(L) + " layers: N = " + grouped(x.N) +
            " parameters, C = " + std::to_string(x.C) + ", vocabulary " + std::to_string(cfg.vocab_size) + ".\nMesh " +
            x.s.plan.describe_mesh() + ", schedule " + x.a.schedule +
            (v > 1 ? " with v = " + std::to_string(v) + " chunks per rank" : "") + ", m = " + std::to_string(x.m) +
            " micro-batches of b = " + std::to_string(x.B) + " x s = " + std::to_string(x.seq) +
            " tokens per step.\nStages: " + x.layout.describe() + "\n\n");
  x.say.ask("P1", "How many bytes of parameters does rank 0 allocate?");
  std::vector<std::vector<std::string>> rows = {{"rank", "virtual stages", "units", "parameters", "bytes (fp32)"}};
  for (int r = 0; r < p; ++r) {
    const std::vector<UnitRange> units = x.layout.rank_units(r, L);
    std::string stages;
    for (int c = 0; c < v; ++c) {
      if (c) stages += ',';
      stages += std::to_string(c * p + r);
    }
    rows.push_back({std::to_string(r), stages, units_str(cfg, units), grouped(params_of(cfg, units)),
                    grouped(4 * params_of(cfg, units))});
  }
  rows.push_back({"one device", "all", "everything", grouped(x.N), grouped(4 * x.N)});
  x.say.say(format_table(rows));
}

// The main run's steps, each shown as it ends; after construction, what each rank holds.
std::vector<PhaseView> train_steps(Lesson& x) {
  StepReporter steps(x.say, x.o.step,
                     "send/recv: the activations [b, s, h] forward and their gradients back, one message per "
                     "micro-batch and stage boundary.\n'loss' and 'grad-norm' sum the stages' partial results "
                     "(the other stages add exact zeros).",
                     " (activations: the micro-batches a stage holds at once)", "core/parallel/pipeline_parallel.cpp (PipelineRunner::train)");
  return run_phases(x.s, x.data, [&](const PhaseView& pv) {
    if (pv.step > 0) return steps.show(fold_micro_batches(pv));
    x.say.say("\nBytes live on each virtual GPU after construction: the parameters, gradients and AdamW moments of its "
              "stages only.\n\n" + memory_table(live_of(pv)));
    x.say.pause();
  });
}

// P1, P2: each rank's model state at rest is its stages' alone.
void check_stage_memory(Lesson& x, const PhaseView& at_rest) {
  std::vector<int64_t> e_params, m_params, e_state, m_state;
  for (int r = 0; r < x.p; ++r) {
    const int64_t n = params_of(x.cfg(), x.layout.rank_units(r, x.L));
    const RankMemory& live = at_rest.ranks[size_t(r)].live;
    e_params.push_back(4 * n), m_params.push_back(live.params);
    e_state.push_back(16 * n), m_state.push_back(live.params + live.grads + live.optimizer);
  }
  x.sheet.exact("P1", "How many bytes of parameters does each rank allocate?",
                "4 x the parameters of its units: its layers (4 C^2-ish each), plus the embedding V C on the first "
                "stage and the final norm + LM head C + V C on the last",
                -1, e_params, m_params);
  x.sheet.answer("P1", {.value = double(m_params[0]), .unit = "bytes", .of = "rank 0"});
  const int64_t sum = std::accumulate(m_state.begin(), m_state.end(), int64_t{0});
  x.sheet.exact("P2", "And model state (params + grads + AdamW)? Summed over the ranks?",
                "16 bytes per parameter held; the ranks together hold exactly one device's 16 N = " + grouped(16 * x.N),
                -1, e_state, m_state, "Measured sum over ranks: " + grouped(sum) + (sum == 16 * x.N ? " = 16 N." : " != 16 N!"));
}

// ---- 2. The schedules, drawn from the simulated clock ---------------------------------------------

// The README's idle time of schedule k, as the exercise sheet states it.
std::string idle_rule(Kind k, bool zb_formula) {
  if (k == Kind::gpipe || k == Kind::one_f_one_b)
    return "(p-1)(F+B): p-1 slots of F at the start and p-1 of B at the end; as a share of the step "
           "(p-1)/(m+p-1), as a share of the ideal time m(F+B) (p-1)/m";
  if (k == Kind::interleaved)
    return "(p-1)(F+B) of one CHUNK, i.e. 1/v of the plain bubble; share of the step (p-1)/(v m + p-1)";
  return zb_formula ? "(p-1)(F+I-W): the deferred W passes fill the cool-down; share of the step "
                      "(p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W)), for m >= p"
                    : "m < p: too few W passes to fill the cool-down; no closed form, the simulator's value";
}

// Schedule k of the main run's p and m with modelled costs: its picture, its idle time per rank
// against the formula (exercise `id`), and its entry in drawn.
void draw_schedule(Lesson& x, Kind k, const char* id, nlohmann::json& drawn) {
  const int p = x.p, m = x.m, kv = k == Kind::interleaved ? x.a.chunks : 1;
  const PipelineSchedule sched = make_pipeline_schedule(k, p, m, kv);
  const StageCosts c = modelled_costs(k, kv);
  const PipelinePicture pic = run_modelled(sched, c);
  x.say.say(pipeline_text(pic, 96) + "\n");
  const double measured = bubble_of(pic), formula = pipeline_bubble_formula(k, p, m, kv, c);
  const bool zb_formula = k != Kind::zb_h1 || m >= p;
  // Expected idle time per rank: the closed form, or for ZB-H1 with m < p the simulator's. The
  // ideal time is every micro-batch through every chunk of a rank: m v (F + B) of one chunk.
  const double ideal = double(m) * kv * (c.forward + c.backward_input + c.backward_weight);
  const double idle = zb_formula ? idle_formula_us(k, p, c) : simulate_pipeline_schedule(sched, c).makespan - ideal;
  const double idle_rank0_us = pic.end_us - pic.busy_us()[0];
  std::vector<int64_t> lo, hi, got;
  for (int r = 0; r < p; ++r) {
    lo.push_back(ns(idle) - 1), hi.push_back(ns(idle) + 1);
    got.push_back(ns(pic.end_us - pic.busy_us()[size_t(r)]));
  }
  const std::string fractions = "Share of the step: measured " + fixed(measured, 4) + ", formula " +
                                (zb_formula ? fixed(formula, 4) : std::string("n/a (m < p)")) +
                                "; relative to the ideal time m(F+B): " + fixed(idle / ideal, 4) + ".";
  x.say.say(fractions + "\n\n");
  x.sheet.range(id, "How many ns does each rank idle in one step of " + sched.name() + "?", idle_rule(k, zb_formula),
                lo, hi, got, fractions);
  // The question asked of 1F1B (B2) is in microseconds; the sheet's, in ns.
  if (k == Kind::one_f_one_b)
    x.sheet.answer(id, {.value = idle_rank0_us, .unit = "us", .of = "every rank", .tolerance = 0.0005});
  drawn[std::string(pipeline_schedule_name(k))] = {
      {"name", sched.name()}, {"bubble_measured", measured},
      {"bubble_formula", zb_formula ? nlohmann::json(formula) : nlohmann::json(nullptr)},
      {"idle_us_per_rank", idle_rank0_us}, {"step_us", pic.end_us}, {"idle_over_ideal", idle / ideal}};
  x.say.pause();
}

// B1-B4: every schedule drawn, its idle time against the formula.
void draw_schedules(Lesson& x) {
  x.say.phase("the schedules, drawn from the simulated clock",
              "core/parallel/pipeline_schedule.cpp (one function per schedule), core/parallel/pipeline_parallel.cpp "
              "(run_modelled_pipeline)");
  x.say.say("Uniform stages, free transfers: each action a fixed time on the simulated clock, F = I = W = 12 us (B = I + W "
            "= 24 us);\nthe interleaved schedule's chunks hold half a stage each, so their actions take 6 us. Letters: F "
            "forward, B backward,\nI/W the two halves of a backward (ZB-H1); lowercase: a rank's second chunk; '.' idle.\n\n");
  x.say.ask("B2", "1F1B, p = " + std::to_string(x.p) + ", m = " + std::to_string(x.m) +
                    ", F = 12 us, B = 24 us: how many microseconds does each rank sit idle in the step?");
  const char* bubble_id[] = {"B1", "B2", "B3", "B4"};
  nlohmann::json drawn = nlohmann::json::object();
  for (size_t i = 0; i < 4; ++i) {
    const Kind k = kAllSchedules[i];
    if (k == Kind::interleaved && x.m % x.p != 0) {
      x.say.say("(interleaved skipped: it runs micro-batches in groups of p, and m = " + std::to_string(x.m) +
                " is not a multiple of p = " + std::to_string(x.p) + ")\n\n");
      continue;
    }
    draw_schedule(x, k, bubble_id[i], drawn);
  }
  x.extra["schedules_modelled"] = drawn;
}

// B5, the sweep: bubble share vs m for every schedule, measured on the clock, against the
// formulas and against the (p-1)/m a seed gives as "the bubble fraction".
void sweep_micro_batches(Lesson& x) {
  const int p = x.p;
  x.say.say("Bubble share of the step vs m (p = " + std::to_string(p) + "; measured on the clock | formula):\n\n");
  std::vector<std::vector<std::string>> rows = {{"m", "gpipe", "1f1b", "interleaved v=" + std::to_string(x.a.chunks),
                                                 "zb-h1", "(p-1)/m: vs ideal, not the step"}};
  int points = 0, agree = 0;
  nlohmann::json sweep = nlohmann::json::array();
  for (int mm : {p, 2 * p, 4 * p, 8 * p}) {
    std::vector<std::string> row = {std::to_string(mm)};
    for (Kind k : kAllSchedules) {
      const int kv = k == Kind::interleaved ? x.a.chunks : 1;
      const PipelineSchedule sched = make_pipeline_schedule(k, p, mm, kv);
      const StageCosts c = modelled_costs(k, kv);
      const double meas = bubble_of(run_modelled(sched, c)), form = pipeline_bubble_formula(k, p, mm, kv, c);
      ++points;
      agree += std::fabs(meas - form) <= 1e-9 ? 1 : 0;
      row.push_back(fixed(meas, 4) + " | " + fixed(form, 4));
      sweep.push_back({{"schedule", std::string(pipeline_schedule_name(k))}, {"m", mm}, {"measured", meas}, {"formula", form}});
    }
    row.push_back(fixed(double(p - 1) / mm, 4));
    rows.push_back(row);
  }
  x.say.say(format_table(rows));
  x.say.say("\nMore micro-batches shrink every bubble; interleaving divides 1F1B's by about v, ZB-H1's is a third of it "
            "when F = I = W.\n");
  x.sheet.exact("B5", "Over the sweep (m = p, 2p, 4p, 8p, four schedules), at how many points does the measured bubble "
                      "equal its formula (within 1e-9)?",
                "all of them: uniform stages and free transfers are exactly the formulas' assumptions", double(points),
                {points}, {agree});
  x.extra["sweep"] = sweep;
  x.say.pause();
}

// ---- 3. Memory: the micro-batches in flight -------------------------------------------------------

// One training step of the real model per schedule (the interleaved one only when m is a
// multiple of p), and one of a single micro-batch.
struct ScheduleRuns {
  std::map<Kind, StepRun> per_schedule;  // in kAllSchedules' order, the enum's
  std::map<Kind, int> depth;  // the layers each schedule's run used
  StepRun unit;               // GPipe with m = 1: one micro-batch's activations per stage
};

ScheduleRuns measure_schedules(Lesson& x) {
  x.say.phase("memory: the micro-batches each rank holds", "core/parallel/pipeline_parallel.cpp (peak_in_flight)");
  x.say.say("One training step of the model per schedule. A rank keeps a micro-batch's activations from its forward to "
            "its backward\n(to its W for ZB-H1): the schedule decides how many it holds at once. From here on the "
            "modelled GPU runs at " + fixed(kSlowGpuTflops, 1) + " TFLOP/s:\non an H100's 989 these tiny stages would "
            "compute for nanoseconds and every picture would show the 1 us message latency instead\n(at Llama 3 "
            "405B's scale an action takes ~100 ms and a transfer ~1 ms; this keeps compute about that far ahead).\n\n");
  x.say.ask("M2", "1F1B: at most how many micro-batches does rank 0 hold at once?");
  const int p = x.p, m = x.m, chunks = x.a.chunks;
  ScheduleRuns runs;
  for (Kind k : kAllSchedules) {
    if (k == Kind::interleaved && m % p != 0) continue;
    LlamaConfig c = x.cfg();
    // Interleaving needs p v stages of at least one layer: a deeper copy when the model is too short.
    if (k == Kind::interleaved && c.num_hidden_layers < int64_t(p) * chunks) c.num_hidden_layers = int64_t(p) * chunks;
    runs.depth[k] = int(c.num_hidden_layers);
    runs.per_schedule[k] = train_one_step(c, pipeline_plan(p, k, chunks), x.one, x.o, x.data,
                                          make_pipeline_schedule(k, p, m, k == Kind::interleaved ? chunks : 1).name() +
                                              ", measured");
  }
  TrainOptions single = x.one;
  single.batch_size = x.B;
  runs.unit = train_one_step(x.cfg(), pipeline_plan(p, Kind::gpipe, 1), single, x.o, x.data, "one micro-batch");
  return runs;
}

// Per rank: one micro-batch's activations, and per schedule the micro-batches in flight at most
// and the activation peak.
void show_in_flight(Lesson& x, const ScheduleRuns& runs) {
  std::vector<std::vector<std::string>> rows = {{"rank", "one micro-batch's activations"}};
  for (const auto& [k, run] : runs.per_schedule)
    rows[0].push_back(std::string(pipeline_schedule_name(k)) + ": in flight / activations");
  for (int r = 0; r < x.p; ++r) {
    std::vector<std::string> row = {std::to_string(r), grouped(runs.unit.peak[size_t(r)].activations)};
    for (const auto& [k, run] : runs.per_schedule)
      row.push_back(std::to_string(run.in_flight[size_t(r)]) + " / " + grouped(run.peak[size_t(r)].activations));
    rows.push_back(row);
  }
  x.say.say(format_table(rows));
  if (runs.per_schedule.count(Kind::interleaved) && runs.depth.at(Kind::interleaved) != x.L)
    x.say.say("(interleaved ran a " + std::to_string(runs.depth.at(Kind::interleaved)) + "-layer copy: p v = " +
              std::to_string(x.p * x.a.chunks) + " stages need a layer each; its in-flight counts are (micro-batch, chunk) "
              "pairs, each 1/v of a stage)\n");
}

// M1-M3, Z2: micro-batches in flight per schedule; M4, M5: GPipe's and 1F1B's activation peaks.
void check_in_flight(Lesson& x, const ScheduleRuns& runs) {
  const int p = x.p, m = x.m;
  const char* flight_id[] = {"M1", "M2", "M3", "Z2"};
  const char* flight_rule[] = {
      "GPipe runs every forward first: all m micro-batches",
      "1F1B: rank r runs p-1-r warm-up forwards, then one forward per backward: min(m, p - r)",
      "interleaved: warm-up 2(p-r-1) + (v-1)p chunk forwards, plus one: min(that + 1, m v) (m v when m = p), counted "
      "in chunks of 1/v stage",
      "ZB-H1: 1F1B's order, but a micro-batch is held until its W, which rank r defers by r: min(m, p) on every rank, "
      "the peak of 1F1B's first rank"};
  for (size_t i = 0; i < 4; ++i) {
    const Kind k = kAllSchedules[i];
    if (!runs.per_schedule.count(k)) continue;
    std::vector<int64_t> e, got;
    for (int r = 0; r < p; ++r) {
      e.push_back(in_flight_formula(k, p, m, k == Kind::interleaved ? x.a.chunks : 1, r));
      got.push_back(runs.per_schedule.at(k).in_flight[size_t(r)]);
    }
    x.sheet.exact(flight_id[i], "At most how many micro-batches does each rank hold under " +
                                    std::string(pipeline_schedule_name(k)) + " (trainer.pipeline()->peak_in_flight())?",
                  flight_rule[i], -1, e, got);
    x.sheet.answer(flight_id[i], {.value = double(got[0]), .unit = "micro-batches", .of = "rank 0"});
  }
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b}) {
    std::vector<int64_t> e, got;
    for (int r = 0; r < p; ++r) {
      e.push_back(int64_t(in_flight_formula(k, p, m, 1, r)) * runs.unit.peak[size_t(r)].activations);
      got.push_back(runs.per_schedule.at(k).peak[size_t(r)].activations);
    }
    x.sheet.exact(k == Kind::gpipe ? "M4" : "M5",
                  "Peak activation bytes per rank under " + std::string(pipeline_schedule_name(k)) + "?",
                  "micro-batches in flight x one micro-batch's activations of that stage (measured with m = 1)", -1, e, got);
  }
  x.say.pause();
}

// ---- 4. Traffic per stage boundary ------------------------------------------------------------------

// T1, T2: what 1F1B's ranks send across their boundaries, per direction.
void check_boundary_traffic(Lesson& x, const StepRun& f1b) {
  const int p = x.p, m = x.m;
  const int64_t bsh = x.B * x.seq * x.C;
  std::vector<int64_t> e, got;
  std::vector<std::vector<std::string>> rows = {{"rank", "activations sent", "gradients sent", "messages"}};
  for (int r = 0; r < p; ++r) {
    const auto& t = f1b.traffic[size_t(r)];
    const int64_t act = sent_bytes(t, "send", label::kPipelineSendActivation);
    const int64_t grad = sent_bytes(t, "send", label::kPipelineSendGradient);
    const int64_t messages = call_count(t, "send", label::kPipelineSend);
    rows.push_back({std::to_string(r), grouped(act), grouped(grad), std::to_string(messages)});
    e.push_back(int64_t(m) * bsh * 4 * ((r < p - 1 ? 1 : 0) + (r > 0 ? 1 : 0)));
    got.push_back(act + grad);
  }
  x.say.say("One step of 1F1B (" + std::to_string(m) + " micro-batches of b s h = " + std::to_string(x.B) + " x " +
            std::to_string(x.seq) + " x " + std::to_string(x.C) + " = " + grouped(bsh) + " numbers):\n\n" + format_table(rows));
  x.sheet.exact("T1", "How many bytes does each rank send per step?",
                "m b s h numbers of activations to the next stage and m b s h of gradients to the previous: 4 m b s h "
                "bytes per direction that rank has (the first and last stages have one direction)",
                -1, e, got);
  x.sheet.answer("T1", {.value = double(got[1]), .unit = "bytes", .of = "rank 1"});
  const int64_t total = std::accumulate(got.begin(), got.end(), int64_t{0});
  x.sheet.exact("T2", "How many numbers cross one stage boundary per step (all ranks' sends / boundaries)?",
                "2 m b s h: m activations forward, m gradients back", double(2 * m * bsh), {2 * m * bsh},
                {total / 4 / (p - 1)});
}

// T3: the interleaved schedule's v chunks per rank, each a stage with its own boundaries.
void check_interleaved_traffic(Lesson& x, const StepRun& ir) {
  const int p = x.p, m = x.m, v = x.a.chunks;
  const int64_t bsh = x.B * x.seq * x.C;
  std::vector<int64_t> e, got;
  for (int r = 0; r < p; ++r) {
    // Rank r holds stages r, p + r, ...: every one sends forward unless it is the last stage,
    // backward unless it is the first.
    int dirs = 0;
    for (int c = 0; c < v; ++c) dirs += (c * p + r < p * v - 1 ? 1 : 0) + (c * p + r > 0 ? 1 : 0);
    e.push_back(int64_t(m) * bsh * 4 * dirs);
    got.push_back(sent_bytes(ir.traffic[size_t(r)], "send", label::kPipelineSend));
  }
  x.sheet.exact("T3", "Interleaved (v = " + std::to_string(v) + "): bytes each rank sends per step?",
                "each of a rank's v chunks is a stage with its own boundaries: v times 1F1B's on the middle ranks; "
                "in all p v - 1 boundaries instead of p - 1, (p v - 1)/(p - 1) times the traffic",
                -1, e, got);
}

void show_boundary_traffic(Lesson& x, const ScheduleRuns& runs) {
  x.say.phase("traffic: what crosses a stage boundary", "core/parallel/pipeline_parallel.cpp (send/recv actions)");
  x.say.ask("T1", "How many bytes does rank 1 send per step (activations forward + gradients back)?");
  check_boundary_traffic(x, runs.per_schedule.at(Kind::one_f_one_b));
  if (runs.per_schedule.count(Kind::interleaved)) check_interleaved_traffic(x, runs.per_schedule.at(Kind::interleaved));
  x.say.pause();
}

// ---- 5. Llama 3's stage balancing -------------------------------------------------------------------

// L1-L3: one step of `kind` on the balanced cut and on Llama 3's, their pictures and compute per rank.
void compare_cuts(Lesson& x, Kind kind, const std::vector<int>& balanced, const std::vector<int>& llama) {
  const int p = x.p;
  x.say.say("The same model, " + std::string(pipeline_schedule_name(kind)) + ", two cuts of its " + std::to_string(x.L) +
            " layers: balanced " + join(balanced) + " and Llama 3's " + join(llama) +
            " (the last stage also runs the final norm, the LM head [V, C] and the loss; the first only looks up "
            "embeddings).\nCompute time per rank is FLOPs / the modelled GPU's rate.\n\n");
  x.say.ask("L2", "By how many microseconds does Llama 3's cut finish the step sooner than the balanced cut "
                  "(negative: later)?");
  const StepRun rb = train_one_step(x.cfg(), pipeline_plan(p, kind, 1, balanced), x.one, x.o, x.data,
                                    "balanced " + join(balanced));
  const StepRun rl = train_one_step(x.cfg(), pipeline_plan(p, kind, 1, llama), x.one, x.o, x.data, "Llama 3 " + join(llama));
  x.say.say(pipeline_text(rb.picture, 96) + "\n" + pipeline_text(rl.picture, 96) + "\n");
  std::vector<std::vector<std::string>> rows = {{"rank", "layers (balanced)", "compute us", "layers (Llama 3)", "compute us"}};
  for (int r = 0; r < p; ++r)
    rows.push_back({std::to_string(r), std::to_string(balanced[size_t(r)]), fixed(rb.time[size_t(r)].compute_us, 3),
                    std::to_string(llama[size_t(r)]), fixed(rl.time[size_t(r)].compute_us, 3)});
  rows.push_back({"step", "", fixed(step_us(rb), 3), "", fixed(step_us(rl), 3)});
  x.say.say(format_table(rows));
  auto busiest_us = [](const StepRun& r) { return r.time[size_t(slowest_rank(r))].compute_us; };
  x.sheet.exact("L1", "With the balanced cut " + join(balanced) + ", which rank computes longest?",
                "the last: the same number of layers as the fullest stages, plus the final norm, the LM head's [V, C] "
                "matmuls and the loss",
                -1, {int64_t(p - 1)}, {int64_t(slowest_rank(rb))});
  x.sheet.range("L2", "Llama 3's cut " + join(llama) + ": is the step shorter (ns)?",
                "yes: the pipeline runs at the pace of its slowest stage, and the head no longer sits on a stage that "
                "already has the most layers",
                {0}, {ns(step_us(rb)) - 1}, {ns(step_us(rl))},
                "Balanced " + fixed(step_us(rb), 3) + " us, Llama 3 " + fixed(step_us(rl), 3) + " us.");
  x.sheet.answer("L2", {.value = step_us(rb) - step_us(rl), .unit = "us", .of = "the step", .tolerance = 0.0005});
  x.sheet.range("L3", "And the slowest stage's compute (ns)?",
                "smaller: the slowest stage now holds max(layers) without the head, or fewer layers with it", {0},
                {ns(busiest_us(rb)) - 1}, {ns(busiest_us(rl))});
  std::vector<double> compute_b, compute_l;
  for (int r = 0; r < p; ++r) compute_b.push_back(rb.time[size_t(r)].compute_us), compute_l.push_back(rl.time[size_t(r)].compute_us);
  x.extra["balancing"] = {{"balanced", balanced}, {"llama3", llama}, {"step_us_balanced", step_us(rb)},
                          {"step_us_llama3", step_us(rl)}, {"compute_us_balanced", compute_b},
                          {"compute_us_llama3", compute_l}};
}

void show_stage_balancing(Lesson& x) {
  x.say.phase("Llama 3's stage balancing: a layer off the first and last stages",
              "core/parallel/pipeline_layout.h (--pp-layers), core/comm/trace.h (the simulated clock)");
  const std::vector<int>& balanced = x.layout.layers_per_stage;
  const std::vector<int> llama = x.v == 1 ? llama3_layers(balanced) : balanced;
  if (x.v > 1 || llama == balanced)
    x.say.say("(skipped: " +
              std::string(x.v > 1 ? "the interleaved layout has p v stages"
                                  : "the layers divide evenly, every stage has as many") +
              "; the stages' layer counts differ with --layers 6 --pp 4)\n");
  else
    compare_cuts(x, x.kind == Kind::interleaved ? Kind::one_f_one_b : x.kind, balanced, llama);
  x.say.pause();
}

// ---- 6. The zero-bubble split -----------------------------------------------------------------------

// Z1: 1F1B's and ZB-H1's pictures of the real model, and their step times.
void show_zero_bubble_split(Lesson& x, const ScheduleRuns& runs) {
  x.say.phase("the zero-bubble split: I now, W later",
              "core/model/llama.cpp (backward: BackwardPass::input / weight), core/parallel/pipeline_schedule.cpp "
              "(zb_h1_order)");
  x.say.say("A layer's backward computes two things: the input gradient dX = dY W^T, which the previous stage is "
            "waiting for (I),\nand the weight gradient dW = X^T dY, which nobody waits for (W). The hand-written "
            "backward does them in two passes,\nso ZB-H1 runs I at once and defers W into the cool-down, where 1F1B "
            "idles (Qi et al. 2023).\n\n");
  if (runs.per_schedule.count(Kind::zb_h1) && runs.per_schedule.count(Kind::one_f_one_b)) {
    const StepRun& z = runs.per_schedule.at(Kind::zb_h1);
    const StepRun& f = runs.per_schedule.at(Kind::one_f_one_b);
    x.say.say(pipeline_text(f.picture, 96) + "\n" + pipeline_text(z.picture, 96) + "\n");
    x.sheet.range("Z1", "On the real model, is ZB-H1's step shorter than 1F1B's (ns)?",
                  "yes: the same work, with the W passes moved into what was 1F1B's cool-down bubble", {0},
                  {ns(f.picture.end_us) - 1}, {ns(z.picture.end_us)},
                  "1F1B " + fixed(f.picture.end_us, 3) + " us, ZB-H1 " + fixed(z.picture.end_us, 3) + " us; bubble " +
                      fixed(bubble_of(f.picture), 4) + " -> " + fixed(bubble_of(z.picture), 4) + ".");
    x.extra["zero_bubble"] = {{"step_us_1f1b", f.picture.end_us}, {"step_us_zb_h1", z.picture.end_us},
                              {"bubble_1f1b", bubble_of(f.picture)}, {"bubble_zb_h1", bubble_of(z.picture)}};
  }
  x.say.pause();
}

// ---- 7. pp x dp with ZeRO-3: reshard after forward, or keep? -----------------------------------------

// D1, D2: the parameter all-gathers of each rank of `z` per step, when resharding after forward
// (re) and when keeping the parameters (keep), against the units its stage holds.
void check_all_gathers(Lesson& x, const ParallelPlan& z, const StepRun& re, const StepRun& keep) {
  const int L = x.L;
  const std::string params = label::params("");
  std::vector<int64_t> e_keep, m_keep, e_re, m_re;
  std::vector<std::vector<std::string>> rows = {
      {"rank", "units held", "all-gathers (reshard)", "bytes", "all-gathers (keep)", "bytes"}};
  const PipelineLayout zl = z.pipeline_layout(x.cfg());
  for (int w = 0; w < z.world_size(); ++w) {
    const UnitRange u = zl.rank_units(z.coordinate("pp", w), L)[0];
    int blocks = 0, ends = 0;
    for (int k = u.begin; k < u.end; ++k) (k == embedding_unit() || k == head_unit(L) ? ends : blocks)++;
    e_keep.push_back(blocks + ends);
    m_keep.push_back(call_count(keep.traffic[size_t(w)], "all_gather", params));
    e_re.push_back(int64_t(2 * x.m) * blocks + int64_t(x.m) * ends);
    m_re.push_back(call_count(re.traffic[size_t(w)], "all_gather", params));
    rows.push_back({std::to_string(w), std::to_string(blocks + ends), std::to_string(m_re.back()),
                    grouped(sent_bytes(re.traffic[size_t(w)], "all_gather", params)), std::to_string(m_keep.back()),
                    grouped(sent_bytes(keep.traffic[size_t(w)], "all_gather", params))});
  }
  x.say.say(format_table(rows));
  x.sheet.exact("D1", "Keeping the parameters (reshard_after_forward = false): all-gathers per rank and step?",
                "one per unit the stage holds: gathered at its first forward, kept until the step ends", -1, e_keep, m_keep);
  x.sheet.exact("D2", "Resharding after forward: all-gathers per rank and step?",
                "2 m per block (its forward and its backward, for every micro-batch), m for the embedding or the head "
                "(kept from forward to backward, freed after it)",
                -1, e_re, m_re);
}

void compare_reshard_and_keep(Lesson& x) {
  x.say.phase("pp x dp with ZeRO-3: why Llama 3 kept the parameters", "core/parallel/fsdp.cpp (keeps_params_for_step)");
  ParallelPlan z = ParallelPlan::parse("pp=" + std::to_string(std::min(x.p, 2)) + ",dp=2");
  z.schedule = Kind::one_f_one_b;
  z.zero = ZeroStage::zero3;
  TrainOptions zt = x.one;
  zt.batch_size = int64_t(x.m) * x.B * 2;  // m micro-batches on each data rank
  x.say.say("Mesh " + z.describe_mesh() + ", 1F1B, ZeRO-3 over each stage's dp group, m = " + std::to_string(x.m) +
            ". A stage's forwards and backwards of different micro-batches interleave, so a parameter freed after\n"
            "its use is gathered again for the next micro-batch.\n\n");
  x.say.ask("D2", "Resharding after forward: how many parameter all-gathers per step does each rank run?");
  z.reshard_after_forward = true;
  const StepRun re = train_one_step(x.cfg(), z, zt, x.o, x.data, "reshard");
  z.reshard_after_forward = false;
  const StepRun keep = train_one_step(x.cfg(), z, zt, x.o, x.data, "keep");
  check_all_gathers(x, z, re, keep);
  std::vector<int64_t> peak_keep, peak_re;
  for (int w = 0; w < z.world_size(); ++w)
    peak_keep.push_back(keep.peak[size_t(w)].params), peak_re.push_back(re.peak[size_t(w)].params);
  x.say.say("\nPeak parameter bytes per rank: reshard " + spaced(peak_re) + "| keep " + spaced(peak_keep) +
            "\n(keeping holds the stage's whole parameters during the step: 1/pp of the model, which is what makes it "
            "affordable).\n");
  x.say.pause();
}

// ---- Exercises, then the equivalence check -----------------------------------------------------------

int finish(Lesson& x, const std::vector<PhaseView>& phases) {
  x.say.phase("exercises: formula vs measured",
              "lessons/common/lesson.cpp (ExerciseSheet: expected vs measured per rank, predictions scored)");
  EquivalenceReport report;
  const bool equivalent = finish_with_equivalence(x.say, x.sheet, x.s, x.data, report);
  return finish_lesson("05-pipeline-parallelism", x.o.json, x.o.preset, x.s, phases, x.sheet, report, equivalent,
                       [&](nlohmann::json& j) {
                         for (auto& [k, val] : x.extra.items()) j[k] = val;
                         j["layers"] = x.L;
                         j["pipeline"] = {{"pp", x.p}, {"schedule", x.a.schedule}, {"chunks", x.v},
                                          {"micro_batches", x.m}, {"layers_per_stage", x.layout.layers_per_stage}};
                       });
}

int run(const LessonOptions& o, const PpArgs& a) {
  Narrator say(o);
  Lesson x = set_up(o, a, say);
  show_stages(x);
  const std::vector<PhaseView> phases = train_steps(x);
  check_stage_memory(x, phases.front());
  draw_schedules(x);
  sweep_micro_batches(x);
  const ScheduleRuns runs = measure_schedules(x);
  show_in_flight(x, runs);
  check_in_flight(x, runs);
  show_boundary_traffic(x, runs);
  show_stage_balancing(x);
  show_zero_bubble_split(x, runs);
  compare_reshard_and_keep(x);
  return finish(x, phases);
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::PpArgs pp;
  options.micro_batches = 8;
  options.rows = 1;
  options.ranks = pp.pp;  // --ranks is --pp here
  CLI::App app{"Lesson 05: pipeline parallelism on virtual GPUs", "lesson05_pipeline"};
  options.add_options(app);
  app.add_option("--pp", pp.pp, "pipeline ranks (stages; each needs at least one layer)")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  app.add_option("--schedule", pp.schedule, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  app.add_option("--pp-chunks", pp.chunks, "model chunks per rank for the interleaved schedule (v)")
      ->check(CLI::Range(2, 8))
      ->capture_default_str();
  app.add_option("--layers", pp.layers, "layers of the model (default 6, small's depth; 0 keeps the preset's)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    if (app.get_option("--ranks")->count() > 0 && options.ranks != pp.pp)
      throw llama4d::InputError("--ranks is --pp here (" + std::to_string(pp.pp) + "); use --pp");
    return llama4d::lesson::run(options, pp);
  });
}
