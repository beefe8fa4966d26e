// llama4d: the command-line front end. Each subcommand registers itself from its own file
// (see commands.h); this file only parses and maps errors to exit codes:
//   0 success · 1 internal/runtime failure · 2 bad input (flags, files, configs, checkpoints)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "cli/launch.h"
#include "core/error.h"

int main(int argc, char** argv) {
  llama4d::cli::prefer_passive_waits_under_mpirun(argv);
  // CUDA loads a kernel's module at its first launch by default, and that load may wait for the
  // whole device: behind an NCCL transfer that waits for a peer, the wait has no deadline. Every
  // module is loaded when CUDA starts instead (a user's own setting stands). Read once, when the
  // first CUDA call initialises the driver, so it is set before anything else.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  CLI::App app{"llama4d: Llama 3 training, one rank or many virtual GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "llama4d 0.1");
  llama4d::cli::add_train_command(app);
  llama4d::cli::add_eval_command(app);
  llama4d::cli::add_generate_command(app);
  llama4d::cli::add_verify_command(app);
  llama4d::cli::add_schedule_command(app);
  llama4d::cli::add_plan_command(app);
  llama4d::cli::add_average_command(app);
  CLI::App* bench = llama4d::cli::add_bench_command(app);
  llama4d::cli::add_bench_comm_command(*bench);
  try {
    llama4d::cli::check_flag_values(app);
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty()) {  // no command was recognised: say which there are
      std::string names;
      for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + c->get_name();
      const std::string given = argc > 1 && argv[1][0] != '-' ? std::string("'") + argv[1] + "' is not a command; " : "";
      std::fprintf(stderr, "llama4d: error: %sthe commands are %s (see --help)\n", given.c_str(), names.c_str());
      return 2;
    }
    // One line like every other input error (CLI11's own report adds a second, "Run with --help").
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    std::fprintf(stderr, "llama4d: error: %s (see --help)\n", message.c_str());
    return 2;
  } catch (const llama4d::cli::VerificationFailed& e) {
    std::fprintf(stderr, "llama4d: equivalence check FAILED: %s\n", e.what());
    return 1;
  } catch (const llama4d::InputError& e) {
    std::fprintf(stderr, "llama4d: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama4d: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
