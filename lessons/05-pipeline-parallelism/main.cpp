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
#include <mutex>
#include <regex>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/parallel/pipeline_parallel.h"
#include "core/parallel/pipeline_picture.h"
#include "core/tensor/memory_tracker.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"

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

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

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
  static const std::regex number(R"(^(pipeline: (send|recv) (activation|gradient)) \d+(\.\d+)? )");
  for (RankSnapshot& r : p.ranks)
    for (TrafficRecord& t : r.traffic) t.label = std::regex_replace(t.label, number, "$1 * ");
  return p;
}

// ---- One training step of a real model on virtual GPUs ------------------------------------------

struct StepRun {
  std::vector<int> in_flight;                       // [world rank] trainer.pipeline()->peak_in_flight()
  std::vector<RankMemory> rest, peak;               // at rest after construction; peaks in the step
  std::vector<std::vector<TrafficRecord>> traffic;  // [world rank] what the step sent
  std::vector<TimelineTotals> time;                 // [world rank] the step on the simulated clock
  std::vector<int> units_held;                      // [world rank]
  PipelinePicture picture;                          // pure pipelines only
};

// The modelled GPU of the side runs, in TFLOP/s. On an H100's 989 the lesson's tiny stages
// compute an action in tens of nanoseconds, far below one message's 1 us of latency, so the
// clock would show latency, not stages. At Llama 3 405B's scale an action takes ~100 ms and a
// transfer ~1 ms: slowing the modelled GPU puts compute back in charge by about that ratio.
constexpr double kSlowGpuTflops = 0.1;

// Builds the plan's model on every rank, then trains one step with the clock restarted after
// set-up (as `llama4d schedule --measure` does), so the timeline holds the step alone.
StepRun train_one_step(const LlamaConfig& cfg, const ParallelPlan& plan, const TrainOptions& train,
                       const LessonOptions& o, const TextDataset& data, const std::string& title) {
  plan.validate();
  plan.check_model(cfg, int(rank_micro_batch_count(train, plan.dp())));
  const int W = plan.world_size();
  VirtualClusterOptions vo;
  vo.ranks = W;
  vo.cluster = ClusterSpec::for_ranks(W, o.gpus_per_node);
  vo.cluster.gpu_tflops = kSlowGpuTflops;
  vo.algo = o.reduce_algo();
  ParallelPlan p = plan;
  p.algo = vo.algo;
  TrainOptions t = train;
  t.steps = 1;
  StepRun run;
  run.in_flight.resize(size_t(W));
  run.rest.resize(size_t(W));
  run.peak.resize(size_t(W));
  run.traffic.resize(size_t(W));
  run.time.resize(size_t(W));
  run.units_held.resize(size_t(W));
  VirtualCluster cluster(vo);
  std::mutex mu;
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model(cfg, &world.memory(), p.tp_layout(cfg, world.rank()), p.held_units(cfg, world.rank()));
    ParallelTrainer<float> trainer(world, model, data, t, p);
    const RankMemory rest = memory_live(world.memory());
    BarrierOptions b;
    b.label = "set-up done";
    world.barrier(b)->wait();
    world.trace().clear();
    const size_t mark = world.traffic().records().size();
    trainer.step();
    const std::vector<TrafficRecord> all = world.traffic().records();
    int held = 0;
    for (int u = 0; u < model.num_units(); ++u) held += model.holds_unit(u) ? 1 : 0;
    std::lock_guard<std::mutex> lock(mu);
    const size_t r = size_t(world.rank());
    run.in_flight[r] = trainer.pipeline() ? trainer.pipeline()->peak_in_flight() : 0;
    run.rest[r] = rest;
    run.peak[r] = trainer.strategy().peak_memory();
    run.traffic[r].assign(all.begin() + std::ptrdiff_t(mark), all.end());
    run.time[r] = world.trace().totals();
    run.units_held[r] = held;
  });
  if (plan.size("pp") == W) run.picture = pipeline_picture(cluster.traces(), title);
  return run;
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

int64_t count_of(const std::vector<TrafficRecord>& records, const std::string& op, const std::string& prefix) {
  return call_count(records, op, prefix);
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

int run(LessonOptions o, const PpArgs& a) {
  Narrator say(o);
  const int p = a.pp, m = int(o.micro_batches);
  const Kind kind = parse_pipeline_schedule(a.schedule);
  const int v = kind == Kind::interleaved ? a.chunks : 1;
  o.ranks = p;
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  if (a.layers > 0) s.model.num_hidden_layers = a.layers;
  s.model.validate();
  s.train = o.train_options();
  s.train.batch_size = int64_t(m) * o.rows;  // one data rank: the p stages share every row
  s.plan = pipeline_plan(p, kind, a.chunks);
  s.plan.validate();
  s.plan.check_model(s.model, m);  // stages vs layers, m vs the schedule: exit 2 before anything runs
  s.cluster = o.cluster_options();
  const LlamaConfig& cfg = s.model;
  const int L = int(cfg.num_hidden_layers);
  const int64_t C = cfg.hidden_size, B = o.rows, T = o.seq_len, N = cfg.num_parameters();
  const TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  const PipelineLayout layout = s.plan.pipeline_layout(cfg);
  ExerciseSheet sheet;
  nlohmann::json extra;

  // ---- 1. Stages: each rank allocates only its own ------------------------------------------
  say.phase("stages: which rank holds which layers", "core/parallel/pipeline_layout.h (make_pipeline_layout)");
  say.say("Model '" + o.preset + "' with " + std::to_string(L) + " layers: N = " + grouped(N) + " parameters, C = " +
          std::to_string(C) + ", vocabulary " + std::to_string(cfg.vocab_size) + ".\nMesh " +
          s.plan.describe_mesh() + ", schedule " + a.schedule + (v > 1 ? " with v = " + std::to_string(v) + " chunks per rank" : "") +
          ", m = " + std::to_string(m) + " micro-batches of b = " + std::to_string(B) + " x s = " + std::to_string(T) +
          " tokens per step.\nStages: " + layout.describe() + "\n\n");
  {
    std::vector<std::vector<std::string>> rows = {{"rank", "virtual stages", "units", "parameters", "bytes (fp32)"}};
    for (int r = 0; r < p; ++r) {
      const std::vector<UnitRange> units = layout.rank_units(r, L);
      std::string stages;
      for (int c = 0; c < v; ++c) {
        if (c) stages += ',';
        stages += std::to_string(c * p + r);
      }
      rows.push_back({std::to_string(r), stages, units_str(cfg, units), grouped(params_of(cfg, units)),
                      grouped(4 * params_of(cfg, units))});
    }
    rows.push_back({"one device", "all", "everything", grouped(N), grouped(4 * N)});
    say.say(format_table(rows));
  }
  say.ask("P1", "How many bytes of parameters does rank 0 allocate?");
  StepReporter steps(say, o.step,
                     "send/recv: the activations [b, s, h] forward and their gradients back, one message per "
                     "micro-batch and stage boundary.\n'loss' and 'grad-norm' sum the stages' partial results "
                     "(the other stages add exact zeros).",
                     " (activations: the micro-batches a stage holds at once)", "core/parallel/pipeline_parallel.cpp (PipelineRunner::train)");
  const std::vector<PhaseView> phases = run_phases(s, data, [&](const PhaseView& pv) {
    if (pv.step > 0) return steps.show(fold_micro_batches(pv));
    say.say("\nBytes live on each virtual GPU after construction: the parameters, gradients and AdamW moments of its "
            "stages only.\n\n" + memory_table(live_of(pv)));
    say.pause();
  });
  {
    std::vector<int64_t> e_params, m_params, e_state, m_state;
    for (int r = 0; r < p; ++r) {
      const int64_t n = params_of(cfg, layout.rank_units(r, L));
      const RankMemory& live = phases.front().ranks[size_t(r)].live;
      e_params.push_back(4 * n), m_params.push_back(live.params);
      e_state.push_back(16 * n), m_state.push_back(live.params + live.grads + live.optimizer);
    }
    sheet.exact("P1", "How many bytes of parameters does each rank allocate?",
                "4 x the parameters of its units: its layers (4 C^2-ish each), plus the embedding V C on the first "
                "stage and the final norm + LM head C + V C on the last",
                -1, e_params, m_params);
    int64_t sum = 0;
    for (int64_t x : m_state) sum += x;
    sheet.exact("P2", "And model state (params + grads + AdamW)? Summed over the ranks?",
                "16 bytes per parameter held; the ranks together hold exactly one device's 16 N = " + grouped(16 * N),
                -1, e_state, m_state, "Measured sum over ranks: " + grouped(sum) + (sum == 16 * N ? " = 16 N." : " != 16 N!"));
  }

  // ---- 2. The schedules, drawn from the simulated clock ----------------------------------------
  say.phase("the schedules, drawn from the simulated clock",
            "core/parallel/pipeline_schedule.cpp (one function per schedule), pipeline_parallel.cpp (run_modelled_pipeline)");
  say.say("Uniform stages, free transfers: each action a fixed time on the simulated clock, F = I = W = 12 us (B = I + W "
          "= 24 us);\nthe interleaved schedule's chunks hold half a stage each, so their actions take 6 us. Letters: F "
          "forward, B backward,\nI/W the two halves of a backward (ZB-H1); lowercase: a rank's second chunk; '.' idle.\n\n");
  const char* bubble_id[] = {"B1", "B2", "B3", "B4"};
  nlohmann::json drawn = nlohmann::json::object();
  for (size_t i = 0; i < 4; ++i) {
    const Kind k = kAllSchedules[i];
    const int kv = k == Kind::interleaved ? a.chunks : 1;
    const std::string name(pipeline_schedule_name(k));
    if (k == Kind::interleaved && m % p != 0) {
      say.say("(interleaved skipped: it runs micro-batches in groups of p, and m = " + std::to_string(m) +
              " is not a multiple of p = " + std::to_string(p) + ")\n\n");
      continue;
    }
    const PipelineSchedule sched = make_pipeline_schedule(k, p, m, kv);
    const StageCosts c = modelled_costs(k, kv);
    if (k == Kind::one_f_one_b)
      say.ask(bubble_id[i], "1F1B, p = " + std::to_string(p) + ", m = " + std::to_string(m) +
                                ", F = 12 us, B = 24 us: how many microseconds does each rank sit idle in the step?");
    const PipelinePicture pic = run_modelled(sched, c);
    say.say(pipeline_text(pic, 96) + "\n");
    const double measured = bubble_of(pic), formula = pipeline_bubble_formula(k, p, m, kv, c);
    const bool zb_formula = k != Kind::zb_h1 || m >= p;
    // Expected idle time per rank: the closed form, or for ZB-H1 with m < p the simulator's.
    const double idle = zb_formula ? idle_formula_us(k, p, c)
                                   : simulate_pipeline_schedule(sched, c).makespan - m * (c.forward + c.backward_input + c.backward_weight);
    std::vector<int64_t> lo, hi, got;
    for (int r = 0; r < p; ++r) {
      lo.push_back(ns(idle) - 1), hi.push_back(ns(idle) + 1);
      got.push_back(ns(pic.end_us - pic.busy_us()[size_t(r)]));
    }
    const double ideal = m * (c.forward + c.backward_input + c.backward_weight);
    const std::string fractions = "Share of the step: measured " + fixed(measured, 4) + ", formula " +
                                  (zb_formula ? fixed(formula, 4) : std::string("n/a (m < p)")) +
                                  "; relative to the ideal time m(F+B): " + fixed(idle / ideal, 4) + ".";
    say.say(fractions + "\n\n");
    const std::string question = "How many ns does each rank idle in one step of " + sched.name() + "?";
    if (k == Kind::gpipe || k == Kind::one_f_one_b)
      sheet.range(bubble_id[i], question,
                  "(p-1)(F+B): p-1 slots of F at the start and p-1 of B at the end; as a share of the step "
                  "(p-1)/(m+p-1), as a share of the ideal time m(F+B) (p-1)/m",
                  lo, hi, got, fractions);
    else if (k == Kind::interleaved)
      sheet.range(bubble_id[i], question,
                  "(p-1)(F+B) of one CHUNK, i.e. 1/v of the plain bubble; share of the step (p-1)/(v m + p-1)", lo, hi,
                  got, fractions);
    else
      sheet.range(bubble_id[i], question,
                  zb_formula ? "(p-1)(F+I-W): the deferred W passes fill the cool-down; share of the step "
                               "(p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W)), for m >= p"
                             : "m < p: too few W passes to fill the cool-down; no closed form, the simulator's value",
                  lo, hi, got, fractions);
    drawn[name] = {{"name", sched.name()}, {"bubble_measured", measured}, {"bubble_formula", zb_formula ? nlohmann::json(formula) : nlohmann::json(nullptr)},
                   {"idle_us_per_rank", pic.end_us - pic.busy_us()[0]}, {"step_us", pic.end_us}};
    say.pause();
  }
  extra["schedules_modelled"] = drawn;

  // The sweep: bubble share vs m for every schedule, measured on the clock, against the formulas
  // and against the (p-1)/m a seed gives as "the bubble fraction".
  say.say("Bubble share of the step vs m (p = " + std::to_string(p) + "; measured on the clock | formula):\n\n");
  {
    std::vector<std::vector<std::string>> rows = {{"m", "gpipe", "1f1b", "interleaved v=" + std::to_string(a.chunks), "zb-h1", "(p-1)/m: vs ideal, not the step"}};
    int points = 0, agree = 0;
    nlohmann::json sweep = nlohmann::json::array();
    for (int mm : {p, 2 * p, 4 * p, 8 * p}) {
      std::vector<std::string> row = {std::to_string(mm)};
      for (Kind k : kAllSchedules) {
        const int kv = k == Kind::interleaved ? a.chunks : 1;
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
    say.say(format_table(rows));
    say.say("\nMore micro-batches shrink every bubble; interleaving divides 1F1B's by about v, ZB-H1's is a third of it "
            "when F = I = W.\n");
    sheet.exact("B5", "Over the sweep (m = p, 2p, 4p, 8p, four schedules), at how many points does the measured bubble "
                      "equal its formula (within 1e-9)?",
                "all of them: uniform stages and free transfers are exactly the formulas' assumptions", double(points),
                {points}, {agree});
    extra["sweep"] = sweep;
  }
  say.pause();

  // ---- 3. Memory: the micro-batches in flight --------------------------------------------------
  say.phase("memory: the micro-batches each rank holds", "core/parallel/pipeline_parallel.cpp (peak_in_flight)");
  say.say("One training step of the model per schedule. A rank keeps a micro-batch's activations from its forward to "
          "its backward\n(to its W for ZB-H1): the schedule decides how many it holds at once. From here on the "
          "modelled GPU runs at " + fixed(kSlowGpuTflops, 1) + " TFLOP/s:\non an H100's 989 these tiny stages would "
          "compute for nanoseconds and every picture would show the 1 us message latency instead\n(at Llama 3 "
          "405B's scale an action takes ~100 ms and a transfer ~1 ms; this keeps compute about that far ahead).\n\n");
  say.ask("M2", "1F1B: how many micro-batches does rank 0 hold at most? And the last rank?");
  TrainOptions one = s.train;
  one.steps = 1;
  std::map<Kind, StepRun> per_schedule;
  std::map<Kind, int> depth;  // the layers each schedule's run used
  for (Kind k : kAllSchedules) {
    if (k == Kind::interleaved && m % p != 0) continue;
    LlamaConfig c = cfg;
    // Interleaving needs p v stages of at least one layer: a deeper copy when the model is too short.
    if (k == Kind::interleaved && c.num_hidden_layers < int64_t(p) * a.chunks) c.num_hidden_layers = int64_t(p) * a.chunks;
    depth[k] = int(c.num_hidden_layers);
    per_schedule[k] = train_one_step(c, pipeline_plan(p, k, a.chunks), one, o, data,
                                     make_pipeline_schedule(k, p, m, k == Kind::interleaved ? a.chunks : 1).name() +
                                         ", measured");
  }
  TrainOptions single = one;
  single.batch_size = B;  // m = 1: one micro-batch's activations per stage
  const StepRun unit = train_one_step(cfg, pipeline_plan(p, Kind::gpipe, 1), single, o, data, "one micro-batch");
  {
    std::vector<std::vector<std::string>> rows = {{"rank", "one micro-batch's activations"}};
    for (Kind k : kAllSchedules)
      if (per_schedule.count(k)) rows[0].push_back(std::string(pipeline_schedule_name(k)) + ": in flight / activations");
    for (int r = 0; r < p; ++r) {
      std::vector<std::string> row = {std::to_string(r), grouped(unit.peak[size_t(r)].activations)};
      for (Kind k : kAllSchedules)
        if (per_schedule.count(k))
          row.push_back(std::to_string(per_schedule[k].in_flight[size_t(r)]) + " / " +
                        grouped(per_schedule[k].peak[size_t(r)].activations));
      rows.push_back(row);
    }
    say.say(format_table(rows));
    if (per_schedule.count(Kind::interleaved) && depth[Kind::interleaved] != L)
      say.say("(interleaved ran a " + std::to_string(depth[Kind::interleaved]) + "-layer copy: p v = " +
              std::to_string(p * a.chunks) + " stages need a layer each; its in-flight counts are (micro-batch, chunk) "
              "pairs, each 1/v of a stage)\n");
  }
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
    if (!per_schedule.count(k)) continue;
    std::vector<int64_t> e, got;
    for (int r = 0; r < p; ++r) {
      e.push_back(in_flight_formula(k, p, m, k == Kind::interleaved ? a.chunks : 1, r));
      got.push_back(per_schedule[k].in_flight[size_t(r)]);
    }
    sheet.exact(flight_id[i], "At most how many micro-batches does each rank hold under " +
                                  std::string(pipeline_schedule_name(k)) + " (trainer.pipeline()->peak_in_flight())?",
                flight_rule[i], -1, e, got);
  }
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b}) {
    std::vector<int64_t> e, got;
    for (int r = 0; r < p; ++r) {
      e.push_back(int64_t(in_flight_formula(k, p, m, 1, r)) * unit.peak[size_t(r)].activations);
      got.push_back(per_schedule[k].peak[size_t(r)].activations);
    }
    sheet.exact(k == Kind::gpipe ? "M4" : "M5",
                "Peak activation bytes per rank under " + std::string(pipeline_schedule_name(k)) + "?",
                "micro-batches in flight x one micro-batch's activations of that stage (measured with m = 1)", -1, e, got);
  }
  say.pause();

  // ---- 4. Traffic per stage boundary ------------------------------------------------------------
  say.phase("traffic: what crosses a stage boundary", "core/parallel/pipeline_parallel.cpp (send/recv actions)");
  const int64_t bsh = B * T * C;
  say.ask("T1", "How many bytes does rank 1 send per step (activations forward + gradients back)?");
  {
    const StepRun& r1 = per_schedule[Kind::one_f_one_b];
    std::vector<int64_t> e, got;
    std::vector<std::vector<std::string>> rows = {{"rank", "activations sent", "gradients sent", "messages"}};
    for (int r = 0; r < p; ++r) {
      const auto& t = r1.traffic[size_t(r)];
      const int64_t act = sent_bytes(t, "send", "pipeline: send activation"), grad = sent_bytes(t, "send", "pipeline: send gradient");
      rows.push_back({std::to_string(r), grouped(act), grouped(grad), std::to_string(count_of(t, "send", "pipeline: send"))});
      e.push_back(int64_t(m) * bsh * 4 * ((r < p - 1 ? 1 : 0) + (r > 0 ? 1 : 0)));
      got.push_back(act + grad);
    }
    say.say("One step of 1F1B (" + std::to_string(m) + " micro-batches of b s h = " + std::to_string(B) + " x " +
            std::to_string(T) + " x " + std::to_string(C) + " = " + grouped(bsh) + " numbers):\n\n" + format_table(rows));
    sheet.exact("T1", "How many bytes does each rank send per step?",
                "m b s h numbers of activations to the next stage and m b s h of gradients to the previous: 4 m b s h "
                "bytes per direction that rank has (the first and last stages have one direction)",
                -1, e, got);
    int64_t total = 0;
    for (int64_t x : got) total += x;
    sheet.exact("T2", "How many numbers cross one stage boundary per step (all ranks' sends / boundaries)?",
                "2 m b s h: m activations forward, m gradients back", double(2 * m * bsh), {2 * m * bsh},
                {total / 4 / (p - 1)});
  }
  if (per_schedule.count(Kind::interleaved)) {
    const StepRun& ir = per_schedule[Kind::interleaved];
    const int vv = a.chunks;
    std::vector<int64_t> e, got;
    for (int r = 0; r < p; ++r) {
      // Rank r holds stages r, p + r, ...: every one sends forward unless it is the last stage,
      // backward unless it is the first.
      int dirs = 0;
      for (int c = 0; c < vv; ++c) dirs += (c * p + r < p * vv - 1 ? 1 : 0) + (c * p + r > 0 ? 1 : 0);
      e.push_back(int64_t(m) * bsh * 4 * dirs);
      got.push_back(sent_bytes(ir.traffic[size_t(r)], "send", "pipeline: send"));
    }
    sheet.exact("T3", "Interleaved (v = " + std::to_string(vv) + "): bytes each rank sends per step?",
                "each of a rank's v chunks is a stage with its own boundaries: v times 1F1B's on the middle ranks; "
                "in all p v - 1 boundaries instead of p - 1, (p v - 1)/(p - 1) times the traffic",
                -1, e, got);
  }
  say.pause();

  // ---- 5. Llama 3's stage balancing ---------------------------------------------------------------
  say.phase("Llama 3's stage balancing: a layer off the first and last stages",
            "core/parallel/pipeline_layout.h (--pp-layers), core/comm/trace.h (the simulated clock)");
  const std::vector<int> balanced = layout.layers_per_stage;
  const Kind bal_kind = kind == Kind::interleaved ? Kind::one_f_one_b : kind;
  const std::vector<int> llama = v == 1 ? llama3_layers(balanced) : balanced;
  if (v > 1 || llama == balanced) {
    say.say("(skipped: " + std::string(v > 1 ? "the interleaved layout has p v stages" : "the layers divide evenly, every stage has as many") +
            "; the stages' layer counts differ with --layers 6 --pp 4)\n");
  } else {
    say.say("The same model, " + std::string(pipeline_schedule_name(bal_kind)) + ", two cuts of its " + std::to_string(L) +
            " layers: balanced " + join(balanced) + " and Llama 3's " + join(llama) +
            " (the last stage also runs the final norm, the LM head [V, C] and the loss; the first only looks up "
            "embeddings).\nCompute time per rank is FLOPs / the modelled GPU's rate.\n\n");
    say.ask("L2", "Which cut finishes the step sooner, and by how many microseconds?");
    const StepRun rb = train_one_step(cfg, pipeline_plan(p, bal_kind, 1, balanced), one, o, data,
                                      "balanced " + join(balanced));
    const StepRun rl = train_one_step(cfg, pipeline_plan(p, bal_kind, 1, llama), one, o, data, "Llama 3 " + join(llama));
    say.say(pipeline_text(rb.picture, 96) + "\n" + pipeline_text(rl.picture, 96) + "\n");
    auto step_of = [](const StepRun& r) {
      double t = 0;
      for (const TimelineTotals& x : r.time) t = std::max(t, x.clock_us);
      return t;
    };
    std::vector<std::vector<std::string>> rows = {{"rank", "layers (balanced)", "compute us", "layers (Llama 3)", "compute us"}};
    for (int r = 0; r < p; ++r)
      rows.push_back({std::to_string(r), std::to_string(balanced[size_t(r)]), fixed(rb.time[size_t(r)].compute_us, 3),
                      std::to_string(llama[size_t(r)]), fixed(rl.time[size_t(r)].compute_us, 3)});
    rows.push_back({"step", "", fixed(step_of(rb), 3), "", fixed(step_of(rl), 3)});
    say.say(format_table(rows));
    auto slowest = [&](const StepRun& r) {
      int w = 0;
      for (int i = 1; i < p; ++i)
        if (r.time[size_t(i)].compute_us > r.time[size_t(w)].compute_us) w = i;
      return w;
    };
    auto busiest_us = [&](const StepRun& r) { return r.time[size_t(slowest(r))].compute_us; };
    sheet.exact("L1", "With the balanced cut " + join(balanced) + ", which rank computes longest?",
                "the last: the same number of layers as the fullest stages, plus the final norm, the LM head's [V, C] "
                "matmuls and the loss",
                -1, {int64_t(p - 1)}, {int64_t(slowest(rb))});
    sheet.range("L2", "Llama 3's cut " + join(llama) + ": is the step shorter (ns)?",
                "yes: the pipeline runs at the pace of its slowest stage, and the head no longer sits on a stage that "
                "already has the most layers",
                {0}, {ns(step_of(rb)) - 1}, {ns(step_of(rl))},
                "Balanced " + fixed(step_of(rb), 3) + " us, Llama 3 " + fixed(step_of(rl), 3) + " us.");
    sheet.range("L3", "And the slowest stage's compute (ns)?",
                "smaller: the slowest stage now holds max(layers) without the head, or fewer layers with it", {0},
                {ns(busiest_us(rb)) - 1}, {ns(busiest_us(rl))});
    extra["balancing"] = {{"balanced", balanced}, {"llama3", llama}, {"step_us_balanced", step_of(rb)},
                          {"step_us_llama3", step_of(rl)}};
  }
  say.pause();

  // ---- 6. The zero-bubble split -------------------------------------------------------------------
  say.phase("the zero-bubble split: I now, W later",
            "core/model/llama.cpp (backward: BackwardPass::input / weight), pipeline_schedule.cpp (zb_h1_order)");
  say.say("A layer's backward computes two things: the input gradient dX = dY W^T, which the previous stage is "
          "waiting for (I),\nand the weight gradient dW = X^T dY, which nobody waits for (W). The hand-written "
          "backward does them in two passes,\nso ZB-H1 runs I at once and defers W into the cool-down, where 1F1B "
          "idles (Qi et al. 2023).\n\n");
  if (per_schedule.count(Kind::zb_h1) && per_schedule.count(Kind::one_f_one_b)) {
    const StepRun& z = per_schedule[Kind::zb_h1];
    const StepRun& f = per_schedule[Kind::one_f_one_b];
    say.say(pipeline_text(f.picture, 96) + "\n" + pipeline_text(z.picture, 96) + "\n");
    sheet.range("Z1", "On the real model, is ZB-H1's step shorter than 1F1B's (ns)?",
                "yes: the same work, with the W passes moved into what was 1F1B's cool-down bubble", {0},
                {ns(f.picture.end_us) - 1}, {ns(z.picture.end_us)},
                "1F1B " + fixed(f.picture.end_us, 3) + " us, ZB-H1 " + fixed(z.picture.end_us, 3) + " us; bubble " +
                    fixed(bubble_of(f.picture), 4) + " -> " + fixed(bubble_of(z.picture), 4) + ".");
  }
  say.pause();

  // ---- 7. pp x dp with ZeRO-3: reshard after forward, or keep? -------------------------------------
  say.phase("pp x dp with ZeRO-3: why Llama 3 kept the parameters", "core/parallel/fsdp.cpp (keeps_params_for_step)");
  {
    const int pp2 = std::min(p, 2);
    ParallelPlan z = ParallelPlan::parse("pp=" + std::to_string(pp2) + ",dp=2");
    z.schedule = Kind::one_f_one_b;
    z.zero = ZeroStage::zero3;
    TrainOptions zt = one;
    zt.batch_size = int64_t(m) * B * 2;  // m micro-batches on each data rank
    say.say("Mesh " + z.describe_mesh() + ", 1F1B, ZeRO-3 over each stage's dp group, m = " + std::to_string(m) +
            ". A stage's forwards and backwards of different micro-batches interleave, so a parameter freed after\n"
            "its use is gathered again for the next micro-batch.\n\n");
    say.ask("D2", "Resharding after forward: how many parameter all-gathers per step does each rank run?");
    z.reshard_after_forward = true;
    const StepRun re = train_one_step(cfg, z, zt, o, data, "reshard");
    z.reshard_after_forward = false;
    const StepRun keep = train_one_step(cfg, z, zt, o, data, "keep");
    std::vector<int64_t> e_keep, m_keep, e_re, m_re;
    std::vector<std::vector<std::string>> rows = {{"rank", "units held", "all-gathers (reshard)", "bytes", "all-gathers (keep)", "bytes"}};
    const PipelineLayout zl = z.pipeline_layout(cfg);
    for (int w = 0; w < z.world_size(); ++w) {
      const int stage = z.coordinate("pp", w);
      const UnitRange u = zl.rank_units(stage, L)[0];
      int blocks = 0, ends = 0;
      for (int k = u.begin; k < u.end; ++k) (k == embedding_unit() || k == head_unit(L) ? ends : blocks)++;
      e_keep.push_back(blocks + ends);
      m_keep.push_back(count_of(keep.traffic[size_t(w)], "all_gather", "params "));
      e_re.push_back(int64_t(2 * m) * blocks + int64_t(m) * ends);
      m_re.push_back(count_of(re.traffic[size_t(w)], "all_gather", "params "));
      rows.push_back({std::to_string(w), std::to_string(blocks + ends), std::to_string(m_re.back()),
                      grouped(sent_bytes(re.traffic[size_t(w)], "all_gather", "params ")), std::to_string(m_keep.back()),
                      grouped(sent_bytes(keep.traffic[size_t(w)], "all_gather", "params "))});
    }
    say.say(format_table(rows));
    sheet.exact("D1", "Keeping the parameters (reshard_after_forward = false): all-gathers per rank and step?",
                "one per unit the stage holds: gathered at its first forward, kept until the step ends", -1, e_keep, m_keep);
    sheet.exact("D2", "Resharding after forward: all-gathers per rank and step?",
                "2 m per block (its forward and its backward, for every micro-batch), m for the embedding or the head "
                "(kept from forward to backward, freed after it)",
                -1, e_re, m_re);
    std::vector<int64_t> peak_keep, peak_re;
    for (int w = 0; w < z.world_size(); ++w)
      peak_keep.push_back(keep.peak[size_t(w)].params), peak_re.push_back(re.peak[size_t(w)].params);
    say.say("\nPeak parameter bytes per rank: reshard " + [&] {
      std::string t;
      for (int64_t x : peak_re) t += grouped(x) + " ";
      return t;
    }() + "| keep " + [&] {
      std::string t;
      for (int64_t x : peak_keep) t += grouped(x) + " ";
      return t;
    }() + "\n(keeping holds the stage's whole parameters during the step: 1/pp of the model, which is what makes it "
          "affordable).\n");
  }
  say.pause();

  // ---- Exercises, then the equivalence check --------------------------------------------------------
  say.phase("exercises: formula vs measured");
  EquivalenceReport report;
  const bool equivalent = finish_with_equivalence(say, sheet, s, data, report);
  return finish_lesson("05-pipeline-parallelism", o.json, o.preset, s, phases, sheet, report, equivalent,
                       [&](nlohmann::json& j) {
                         for (auto& [k, val] : extra.items()) j[k] = val;
                         j["layers"] = L;
                         j["pipeline"] = {{"pp", p}, {"schedule", a.schedule}, {"chunks", v},
                                          {"micro_batches", m}, {"layers_per_stage", balanced}};
                       });
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
