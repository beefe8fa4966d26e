#include "cli/common.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/ops.h"

namespace llama4d::cli {

void ModelChoice::add_options(CLI::App& cmd, const std::string& default_preset, bool with_checkpoint) {
  preset = default_preset;
  std::string names;  // from the list itself, so the help never misses a preset
  for (const std::string& n : LlamaConfig::preset_names()) names += (names.empty() ? "" : ", ") + n;
  cmd.add_option("--preset", preset, "model shape: " + names)
      ->capture_default_str();
  cmd.add_option("--config", config, "Hugging Face config.json (overrides --preset)");
  if (with_checkpoint)
    cmd.add_option("--checkpoint", checkpoint, "checkpoint directory: config.json + model.safetensors");
  cmd.add_option("--dtype", dtype, "f32, f64, or bf16 (mixed precision: bf16 compute over f32 master weights)")
      ->check(CLI::IsMember({"f32", "f64", "bf16"}))
      ->capture_default_str();
}

namespace {
// The chosen config, MoE or not.
LlamaConfig resolve_config(const ModelChoice& m) {
  if (!m.checkpoint.empty()) {
    std::error_code ec;
    const char* makes = "; `llama4d train --out DIR` saves one as DIR/checkpoint";
    if (!std::filesystem::exists(m.checkpoint, ec))
      throw InputError("--checkpoint " + m.checkpoint + " does not exist" + makes);
    if (std::filesystem::is_directory(m.checkpoint, ec) &&
        !std::filesystem::exists(std::filesystem::path(m.checkpoint) / kConfigFile, ec))
      throw InputError("--checkpoint " + m.checkpoint + " is not a checkpoint (no config.json in it)" + makes);
    return load_config(m.checkpoint);
  }
  if (!m.config.empty()) return LlamaConfig::from_file(m.config);
  LlamaConfig cfg = LlamaConfig::preset(m.preset);
  cfg.validate();
  return cfg;
}
}  // namespace

LlamaConfig ModelChoice::resolve() const {
  return resolve_config(*this);
}

std::string ModelChoice::describe() const {
  if (!checkpoint.empty()) return "checkpoint " + checkpoint;
  if (!config.empty()) return "config " + config;
  return "preset " + preset;
}

int64_t fitted_seq_len(const CLI::App& cmd, int64_t seq_len, const LlamaConfig& cfg) {
  if (cmd.count("--seq-len") > 0 || seq_len <= cfg.max_position_embeddings) return seq_len;
  return cfg.max_position_embeddings;
}

ModelDirectory ModelChoice::open() const {
  namespace fs = std::filesystem;
  if (!checkpoint.empty() && fs::is_directory(checkpoint)) return open_model_directory(checkpoint);
  ModelDirectory m;
  m.config = resolve();
  m.tokenizer = tokenizer_for_shape(m.config);
  m.stop_ids = m.tokenizer->eos_ids();
  return m;
}

void check_fits_in_memory(const LlamaConfig& cfg, double bytes_per_param, bool force, const std::string& what,
                          double extra_bytes) {
  const double need = double(cfg.num_parameters()) * bytes_per_param + extra_bytes;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (need > 0.8 * have && !force)
    throw InputError(what + " needs about " + std::to_string(int64_t(need)) + " bytes (" +
                     std::to_string(int64_t(need / 1e9)) + " GB) for " + std::to_string(cfg.num_parameters()) +
                     " parameters but this machine has " + std::to_string(int64_t(have)) + " bytes (" +
                     std::to_string(int64_t(have / 1e9)) + " GB) of physical memory; pass --force to try anyway");
}

void check_batch_fits_in_memory(const LlamaConfig& cfg, int64_t rows, int64_t seq_len, double bytes, double share,
                                bool force, const std::string& what) {
  const double per_token = double(cfg.hidden_size) * double(cfg.num_hidden_layers + 1) + double(cfg.vocab_size);
  const double need = double(rows) * double(seq_len) * per_token * bytes * share;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (need > have && !force)
    throw InputError(what + ": one forward of " + std::to_string(rows) + " rows x " + std::to_string(seq_len) +
                     " tokens needs at least " + std::to_string(uint64_t(std::min(need, 1.8e19))) +
                     " bytes of activations (each layer's input and the logits) but this machine has " +
                     std::to_string(uint64_t(have)) + " bytes; use fewer rows per forward (--micro-batch-size) or "
                     "pass --force to try anyway");
}

// A byte model can emit a sequence that is not UTF-8; JSON output shows it as U+FFFD instead of failing.
void print_json(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

std::string data_fingerprint(const std::vector<int32_t>& tokens) {
  uint64_t h = 14695981039346656037ull;
  for (const int32_t t : tokens) h = (h ^ uint64_t(uint32_t(t))) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return std::to_string(tokens.size()) + " tokens, fnv1a " + hex;
}

std::vector<RankSetting> model_and_step_rank_settings(const LlamaConfig& cfg, const std::string& dtype,
                                                      const TrainOptions& opt) {
  std::vector<RankSetting> s{{"--dtype", dtype}};
  // One setting per leaf: "/rope_parameters/rope_theta" is named rope_parameters.rope_theta.
  const nlohmann::json leaves = cfg.to_json().flatten();  // items() refers to it
  for (const auto& [pointer, value] : leaves.items()) {
    std::string key = pointer.substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    s.push_back({"model config " + key, value.dump()});
  }
  const nlohmann::json options = opt.to_json();
  for (const TrainOptionField& f : train_option_fields())
    s.push_back({f.flag, options.at(nlohmann::json::json_pointer(f.pointer)).dump()});
  return s;
}

namespace {

// Creates and removes a probe file in `dir`: false if the file cannot be written there.
bool can_write_in(const std::string& dir) {
  const std::string probe = dir + "/.llama4d-write-test-" + std::to_string(getpid());
  std::error_code ec;
  bool ok;
  {
    std::ofstream f(probe);
    ok = f && (f << "ok") && f.flush();
  }
  std::filesystem::remove(probe, ec);
  return ok;
}

}  // namespace

OutputDir::OutputDir(const std::string& dir) : exceptions_(std::uncaught_exceptions()) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created_.insert(created_.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw InputError("--out " + dir + " is not a writable directory: " + ec.message());
  if (!can_write_in(dir)) throw InputError("--out " + dir + " is not writable");
}

OutputDir::~OutputDir() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  std::error_code ec;
  // Innermost first; a directory that holds anything (metrics of steps that ran) is kept.
  for (auto it = created_.rbegin(); it != created_.rend(); ++it)
    if (!std::filesystem::remove(*it, ec)) break;
}

OutputLock::OutputLock(const std::string& dir, const std::string& command)
    : holder_file_((std::filesystem::path(dir) / ".llama4d-run").string()) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw InputError("--out " + dir + ": cannot open: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      ::close(fd_);
      fd_ = -1;
      std::ifstream in(holder_file_);
      std::string holder;
      std::getline(in, holder);
      throw InputError("--out " + dir + " is in use by another run (" + (holder.empty() ? "holder unknown" : holder) +
                       "): two runs in one directory would mix their metrics and checkpoints; wait for it to "
                       "finish or choose another --out");
    }
    std::fprintf(stderr, "llama4d: warning: cannot lock --out %s (%s): a second run on it would not be refused\n",
                 dir.c_str(), std::strerror(err));
    return;
  }
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::ofstream out(holder_file_, std::ios::trunc);
  out << "llama4d " << command << ", pid " << getpid() << " on " << host << "\n";
  if (!out.flush()) throw IoError("cannot write " + holder_file_);
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  std::error_code ec;
  std::filesystem::remove(holder_file_, ec);  // before the unlock: a holder file always names a live holder
  ::close(fd_);
}

void check_writable_file(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (fs::is_directory(path, ec)) throw InputError(flag + " " + path + " is a directory, not a file");
  if (!fs::is_directory(dir, ec)) throw InputError(flag + " " + path + ": directory " + dir.string() + " does not exist");
  if (!can_write_in(dir.string())) throw InputError(flag + " " + path + ": cannot write in " + dir.string());
  if (fs::exists(path, ec) && access(path.c_str(), W_OK) != 0)
    throw InputError(flag + " " + path + " exists and is not writable");
}

void add_compute_options(CLI::App& cmd, ComputeChoice& c, const std::string& threads_help) {
  std::string devices;
  for (const std::string& n : ops::compute_backend_names()) devices += (devices.empty() ? "" : ", ") + n;
  cmd.add_option("--device", c.device, "where the ops run; this build has: " + devices)->capture_default_str();
  add_number(cmd, "--threads", c.threads, threads_help);
  cmd.add_option("--kernels", c.kernels,
                 "with --device cuda: exact (the default: products summed in an order fixed by K alone, so "
                 "verify is bitwise) or fast (NVIDIA's cuBLASLt; opt-in until a GPU run has held it to bounds)");
}

void use_compute(const ComputeChoice& c) {
  if (c.threads < 0)
    throw InputError("--threads " + std::to_string(c.threads) + ": use 0 (all cores) or a count in [1, " +
                     std::to_string(ops::kMaxBackendThreads) + "]");
  // Threads are the CPU backend's: GPU kernels would take the count and use no host thread.
  if (c.threads > 0 && c.device != "cpu")
    throw InputError("--threads " + std::to_string(c.threads) + " sets the CPU backend's compute threads; --device " +
                     c.device + " does not use them (drop --threads)");
  if (!c.kernels.empty() && c.kernels != "exact" && c.kernels != "fast")
    throw InputError("--kernels " + c.kernels + ": use exact or fast");
  ops::select_compute_backend(c.device);
  if (c.threads > 0) ops::set_backend_threads(c.threads);
  if (c.kernels.empty()) return;
  const ops::ComputeBackend& backend = ops::compute_backend();
  if (backend.set_kernel_mode == nullptr)
    throw InputError("--kernels chooses between the CUDA backend's two sets of kernels; --device " + c.device +
                     " has one (drop --kernels)");
  backend.set_kernel_mode(c.kernels == "fast" ? ops::KernelMode::fast : ops::KernelMode::exact);
}

}  // namespace llama4d::cli
