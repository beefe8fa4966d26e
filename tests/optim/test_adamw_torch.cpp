// AdamW<double> against torch.optim.AdamW itself: 5 steps on the same fp64 params and grads,
// with a no-decay group, compared at relative 1e-12. Skips when /usr/bin/python3 has no torch.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/optim/adamw.h"
#include "optim_test_util.h"

#ifndef LLAMA4D_OPTIM_TEST_DIR
#error "LLAMA4D_OPTIM_TEST_DIR must name tests/optim (set by tests/optim/CMakeLists.txt)"
#endif

namespace llama4d {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

template <class V>
void write_raw(std::ofstream& f, const V& value) {
  f.write(reinterpret_cast<const char*>(&value), sizeof(value));
}

// A scratch directory unique to this process, removed on scope exit.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    path = fs::temp_directory_path() / ("llama4d_adamw_torch_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TEST(AdamWTorch, MatchesTorchOptimAdamWFp64) {
  if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found; PyTorch reference skipped";
  const fs::path script = fs::path(LLAMA4D_OPTIM_TEST_DIR) / "adamw_torch_reference.py";
  ASSERT_TRUE(fs::exists(script)) << script;

  const auto specs = test::small_llama_like_specs();
  const int64_t n = test::total_numel(specs);
  const int steps = 5;
  const double lrs[steps] = {1e-2, 3e-2, 2e-2, 5e-3, 1e-2};
  const std::vector<double> params0 = test::random_vector<double>(n, 21);
  std::vector<std::vector<double>> grads;
  for (int s = 0; s < steps; ++s) grads.push_back(test::random_grads<double>(n, 400 + s));

  ScratchDir dir;
  const fs::path in_path = dir.path / "in.bin", out_path = dir.path / "out.bin";
  {
    std::ofstream f(in_path, std::ios::binary);
    write_raw(f, static_cast<int64_t>(specs.size()));
    write_raw(f, static_cast<int64_t>(steps));
    for (const ParamSpec& s : specs) {
      write_raw(f, s.numel);
      write_raw(f, static_cast<int64_t>(s.weight_decay ? 1 : 0));
    }
    f.write(reinterpret_cast<const char*>(lrs), sizeof(lrs));
    f.write(reinterpret_cast<const char*>(params0.data()), n * sizeof(double));
    for (const auto& g : grads) f.write(reinterpret_cast<const char*>(g.data()), n * sizeof(double));
    ASSERT_TRUE(f.good()) << "could not write " << in_path;
  }
  const std::string cmd = std::string(kPython) + " '" + script.string() + "' '" +
                          in_path.string() + "' '" + out_path.string() + "'";
  const int status = std::system(cmd.c_str());
  ASSERT_NE(status, -1) << "could not run " << cmd;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 3 || code == 127) GTEST_SKIP() << "PyTorch is not importable by " << kPython;
  ASSERT_EQ(code, 0) << "reference script failed: " << cmd;

  std::vector<double> torch_out(static_cast<size_t>(3 * n + 1));
  {
    std::ifstream f(out_path, std::ios::binary);
    f.read(reinterpret_cast<char*>(torch_out.data()), torch_out.size() * sizeof(double));
    ASSERT_TRUE(f.good()) << "short or missing output " << out_path;
  }

  std::vector<double> params = params0;
  AdamW<double> opt(AdamWConfig{}, specs);  // defaults are the values the script uses
  for (int s = 0; s < steps; ++s) opt.step(params.data(), grads[static_cast<size_t>(s)].data(), lrs[s]);

  EXPECT_EQ(torch_out[static_cast<size_t>(3 * n)], static_cast<double>(opt.step_count()));
  const std::vector<double> m = test::as_vector(opt.exp_avg()), v = test::as_vector(opt.exp_avg_sq());
  const std::vector<double>* ours[3] = {&params, &m, &v};
  const char* names[3] = {"param", "exp_avg", "exp_avg_sq"};
  double worst = 0;
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      const double want = torch_out[static_cast<size_t>(k * n + i)];
      const double got = (*ours[k])[static_cast<size_t>(i)];
      const double rel = std::abs(got - want) / std::abs(want);
      worst = std::max(worst, rel);
      ASSERT_LE(std::abs(got - want), 1e-12 * std::abs(want))
          << names[k] << "[" << i << "]: ours " << got << " torch " << want;
    }
  }
  // Sanity: the run really moved the params (a no-op optimizer would fail above anyway).
  double moved = 0;
  for (int64_t i = 0; i < n; ++i) moved = std::max(moved, std::abs(params[i] - params0[i]));
  EXPECT_GT(moved, 1e-3);
  std::cout << "[ INFO ] worst relative difference vs torch.optim.AdamW: " << worst << "\n";
}

}  // namespace
}  // namespace llama4d
