// The loop of a `train` run (cli/train_loop.h).
#include "cli/train_loop.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"

namespace llama4d::cli::training {

namespace {

// metrics.jsonl is the history of the run in <out>: a new run starts it afresh; a resume keeps
// the rows up to the checkpoint's step (the last of a repeated step: the one the run went on
// from) and drops the later ones, which the resumed run computes again.
void restart_metrics(const std::string& path, int64_t steps_done) {
  std::map<int64_t, std::string> rows;
  std::ifstream in(path);
  for (std::string line; steps_done > 0 && std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);  // a line cut by a kill is dropped
    if (row.is_object() && row.contains("step") && row.at("step").is_number_integer() &&
        row.at("step").get<int64_t>() <= steps_done)
      rows[row.at("step").get<int64_t>()] = line;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [step, line] : rows) out << line << "\n";
    if (!out.flush()) throw IoError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError("cannot replace " + path + ": " + ec.message());
}


}  // namespace

nlohmann::json train_loop(const TrainArgs& a, const TrainOptions& opt, const TrainerCalls& t, bool lead,
                          Supervision* sup, const std::string& stage, bool save_at_end) {
  const int64_t last = a.stop_at > 0 ? std::min(a.stop_at, opt.steps) : opt.steps;
  std::ofstream metrics;
  if (lead) {
    restart_metrics(a.out + "/metrics.jsonl", t.steps_done());
    metrics.open(a.out + "/metrics.jsonl", std::ios::app);
    if (!metrics) throw IoError("cannot append to " + a.out + "/metrics.jsonl");
  }
  double total_seconds = 0, last_loss = NAN, val_loss = NAN;
  std::optional<double> last_aux;  // mixture of experts: the last step's load-balancing loss
  int64_t total_tokens = 0, steps_this_run = 0;
  GoodputLedger* ledger = lead && sup ? &sup->ledger : nullptr;
  if (ledger) ledger->loop_started(sup->now());
  // What each checkpoint of this attempt stalled the run for (and, asynchronous, what its write
  // took beside training): rows of the JSON result's "checkpoints".
  nlohmann::json checkpoints = nlohmann::json::array();
  int64_t writing = -1;  // the step whose asynchronous write may be in flight (-1: none)
  // Waits for the asynchronous write in flight; returns the seconds waited.
  const auto wait_for_write = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const AsyncCheckpointStats st = t.wait_saved();
    const double waited = seconds_since(t0);
    if (writing >= 0 && st.last_committed_step == writing) {
      if (ledger) ledger->write_committed(writing, st.last_write_s);
      for (nlohmann::json& row : checkpoints)
        if (row.at("step") == writing) row["write_s"] = st.last_write_s;
      if (lead)
        progress("train: checkpoint of step %lld written in the background in %.3f s\n", (long long)writing,
                 st.last_write_s);
    }
    writing = -1;
    return waited;
  };
  const auto save = [&](const std::string& dir, bool last) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!t.snapshot) {
      t.save(dir);
      const double seconds = seconds_since(t0);
      if (ledger) ledger->saved(t.steps_done(), seconds, sup->now());
      checkpoints.push_back({{"step", t.steps_done()}, {"async", false}, {"stall_s", seconds}});
      return;
    }
    double waited = wait_for_write();  // the previous write: its failure ends the run here
    const auto t1 = std::chrono::steady_clock::now();
    t.snapshot(dir);
    const double snapshot = seconds_since(t1);
    writing = t.steps_done();
    checkpoints.push_back({{"step", writing}, {"async", true}, {"stall_s", waited + snapshot}, {"wait_s", waited},
                           {"snapshot_s", snapshot}, {"write_s", nullptr}});
    const int64_t step = writing;
    if (last) {
      // The run ends once its last checkpoint is on disk.
      const double end_wait = wait_for_write();
      waited += end_wait;
      checkpoints.back()["wait_s"] = waited, checkpoints.back()["stall_s"] = waited + snapshot;
    }
    if (ledger) {
      ledger->snapshot_taken(step, waited, snapshot, sup->now());
      if (last) ledger->write_committed(step, checkpoints.back().at("write_s").get<double>());
    }
  };
  while (t.steps_done() < last) {
    const auto t0 = std::chrono::steady_clock::now();
    if (t.before_step) t.before_step(t.steps_done() + 1);
    const StepStats st = t.step();
    if (t.after_step) t.after_step(st);
    if (ledger) ledger->step_done(st.step, seconds_since(t0), sup->now());
    total_seconds += st.seconds;
    total_tokens += st.tokens;
    ++steps_this_run;
    last_loss = st.loss;
    if (!st.expert_tokens.empty()) last_aux = st.aux_loss;
    if (!std::isfinite(st.loss))
      throw Error("training diverged: loss is " + std::to_string(st.loss) + " at step " + std::to_string(st.step));
    const bool eval_now = a.eval_every > 0 && (st.step % a.eval_every == 0 || st.step == last);
    if (eval_now) val_loss = t.validation_loss(a.eval_windows);
    if (lead) {
      nlohmann::json row = {{"step", st.step}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                            {"tokens_per_s", double(st.tokens) / st.seconds}};
      if (eval_now) row["val_loss"] = val_loss;
      if (!st.expert_tokens.empty()) row["aux_loss"] = st.aux_loss, row["expert_tokens"] = st.expert_tokens;
      if (!stage.empty()) row["stage"] = stage;
      // A row lost to a full disk or an I/O error ends the run: the history is the run's record.
      if (!(metrics << row.dump() << "\n" << std::flush)) throw IoError("cannot write " + a.out + "/metrics.jsonl");
      if (st.step % a.log_every == 0 || st.step == last || eval_now)
        progress("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s%s%s\n", (long long)st.step,
                 (long long)last, st.loss, st.lr, st.grad_norm, double(st.tokens) / st.seconds,
                 st.expert_tokens.empty() ? "" : ("  aux_loss " + std::to_string(st.aux_loss)).c_str(),
                 eval_now ? ("  val_loss " + std::to_string(val_loss)).c_str() : "");
    }
    if (a.save_every > 0 && st.step % a.save_every == 0 && st.step != last) save(a.out + "/checkpoint", false);
  }
  if (std::isnan(val_loss) && a.eval_every > 0) val_loss = t.validation_loss(a.eval_windows);
  const std::string ckpt = a.out + "/checkpoint";
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  if (!save_at_end) {
    if (t.wait_saved) wait_for_write();
    return {{"final_loss", num(last_loss)}, {"steps", t.steps_done()}, {"steps_this_run", steps_this_run},
            {"tokens", total_tokens}, {"seconds", total_seconds},
            {"tokens_per_s", total_seconds > 0 ? double(total_tokens) / total_seconds : 0.0}, {"val_loss", num(val_loss)}};
  }
  save(ckpt, true);
  if (lead && steps_this_run == 0)  // a resumed run that had already finished: no loss to report
    progress("train: the checkpoint had finished all %lld steps, nothing to train (pass --steps with a larger total "
             "to go on); saved %s%s\n",
             (long long)t.steps_done(), ckpt.c_str(),
             a.eval_every > 0 ? (", val loss " + std::to_string(val_loss)).c_str() : "");
  else if (lead)
    progress("train: saved %s; final loss %.4f%s\n", ckpt.c_str(), last_loss,
             a.eval_every > 0 ? (", val loss " + std::to_string(val_loss)).c_str() : " (no validation: --eval-every 0)");
  nlohmann::json result = {{"final_loss", num(last_loss)},
          {"steps", t.steps_done()},
          {"steps_this_run", steps_this_run},
          {"tokens", total_tokens},
          {"tokens_per_s", total_seconds > 0 ? double(total_tokens) / total_seconds : 0.0},
          {"val_loss", num(val_loss)},
          {"checkpoint", ckpt},
          {"metrics", a.out + "/metrics.jsonl"},
          {"options", opt.to_json()},
          {"checkpoints", checkpoints}};
  if (last_aux) result["final_aux_loss"] = *last_aux;  // final_loss is the cross-entropy alone
  return result;
}

}  // namespace llama4d::cli::training
