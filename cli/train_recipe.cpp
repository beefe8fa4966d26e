// `train --recipe FILE` (cli/train_recipe.h).
#include "cli/train_recipe.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "cli/train_loop.h"
#include "core/data/data_mix.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/reshard_in_memory.h"
#include "core/train/checkpoint_state.h"
#include "core/train/recipe.h"
#include "core/train/stage_flags.h"

namespace llama4d::cli::training {

namespace {

// --recipe FILE: the stages of a training recipe (core/train/recipe.h), one after another, on
// virtual GPUs. Each stage runs on its own mesh with its global batch, sequence length and LR
// segment (Recipe::stage_options); at a boundary where the mesh changes the state moves onto the
// next stage's plan through memory (InMemoryReshard: the checkpoint's code path without the
// files), and where it does not the next stage goes on in the same launch with the state in place
// (ParallelTrainer::continue_with). Either way the run equals, byte for byte, stopping at the
// boundary (--stop-at), saving, and resuming the recipe on the next stage's plan from that
// checkpoint.
struct RecipeRun {
  Recipe recipe;
  std::vector<ParallelPlan> plans;               // stage i's plan
  std::vector<std::vector<MixEntry>> sources;    // stage i's data, paths made absolute
  std::string primary;                           // stage 1's first source: the run's --data
  size_t first_stage = 0;  // a resume's stage; stages.size(): the checkpoint had finished
  // Whether stage i draws its rows from a mix (several sources, or one that is not the primary).
  bool mixes(size_t i) const { return sources[i].size() > 1 || sources[i][0].path != primary; }
};

// Flags whose values a recipe gives per stage, or that this build does not run with one.
void check_recipe_flags(const TrainArgs& a, const CLI::App& cmd) {
  const bool flags = !a.stages.empty();
  if (flags && !a.recipe.empty())
    throw InputError("--stage and --recipe: give the stages in the file or on the command line, not both");
  const std::string with = flags ? "--stage" : "--recipe";
  for (const char* flag : {"--mesh", "--batch-size", "--seq-len", "--steps", "--lr", "--min-lr", "--warmup-steps",
                           "--seed", "--data"}) {
    if (flags && std::string(flag) == "--seed") continue;  // the seed of a recipe on the command line
    if (cmd.count(flag) > 0)
      throw InputError(std::string(flag) + " and " + with + ": the " + (flags ? "--stage flags give" : "recipe gives") +
                       " each stage's mesh (dp, tp, cp, pp), batch_size, seq_len, length, LR segment and data" +
                       (flags ? "" : ", and its seed"));
  }
  // --trace: each stage is its own launch, which would write the file over the last stage's.
  for (const char* flag : {"--init", "--faults", "--fault-rate", "--fault-seed", "--max-restarts", "--memory-copy-every",
                           "--check-replicas", "--async-checkpoint",
                           "--straggler-factor", "--straggler-margin", "--heartbeat-timeout", "--on-lost-node", "--trace"})
    if (cmd.count(flag) > 0) throw InputError(std::string(flag) + " and " + with + ": not supported together in this build");
  if (a.launch.backend != "virtual")
    throw InputError(with + " runs on virtual GPUs (--backend virtual), not --backend " + a.launch.backend +
                     ": a stage boundary moves the state between ranks in this process's memory");
}

// Where the recipe came from, as errors name it: its file, or "--stage" for the command line's.
std::string recipe_origin(const TrainArgs& a) { return a.recipe.empty() ? "--stage" : a.recipe; }

// The run's recipe: --recipe's file, or the --stage flags' stages (their data defaulting to the
// run's --data default, the shipped corpus) with --seed's seed where given.
Recipe load_run_recipe(const TrainArgs& a, int64_t max_positions) {
  if (!a.recipe.empty()) return load_recipe(a.recipe, max_positions);
  const uint64_t seed = a.opt.seed;
  try {
    return parse_recipe(stage_flags_recipe(a.stages, seed, default_corpus_path()), max_positions);
  } catch (const InputError& e) {
    throw InputError(std::string("--stage: ") + e.what());
  }
}

// "recipe stage 2 (\"long\")": how errors name a stage.
std::string stage_label(const Recipe& recipe, size_t i) {
  return "recipe stage " + std::to_string(i + 1) + " (\"" + recipe.stages[i].name + "\")";
}

// The recipe checked against the model and the flags: one plan per stage, each stage's sources
// (stage 1's first is the run's data: its held-out split is what every stage evaluates on; a
// stage of other or several sources draws its rows from a DataMix of their train splits), and
// where a resume starts.
RecipeRun resolve_recipe(Run& r, const CLI::App& cmd) {
  TrainArgs& a = r.args;
  RecipeRun rr;
  rr.recipe = load_run_recipe(a, r.cfg.max_position_embeddings);
  const Recipe& recipe = rr.recipe;
  const std::string origin = recipe_origin(a);
  int64_t longest = 0;
  for (size_t i = 0; i < recipe.stages.size(); ++i) {
    const RecipeStage& st = recipe.stages[i];
    const std::string where = origin + ": " + stage_label(recipe, i);
    // A relative source is relative to the recipe file, so the recipe runs from any directory
    // (to the working directory for --stage's).
    std::vector<MixEntry> sources;
    for (const MixEntry& e : st.data) {
      std::filesystem::path p(e.path);
      if (p.is_relative() && !a.recipe.empty()) p = std::filesystem::path(a.recipe).parent_path() / p;
      sources.push_back({absolute_path(p.lexically_normal().string()), e.weight});
    }
    if (i == 0) rr.primary = sources[0].path;
    rr.sources.push_back(std::move(sources));
    longest = std::max(longest, st.seq_len);
    const TrainOptions opt = recipe.stage_options(a.opt, i);
    try {
      opt.validate();
      ParallelChoice choice = a.parallel;
      choice.mesh = st.mesh();
      rr.plans.push_back(choice.plan(r.cfg, a.launch.algo));
      const ParallelPlan& plan = rr.plans.back();
      plan.check_precision(opt.bf16_compute);
      check_moe_micro_batches(r.cfg, opt, plan);
      plan.check_model(r.cfg, int(rank_micro_batch_count(opt, plan.dp())));
      plan.check_sequence(opt.seq_len);
      check_step_fits_in_memory(r.cfg, opt, plan, a.launch.backend, a.model.fp64() ? 8 : 4, a.force);
    } catch (const InputError& e) {
      throw InputError(where + " (mesh " + st.mesh() + "): " + e.what());
    }
  }
  if (cmd.count("--data") == 0) a.data = rr.primary;
  a.opt.seq_len = longest;  // the data split must hold a window of the longest stage
  nlohmann::json loop = nlohmann::json::parse(a.opt.loop);
  loop["data"] = absolute_path(a.data);
  if (!a.recipe.empty()) loop["recipe"] = absolute_path(a.recipe);
  a.opt.loop = loop.dump();
  if (!a.resume.empty()) {
    const TrainingCheckpointInfo saved = read_training_state(a.resume);
    const int64_t total = recipe.total_steps();
    if (saved.steps_done > total)
      throw InputError("--resume " + a.resume + " has done " + std::to_string(saved.steps_done) + " steps, more than recipe \"" +
                       recipe.name + "\"'s " + std::to_string(total));
    rr.first_stage = saved.steps_done == total ? recipe.stages.size() : recipe.locate(saved.steps_done).first;
    // The checkpoint must be this recipe's (by name and fingerprint), whatever stage it is in.
    const size_t check = std::min(rr.first_stage, recipe.stages.size() - 1);
    TrainOptions next = recipe.stage_options(a.opt, check);
    next.steps = std::max(next.steps, saved.steps_done);
    check_resumable(saved.options, saved.steps_done, next);
  }
  return rr;
}

// The rows each source of stage i's data gave to steps [from, to) (source_of is a pure function
// of seed, step and row, so the lead rank counts every rank's rows) beside the weights' shares.
nlohmann::json drawn_json(const RecipeRun& rr, size_t i, const DataMix* mix, int64_t from, int64_t to) {
  const std::vector<MixEntry>& sources = rr.sources[i];
  std::vector<int64_t> drawn(sources.size(), 0);
  const int64_t rows = rr.recipe.stages[i].batch_size;
  for (int64_t step = from; step < to; ++step)
    for (int64_t row = 0; row < rows; ++row) ++drawn[size_t(mix ? mix->source_of(rr.recipe.seed, step, row) : 0)];
  const std::vector<double> shares = drawn_shares(drawn);
  double total = 0;
  for (const MixEntry& e : sources) total += e.weight;
  nlohmann::json out = nlohmann::json::array();
  for (size_t k = 0; k < sources.size(); ++k)
    out.push_back({{"source", sources[k].path}, {"weight", sources[k].weight}, {"weight_share", sources[k].weight / total},
                   {"rows", drawn[k]}, {"share", shares[k]}});
  return out;
}

// Whether the boundary after stage i keeps the state in place: the next stage runs on the same
// mesh and plan (only its batch rows, sequence length, length, data or LR change), so every rank
// already holds exactly what it will keep, and the stage continues on the same ranks
// (ParallelTrainer::continue_with) instead of moving anything.
bool same_plan(const RecipeRun& rr, size_t i) {
  return i + 1 < rr.plans.size() && rr.plans[i].to_json() == rr.plans[i + 1].to_json();
}

// Stage i's data mix (none: it trains on the run's own train split).
std::optional<DataMix> stage_mix(const TrainArgs& a, const RecipeRun& rr, size_t i, const TextDataset& data,
                                 const std::map<std::string, TextDataset>& others) {
  if (!rr.mixes(i)) return std::nullopt;
  std::vector<MixSource> sources;
  for (const MixEntry& e : rr.sources[i])
    sources.push_back({e.path, (e.path == rr.primary ? data : others.at(e.path)).train(), e.weight});
  try {
    return DataMix(std::move(sources), rr.recipe.stages[i].seq_len);
  } catch (const InputError& e) {
    throw InputError(recipe_origin(a) + ": " + stage_label(rr.recipe, i) + " key \"data\": " + e.what());
  }
}

// What the lead rank learns about one stage inside a launch.
struct StageResult {
  nlohmann::json loop;       // train_loop's result
  int64_t started_at = 0;    // global steps done when the stage began
  std::string strategy;
  StateMoves moved;          // the boundary into the stage, when it came through memory
  double restore_seconds = 0, handoff_seconds = 0;
};

template <class T>
nlohmann::json run_recipe(const Run& r, const RecipeRun& rr, const TextDataset& data,
                          const std::map<std::string, TextDataset>& others) {
  const TrainArgs& a = r.args;
  const Recipe& recipe = rr.recipe;
  std::unique_ptr<InMemoryReshard<T>> carried;  // the state handed from one launch to the next
  nlohmann::json stages = nlohmann::json::array(), last;
  double capture_seconds = 0;
  if (rr.first_stage == recipe.stages.size())
    progress("train: the checkpoint had finished all %lld steps of recipe \"%s\"\n", (long long)recipe.total_steps(),
             recipe.name.c_str());
  const auto stops_at = [&](size_t i) { return a.stop_at > 0 && a.stop_at <= recipe.stage_options(a.opt, i).steps; };
  bool stopped = false;
  for (size_t first = rr.first_stage; first < recipe.stages.size() && !stopped;) {
    // One launch runs stages [first, end): those on the same plan, up to a stop.
    size_t end = first + 1;
    while (end < recipe.stages.size() && same_plan(rr, end - 1) && !stops_at(end - 1)) ++end;
    const ParallelPlan& plan = rr.plans[first];
    const size_t last_stage = end - 1;
    stopped = stops_at(last_stage);
    const bool hand_on = end < recipe.stages.size() && !stopped;
    std::unique_ptr<InMemoryReshard<T>> next = hand_on ? std::make_unique<InMemoryReshard<T>>() : nullptr;
    std::vector<std::optional<DataMix>> mixes;
    for (size_t i = first; i < end; ++i) mixes.push_back(stage_mix(a, rr, i, data, others));
    std::vector<StageResult> results(end - first);
    // sim_us[k][rank]: the simulated clock each rank spent in stage first + k (core/comm/trace.h):
    // the first stage from the launch's start (moving the state in included), each later one from
    // the end of the one before.
    std::vector<std::vector<double>> sim_us(end - first, std::vector<double>(size_t(plan.world_size()), 0.0));
    RankLaunch launcher(a.launch);
    std::mutex mu;
    launcher.run(plan.world_size(), [&](ProcessGroup& world) {
      Llama<T> model = plan.make_model<T>(r.cfg, world.memory(), world.rank());
      ParallelTrainer<T> trainer(world, model, data, recipe.stage_options(a.opt, first), plan);
      const bool lead = world.rank() == 0;
      if (carried) {
        const auto t0 = std::chrono::steady_clock::now();
        const StateMoves m = carried->restore(trainer);  // collective: every rank has read its share
        if (lead) {
          results[0].moved = m, results[0].restore_seconds = seconds_since(t0);
          progress("train: into %s: moved %lld of %lld bytes of state in memory from mesh %s to %s in %.3f s\n",
                   stage_label(recipe, first).c_str(), (long long)m.total_moved(), (long long)m.total_read(),
                   recipe.stages[first - 1].mesh().c_str(), recipe.stages[first].mesh().c_str(),
                   capture_seconds + results[0].restore_seconds);
        }
      } else if (!a.resume.empty()) {
        trainer.load_checkpoint(a.resume);
      }
      double clock = 0;
      for (size_t i = first; i < end; ++i) {
        const size_t k = i - first;
        const RecipeStage& st = recipe.stages[i];
        const TrainOptions opt = recipe.stage_options(a.opt, i);
        if (i > first) {
          trainer.continue_with(opt);  // the same plan: the state stays on every rank
          if (lead)
            progress("train: into %s: the same mesh %s and plan as %s: every rank keeps its state, 0 bytes moved\n",
                     stage_label(recipe, i).c_str(), st.mesh().c_str(), stage_label(recipe, i - 1).c_str());
        }
        trainer.set_data_mix(mixes[k] ? &*mixes[k] : nullptr);
        if (lead) results[k].started_at = trainer.steps_done();
        if (lead)
          progress("train: %s %lld steps (%lld..%lld), global batch %lld x %lld tokens, mesh %s (%s), lr %s %.3g -> %.3g\n",
                   stage_label(recipe, i).c_str(), (long long)st.steps, (long long)opt.recipe.first_step + 1,
                   (long long)opt.steps, (long long)st.batch_size, (long long)st.seq_len, st.mesh().c_str(),
                   trainer.describe().c_str(), st.lr.shape_name.c_str(), st.lr.from, st.lr.to);
        const TrainerCalls calls{[&] { return trainer.step(); }, [&] { return trainer.steps_done(); },
                                 [&](int64_t w) { return trainer.validation_loss(w).mean(); },
                                 [&](const std::string& dir) {
                                   trainer.save_checkpoint(dir);
                                   if (world.rank() == 0) write_tokenizer_files(r, dir);
                                 },
                                 {}, {}, {}, {}};
        // A stage hands on (no checkpoint) unless it is the last of the recipe or of --stop-at.
        const bool saves = i == last_stage && !hand_on;
        nlohmann::json res = train_loop(a, opt, calls, lead, nullptr, st.name, saves);
        if (i == last_stage && next) {
          const auto t0 = std::chrono::steady_clock::now();
          next->capture(trainer);  // collective over this launch's ranks
          if (lead) results[k].handoff_seconds = seconds_since(t0);
        }
        const double now = world.trace().sim_now_us();
        std::lock_guard<std::mutex> lock(mu);
        sim_us[k][size_t(world.rank())] = now - clock;
        if (lead) results[k].loop = std::move(res), results[k].strategy = trainer.describe();
        clock = now;
      }
    });
    for (size_t i = first; i < end; ++i) {
      const size_t k = i - first;
      const RecipeStage& st = recipe.stages[i];
      const StageResult& s = results[k];
      const nlohmann::json& j = s.loop;
      nlohmann::json row = {{"name", st.name}, {"stage", i + 1}, {"mesh", st.mesh()}, {"strategy", s.strategy},
                            {"batch_size", st.batch_size}, {"seq_len", st.seq_len},
                            {"lr", {{"shape", st.lr.shape_name}, {"from", st.lr.from}, {"to", st.lr.to}}},
                            {"steps", j.at("steps_this_run")}, {"tokens", j.at("tokens")},
                            {"final_loss", j.at("final_loss")}, {"val_loss", j.at("val_loss")},
                            {"tokens_per_s", j.at("tokens_per_s")},
                            {"data", drawn_json(rr, i, mixes[k] ? &*mixes[k] : nullptr, s.started_at,
                                                j.at("steps").get<int64_t>())}};
      // The attention cost on the modelled cluster (core/comm/cluster.h): the slowest rank's
      // simulated time in the stage (moving the state in and evaluation included) per step.
      if (const int64_t n = j.at("steps_this_run").get<int64_t>(); n > 0) {
        const double step_us = *std::max_element(sim_us[k].begin(), sim_us[k].end()) / double(n);
        row["simulated"] = {{"step_us", step_us},
                            {"tokens_per_s", step_us > 0 ? double(st.batch_size * st.seq_len) / (step_us * 1e-6) : 0.0}};
      }
      if (i > first) {
        // Kept in place: this stage's ranks are the last one's, holding what they will keep.
        row["reshard"] = {{"from_mesh", recipe.stages[i - 1].mesh()}, {"to_mesh", st.mesh()}, {"in_place", true},
                          {"moved", "nothing: the same mesh and plan, every rank keeps its state"},
                          {"bytes_moved", 0}, {"bytes_read", 0},
                          {"bytes_moved_per_rank", std::vector<int64_t>(size_t(plan.world_size()), 0)}, {"seconds", 0.0}};
      } else if (carried) {
        // What the boundary into this stage moved: the bytes each rank of this stage's plan read
        // that the same rank of the previous stage had not written (what a cluster would send).
        row["reshard"] = {{"from_mesh", recipe.stages[i - 1].mesh()}, {"to_mesh", st.mesh()}, {"in_place", false},
                          {"moved", "weights, AdamW moments (exp_avg, exp_avg_sq), step count"},
                          {"bytes_moved", s.moved.total_moved()}, {"bytes_read", s.moved.total_read()},
                          {"bytes_moved_per_rank", s.moved.bytes_moved}, {"seconds", capture_seconds + s.restore_seconds}};
      }
      progress("train: %s done: %lld steps, %lld tokens, loss %.4f, %.0f tok/s\n", stage_label(recipe, i).c_str(),
               (long long)j.at("steps_this_run").get<int64_t>(), (long long)j.at("tokens").get<int64_t>(),
               j.at("final_loss").is_number() ? j.at("final_loss").get<double>() : NAN, j.at("tokens_per_s").get<double>());
      stages.push_back(row);
      last = j;
    }
    carried = std::move(next);
    capture_seconds = results.back().handoff_seconds;
    first = end;
  }
  nlohmann::json result = last.is_null() ? nlohmann::json::object() : last;
  if (last.is_null()) {
    // A resume of a finished recipe: nothing trained, the checkpoint stays as it was.
    const int64_t done = recipe.total_steps();
    result = {{"final_loss", nullptr}, {"steps", done}, {"steps_this_run", 0}, {"tokens", 0}, {"val_loss", nullptr},
              {"checkpoint", a.resume}, {"metrics", a.out + "/metrics.jsonl"}};
  }
  const int64_t done = result.at("steps").get<int64_t>();
  nlohmann::json position = {{"step", done}};
  if (done < recipe.total_steps()) {
    const auto [stage, k] = recipe.locate(done);
    position["stage"] = stage + 1, position["stage_name"] = recipe.stages[stage].name, position["step_in_stage"] = k;
  } else {
    position["stage"] = recipe.stages.size(), position["stage_name"] = recipe.stages.back().name,
    position["step_in_stage"] = recipe.stages.back().steps, position["finished"] = true;
  }
  result.erase("steps_this_run");
  result["recipe"] = {{"name", recipe.name}, {"file", a.recipe.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.recipe)},
                      {"stage_flags", a.stages}, {"fingerprint", recipe.fingerprint()},
                      {"total_steps", recipe.total_steps()}, {"position", position}};
  result["stages"] = stages;
  result["model"] = model_name(a);
  result["parameters"] = r.cfg.num_parameters();
  result["dtype"] = a.model.dtype;
  result["backend"] = a.launch.backend;
  return result;
}

}  // namespace

nlohmann::json train_recipe(const TrainArgs& asked, const CLI::App& cmd) {
  use_compute(asked.compute);
  check_recipe_flags(asked, cmd);
  Run r = resolve_run(asked, cmd);
  RecipeRun rr = resolve_recipe(r, cmd);
  const TrainArgs& a = r.args;
  a.launch.validate(true);
  const bool f64 = a.model.fp64();
  check_fits_in_memory(r.cfg, 4.0 * (f64 ? 8 : 4), a.force,
                       "training a " + std::to_string(r.cfg.num_parameters()) + "-parameter model");
  const TextDataset data = load_run_data(r, false);
  // The other sources of the stages' mixes, each checked on resume against the text the run
  // started on, as the primary is.
  std::map<std::string, TextDataset> others;
  nlohmann::json loop = nlohmann::json::parse(r.args.opt.loop);
  for (const std::vector<MixEntry>& stage : rr.sources)
    for (const MixEntry& e : stage) {
      if (e.path == rr.primary || others.count(e.path)) continue;
      TextDataset d = load_source(r, e.path);
      const std::string now = data_fingerprint(d.tokens);
      nlohmann::json& saved = loop["mix_fingerprints"][e.path];
      if (!saved.is_null() && saved != now)
        throw InputError("recipe source " + e.path + " (" + now + ") is not the text the checkpoint's run trained on (" +
                         saved.dump() + "): " + kResumeKeepsTheMath);
      saved = now;
      others.emplace(e.path, std::move(d));
    }
  r.args.opt.loop = loop.dump();
  const OutputDir out(a.out);
  OutputLock lock(a.out, "train");
  check_directory_replaceable(a.out + "/checkpoint", kConfigFile);
  remove_stale_staging(a.out + "/checkpoint");
  nlohmann::json result = f64 ? run_recipe<double>(r, rr, data, others) : run_recipe<float>(r, rr, data, others);
  result["device"] = ops::backend_name();
  result["kernels"] = ops::kernel_mode_name(ops::kernel_mode());
  return result;
}

}  // namespace llama4d::cli::training
