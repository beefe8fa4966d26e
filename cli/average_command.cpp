// `llama4d average --out DIR CKPT CKPT...`: the element-wise mean of checkpoints' weights
// (core/train/checkpoint_average.h), written as a model checkpoint.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/train/checkpoint_average.h"

namespace llama4d::cli {

void add_average_command(CLI::App& app) {
  struct Args {
    std::string out;
    std::vector<std::string> inputs;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("average", "average the weights of checkpoints of one model (Llama 3's annealing average)");
  cmd->add_option("--out", a->out, "checkpoint directory to write (replaced atomically)")->required();
  cmd->add_option("checkpoints", a->inputs, "two or more checkpoint directories of the same config")->required();
  cmd->add_flag("--json", a->json, "print one JSON object with the result on stdout");
  cmd->callback([a] {
    const AverageResult r = average_checkpoints(a->out, a->inputs);
    progress("average: %lld checkpoints, %lld parameters each (%s) -> %s\n", (long long)r.checkpoints,
             (long long)r.parameters, r.dtype.c_str(), a->out.c_str());
    if (a->json) {
      nlohmann::json j = r.to_json();
      j["out"] = a->out;
      print_json(j);
    }
  });
}

}  // namespace llama4d::cli
