#pragma once
// Pieces every subcommand shares: how the model is chosen, output conventions, --json.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cli/commands.h"
#include "core/comm/rank_agreement.h"
#include "core/model/config.h"
#include "core/train/train_options.h"
#include "core/train/model_directory.h"

namespace llama4d::cli {

// --preset / --config / --checkpoint: exactly one way to pick the model shape.
struct ModelChoice {
  std::string preset;      // "tiny", "small", ...
  std::string config;      // path to a Hugging Face config.json
  std::string checkpoint;  // a checkpoint directory (config.json + model.safetensors)
  std::string dtype = "f32";

  void add_options(CLI::App& cmd, const std::string& default_preset, bool with_checkpoint);
  // The chosen config, validated. InputError for unknown presets or bad files.
  // Mixture-of-experts configs run on one device and under data parallelism (dp, dp_shard,
  // dp_replicate); a --mesh with tp, cp, pp or ep > 1 refuses them (ParallelPlan::check_model),
  // and `plan` refuses them (refuse_moe).
  LlamaConfig resolve() const;
  // Which model this is, for the progress line and the JSON: "preset tiny", "config PATH",
  // "checkpoint DIR".
  std::string describe() const;
  // The chosen model with its tokenizer: --checkpoint's directory (open_model_directory:
  // tokenizer, stop ids, chat template, all checked), else resolve()'s shape with the byte
  // tokenizer (dir empty).
  ModelDirectory open() const;
  bool fp64() const { return dtype == "f64"; }
  // bf16 mixed precision: an f32 model computing in bf16 (Llama::set_bf16_compute).
  bool bf16() const { return dtype == "bf16"; }
};

// The --seq-len to run: the flag's value when given; left at the command's default, at most the
// model's max_position_embeddings, so that every preset runs with the defaults (tiny has 128
// positions, train's default is 256). A value given and too long is refused later, naming it.
int64_t fitted_seq_len(const CLI::App& cmd, int64_t seq_len, const LlamaConfig& cfg);

// Refuses shapes whose training state would not fit in this machine's memory (the real
// llama3-* presets), unless the user insists. bytes_per_param: 16 for fp32 params, grads and
// two AdamW moments; extra_bytes: what else the command holds (a KV cache). Checked against 80%
// of physical memory (sysconf), before anything is allocated; the message gives both in bytes.
void check_fits_in_memory(const LlamaConfig& cfg, double bytes_per_param, bool force, const std::string& what,
                          double extra_bytes = 0);

// Refuses, before any work, a batch whose activations cannot fit in this machine's memory (an
// InputError naming the bytes, where the allocation would otherwise fail mid-step). A lower bound:
// every layer's input and the logits of one forward of `rows` x `seq_len` tokens, `bytes` each,
// times `share`, the forwards this process holds at once (its data-parallel replicas on virtual
// GPUs; 1 / (tp x cp x pp) of one on an MPI rank). `what` names the flags that set the rows.
void check_batch_fits_in_memory(const LlamaConfig& cfg, int64_t rows, int64_t seq_len, double bytes, double share,
                                bool force, const std::string& what);

// Where human-readable progress goes: stderr always, so --json output stays clean on stdout.
template <class... Args>
void progress(const char* fmt, Args... args) {
  std::fprintf(stderr, fmt, args...);
  std::fflush(stderr);
}

// Prints the final result: one JSON object on stdout.
void print_json(const nlohmann::json& j);

// What identifies the tokens a run trains on, wherever the file lies: their count and FNV-1a hash.
std::string data_fingerprint(const std::vector<int32_t>& tokens);

// What the ranks of an MPI job must agree on (core/comm/rank_agreement.h) about the model and the
// step: --dtype, the model config's fields one by one ("model config rope_theta") and every
// option of `opt` by its flag (train_option_fields), `loop` aside.
std::vector<RankSetting> model_and_step_rank_settings(const LlamaConfig& cfg, const std::string& dtype,
                                                      const TrainOptions& opt);

// The --out directory of a command: created (with its parents) and checked that a file can be
// written in it, so a bad --out fails before any work (InputError naming it). If the command
// fails before putting anything in it, the directories created here are removed again: a
// rejected run leaves no empty --out behind.
class OutputDir {
 public:
  explicit OutputDir(const std::string& dir);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

 private:
  std::vector<std::string> created_;  // outermost first
  int exceptions_;                    // in flight at construction: more at destruction = failing
};

// One run at a time in an --out directory: an exclusive flock on the directory itself, held
// until destruction, so two runs cannot interleave their metrics and checkpoints. The holder is
// named in <dir>/.llama4d-run (pid, host, command), removed again on release. A second run is
// refused with InputError naming the holder. Where the filesystem has no flock for directories
// (some NFS mounts) it says so on stderr and runs unlocked.
class OutputLock {
 public:
  OutputLock(const std::string& dir, const std::string& command);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string holder_file_;
  int fd_ = -1;
};

// Checks, before any work, that `path` (the value of `flag`) can be created or overwritten
// later: its directory exists and takes a new file. Leaves nothing behind.
void check_writable_file(const std::string& path, const std::string& flag);

// Where a command's ops run: --device (a compute backend linked into this build, "cpu" by
// default), --threads (0: all cores) and --kernels (empty: not given, the backend's exact
// kernels; core/ops.h's KernelMode).
struct ComputeChoice {
  std::string device = "cpu";
  int threads = 0;
  std::string kernels;
};
void add_compute_options(CLI::App& cmd, ComputeChoice& c, const std::string& threads_help);
// Selects the device, before any buffer is allocated, the calling thread's compute threads and
// the device's kernels. InputError (exit 2) for a negative count, a device this build has not
// linked (naming those it has), --kernels other than exact or fast, --kernels on a device with one
// set of kernels, or fast kernels whose library this machine lacks (naming it).
void use_compute(const ComputeChoice& c);

}  // namespace llama4d::cli
