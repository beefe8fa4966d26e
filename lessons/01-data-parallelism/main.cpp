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
  const int64_t N = s.model.num_parameters(), R = o.ranks;

  say.phase("the mesh and the batch");
  say.say("Model '" + o.preset + "': N = " + grouped(N) + " parameters (fp32: 4N = " + grouped(4 * N) +
          " bytes). Data parallelism over " + std::to_string(R) + " virtual GPUs, " +
          std::string(reduce_algo_name(s.cluster.algo)) + " reductions; " + s.cluster.cluster.describe() + ".\n\n");
  say.say(mesh_table(s.plan, s.cluster.cluster));
  say.say("\nThe global batch is " + std::to_string(s.train.batch_size) +
          " sequences whatever the number of ranks; data rank d trains rows [d*B/R, (d+1)*B/R) in " +
          std::to_string(o.micro_batches) + " micro-batch(es) of " + std::to_string(o.rows) +
          " rows. Rows of step 1:\n\n");
  say.say(batch_table(data, s.train, int(R), 0));
  say.pause();

  StepReporter steps(say, o.step,
                     "One all-reduce per bucket (a bucket = one layer, or the embedding / the norm + head), launched\n"
                     "as soon as that layer's backward is done, while earlier layers still compute (the CLI's --trace\n"
                     "shows it). With " + std::to_string(o.micro_batches) +
                         " micro-batch(es), only the last backward communicates: the others accumulate (no_sync).",
                     "");
  const std::vector<PhaseView> phases = run_phases(s, data, [&](const PhaseView& p) {
    if (p.step > 0) return steps.show(p);
    say.phase("replicas at rest (" + p.strategy + ")");
    say.say("Every rank holds the whole model: parameters 4N, gradients 4N, AdamW moments 8N = 16N bytes\n"
            "(bytes live on each virtual GPU right after construction):\n\n");
    say.say(memory_table(live_of(p)));
    say.pause();
  });

  // ---- Exercises: the README's formulas against the last step's measurements.
  say.phase("exercises: formula vs measured");
  const PhaseView& last = phases.back();
  const ReduceAlgo algo = s.cluster.algo;
  ExerciseSheet sheet;
  std::vector<int64_t> state, grad_bytes, grad_calls, all_bytes, exp_state, exp_grad, exp_calls, exp_all;
  for (int r = 0; r < R; ++r) {
    const RankSnapshot& snap = last.ranks[size_t(r)];
    state.push_back(snap.peak.params + snap.peak.grads + snap.peak.optimizer);
    grad_bytes.push_back(sent_bytes(snap.traffic, "all_reduce", "grad bucket"));
    grad_calls.push_back(call_count(snap.traffic, "all_reduce", "grad bucket"));
    all_bytes.push_back(total_sent(snap.traffic));
    exp_state.push_back(16 * N);
    int64_t g = 0;
    for (const Segment& b : buckets) g += all_reduce_sent(b.numel(), int(R), r, 4, algo);
    exp_grad.push_back(g);
    exp_calls.push_back(int64_t(buckets.size()));
    exp_all.push_back(g + all_reduce_sent(2, int(R), r, 8, algo));  // + the fp64 (loss_sum, tokens) pair
  }
  const double ar = 2.0 * double(R - 1) / double(R);
  sheet.exact("E1", "How many bytes of model state (params + grads + AdamW) does each rank hold?",
              "4N + 4N + 8N = 16N, the same as one GPU: DP buys throughput, not memory", 16.0 * double(N), exp_state,
              state);
  sheet.exact("E2", "How many bytes does each rank send per step to all-reduce the gradients?",
              "2(R-1)/R * 4N (reduce-scatter + all-gather, ring or direct alike)", ar * 4.0 * double(N), exp_grad,
              grad_bytes,
              "Each bucket is split into R balanced chunks; when R does not divide it, ranks with a longer chunk send "
              "a few bytes more, ranks with a shorter one less: the mean stays exact.");
  sheet.exact("E3", "How many gradient all-reduces does each rank issue per step with " +
                        std::to_string(o.micro_batches) + " micro-batch(es)?",
              "one per bucket (L + 2 = " + std::to_string(buckets.size()) +
                  "), whatever the number of micro-batches: only the last backward syncs (no_sync)",
              double(buckets.size()), exp_calls, grad_calls);
  sheet.exact("E4", "What else moves during a step?",
              "only the loss: one all-reduce of 2 doubles (loss sum, tokens): 2(R-1)/R * (4N + 16) in all",
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
