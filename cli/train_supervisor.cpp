// The supervisor of a parallel `train` run (cli/train_supervisor.h).
#include "cli/train_supervisor.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cli/train_parallel.h"
#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/ops.h"

namespace llama4d::cli::training {

namespace {

// Where --fault-rate's schedule is written, to replay with --faults.
std::string drawn_faults_path(const TrainArgs& a) { return a.out + "/faults_drawn.json"; }

// --on-lost-node shrink: the plan with one data-parallel replica less (the mesh's dp dim one
// smaller). The global batch stays --batch-size rows: each of the dp - 1 data ranks gets
// batch / (dp - 1) rows, in more micro-batches of --micro-batch-size. InputError naming the
// flag when dp - 1 cannot take the batch (checked before the run starts).
ParallelPlan shrunk(const ParallelPlan& plan, const TrainOptions& opt, const LlamaConfig& cfg) {
  const int dp = plan.size("dp");
  if (dp < 2)
    throw InputError("--on-lost-node shrink drops one data-parallel replica of --mesh " + plan.describe_mesh() +
                     ", which has " + std::to_string(dp) + " on its dp dim: it cannot shrink below 1 replica");
  ParallelPlan p = plan;
  for (MeshDim& d : p.mesh)
    if (d.name == "dp") --d.size;
  try {
    p.check_model(cfg, int(rank_micro_batch_count(opt, p.dp())));
  } catch (const InputError& e) {
    throw InputError("--on-lost-node shrink: on --mesh " + p.describe_mesh() + " (dp " + std::to_string(dp) + " - 1): " +
                     e.what());
  }
  return p;
}

// Every parallel run: runs the job and reports its goodput. With `train --max-restarts N`, when
// it fails (a rank crashed, hung, lost a link, or its weights disagree with its replicas), starts
// it again from the latest checkpoint this run saved (or from the run's own start), at most N times. The batches of a step are a pure function
// of the step, so the restarted run trains the same rows and ends on the same bytes.
template <class T>
nlohmann::json supervise(const Run& r, const ParallelPlan& first_plan, const TextDataset& data, const FaultSchedule& faults) {
  const TrainArgs& a = r.args;
  ParallelPlan plan = first_plan;  // one dp replica less after each node lost under --on-lost-node shrink
  // A hung rank sleeps past its peers' timeout (they name it), then stops.
  FaultInjector injector(faults, std::chrono::milliseconds(int64_t(a.launch.timeout_s) * 1000 + 500));
  Supervision sup;
  sup.stragglers.emplace(a.stragglers);
  const std::string ckpt = a.out + "/checkpoint";
  // --memory-copy-every: the copies outlive the attempts, as another host's memory outlives a GPU.
  std::optional<MemoryCopies<T>> copies;
  if (a.memory_copy_every > 0) copies.emplace(plan.world_size(), a.launch.gpus_per_node, a.memory_copy_every);
  std::optional<TrainingStateImage<T>> image;  // the copies assembled for the next attempt
  // Where the next attempt starts: the run's own start, then the latest checkpoint this run saved.
  // Read from disk, not from the lead rank's view: a save can be complete on disk while the lead
  // rank, still in its last collective, fails with the rank that crashed right after it. A
  // checkpoint already in <out> before the run is not this run's unless it changed since.
  std::string from;
  int64_t from_step = a.resume.empty() ? 0 : read_training_state(a.resume).steps_done;
  const auto trainer_state = [&] {
    std::ifstream in(ckpt + "/" + kTrainerStateFile, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string state_before = trainer_state();
  // --init's staged copy of the directory's weights goes when the supervised run ends, however
  // it ends: an attempt restarted from <out>/checkpoint no longer reads (or removes) it.
  struct RemoveStagedInit {
    std::string dir;
    ~RemoveStagedInit() {
      std::error_code ignored;
      if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
  } remove_staged{!a.init.empty() && a.resume.empty() ? a.out + "/init-checkpoint" : ""};
  size_t fired_at_start = 0;
  for (int64_t attempt = 0;; ++attempt) {
    sup.ledger.attempt_started(sup.now(), from_step);
    sup.attempt_starts(plan.world_size(), from_step);
    try {
      fired_at_start = injector.fired().size();
      // --heartbeat-timeout: one monitor per attempt; a silent rank is named, and stopped where
      // it is in an injected hang (a real hang cannot be stopped here: its peers' collective
      // timeout ends the attempt, and the diagnosis goes with its error).
      std::optional<HeartbeatMonitor> heartbeat;
      if (a.heartbeat_timeout_s > 0)
        heartbeat.emplace(plan.world_size(), a.heartbeat_timeout_s, [&](int rank, const std::string& why) {
          progress("train: %s\n", why.c_str());
          injector.release(rank, why);
        });
      nlohmann::json j;
      try {
        j = run_parallel<T>(r, plan, data,
                            {faults.empty() ? nullptr : &injector, &sup, from, copies ? &*copies : nullptr,
                             image ? &*image : nullptr, heartbeat ? &*heartbeat : nullptr});
      } catch (const InputError&) {
        throw;
      } catch (const Error& e) {
        const std::string why = heartbeat ? heartbeat->diagnosis() : "";
        if (why.empty() || std::string_view(e.what()).find(why) != std::string_view::npos) throw;
        throw Error(why + "; then: " + e.what());
      }
      sup.ledger.attempt_ended(sup.now(), "");
      if (!j.is_null()) {
        j["goodput"] = sup.ledger.report();
        if (!faults.empty()) {
          j["faults_injected"] = nlohmann::json::array();
          for (const Fault& f : injector.fired()) j["faults_injected"].push_back(f.describe());
        }
      }
      return j;
    } catch (const InputError&) {
      throw;
    } catch (const Error& e) {
      if (attempt >= a.max_restarts) {
        if (a.max_restarts > 0)
          throw Error("train: gave up after " + std::to_string(a.max_restarts) + " restart" +
                      (a.max_restarts == 1 ? "" : "s") + ": " + e.what());
        throw;
      }
      const std::string state = trainer_state();
      if (!state.empty() && state != state_before) {
        from = ckpt;
        from_step = read_training_state(ckpt).steps_done;
      }
      image.reset();
      std::string why_disk;
      bool node_lost = false;  // a permanent crash fired in this attempt
      for (size_t i = fired_at_start; i < injector.fired().size(); ++i)
        node_lost = node_lost || (injector.fired()[i].kind == FaultKind::crash && injector.fired()[i].permanent);
      if (copies) {
        // A crashed or hung rank takes its node's memory (its host) with it, copies included.
        const std::vector<Fault>& fired = injector.fired();
        for (size_t i = fired_at_start; i < fired.size(); ++i)
          if (fired[i].kind == FaultKind::crash || fired[i].kind == FaultKind::hang)
            copies->lose_node(copies->node_of(fired[i].rank));
        why_disk = copies->why_unrecoverable();
        if (why_disk.empty() && copies->step() >= (from.empty() ? 0 : from_step)) {
          image.emplace();
          copies->restore_into(*image);
        }
      }
      // Continuing on fewer replicas (torchft's replica groups): the lost rank's dp replica goes,
      // the others renumber, and the state (copies or checkpoint, both unsharded images any plan
      // loads) is read on the smaller mesh; new copies are laid out for it.
      if (node_lost && a.on_lost_node == "shrink") {
        const ParallelPlan before = plan;
        plan = shrunk(plan, a.opt, r.cfg);
        if (copies) copies.emplace(plan.world_size(), a.launch.gpus_per_node, a.memory_copy_every);
        progress("train: a node is lost for good (--on-lost-node shrink): going on with --mesh %s instead of %s, "
                 "%lld rows per data rank\n",
                 plan.describe_mesh().c_str(), before.describe_mesh().c_str(), (long long)(a.opt.batch_size / plan.dp()));
      }
      const int64_t kept = image ? image->steps_done() : from.empty() ? 0 : from_step;
      sup.ledger.attempt_ended(sup.now(), e.what(), kept, sup.every_rank_reached());
      sup.ledger.recovered(image.has_value());
      if (image) from_step = image->steps_done();
      if (copies && !why_disk.empty())
        progress("train: attempt %lld failed: %s\ntrain: cannot recover from memory: %s; falling back to disk\n",
                 (long long)attempt + 1, e.what(), why_disk.c_str());
      else
        progress("train: attempt %lld failed: %s\n", (long long)attempt + 1, e.what());
      progress("train: restarting (%lld of %lld) from %s\n", (long long)attempt + 1, (long long)a.max_restarts,
               image      ? ("the in-memory copies (step " + std::to_string(from_step) + ")").c_str()
               : !from.empty() ? (from + " (step " + std::to_string(from_step) + ")").c_str()
               : a.resume.empty() ? "the start (no checkpoint saved yet)"
                                  : a.resume.c_str());
    }
  }
}


}  // namespace


nlohmann::json drawn_faults_json(const TrainArgs& a, const DrawnSchedule& d) {
  nlohmann::json causes = nlohmann::json::array();
  for (const DrawnFault& f : d.drawn) causes.push_back({{"fault", f.fault.describe()}, {"cause", f.cause->cause}});
  return {{"per_rank_step", a.fault_rate}, {"seed", a.fault_seed}, {"schedule", d.schedule.to_json()},
          {"causes", causes}, {"dropped_sdc", d.dropped_sdc}, {"file", drawn_faults_path(a)}};
}

void report_drawn_faults(const TrainArgs& a, const DrawnSchedule& d) {
  const std::string path = drawn_faults_path(a);
  write_text_file_atomically(path, d.schedule.to_json().dump(1) + "\n");
  progress("train: --fault-rate %g per rank-step, --fault-seed %lld: drew %zu fault%s over %lld steps (Llama 3's "
           "Table 5 mix); replay with --faults %s\n",
           a.fault_rate, (long long)a.fault_seed, d.drawn.size(), d.drawn.size() == 1 ? "" : "s",
           (long long)last_step(a), path.c_str());
  bool sdc = false;
  for (const DrawnFault& f : d.drawn) {
    progress("  %s (%s)\n", f.fault.describe().c_str(), f.cause->cause);
    sdc = sdc || f.fault.kind == FaultKind::sdc;
  }
  if (d.dropped_sdc > 0)
    progress("  and %d silent data corruption%s not injected: ZeRO-3 (--zero 3) holds no whole weights to flip a bit of\n",
             d.dropped_sdc, d.dropped_sdc == 1 ? "" : "s");
  if (sdc && !a.check_replicas)
    progress("  (without --check-replicas nothing will notice the silent corruption: it stays in the weights)\n");
}

FaultSchedule check_fault_flags(const TrainArgs& a, const CLI::App& cmd, const ParallelPlan& plan, const LlamaConfig& cfg) {
  check_straggler_options(a.stragglers);
  if (a.max_restarts < 0)
    throw InputError("--max-restarts must be >= 0 (0: a failure ends the run), got " + std::to_string(a.max_restarts));
  const bool parallel = a.parallel.parallel();
  for (const char* flag : {"--faults", "--fault-rate", "--fault-seed", "--max-restarts", "--check-replicas",
                           "--straggler-factor", "--straggler-margin", "--on-lost-node", "--heartbeat-timeout"})
    if (cmd.count(flag) > 0 && !parallel)
      throw InputError(std::string(flag) + " applies to the ranks of a parallel --mesh, and none was given (e.g. --mesh dp=2)");
  if (a.check_replicas && std::string_view(ops::backend_name()) != "cpu")
    throw InputError("--check-replicas reads the weights in host memory: it runs on --device cpu");
  if (a.check_replicas && parallel && plan.dp() * plan.size("cp") == 1)
    throw InputError("--check-replicas compares the data-parallel replicas' weights, and --mesh " + plan.describe_mesh() +
                     " has one (dp x cp = 1): it would check nothing");
  if (a.check_replicas && plan.zero == ZeroStage::zero3)
    throw InputError("--check-replicas compares whole weights, and ZeRO-3 (--zero 3) keeps only a shard of each");
  if (a.on_lost_node != "spare" && a.on_lost_node != "shrink")
    throw InputError("--on-lost-node must be spare or shrink, got \"" + a.on_lost_node + "\"");
  if (a.on_lost_node == "shrink") {
    if (a.launch.backend != "virtual")
      throw InputError("--on-lost-node shrink restarts the virtual GPUs of a parallel --mesh (--backend virtual)");
    if (a.max_restarts == 0)
      throw InputError("--on-lost-node shrink continues after a restart, and --max-restarts is 0: give --max-restarts N");
    // Every shrink a run can go through (one per restart, down to dp = 1) must fit the batch;
    // the first one also refuses a mesh with one replica.
    ParallelPlan p = plan;
    for (int64_t k = 0; k < a.max_restarts && (k == 0 || p.size("dp") > 1); ++k) {
      p = shrunk(p, a.opt, cfg);
      if (a.memory_copy_every > 0) MemoryCopies<float>(p.world_size(), a.launch.gpus_per_node, a.memory_copy_every);
    }
  }
  if (cmd.count("--heartbeat-timeout") > 0) {
    if (a.launch.backend != "virtual")
      throw InputError("--heartbeat-timeout watches virtual GPUs (--backend virtual), not --backend " + a.launch.backend);
    if (!(a.heartbeat_timeout_s >= 0) || !std::isfinite(a.heartbeat_timeout_s))
      throw InputError("--heartbeat-timeout must be >= 0 seconds (0: no heartbeats), got " +
                       std::to_string(a.heartbeat_timeout_s));
    if (a.heartbeat_timeout_s >= a.launch.timeout_s)
      throw InputError("--heartbeat-timeout " + std::to_string(a.heartbeat_timeout_s) + " s is not under --timeout " +
                       std::to_string(a.launch.timeout_s) + " s: the collective's timeout would always fire first");
  }
  if (a.max_restarts > 0 && a.launch.backend != "virtual")
    throw InputError("--max-restarts restarts the ranks of virtual GPUs (--backend virtual); under mpirun a launcher "
                     "would relaunch the processes, which this build does not do");
  if (cmd.count("--memory-copy-every") > 0) {
    if (!parallel)
      throw InputError("--memory-copy-every copies the shards of a parallel --mesh, and none was given (e.g. --mesh dp=4)");
    if (a.launch.backend != "virtual")
      throw InputError("--memory-copy-every keeps the copies in this process, for virtual GPUs (--backend virtual), not "
                       "--backend " + a.launch.backend);
    MemoryCopies<float>(plan.world_size(), a.launch.gpus_per_node, a.memory_copy_every);  // InputError naming it
    // The copies exist to restart from; with no restart allowed they would only cost time.
    if (a.max_restarts == 0)
      throw InputError("--memory-copy-every keeps copies to restart from, and --max-restarts is 0 (a failure ends the "
                       "run): give --max-restarts N as well");
  }
  if (a.async_checkpoint && parallel && a.launch.backend != "virtual")
    throw InputError("--async-checkpoint snapshots every rank's share into this process's memory: it runs on one rank "
                     "or on virtual GPUs (--backend virtual), not --backend " + a.launch.backend);
  if (cmd.count("--fault-seed") > 0 && cmd.count("--fault-rate") == 0)
    throw InputError("--fault-seed seeds the faults --fault-rate draws, and --fault-rate was not given");
  if (cmd.count("--fault-rate") > 0) {
    if (!a.faults.empty()) throw InputError("--fault-rate and --faults: give a schedule or a rate to draw one, not both");
    if (a.launch.backend != "virtual")
      throw InputError("--fault-rate injects into virtual GPUs only (--backend virtual), not --backend " + a.launch.backend);
    if (a.fault_seed < 0) throw InputError("--fault-seed must be >= 0, got " + std::to_string(a.fault_seed));
    draw_fault_schedule(a.fault_rate, 0, 1, 0);  // InputError naming --fault-rate for a rate outside (0, 1]
    return {};
  }
  if (a.faults.empty()) return {};
  if (a.launch.backend != "virtual")
    throw InputError("--faults injects into virtual GPUs only (--backend virtual), not --backend " + a.launch.backend);
  FaultSchedule s = FaultSchedule::read(a.faults);
  s.check_fits(plan.world_size(), last_step(a));
  const int weight_bits = a.model.fp64() ? 64 : 32;  // bf16 runs keep fp32 master weights
  for (const Fault& f : s.faults) {
    if (f.bit >= weight_bits)
      throw InputError("--faults: " + f.describe() + ": \"bit\" " + std::to_string(f.bit) + " does not exist in a " +
                       std::to_string(weight_bits) + "-bit weight");
    if (f.kind == FaultKind::sdc && plan.zero == ZeroStage::zero3)
      throw InputError("--faults: " + f.describe() + ": an sdc fault flips a bit of a rank's whole weights, which ZeRO-3 "
                       "(--zero 3) does not hold");
  }
  return s;
}


nlohmann::json supervise_run(const Run& r, const ParallelPlan& plan, const TextDataset& data, const FaultSchedule& faults) {
  return r.args.model.fp64() ? supervise<double>(r, plan, data, faults) : supervise<float>(r, plan, data, faults);
}

}  // namespace llama4d::cli::training
