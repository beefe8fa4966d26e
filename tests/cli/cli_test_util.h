#pragma once
// Running the real `llama4d` binary from a test, the way a user meets it: exit code, stdout and
// stderr captured separately. Shared by the tests in tests/cli/.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace llama4d::cli_test {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

// Runs `llama4d <args>`, capturing stdout and stderr separately; with `limit_s` > 0, under
// coreutils' timeout: a run still going after limit_s seconds is killed and returns code 124 (a
// guard against a hang, not a measure of speed).
inline Result run(const std::string& args, int limit_s = 0) {
  // ctest runs tests as parallel processes: each call needs its own file.
  static int calls = 0;
  const std::string err_file =
      testing::TempDir() + "/llama4d_cli_stderr_" + std::to_string(getpid()) + "_" + std::to_string(++calls) + ".txt";
  const std::string limit = limit_s > 0 ? "timeout -k 5 " + std::to_string(limit_s) + " " : "";
  const std::string cmd = limit + std::string(LLAMA4D_BIN) + " " + args + " 2>" + err_file;
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(err_file);
  return r;
}

// A fresh (removed) path under the test temp directory.
inline std::string tmp(const std::string& name) {
  const std::string d = testing::TempDir() + "/llama4d_cli_" + name;
  fs::remove_all(d);
  return d;
}

inline int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

inline void expect_bad_input(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(lines(r.err), 1) << "expected a one-line error, got:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "error should mention '" << needle << "': " << r.err;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace llama4d::cli_test
