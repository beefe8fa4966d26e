// Lesson 01: data parallelism. Every virtual GPU holds the whole model, trains on its own rows of
// the global batch, and after backward the ranks all-reduce their gradients, so every rank takes
// the same AdamW step a single device would. The program shows the mesh and the rows, trains a
// few steps with the library's ParallelTrainer, shows what each rank held and sent, checks
// the README's formulas against the measured numbers, and proves the result equals one device.
//   lesson01_data_parallel [--ranks 4] [--micro-batches 2] [--step] [--json]
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/comm/traffic_labels.h"
#include "core/data/dataset.h"
#include "core/model/flops.h"
#include "core/model/params.h"
#include "core/optim/segmented_norm.h"
#include "lessons/common/clock.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"
#include "lessons/common/step_run.h"

namespace llama4d::lesson {
namespace {

// A step of W data-parallel ranks on the simulated clock, from the formulas: M micro-batches of
// forward + backward FLOPs at the GPU's rate, then what the gradient buckets leave exposed after
// the last backward (each bucket all-reduced as its unit finishes, one at a time on the comm
// stream), then the loss all-reduce, which nothing hides. One node: every hop is NVLink.
struct StepTime {
  double compute_us = 0, exposed_us = 0;
  double step_us() const { return compute_us + exposed_us; }
};
StepTime step_time_formula(const LlamaConfig& cfg, const std::vector<Segment>& buckets, int64_t W, int64_t M,
                           int64_t b, int64_t T, ReduceAlgo algo, const ClusterSpec& cluster) {
  const double per_us = cluster.gpu_tflops * 1e6;  // FLOPs per microsecond
  const int L = int(cfg.num_hidden_layers);
  std::vector<double> backward_us, all_reduce_times;
  StepTime t;
  for (int u = num_units(L) - 1; u >= 0; --u) {  // backward order: the head first
    const UnitFlops f = unit_flops(cfg, b, T, u);
    t.compute_us += double(M) * (f.forward + f.backward) / per_us;
    backward_us.push_back(f.backward / per_us);
    all_reduce_times.push_back(all_reduce_us(buckets[size_t(u)].numel(), int(W), 4, algo, cluster.nvlink));
  }
  t.exposed_us = bucket_pipeline_tail_us(backward_us, all_reduce_times) + all_reduce_us(2, int(W), 8, algo, cluster.nvlink);
  return t;
}

// The README's questions: asked (with --step) before the table that answers them, and set beside
// the measurements on the exercise sheet.
struct Questions {
  std::string batch, state, grads, calls, total, steps, exposed;
};

Questions questions_for(int64_t W, int64_t M, int64_t b) {
  return {
      .batch = "How many sequences does one step train on (the global batch B), with W = " + std::to_string(W) +
               " ranks, M = " + std::to_string(M) + " micro-batch(es) per rank, b = " + std::to_string(b) + " rows each?",
      .state = "How many bytes of model state (params + grads + AdamW) does each rank hold?",
      .grads = "How many bytes does rank 0 send per step to all-reduce the gradients?",
      .calls = "How many gradient all-reduces does each rank issue per step with M = " + std::to_string(M) +
               " micro-batch(es)?",
      .total = "How many bytes does rank 0 send in all during a step?",
      .steps = "On the simulated clock, how long does a step take for W = 1, 2, 4 and 8 (ns)? Predict the largest W's.",
      .exposed = "On the simulated clock, how long is rank 0's compute blocked on communication per step (ns)?",
  };
}

// What every phase reads: the run, its rows, the model's buckets and the README's notation.
struct DpLesson {
  const LessonOptions& o;
  RunSetup s;
  TextDataset data;
  std::vector<Segment> buckets;  // one per unit (embedding, L layers, head): what one all-reduce carries
  // Notation (README): N parameters; W ranks, all of them in every all-reduce (n = W); M
  // micro-batches of b rows per rank; B = W M b sequences per step.
  int64_t N, W, M, b;
  Questions q;
};

DpLesson set_up(const LessonOptions& o) {
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  s.train = o.train_options();
  s.plan = ParallelPlan::parse("dp=" + std::to_string(o.ranks));  // plain dp: one group, no replicas
  s.cluster = o.cluster_options();
  TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  std::vector<Segment> buckets = param_segments(llama_param_specs(s.model));
  const int64_t N = s.model.num_parameters();
  return {.o = o, .s = std::move(s), .data = std::move(data), .buckets = std::move(buckets), .N = N, .W = o.ranks,
          .M = o.micro_batches, .b = o.rows, .q = questions_for(o.ranks, o.micro_batches, o.rows)};
}

void show_mesh_and_batch(Narrator& say, const DpLesson& l) {
  const int64_t W = l.W, M = l.M, b = l.b;
  say.phase("the mesh and the batch",
            "core/parallel/parallel_trainer.cpp: data_rank_micro_batches() gives data rank d its rows, cut into "
            "micro-batches; lessons/common/lesson.cpp: LessonOptions::train_options() sets B");
  say.say("Model '" + l.o.preset + "': N = " + grouped(l.N) + " parameters (fp32: 4N = " + grouped(4 * l.N) +
          " bytes). Data parallelism over W = " + std::to_string(W) + " virtual GPUs, " +
          std::string(reduce_algo_name(l.s.cluster.algo)) + " reductions; " + l.s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(l.s.plan, l.s.cluster.cluster));
  say.say("\n");
  say.ask("E1", l.q.batch);
  say.say("\nThe global batch is B = W x M x b = " + std::to_string(W) + " x " + std::to_string(M) + " x " +
          std::to_string(b) + " = " + std::to_string(l.s.train.batch_size) +
          " sequences.\nEvery rank trains M micro-batches of b rows whatever W is, so B grows with the ranks (llama4d "
          "train does\nthe opposite: --batch-size fixes B, and each rank gets B/W rows). Data rank d trains rows "
          "[d*B/W, (d+1)*B/W).\nRows of step 1:\n\n");
  say.say(batch_table(l.data, l.s.train, int(W), 0));
  say.pause();
}

void show_replicas_at_rest(Narrator& say, const DpLesson& l, const PhaseView& p) {
  say.phase("replicas at rest (" + p.strategy + ")",
            "core/parallel/data_parallel.cpp: DistributedDataParallel::init_weights(); core/optim/adamw.h: AdamW "
            "(the moments m and v)");
  say.ask("E2", l.q.state);
  say.say("\nEvery rank holds the whole model: parameters 4N, gradients 4N, AdamW moments 8N = 16N bytes\n"
          "(bytes live on each virtual GPU right after construction):\n\n");
  say.say(memory_table(live_of(p)));
  say.pause();
}

// The run itself: the replicas after construction, then every step's traffic and memory (the
// questions about a step asked before the first step's tables).
std::vector<PhaseView> train_and_show_steps(Narrator& say, const DpLesson& l) {
  StepReporter steps(say, l.o.step,
                     "One all-reduce per bucket (a bucket = one unit: a layer, the embedding, or the head = final norm\n"
                     "+ LM head), launched as soon as that unit's backward is done, while earlier units still compute;\n"
                     "the head's is the first, the embedding's the last. With M = " + std::to_string(l.M) +
                         ", only the last micro-batch's backward\ncommunicates: the others accumulate (no_sync).",
                     "",
                     "core/parallel/data_parallel.cpp: DistributedDataParallel::step() (no_sync) and after_backward() "
                     "(one bucket per unit)");
  return run_phases(l.s, l.data, [&](const PhaseView& p) {
    if (p.step == 0) return show_replicas_at_rest(say, l, p);
    steps.show(p, [&] {
      if (p.step > 1) return;
      say.ask("E3", l.q.grads);
      say.ask("E4", l.q.calls);
      say.ask("E5", l.q.total);
      say.ask("E6", l.q.exposed);
      if (l.o.step) say.say("\n");
    });
  });
}

// E1-E5: the batch, the model state and the bytes and calls of a step, per rank, against the
// README's formulas (the sheet is printed after the time phase).
void check_batch_state_and_traffic(ExerciseSheet& sheet, const DpLesson& l, const PhaseView& last) {
  const int64_t N = l.N, W = l.W;
  const ReduceAlgo algo = l.s.cluster.algo;
  const std::string grad_buckets = label::grad_bucket("");
  std::vector<int64_t> batch, state, grad_bytes, grad_calls, all_bytes, exp_batch, exp_state, exp_grad, exp_calls,
      exp_all;
  for (int r = 0; r < W; ++r) {
    const RankSnapshot& snap = last.ranks[size_t(r)];
    batch.push_back(snap.tokens / l.s.train.seq_len);  // every position of every row has a target
    state.push_back(snap.peak.params + snap.peak.grads + snap.peak.optimizer);
    grad_bytes.push_back(sent_bytes(snap.traffic, "all_reduce", grad_buckets));
    grad_calls.push_back(call_count(snap.traffic, "all_reduce", grad_buckets));
    all_bytes.push_back(total_sent(snap.traffic));
    exp_batch.push_back(W * l.M * l.b);
    exp_state.push_back(16 * N);
    int64_t g = 0;
    for (const Segment& seg : l.buckets) g += all_reduce_sent(seg.numel(), int(W), r, 4, algo);
    exp_grad.push_back(g);
    exp_calls.push_back(int64_t(l.buckets.size()));
    exp_all.push_back(g + all_reduce_sent(2, int(W), r, 8, algo));  // + the fp64 (loss_sum, tokens) pair
  }
  const double ar = 2.0 * double(W - 1) / double(W);
  const std::string n_is = " (n = " + std::to_string(W) + ")";
  sheet.exact("E1", l.q.batch,
              "B = W x M x b: each rank trains M micro-batches of b rows (measured: the tokens the step's loss "
              "all-reduce counted, / T)",
              -1, exp_batch, batch);  // every rank measures the same global B: no mean to compare
  sheet.exact("E2", l.q.state, "4N + 4N + 8N = 16N, the same as one GPU: DP buys throughput, not memory",
              16.0 * double(N), exp_state, state);
  sheet.exact("E3", l.q.grads, "2(n-1)/n * 4N" + n_is + ": reduce-scatter + all-gather, ring or direct alike",
              ar * 4.0 * double(N), exp_grad, grad_bytes,
              "Each bucket is split into n balanced chunks; when n does not divide it, ranks with a longer chunk send "
              "a few bytes more, ranks with a shorter one less: the mean stays exact.");
  sheet.exact("E4", l.q.calls,
              "one per bucket (L + 2 = " + std::to_string(l.buckets.size()) +
                  "), whatever M: only the last backward syncs (no_sync)",
              double(l.buckets.size()), exp_calls, grad_calls);
  sheet.exact("E5", l.q.total,
              "the gradients + only the loss, one all-reduce of 2 doubles (loss sum, tokens): 2(n-1)/n * (4N + 16)",
              ar * (4.0 * double(N) + 16.0), exp_all, all_bytes);
}

StepTime step_time_formula(const DpLesson& l, int64_t W, const ClusterSpec& cluster) {
  return step_time_formula(l.s.model, l.buckets, W, l.M, l.b, l.s.train.seq_len, l.s.cluster.algo, cluster);
}

// E6: what the gradient buckets leave exposed, per rank, on the simulated clock.
void check_exposed_comm(ExerciseSheet& sheet, const DpLesson& l, const PhaseView& last) {
  const StepTime f = step_time_formula(l, l.W, l.s.cluster.cluster);
  std::vector<int64_t> lo, hi, exposed;
  for (int r = 0; r < l.W; ++r) {
    lo.push_back(ns(f.exposed_us) - 1), hi.push_back(ns(f.exposed_us) + 1);
    exposed.push_back(ns(last.ranks[size_t(r)].time.wait_us));
  }
  sheet.range("E6", l.q.exposed,
              "the bucket pipeline's tail: each bucket's all-reduce starts when its unit's backward ends and the "
              "previous bucket is done; what runs past the last backward (the embedding's bucket, at least) plus "
              "the loss all-reduce",
              lo, hi, exposed, "Within 1 ns of rounding; lessons/common/clock.cpp: bucket_pipeline_tail_us().");
}

// One step of w data-parallel ranks, each with this run's M micro-batches of b rows: rank 0's clock.
TimelineTotals step_on_clock(const DpLesson& l, int64_t w) {
  TrainOptions train = l.s.train;
  train.batch_size = w * l.M * l.b;
  const ParallelPlan plan = ParallelPlan::parse("dp=" + std::to_string(w));
  return measure_one_step(l.s.model, plan, train, l.o, l.data).time[0];
}

// E7: one step for W = 1, 2, 4, 8 on the simulated clock (as far as one node holds them), and what
// the table says about the exposed share.
void show_throughput(Narrator& say, ExerciseSheet& sheet, const DpLesson& l) {
  const ClusterSpec& cluster = l.s.cluster.cluster;
  const int64_t M = l.M, b = l.b, T = l.s.train.seq_len;
  say.phase("throughput as W grows, on the simulated clock",
            "lessons/common/clock.h: the step as the clock charges it; core/comm/trace.h: RankTrace");
  say.ask("E7", l.q.steps);
  say.say("One step of " + std::to_string(M) + " micro-batch(es) of b = " + std::to_string(b) +
          " rows per rank, W = 1, 2, 4, 8 (B grows with W); each GPU " + std::to_string(int(cluster.gpu_tflops)) +
          " TFLOP/s, NVLink " + std::to_string(int(cluster.nvlink.bandwidth_gbps)) + " GB/s:\n\n");
  std::vector<std::vector<std::string>> rows = {
      {"W", "step us", "of which exposed comm us", "tokens/s", "speed-up vs W=1", "formula step us"}};
  std::vector<int64_t> w_lo, w_hi, w_measured;
  double one = 0;
  for (int64_t w : {1, 2, 4, 8}) {
    if (w > cluster.gpus_per_node) break;  // the formulas price every hop as NVLink: one node only
    const TimelineTotals t = step_on_clock(l, w);
    const StepTime expect = step_time_formula(l, w, ClusterSpec::for_ranks(int(w), cluster.gpus_per_node));
    const double tokens_per_s = double(w * M * b * T) / (t.clock_us * 1e-6);
    if (w == 1) one = tokens_per_s;
    rows.push_back({std::to_string(w), fixed(t.clock_us, 2), fixed(t.wait_us, 2), fixed(tokens_per_s, 0),
                    fixed(tokens_per_s / one, 2) + "x", fixed(expect.step_us(), 2)});
    w_lo.push_back(ns(expect.step_us()) - 1), w_hi.push_back(ns(expect.step_us()) + 1);
    w_measured.push_back(ns(t.clock_us));
  }
  say.say(format_table(rows));
  // What the table says, from its own numbers: the share of the W = 8 step that is exposed
  // communication, against the backward that could hide it.
  const StepTime f8 = step_time_formula(l, 8, ClusterSpec::for_ranks(8, cluster.gpus_per_node));
  say.say("\nCompute per rank is the same for every W (each rank trains M x b rows); the step grows only by the\n"
          "communication the buckets leave exposed: at W = 8, " + fixed(100 * f8.exposed_us / f8.step_us(), 0) +
          "% of the step. Only the last micro-batch's backward (" + fixed(f8.compute_us / double(M) * 2 / 3, 2) +
          " us here) can hide the buckets: 4N of a\ntoken's 6N FLOPs are backward, so 2 (n-1)/n x 4N bytes / bw <= "
          "4N t / F needs t >= 2 F (n-1) / (n bw) tokens per micro-batch,\n" +
          fixed(2 * cluster.gpu_tflops * 1e12 * 7 / (8 * cluster.nvlink.bandwidth_gbps * 1e9), 0) +
          " at n = 8 (this run: " + std::to_string(b * T) + "), before each phase's latency and the embedding's "
          "bucket, which comes last and hides\nbehind nothing. Try --rows 32 --seq-len 128, or --preset small "
          "--rows 16 --seq-len 256, and watch the exposed share fall.\n");
  say.pause();
  sheet.range("E7", l.q.steps,
              "M x the forward + backward FLOPs per rank / GPU rate + the exposed communication of E6", w_lo, w_hi,
              w_measured, "Per W (the columns are W = 1, 2, 4, 8 as far as one node holds them, not ranks); within 1 ns "
              "of rounding.");
  const int64_t largest = int64_t(1) << (w_measured.size() - 1);
  sheet.answer("E7", {.value = double(w_measured.back()), .unit = "ns", .of = "W = " + std::to_string(largest), .tolerance = 1});
}

int run(const LessonOptions& o) {
  Narrator say(o);
  const DpLesson l = set_up(o);
  show_mesh_and_batch(say, l);
  const std::vector<PhaseView> phases = train_and_show_steps(say, l);
  ExerciseSheet sheet;
  check_batch_state_and_traffic(sheet, l, phases.back());
  if (l.s.cluster.cluster.nodes == 1) {  // the time formulas price every hop as NVLink: one node only
    check_exposed_comm(sheet, l, phases.back());
    show_throughput(say, sheet, l);
  }
  say.phase("exercises: formula vs measured",
            "lessons/common/lesson.cpp: all_reduce_sent() (the README's formulas); core/comm/comm_model.cpp: "
            "plan_all_reduce() (what the virtual GPUs counted)");
  EquivalenceReport rep;
  const bool equivalent = finish_with_equivalence(say, sheet, l.s, l.data, rep);
  return finish_lesson("01-data-parallelism", o.json, o.preset, l.s, phases, sheet, rep, equivalent);
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  options.micro_batches = 2;  // shows no_sync: accumulation without communication
  CLI::App app{"Lesson 01: data parallelism on virtual GPUs", "lesson01_data_parallel"};
  options.add_options(app);
  return llama4d::lesson::lesson_main(app, argc, argv, [&] { return llama4d::lesson::run(options); });
}
