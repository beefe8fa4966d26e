#include "lessons/common/cli_runner.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace fs = std::filesystem;

namespace llama4d::lesson {

std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string number_text(double v) {
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // whole numbers as written: 30, not 3e+01
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

Cli::Cli(Narrator& say, std::string log) : say_(say), log_(std::move(log)) {
  bin_ = (fs::canonical("/proc/self/exe").parent_path() / "llama4d").string();
  if (!fs::exists(bin_)) throw Error("no llama4d beside this program: " + bin_ + " (build the llama4d_cli target)");
}

nlohmann::json Cli::run(const std::string& args, const std::string& stdin_text) {
  say_.say("$ llama4d " + args + "\n");
  std::string cmd = shell_word(bin_) + " " + args + " --json 2>" + shell_word(log_);
  cmd += stdin_text.empty() ? " < /dev/null" : " <<'LLAMA4D_EOF'\n" + stdin_text + "\nLLAMA4D_EOF\n";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw Error("could not start " + bin_);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  std::ifstream in(log_);
  last_stderr_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (status != 0) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    const std::string what = "llama4d " + args + " failed (exit " + std::to_string(code) + "):\n" +
                             last_stderr_.substr(last_stderr_.size() > 3000 ? last_stderr_.size() - 3000 : 0);
    if (code == 2) throw InputError(what);
    throw Error(what);
  }
  return nlohmann::json::parse(out);
}

WorkDirectory::WorkDirectory(const std::string& given, const std::string& lesson)
    : path_(given.empty() ? std::filesystem::temp_directory_path() /
                                ("llama4d-" + lesson + "-" + std::to_string(getpid()))
                          : std::filesystem::path(given)),
      own_(given.empty()) {
  std::filesystem::create_directories(path_);
}

WorkDirectory::~WorkDirectory() {
  std::error_code ec;
  if (own_) std::filesystem::remove_all(path_, ec);
}

}  // namespace llama4d::lesson
