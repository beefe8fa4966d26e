// `llama4d schedule`: a pipeline schedule's timeline, per rank, from the simulated clock.
//
//   llama4d schedule --pp 4 --micro-batches 8 --schedule 1f1b [--svg 1f1b.svg]
// runs the schedule's lists on p virtual GPUs with every action a fixed modelled time
// (--costs F,I,W in microseconds: uniform stages, free transfers), the setting of the bubble
// formulas, and prints the picture, each rank's bubble and the formula. With --measure it trains
// one step of a model (--preset, --seq-len) with that pipeline instead, so the boxes are the
// FLOPs of the real stages (the embedding and the head make the first and last uneven) and the
// transfers cost what the cluster model says; --trace writes that run for Perfetto.
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "backends/virtual/virtual_cluster.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/pipeline_parallel.h"
#include "core/parallel/pipeline_picture.h"
#include "core/parse_number.h"

namespace llama4d::cli {

namespace {

struct ScheduleArgs {
  ModelChoice model;
  LaunchOptions launch;
  int pp = 4, micro_batches = 8, chunks = 1, columns = 96;
  std::string schedule = "1f1b", costs = "1,1,1", layers, svg;
  int64_t seq_len = 256;
  bool measure = false, json = false;
};

StageCosts parse_costs(const std::string& text) {
  std::vector<double> v;
  for (size_t at = 0, comma = 0; comma != std::string::npos; at = comma + 1) {
    comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const double x = parse_number<double>(item, "--costs " + text + ": time", 0);
    if (!(x > 0)) throw InputError("--costs " + text + ": '" + item + "' is not a positive time");
    v.push_back(x);
  }
  if (v.size() != 3) throw InputError("--costs takes three times F,I,W (forward, backward-input, backward-weight), got " + text);
  return {v[0], v[1], v[2]};
}

// Refuses, before any work, an --svg that is a directory or lies where no file can be written;
// the directories it names that do not exist yet are made when the picture is written.
void check_svg_path(const std::string& svg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(svg, ec)) throw InputError("--svg " + svg + " is a directory, not a file");
  fs::path dir = fs::absolute(svg, ec).parent_path();
  while (!dir.empty() && !fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
  if (!fs::is_directory(dir, ec)) throw InputError("--svg " + svg + ": " + dir.string() + " is not a directory");
  if (access(dir.c_str(), W_OK) != 0) throw InputError("--svg " + svg + ": cannot write in " + dir.string());
}

nlohmann::json run_schedule(const ScheduleArgs& a, const CLI::App& cmd) {
  if (!a.svg.empty()) check_svg_path(a.svg);
  const PipelineScheduleKind kind = parse_pipeline_schedule(a.schedule);
  const PipelineSchedule s = make_pipeline_schedule(kind, a.pp, a.micro_batches, a.chunks);
  const ScheduleSimulation plan = simulate_pipeline_schedule(s);  // checks the lists; peaks in flight
  const StageCosts costs = parse_costs(a.costs);
  if (a.columns < 20) throw InputError("--columns must be >= 20");
  if (!a.measure)
    for (const char* flag : {"--preset", "--config", "--dtype", "--seq-len", "--pp-layers"})
      if (cmd.count(flag)) throw InputError(std::string(flag) + " applies with --measure only");
  if (a.measure && cmd.count("--costs")) throw InputError("--costs applies without --measure only");
  if (a.measure && a.pp < 2) throw InputError("--measure trains a pipeline: it needs --pp 2 or more, got " + std::to_string(a.pp));

  RankLaunch launcher(a.launch);
  std::vector<int> peaks = plan.peak_in_flight;
  std::string title = s.name();
  if (!a.measure) {
    launcher.run(a.pp, [&](ProcessGroup& world) { run_modelled_pipeline(world, s, costs); });
  } else {
    // One step of the model, a row per micro-batch; the clock restarts after set-up.
    const LlamaConfig cfg = a.model.resolve();
    ParallelPlan p = ParallelPlan::parse("pp=" + std::to_string(a.pp));
    p.schedule = kind;
    p.pp_chunks = a.chunks;
    if (!a.layers.empty()) p.pp_layers = parse_pipeline_layers(a.layers);
    p.validate();
    p.check_model(cfg, a.micro_batches);
    TrainOptions opt;
    opt.steps = 1, opt.batch_size = a.micro_batches, opt.micro_batch_size = 1;
    opt.seq_len = fitted_seq_len(cmd, a.seq_len, cfg);
    opt.bf16_compute = a.model.bf16();
    check_fits_in_memory(cfg, 16.0, false, "drawing a schedule of");
    const TextDataset data = load_dataset(default_corpus_path(), opt.seq_len);
    if (a.model.fp64()) throw InputError("schedule --measure draws an f32 run; --dtype f64 changes nothing it shows");
    title += ", " + (a.model.preset.empty() ? a.model.config : a.model.preset) + ", " + std::to_string(opt.seq_len) +
             " tokens per micro-batch";
    launcher.run(a.pp, [&](ProcessGroup& world) {
      Llama<float> model(cfg, &world.memory(), {}, p.held_units(cfg, world.rank()));
      ParallelTrainer<float> trainer(world, model, data, opt, p);
      BarrierOptions b{.label = "set-up done"};
      world.barrier(b)->wait();
      world.trace().clear();
      trainer.step();
      peaks[size_t(world.rank())] = trainer.pipeline()->peak_in_flight();
    });
  }
  if (!launcher.reporting()) return nullptr;
  const PipelinePicture pic = pipeline_picture(launcher.traces(), title);
  const std::vector<double> busy = pic.busy_us(), bubble = pic.bubble_fraction();
  double total_busy = 0;
  for (double b : busy) total_busy += b;
  const double measured = pic.end_us > 0 ? 1.0 - total_busy / (double(a.pp) * pic.end_us) : 0.0;
  const double formula = pipeline_bubble_formula(kind, a.pp, a.micro_batches, a.chunks, costs);
  if (!a.svg.empty()) {
    const std::filesystem::path dir = std::filesystem::path(a.svg).parent_path();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    if (ec) throw InputError("--svg " + a.svg + ": cannot create " + dir.string() + ": " + ec.message());
    write_text_file_atomically(a.svg, pipeline_svg(pic));
  }

  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < a.pp; ++r)
    ranks.push_back({{"rank", r}, {"busy_us", busy[size_t(r)]}, {"bubble_fraction", bubble[size_t(r)]},
                     {"peak_in_flight", peaks[size_t(r)]}});
  nlohmann::json out = {{"schedule", std::string(pipeline_schedule_name(kind))},
                        {"name", title},
                        {"ranks", a.pp},
                        {"chunks", a.chunks},
                        {"micro_batches", a.micro_batches},
                        {"mode", a.measure ? "measured" : "modelled"},
                        {"step_us", pic.end_us},
                        {"bubble_fraction", measured},
                        {"bubble_formula", a.measure ? nlohmann::json(nullptr) : nlohmann::json(formula)},
                        {"per_rank", ranks},
                        {"svg", a.svg.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.svg)},
                        {"lists", s.describe()}};
  if (!a.measure) out["costs_us"] = {{"forward", costs.forward}, {"backward_input", costs.backward_input},
                                     {"backward_weight", costs.backward_weight}};
  if (a.json) return out;
  std::printf("%s\n", pipeline_text(pic, a.columns).c_str());
  std::printf("bubble (idle share of the step over all ranks): %.4f", measured);
  if (!a.measure)
    std::printf("   formula for uniform stages: %.4f\n", formula);
  else
    std::printf("   (stages as the model cuts them: no formula applies exactly)\n");
  std::printf("micro-batches in flight at most, per rank:");
  for (int v : peaks) std::printf(" %d", v);
  std::printf("\n");
  if (!a.svg.empty()) std::printf("wrote %s\n", a.svg.c_str());
  return out;
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto a = std::make_shared<ScheduleArgs>();
  CLI::App* cmd = app.add_subcommand("schedule", "draw a pipeline schedule's timeline per rank from the simulated clock");
  add_number(*cmd, "--pp", a->pp, "pipeline ranks", 1, kMaxVirtualRanks)->capture_default_str();
  add_number(*cmd, "--micro-batches", a->micro_batches, "micro-batches per step")->capture_default_str();
  cmd->add_option("--schedule", a->schedule, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  add_number(*cmd, "--pp-chunks", a->chunks, "model chunks per rank (interleaved, >= 2)")->capture_default_str();
  cmd->add_option("--costs", a->costs, "modelled times of F, I and W in microseconds (B = I + W)")->capture_default_str();
  cmd->add_option("--svg", a->svg, "also write the picture as an SVG file here");
  add_number(*cmd, "--columns", a->columns, "width of the text picture")->capture_default_str();
  cmd->add_flag("--measure", a->measure, "train one step of --preset's model with this pipeline and draw that instead");
  a->model.add_options(*cmd, "small", false);
  add_number(*cmd, "--seq-len", a->seq_len, "--measure: tokens per micro-batch, one row each (at most the model's max_position_embeddings unless given)")->capture_default_str();
  cmd->add_option("--pp-layers", a->layers, "--measure: layers of each stage, e.g. 1,2,2,1 (default: balanced)");
  a->launch.add_options(*cmd);
  cmd->add_flag("--json", a->json, "print one JSON object with the timeline's numbers on stdout");
  cmd->callback([a, cmd] {
    a->launch.validate(true);
    const nlohmann::json out = run_schedule(*a, *cmd);
    if (a->json && !out.is_null()) print_json(out);
  });
}

}  // namespace llama4d::cli
