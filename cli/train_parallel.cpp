// One launch of a parallel `train` run (cli/train_parallel.h).
#include "cli/train_parallel.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>

#include "cli/init_checkpoint.h"
#include "core/comm/rank_failure.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/atomic_file.h"
#include "core/model/llama.h"
#include "core/parallel/dp_common.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/replica_checksum.h"

namespace llama4d::cli::training {

namespace {

// What every process of an MPI job must have alike (RankLaunch::agree_on): the model, the
// options, the plan, the data and where the run writes. Not --threads, --json or --force, which
// are each process's own and change no result.
std::vector<RankSetting> rank_settings(const Run& r, const ParallelPlan& plan) {
  const TrainArgs& a = r.args;
  std::vector<RankSetting> s = a.parallel.rank_settings(plan);
  const std::vector<RankSetting> step = model_and_step_rank_settings(r.cfg, a.model.dtype, a.opt);
  s.insert(s.end(), step.begin(), step.end());
  const nlohmann::json loop = nlohmann::json::parse(a.opt.loop);
  s.push_back({"--data (its tokens)", loop.at("data_fingerprint").get<std::string>()});
  for (const LoopSetting& l : kLoopSettings) s.push_back({l.flag, std::to_string(a.*l.value)});
  for (const auto& [flag, value] : {std::pair{"--out", a.out}, std::pair{"--resume", a.resume}, std::pair{"--init", a.init}})
    s.push_back({flag, value});
  s.push_back({"--stop-at", std::to_string(a.stop_at)});
  s.push_back({"--check-replicas", a.check_replicas ? "given" : "not given"});  // a collective every step
  s.push_back({"--straggler-factor", a.stragglers.factor == 0 ? "0" : "on"});    // a collective every step
  return s;
}


// A failed parallel run leaves every rank's flight recorder in <out>/flight_recorder.json (the
// latest failure's) and prints which rank did not enter which collective.
void write_flight_records(const std::string& out, const std::vector<std::vector<FlightEntry>>& ranks) {
  const nlohmann::json j = flight_json(ranks);
  const std::string path = out + "/flight_recorder.json";
  write_text_file_atomically(path, j.dump(1) + "\n");
  const std::string diagnosis = j.at("diagnosis").get<std::string>();
  std::string lines;
  for (size_t at = 0; at < diagnosis.size();) {
    const size_t end = std::min(diagnosis.find('\n', at), diagnosis.size());
    lines += "\n  " + diagnosis.substr(at, end - at);
    at = end + 1;
  }
  progress("train: flight recorder of every rank's last collectives in %s%s\n", path.c_str(),
           lines.empty() ? "" : (":" + lines).c_str());
}

}  // namespace

template <class T>
nlohmann::json run_parallel(const Run& r, const ParallelPlan& plan, const TextDataset& data, const Attempt<T>& at) {
  const TrainArgs& a = r.args;
  // --init: the directory's weights staged as a step-0 checkpoint in <out>/init-checkpoint,
  // which every rank reads its part of, removed after the run. Virtual GPUs: this process stages
  // it before they start. MPI or NCCL: world rank 0 stages it once the job is up, the others
  // waiting (--timeout bounds the wait), and a failure there stops every rank.
  const bool staged = !at.image && at.restart_from.empty() && a.resume.empty() && !a.init.empty();
  const bool stage_in_job = staged && a.launch.backend != "virtual";
  const std::string staged_dir = a.out + "/init-checkpoint";
  const auto stage = [&] { return stage_init_checkpoint<T>(r.cfg, a.init, data, a.opt, staged_dir); };
  const std::string start = at.image                 ? ""
                            : !at.restart_from.empty() ? at.restart_from
                            : !a.resume.empty()      ? a.resume
                            : stage_in_job           ? staged_dir
                            : staged                 ? stage()
                                                     : "";
  const int ranks = plan.world_size();
  const double unigram = unigram_nats(r, data);
  RankLaunch launcher(a.launch);
  launcher.agree_on(rank_settings(r, plan));
  if (at.faults) launcher.set_fault_hook([f = at.faults](int rank, CommOp op, int64_t seq) { f->on_collective(rank, op, seq); });
  nlohmann::json result;
  std::vector<RankMemory> memory(static_cast<size_t>(ranks));
  std::mutex mu;
  std::string strategy;
  // Rank 0's; a supervised run's detector outlives its attempts.
  std::optional<StragglerDetector> own_stragglers;
  StragglerDetector& stragglers =
      at.sup && at.sup->stragglers ? *at.sup->stragglers : own_stragglers.emplace(a.stragglers);
  const bool detect = a.stragglers.factor > 0;
  // --async-checkpoint: one writer for the ranks of this process; a write in flight when the
  // job fails finishes (or fails) before the supervisor looks at the disk.
  AsyncCheckpointer<T> async;
  try {
    launcher.run(ranks, [&](ProcessGroup& world) {
      std::optional<OutputLock> out_lock;
      if (world.backend() != "virtual" && world.rank() == 0) out_lock.emplace(a.out, "train");
      if (stage_in_job) {
        std::exception_ptr error;
        const int32_t failed = world.rank() == 0 ? capture_failure(error, stage) : 0;
        if (first_failed_rank(world, failed, "--init staged") >= 0) {
          if (error) std::rethrow_exception(error);
          throw Error("train: rank 0 could not stage --init " + a.init + " in " + staged_dir + " (its error ends the job)");
        }
      }
      Llama<T> model = plan.make_model<T>(r.cfg, world.memory(), world.rank());
      ParallelTrainer<T> trainer(world, model, data, a.opt, plan);
      if (at.image)
        trainer.load_state(*at.image);  // the partners' copies: no disk
      else if (!start.empty())
        trainer.load_checkpoint(start);
      const bool lead = world.rank() == 0 && launcher.reporting();
      if (lead) {
        progress("train: %s, %lld parameters, %s, %s on %d %s ranks (%s reductions); data %s\n",
                 model_name(a).c_str(), (long long)r.cfg.num_parameters(), a.model.dtype.c_str(), trainer.describe().c_str(),
                 ranks, a.launch.backend.c_str(), a.launch.algo.c_str(), a.data.c_str());
        progress("train: global batch %lld x %lld tokens, %lld rows per rank in micro-batches of %lld\n",
                 (long long)a.opt.batch_size, (long long)a.opt.seq_len, (long long)(a.opt.batch_size / plan.dp()),
                 (long long)rank_micro_batch_rows(a.opt, plan.dp()));
      }
      // The rank's weights as bytes, where it holds them whole (not under ZeRO-3's per-unit residency).
      const auto weights = [&] {
        return model.param_residency() == Llama<T>::Residency::whole
                   ? std::span<std::byte>(reinterpret_cast<std::byte*>(model.params()), size_t(model.num_params()) * sizeof(T))
                   : std::span<std::byte>();
      };
      TrainerCalls calls{[&] {
                           const StepStats st = trainer.step();
                           if (at.sup) at.sup->finished(world.rank(), st.step);
                           return st;
                         },
                         [&] { return trainer.steps_done(); },
                         [&](int64_t w) { return trainer.validation_loss(w).mean(); },
                         [&](const std::string& dir) {
                           trainer.save_checkpoint(dir);
                           if (world.rank() == 0) write_tokenizer_files(r, dir);
                         },
                         {}, {}, {}, {}};
      if (a.async_checkpoint)
        use_async_checkpoint<T>(calls, async, world.size(),
                                [&](TrainingStateImage<T>& image, const std::function<void()>& written) {
                                  trainer.save_state(image, written);
                                },
                                [&](const std::string& staging) { write_tokenizer_files(r, staging); });
      // The rank's compute time from the start of a step to the end of its after-step work (not
      // evaluation or saving, which rank 0 does more of); see core/parallel/straggler_detector.h.
      StepComputeClock compute;
      // Heartbeats (core/parallel/heartbeat.h): after a fault would fire, so a rank hung there is
      // behind its peers' beats.
      if (at.faults || detect || at.heartbeat)
        calls.before_step = [&](int64_t next) {
          if (at.faults) at.faults->before_step(world.rank(), next);
          if (at.heartbeat) at.heartbeat->beat(world.rank(), next, BeatPhase::step);
          compute.restart();
        };
      if (at.faults || a.check_replicas || at.copies || detect || at.heartbeat)
        calls.after_step = [&](const StepStats& st) {
          if (at.faults) at.faults->after_step(world.rank(), st.step, st.seconds, weights(), int(sizeof(T)));
          if (at.heartbeat) at.heartbeat->beat(world.rank(), st.step, BeatPhase::after_step);
          if (detect) {
            const std::vector<double> times = share_step_times(world, compute.seconds());
            if (world.rank() == 0)
              for (const StragglerFlag& f : stragglers.observe(st.step, times))
                if (lead)
                  progress("train: straggler: rank %d took %.3f s of compute at step %lld, %.1fx the median %.3f s "
                           "(--straggler-factor %g); the run goes on\n",
                           f.rank, f.seconds, (long long)f.step, f.median > 0 ? f.seconds / f.median : INFINITY,
                           f.median, a.stragglers.factor);
          }
          if (a.check_replicas) check_replicas_agree(trainer.replica_group(), weights(), st.step);
          // After the replica check: a copy of corrupted weights is never taken.
          if (at.copies && at.copies->due(st.step)) {
            const auto t0 = std::chrono::steady_clock::now();
            at.copies->take(trainer, world);
            if (lead && at.sup) at.sup->ledger.memory_copied(seconds_since(t0), at.sup->now());
          }
        };
      if (at.heartbeat) at.heartbeat->beat(world.rank(), trainer.steps_done(), BeatPhase::ready);
      nlohmann::json j = train_loop(a, a.opt, calls, lead, at.sup);
      if (at.heartbeat) at.heartbeat->done(world.rank());
      std::lock_guard<std::mutex> lock(mu);
      memory[size_t(world.rank())] = trainer.strategy().peak_memory();
      if (world.rank() == 0) result = j, strategy = trainer.describe();
    });
  } catch (const Error& e) {
    if (const std::string lost = async.finish_quietly(); !lost.empty() && lost != e.what())
      progress("train: %s\n", lost.c_str());
    // Virtual GPUs only: there this process holds every rank's recorder (MPI processes would
    // each write their own rank's over the others'). A failure to write it hides nothing.
    if (dynamic_cast<const InputError*>(&e) == nullptr && a.launch.backend == "virtual") {
      try {
        write_flight_records(a.out, launcher.flight_records());
      } catch (const Error& w) {
        progress("train: the flight recorder was not written: %s\n", w.what());
      }
    }
    throw;
  }
  if (staged && launcher.reporting()) std::filesystem::remove_all(start);
  if (!launcher.reporting()) return {};
  const nlohmann::json mem = memory_json(memory);
  if (!a.json) std::fputs(launcher.summary().c_str(), stderr);
  result["unigram_entropy_nats"] = std::isnan(unigram) ? nlohmann::json(nullptr) : nlohmann::json(unigram);
  result["model"] = model_name(a);
  result["parameters"] = r.cfg.num_parameters();
  result["dtype"] = a.model.dtype;
  result["ranks"] = ranks;
  result["mesh"] = plan.describe_mesh();
  result["plan"] = plan.to_json();
  result["strategy"] = strategy;
  result["backend"] = a.launch.backend;
  result["peak_memory_per_rank"] = mem;
  result["traffic"] = launcher.traffic_totals();
  if (detect) result["stragglers"] = stragglers.to_json();
  if (r.model_dir) result["tokenizer"] = r.model_dir->tokenizer->describe();
  return result;
}

template nlohmann::json run_parallel<float>(const Run&, const ParallelPlan&, const TextDataset&, const Attempt<float>&);
template nlohmann::json run_parallel<double>(const Run&, const ParallelPlan&, const TextDataset&, const Attempt<double>&);

}  // namespace llama4d::cli::training
