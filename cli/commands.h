#pragma once
// Each subcommand of the `llama4d` CLI lives in its own file and registers itself on the app.
// A command's callback throws llama4d errors; main() turns them into a one-line message and an
// exit code (InputError -> 2, anything else -> 1). Every command accepts --json, which prints
// exactly one JSON object on stdout (human-readable progress then goes to stderr).
#include <stdexcept>

#include <CLI/CLI.hpp>

#include "cli/flag_values.h"

namespace llama4d::cli {

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_schedule_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_average_command(CLI::App& app);

// Thrown by `verify` when the parallel run is outside tolerance: exit code 1, after the report.
class VerificationFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// `bench` (a full training step on `small`) and its `bench comm` subcommand.
CLI::App* add_bench_command(CLI::App& app);
void add_bench_comm_command(CLI::App& bench);

}  // namespace llama4d::cli
