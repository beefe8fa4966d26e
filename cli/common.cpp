#include "cli/common.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/ops.h"

namespace llama4d::cli {

void ModelChoice::add_options(CLI::App& cmd, const std::string& default_preset, bool with_checkpoint) {
  preset = default_preset;
  cmd.add_option("--preset", preset, "model shape: tiny, small, llama3-8b, llama3-70b, llama3-405b")
      ->capture_default_str();
  cmd.add_option("--config", config, "Hugging Face config.json (overrides --preset)");
  if (with_checkpoint)
    cmd.add_option("--checkpoint", checkpoint, "checkpoint directory: config.json + model.safetensors");
  cmd.add_option("--dtype", dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}))->capture_default_str();
}

LlamaConfig ModelChoice::resolve() const {
  if (!checkpoint.empty()) return load_config(checkpoint);
  if (!config.empty()) return LlamaConfig::from_file(config);
  LlamaConfig cfg = LlamaConfig::preset(preset);
  cfg.validate();
  return cfg;
}

void check_fits_in_memory(const LlamaConfig& cfg, double bytes_per_param, bool force, const std::string& what) {
  const double need = double(cfg.num_parameters()) * bytes_per_param;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (need > 0.8 * have && !force)
    throw InputError(what + " needs about " + std::to_string(int64_t(need / 1e9)) + " GB for " +
                     std::to_string(cfg.num_parameters()) + " parameters but this machine has " +
                     std::to_string(int64_t(have / 1e9)) + " GB; pass --force to try anyway");
}

// A byte model can emit a sequence that is not UTF-8; JSON output shows it as U+FFFD instead of failing.
void print_json(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

void ensure_writable_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw InputError("--out " + dir + " is not a writable directory: " + ec.message());
  const std::string probe = dir + "/.llama4d-write-test-" + std::to_string(getpid());
  {
    std::ofstream f(probe);
    if (!f || !(f << "ok") || !f.flush()) {
      fs::remove(probe, ec);
      throw InputError("--out " + dir + " is not writable");
    }
  }
  fs::remove(probe, ec);
}

void set_threads(int threads) {
  if (threads < 0)
    throw InputError("--threads " + std::to_string(threads) + ": use 0 (all cores) or a count in [1, " +
                     std::to_string(ops::kMaxBackendThreads) + "]");
  if (threads > 0) ops::set_backend_threads(threads);
}

}  // namespace llama4d::cli
