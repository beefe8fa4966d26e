// Lesson 01: data parallelism. Every virtual GPU holds the whole model, trains on its own rows of
// the global batch, and after backward the ranks all-reduce their gradients, so every rank takes
// the same AdamW step a single device would. The program shows the mesh and the rows, trains a
// few steps with the library's ParallelTrainer, shows what each rank held and sent, checks
// the README's formulas against the measured numbers, and proves the result equals one device.
//   lesson01_data_parallel [--ranks 4] [--micro-batches 2] [--step] [--json]
#include "core/data/dataset.h"
#include "core/model/params.h"
#include "core/optim/segmented_norm.h"
#include "lessons/common/lesson.h"

namespace llama4d::lesson {
namespace {

int run(const LessonOptions& o) {
  Narrator say(o);
  RunSetup s;
  s.model = LlamaConfig::preset(o.preset);
  s.train = o.train_options();
  s.plan = ParallelPlan::parse("dp=" + std::to_string(o.ranks));  // plain dp: one group, no replicas
  s.cluster = o.cluster_options();
  const TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  const std::vector<Segment> buckets = param_segments(llama_param_specs(s.model));
  // Notation (README): W ranks, all of them in every all-reduce (n = W); M micro-batches of b rows
  // per rank; B = W M b sequences per step.
  const int64_t N = s.model.num_parameters(), W = o.ranks, M = o.micro_batches, b = o.rows;
  const std::string n_is = " (n = " + std::to_string(W) + ")";

  // The questions, asked (with --step) before the phase that shows the answer.
  const std::string q_batch = "How many sequences does one step train on (the global batch B), with W = " +
                              std::to_string(W) + " ranks, M = " + std::to_string(M) + " micro-batch(es) per rank, b = " +
                              std::to_string(b) + " rows each?";
  const std::string q_state = "How many bytes of model state (params + grads + AdamW) does each rank hold?";
  const std::string q_grads = "How many bytes does each rank send per step to all-reduce the gradients?";
  const std::string q_calls =
      "How many gradient all-reduces does each rank issue per step with M = " + std::to_string(M) + " micro-batch(es)?";
  const std::string q_total = "How many bytes does each rank send in all during a step?";

  say.phase("the mesh and the batch",
            "core/parallel/parallel_trainer.cpp: data_rank_micro_batches() gives data rank d its rows, cut into "
            "micro-batches; lessons/common/lesson.cpp: LessonOptions::train_options() sets B");
  say.say("Model '" + o.preset + "': N = " + grouped(N) + " parameters (fp32: 4N = " + grouped(4 * N) +
          " bytes). Data parallelism over W = " + std::to_string(W) + " virtual GPUs, " +
          std::string(reduce_algo_name(s.cluster.algo)) + " reductions; " + s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(s.plan, s.cluster.cluster));
  say.say("\n");
  say.ask("E1", q_batch);
  say.say("\nThe global batch is B = W x M x b = " + std::to_string(W) + " x " + std::to_string(M) + " x " +
          std::to_string(b) + " = " + std::to_string(s.train.batch_size) +
          " sequences.\nEvery rank trains M micro-batches of b rows whatever W is, so B grows with the ranks (llama4d "
          "train does\nthe opposite: --batch-size fixes B, and each rank gets B/W rows). Data rank d trains rows "
          "[d*B/W, (d+1)*B/W).\nRows of step 1:\n\n");
  say.say(batch_table(data, s.train, int(W), 0));
  say.pause();

  StepReporter steps(say, o.step,
                     "One all-reduce per bucket (a bucket = one unit: a layer, the embedding, or the head = final norm\n"
                     "+ LM head), launched as soon as that unit's backward is done, while earlier units still compute;\n"
                     "the head's is the first, the embedding's the last. With M = " + std::to_string(M) +
                         ", only the last micro-batch's backward\ncommunicates: the others accumulate (no_sync).",
                     "",
                     "core/parallel/data_parallel.cpp: DistributedDataParallel::step() (no_sync) and after_backward() "
                     "(one bucket per unit)");
  const std::vector<PhaseView> phases = run_phases(s, data, [&](const PhaseView& p) {
    if (p.step > 0)
      return steps.show(p, [&] {
        if (p.step > 1) return;
        say.ask("E3", q_grads);
        say.ask("E4", q_calls);
        say.ask("E5", q_total);
        if (o.step) say.say("\n");
      });
    say.phase("replicas at rest (" + p.strategy + ")",
              "core/parallel/data_parallel.cpp: DistributedDataParallel::init_weights(); core/optim/adamw.h: AdamW "
              "(the moments m and v)");
    say.ask("E2", q_state);
    say.say("\nEvery rank holds the whole model: parameters 4N, gradients 4N, AdamW moments 8N = 16N bytes\n"
            "(bytes live on each virtual GPU right after construction):\n\n");
    say.say(memory_table(live_of(p)));
    say.pause();
  });

  // ---- Exercises: the README's formulas against the last step's measurements.
  say.phase("exercises: formula vs measured",
            "lessons/common/lesson.cpp: all_reduce_sent() (the README's formulas); core/comm/comm_model.cpp: "
            "plan_all_reduce() (what the virtual GPUs counted)");
  const PhaseView& last = phases.back();
  const ReduceAlgo algo = s.cluster.algo;
  ExerciseSheet sheet;
  std::vector<int64_t> batch, state, grad_bytes, grad_calls, all_bytes, exp_batch, exp_state, exp_grad, exp_calls,
      exp_all;
  for (int r = 0; r < W; ++r) {
    const RankSnapshot& snap = last.ranks[size_t(r)];
    batch.push_back(snap.tokens / s.train.seq_len);  // every position of every row has a target
    state.push_back(snap.peak.params + snap.peak.grads + snap.peak.optimizer);
    grad_bytes.push_back(sent_bytes(snap.traffic, "all_reduce", "grad bucket"));
    grad_calls.push_back(call_count(snap.traffic, "all_reduce", "grad bucket"));
    all_bytes.push_back(total_sent(snap.traffic));
    exp_batch.push_back(W * M * b);
    exp_state.push_back(16 * N);
    int64_t g = 0;
    for (const Segment& seg : buckets) g += all_reduce_sent(seg.numel(), int(W), r, 4, algo);
    exp_grad.push_back(g);
    exp_calls.push_back(int64_t(buckets.size()));
    exp_all.push_back(g + all_reduce_sent(2, int(W), r, 8, algo));  // + the fp64 (loss_sum, tokens) pair
  }
  const double ar = 2.0 * double(W - 1) / double(W);
  sheet.exact("E1", q_batch,
              "B = W x M x b: each rank trains M micro-batches of b rows (measured: the tokens the step's loss "
              "all-reduce counted, / T)",
              -1, exp_batch, batch);  // every rank measures the same global B: no mean to compare
  sheet.exact("E2", q_state, "4N + 4N + 8N = 16N, the same as one GPU: DP buys throughput, not memory",
              16.0 * double(N), exp_state, state);
  sheet.exact("E3", q_grads, "2(n-1)/n * 4N" + n_is + ": reduce-scatter + all-gather, ring or direct alike",
              ar * 4.0 * double(N), exp_grad, grad_bytes,
              "Each bucket is split into n balanced chunks; when n does not divide it, ranks with a longer chunk send "
              "a few bytes more, ranks with a shorter one less: the mean stays exact.");
  sheet.exact("E4", q_calls,
              "one per bucket (L + 2 = " + std::to_string(buckets.size()) +
                  "), whatever M: only the last backward syncs (no_sync)",
              double(buckets.size()), exp_calls, grad_calls);
  sheet.exact("E5", q_total,
              "the gradients + only the loss, one all-reduce of 2 doubles (loss sum, tokens): 2(n-1)/n * (4N + 16)",
              ar * (4.0 * double(N) + 16.0), exp_all, all_bytes);
  EquivalenceReport rep;
  const bool equivalent = finish_with_equivalence(say, sheet, s, data, rep);

  if (o.json) {
    const nlohmann::json j =
        summary_json("01-data-parallelism", o.preset, s, phases, sheet, rep, sheet.failed() == 0 && equivalent);
    std::printf("%s\n", j.dump().c_str());
  }
  return sheet.failed() == 0 && equivalent ? 0 : 1;
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
