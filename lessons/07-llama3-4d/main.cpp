// Lesson 07: Llama 3's 4D parallelism and the planner. Llama 3 405B trained on 16,384 H100s as
// tp=8 x cp x pp=16 x dp, innermost first. The program asks the planner (core/plan/, formulas
// only) what that layout holds and moves per GPU, why the order puts tensor parallelism on
// NVLink and data parallelism across nodes, then scales the same plan down to 16 virtual GPUs,
// where every number the planner predicts is measured: memory per category per rank, bytes per
// mesh dimension, the pipeline bubble; and ends with the 4D plan against one device.
//   lesson07_llama3_4d [--preset tiny] [--mesh tp=2,cp=2,pp=2,dp=2] [--zero 3] [--steps 2] [--step] [--json]
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/error.h"
#include "core/parallel/pipeline_schedule.h"
#include "core/plan/llama3.h"
#include "core/plan/traffic.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"

namespace llama4d::lesson {
namespace {

struct FourDArgs {
  std::string mesh = "tp=2,cp=2,pp=2,dp=2";
  int zero = 3;
  std::string ac = "selective";
};

std::string traffic_rows(const PlanReport& r) {
  std::vector<std::vector<std::string>> rows = {{"dim", "group", "bytes / GPU / step", "link", "exposed ms"}};
  for (const DimensionTraffic& d : r.traffic)
    rows.push_back({d.dim, d.group, format_bytes(d.bytes_per_rank), d.link, fixed(d.exposed_seconds * 1e3, 1)});
  return format_table(rows);
}

// Bytes every rank sent in one step, summed per group (the traffic log's group names).
std::map<std::string, int64_t> measured_group_bytes(const PhaseView& p) {
  std::map<std::string, int64_t> out;
  for (const RankSnapshot& r : p.ranks)
    for (const TrafficRecord& t : r.traffic) out[t.group] += t.bytes_sent;
  return out;
}

// What each of the planner's fitted assumptions moves on the 8,192-GPU layout: its MFU and step
// time with one input changed at a time; each row also goes into `out`.
std::string assumption_rows(nlohmann::json& out) {
  const Llama3Layout l8k = llama3_405b_layouts().front();
  struct Variant {
    std::string what;
    double efficiency, dp_overlap;
    bool reduce_once = true;
  };
  const ClusterModel base = h100_cluster();
  const std::vector<Variant> variants = {
      {"as fitted: kernels at 60% of peak, 90% of dp traffic hidden", base.compute_efficiency, base.dp_overlap},
      {"kernels at 50% of peak", 0.5, base.dp_overlap},
      {"kernels at 70% of peak", 0.7, base.dp_overlap},
      {"no dp traffic hidden", base.compute_efficiency, 0.0},
      {"all dp traffic hidden", base.compute_efficiency, 1.0},
      {"a reduce-scatter every micro-batch", base.compute_efficiency, base.dp_overlap, false},
      {"a reduce-scatter every micro-batch, no dp traffic hidden", base.compute_efficiency, 0.0, false}};
  std::vector<std::vector<std::string>> rows = {{l8k.mesh + ", one input changed", "dp bytes/GPU", "step s", "MFU"}};
  for (const Variant& v : variants) {
    ClusterModel c = base;
    c.compute_efficiency = v.efficiency, c.dp_overlap = v.dp_overlap;
    StepShape shape = llama3_405b_shape(l8k);
    shape.plan.reduce_once = v.reduce_once;
    const PlanReport r = plan_step(shape, c);
    int64_t dp_bytes = 0;
    for (const DimensionTraffic& d : r.traffic)
      if (d.dim == "dp") dp_bytes += d.bytes_per_rank;
    rows.push_back({v.what, format_bytes(dp_bytes), fixed(r.step_seconds, 2), fixed(r.mfu * 100, 1) + "%"});
    out.push_back({{"assumption", v.what}, {"compute_efficiency", v.efficiency}, {"dp_overlap", v.dp_overlap},
                   {"reduce_once", v.reduce_once}, {"dp_bytes_per_gpu", dp_bytes}, {"step_seconds", r.step_seconds},
                   {"mfu", r.mfu}});
  }
  return format_table(rows);
}

// The 8,192-GPU layout without activation checkpointing, as Llama 3 pre-trained at 8K tokens
// ("The Llama 3 Herd of Models", section 3.3.2), by this engine's accounting of what a rank keeps.
nlohmann::json without_checkpointing(Narrator& say) {
  const Llama3Layout l8k = llama3_405b_layouts().front();
  const PlanReport r = plan_step(llama3_405b_shape(l8k, "none"), h100_cluster());
  say.say("\nWithout activation checkpointing (" + l8k.mesh + ", --ac none), the fullest GPU would keep " +
          format_bytes(r.worst.activations) + " of activations, " + format_bytes(r.worst.total()) + " in all: " +
          (r.fits ? "it fits" : "it does not fit 80 GB") + ". Llama 3 pre-trained at 8K tokens without checkpointing\n"
          "(\"The Llama 3 Herd of Models\", section 3.3.2); this engine keeps more per layer than Megatron's kernels: "
          "with sequence\nparallelism it keeps each block's all-gathered normed inputs whole for the backward, where "
          "Megatron keeps its\n1/tp shard and gathers again. Hence selective checkpointing in the rows above.\n");
  return {{"mesh", l8k.mesh}, {"activations", r.worst.activations}, {"total", r.worst.total()}, {"fits", r.fits},
          {"overflow", r.overflow}};
}

// Phase 1: the paper's three layouts of Llama 3 405B through the planner. Returns each plan's
// report (with the paper's MFU), what each fitted assumption moves and the first layout without
// checkpointing, for the JSON summary.
nlohmann::json show_llama3_layouts(Narrator& say, nlohmann::json& assumptions, nlohmann::json& no_ac) {
  say.phase("Llama 3 405B on 16,384 H100s: the paper's three layouts, as the planner sees them",
            "core/plan/planner.cpp (plan_step), core/plan/memory.cpp, core/plan/traffic.cpp");
  std::vector<std::vector<std::string>> rows = {
      {"mesh (innermost first)", "seq", "GPUs", "weights/GPU", "activations/GPU", "bubble", "step s", "MFU (fitted)",
       "paper"}};
  nlohmann::json llama3 = nlohmann::json::array();
  for (const Llama3Layout& row : llama3_405b_layouts()) {
    const PlanReport r = plan_step(llama3_405b_shape(row), h100_cluster());
    rows.push_back({row.mesh, grouped(row.seq_len), grouped(r.shape.plan.world_size()), format_bytes(r.worst.weight_states()),
                    format_bytes(r.worst.activations), fixed(r.bubble_fraction * 100, 1) + "%", fixed(r.step_seconds, 2),
                    fixed(r.mfu * 100, 1) + "%", fixed(row.reported_mfu * 100, 0) + "%"});
    nlohmann::json j = r.to_json();
    j["reported_mfu"] = row.reported_mfu;
    llama3.push_back(j);
  }
  say.say(format_table(rows));
  no_ac = without_checkpointing(say);
  say.say("\nbf16 weights and activations, fp32 gradients and master weights (12 bytes of optimizer state per "
          "parameter),\nZeRO-3 keeping parameters gathered and reducing gradients once per step, interleaved 1F1B with 4 chunks, selective checkpointing; "
          "kernels at\n60% of the 989 TFLOP/s dense BF16 peak, 90% of the data-parallel traffic hidden: every one "
          "an input\n(`llama4d plan --llama3`, --efficiency, --dp-overlap). Weights per GPU are 1/(tp pp) of the "
          "model before\nFSDP divides them by dp; activations are what a pipeline rank keeps for its micro-batches "
          "in flight.\nThe MFU column is fitted, not a check: the two efficiencies were chosen to land near the "
          "paper's figures.\n\n" + assumption_rows(assumptions) + "\n");
  say.pause();
  return llama3;
}

// Phase 2: the 8,192-GPU layout in Llama 3's order and reversed (O1). Returns both step times.
nlohmann::json show_why_this_order(Narrator& say, ExerciseSheet& sheet) {
  say.phase("why [tp, cp, pp, dp]: the innermost dimensions share a node", "core/comm/device_mesh.h, core/plan/planner.cpp");
  say.ask("O1", "The 8,192-GPU layout with the order reversed (dp innermost): how many times longer is its step?");
  const Llama3Layout l8k = llama3_405b_layouts().front();  // tp=8,cp=1,pp=16,dp=64
  const PlanReport llama_order = plan_step(llama3_405b_shape(l8k), h100_cluster());
  const PlanReport reversed =
      plan_step(llama3_405b_shape({"dp=64,pp=16,cp=1,tp=8", l8k.seq_len, l8k.batch_per_dp, 0}), h100_cluster());
  say.say("Llama 3's order, tp=8 on each node's NVLink:\n\n" + traffic_rows(llama_order) +
          "\nReversed, dp=64 innermost: the tensor group now spans 8 nodes.\n\n" + traffic_rows(reversed) +
          "\nstep: " + fixed(llama_order.step_seconds, 2) + " s against " + fixed(reversed.step_seconds, 2) + " s (" +
          fixed(reversed.step_seconds / llama_order.step_seconds, 2) +
          "x). Tensor parallelism talks inside every layer, on the critical\npath, with bytes proportional to the "
          "activations; data parallelism talks once per unit per step and hides\nbehind compute. So the group that "
          "talks most and cannot hide gets the fastest link.\n");
  say.pause();
  Exercise o1;
  o1.id = "O1";
  o1.question = "The 8,192-GPU layout with the order reversed (dp innermost): how many times longer is its step?";
  o1.formula = "longer: tensor parallelism's all-reduces, on the critical path of every layer, leave NVLink for "
               "InfiniBand";
  o1.value = reversed.step_seconds / llama_order.step_seconds;
  o1.note = "The planner's step times: " + fixed(llama_order.step_seconds, 2) + " s and " +
            fixed(reversed.step_seconds, 2) + " s, " + fixed(*o1.value, 2) + "x.";
  o1.pass = *o1.value > 1;
  sheet.add(o1);
  sheet.answer("O1", {.value = *o1.value, .unit = "x", .of = "the planner's step", .tolerance = 0.005});
  return {{"llama3_step_seconds", llama_order.step_seconds}, {"reversed_step_seconds", reversed.step_seconds}};
}

// What the planner predicts for the run on virtual GPUs, before anything runs.
struct Prediction {
  PlanReport step;
  std::vector<MemoryPrediction> memory;         // [world rank]
  std::map<std::string, GroupTraffic> traffic;  // per mesh group, summed over its ranks
};

Prediction predict(const RunSetup& s) {
  StepShape shape;
  shape.model = s.model;
  shape.plan = s.plan;
  shape.seq_len = s.train.seq_len;
  shape.batch_size = s.train.batch_size;
  shape.micro_batch_size = s.train.micro_batch_size;
  ClusterModel virtual_cluster;
  virtual_cluster.cluster = s.cluster.cluster;
  return {plan_step(shape, virtual_cluster), predict_memory(shape), predict_step_traffic(shape)};
}

// Phase 3: every rank's coordinates on the mesh, and the planner's prediction.
void show_mesh_and_prediction(Narrator& say, const RunSetup& s, const PlanReport& predicted) {
  say.phase("the same layout on " + std::to_string(s.plan.world_size()) + " virtual GPUs: " + s.plan.describe(),
            "core/parallel/parallel_trainer.cpp (the groups), core/parallel/tensor_context_comm.h (tp x cp)");
  std::vector<std::vector<std::string>> mesh = {{"rank", "node"}};
  for (const MeshDim& d : s.plan.mesh) mesh[0].push_back(d.name);
  for (int w = 0; w < s.plan.world_size(); ++w) {
    mesh.push_back({std::to_string(w), std::to_string(s.cluster.cluster.node_of(w))});
    for (const MeshDim& d : s.plan.mesh) mesh.back().push_back(std::to_string(s.plan.coordinate(d.name, w)));
  }
  std::string formula = "rank = ", close;  // mixed radix: c0 + size0 (c1 + size1 (c2 + ...))
  for (size_t i = 0; i < s.plan.mesh.size(); ++i) {
    if (i > 0) formula += " + " + std::to_string(s.plan.mesh[i - 1].size) + " (", close += ")";
    formula += s.plan.mesh[i].name;
  }
  say.say(formula + close + " (innermost first): the first dimension's group is neighbouring ranks, the last's the "
          "farthest apart.\n\n" + format_table(mesh) + "\n");
  say.ask("M1", "How many bytes of parameters does rank 0 hold at its peak during the step?");
  say.ask("M2", "How many bytes of AdamW state does rank 0 hold?");
  if (s.plan.size("pp") > 1) say.ask("B1", "What share of a step does a pipeline rank sit idle (uniform stages)?");
  say.say("The planner's prediction, before anything runs:\n\n" + predicted.table() + "\n");
  if (predicted.mfu < 0.01)
    say.say("(MFU " + fixed(predicted.mfu * 100, 2) + "%: at a modelled H100's rate this model computes each "
            "action in nanoseconds, while every message pays about 1 us of latency, so the step is all communication. "
            "What this phase checks is memory and bytes, not time.)\n");
  say.pause();
}

std::vector<PhaseView> train_and_show_steps(Narrator& say, const LessonOptions& o, const RunSetup& s,
                                            const TextDataset& data) {
  StepReporter reporter(say, o.step,
                        "Four groups talk: 'SP ...' and 'vocab-parallel ...' over tp, 'context parallelism' over cp, "
                        "'pipeline' sends over pp,\n'params' / 'grads' (ZeRO-3) over cp+dp; the grad-norm and loss "
                        "all-reduces cross them all.",
                        " (what each rank's allocator handed out)", "core/parallel/parallel_trainer.cpp (step)");
  return run_phases(s, data, [&](const PhaseView& p) {
    if (p.step >= 1) reporter.show(p);
  });
}

// M1-M4: the planner's memory per category per rank against the first step's peaks.
void check_memory(ExerciseSheet& sheet, const RunSetup& s, const PhaseView& first,
                  const std::vector<MemoryPrediction>& memory) {
  std::vector<int64_t> p_params, m_params, p_opt, m_opt, p_comm, m_comm, lo_grads, hi_grads, m_grads;
  for (int w = 0; w < s.plan.world_size(); ++w) {
    const RankMemory& m = first.ranks[size_t(w)].peak;
    const MemoryPrediction& p = memory[size_t(w)];
    p_params.push_back(p.params), m_params.push_back(m.params);
    p_opt.push_back(p.optimizer), m_opt.push_back(m.optimizer);
    lo_grads.push_back(p.grads_min), hi_grads.push_back(p.grads), m_grads.push_back(m.grads);
    if (s.plan.size("pp") == 1) p_comm.push_back(p.comm_buffers), m_comm.push_back(m.comm_buffers);
  }
  sheet.exact("M1", "Parameter bytes on each rank at their peak?",
              "its tp slice of its stage's units; ZeRO-3: its shard + the units gathered at once", -1, p_params, m_params);
  sheet.answer("M1", {.value = double(m_params[0]), .unit = "bytes", .of = "rank 0"});
  sheet.exact("M2", "Optimizer bytes on each rank?", "AdamW's 2 moments of its ZeRO shard of its tp slice of its stage",
              -1, p_opt, m_opt);
  sheet.answer("M2", {.value = double(m_opt[0]), .unit = "bytes", .of = "rank 0"});
  sheet.range("M3", "Gradient bytes on each rank at their peak?",
              "its shard + the full gradients of 1 to 3 units still being reduced", lo_grads, hi_grads, m_grads);
  if (!p_comm.empty())
    sheet.exact("M4", "Communication buffer bytes on each rank?", "the reduce-scatter's output: one shard", -1, p_comm,
                m_comm);
}

// T1, T2, ...: per mesh group, the planner's bytes against what all ranks sent in the first step.
void check_group_traffic(ExerciseSheet& sheet, const std::map<std::string, GroupTraffic>& traffic,
                         const PhaseView& first) {
  const std::map<std::string, int64_t> measured = measured_group_bytes(first);
  int id = 1;
  for (const auto& [group, t] : traffic) {
    const auto it = measured.find(group);
    sheet.exact("T" + std::to_string(id++), "Bytes all ranks sent over the '" + group + "' groups in one step?",
                "traffic.cpp's formula for every collective of the step", -1, {t.bytes_sent},
                {it == measured.end() ? 0 : it->second}, "one number: the sum over all ranks of every such group");
  }
}

// B1: the planner's bubble against the schedule's lists replayed on the simulated clock.
void check_bubble(ExerciseSheet& sheet, const LessonOptions& o, const RunSetup& s, const PlanReport& predicted) {
  const double replay = simulate_pipeline_schedule(make_pipeline_schedule(s.plan.schedule, s.plan.size("pp"),
                                                                          int(o.micro_batches), s.plan.pp_chunks))
                            .bubble_fraction();
  Exercise bubble;
  bubble.id = "B1";
  bubble.question = "The pipeline's idle share of a step with uniform stages?";
  bubble.formula = "(p-1)/(m+p-1) for 1F1B: " + fixed(predicted.bubble_fraction, 6);
  bubble.note = "the schedule's lists replayed on the simulated clock: " + fixed(replay, 6);
  bubble.pass = std::abs(replay - predicted.bubble_fraction) < 1e-12;
  bubble.value = replay;
  sheet.add(bubble);
  sheet.answer("B1", {.value = replay, .unit = "of the step", .of = "every pipeline rank", .tolerance = 0.0005});
}

int run(LessonOptions o, const FourDArgs& a) {
  Narrator say(o);
  ExerciseSheet sheet;
  nlohmann::json assumptions = nlohmann::json::array();
  nlohmann::json no_ac;
  const nlohmann::json llama3 = show_llama3_layouts(say, assumptions, no_ac);
  const nlohmann::json order = show_why_this_order(say, sheet);
  const RunSetup s = mesh_run_setup(o, a.mesh, a.zero, a.ac);
  const Prediction predicted = predict(s);
  show_mesh_and_prediction(say, s, predicted.step);
  const TextDataset data = load_dataset(default_corpus_path(), s.train.seq_len);
  const std::vector<PhaseView> phases = train_and_show_steps(say, o, s, data);
  const PhaseView& first = phases.at(1);

  say.phase("predicted vs measured", "core/plan/memory.cpp, core/plan/traffic.cpp");
  check_memory(sheet, s, first, predicted.memory);
  check_group_traffic(sheet, predicted.traffic, first);
  if (s.plan.size("pp") > 1) check_bubble(sheet, o, s, predicted.step);
  say.pause();

  EquivalenceReport report;
  const bool equivalent = finish_with_equivalence(say, sheet, s, data, report);
  return finish_lesson("07-llama3-4d", o.json, o.preset, s, phases, sheet, report, equivalent, [&](nlohmann::json& j) {
    j["llama3_405b"] = llama3;
    j["fitted_assumptions"] = assumptions;
    j["llama3_405b_without_checkpointing"] = no_ac;
    j["order"] = order;
    j["predicted"] = predicted.step.to_json();
  });
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::FourDArgs args;
  options.micro_batches = 2;
  options.rows = 1;
  options.seq_len = 32;
  CLI::App app{"Lesson 07: Llama 3's 4D parallelism and the planner, on 16 virtual GPUs", "lesson07_llama3_4d"};
  options.add_options(app);
  app.add_option("--mesh", args.mesh, "the 4D mesh, innermost first")->capture_default_str();
  llama4d::cli::add_number(app, "--zero", args.zero, "ZeRO stage over cp x dp", 0, 3)->capture_default_str();
  app.add_option("--ac", args.ac, "activation checkpointing: none, selective, full")->capture_default_str();
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    if (app.get_option("--ranks")->count() > 0)
      throw llama4d::InputError("--ranks follows from --mesh here (" + args.mesh + ")");
    return llama4d::lesson::run(options, args);
  });
}
