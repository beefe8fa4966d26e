// Asynchronous checkpoints (core/train/async_checkpoint.h): the ranks snapshot into host memory,
// one background thread writes the directory while they train on. The directory written from the
// snapshot must be the bytes, file for file, of the synchronous sharded save of the same state
// (ParallelTrainer::save_checkpoint, the oracle); the ranks' next steps must not change what is
// written (they run while it is written: the ThreadSanitizer preset runs this test to check that
// the writer shares nothing with them); a failed write is named where the run waits, and leaves
// the previous checkpoint whole.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "core/error.h"
#include "core/train/async_checkpoint.h"
#include "core/train/checkpoint_state.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

// Every file of a directory: name -> bytes.
std::map<std::string, std::string> directory_bytes(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    files[e.path().filename().string()] = {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  return files;
}

ParallelPlan async_plan(const std::string& text, ZeroStage zero = ZeroStage::none) {
  ParallelPlan p = ParallelPlan::parse(text);
  p.zero = zero;
  return p;
}

// Two steps, then at once the synchronous save (to `sync`) and the snapshot whose write goes to
// `async` in the background while every rank trains two more steps; then the end of the run's
// wait. The two directories must hold the same files with the same bytes. Sanitizers: DP and
// TP x PP; release: ZeRO-3 and 4D as well.
void expect_background_write_equals_sync_save(const std::vector<std::pair<const char*, ParallelPlan>>& plans) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(4, 2);
  const std::string root = testing::TempDir() + "/llama4d_async_checkpoint";
  for (const auto& [name, plan] : plans) {
    SCOPED_TRACE(name);
    std::filesystem::remove_all(root);
    const std::string sync = root + "/sync", async = root + "/async";
    AsyncCheckpointer<float> writer;
    test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
      Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> t(world, model, test::corpus(), opt, plan);
      t.step();
      t.step();
      t.save_checkpoint(sync);
      writer.wait();
      // The last rank whose share is in starts the write, as train --async-checkpoint does.
      t.save_state(writer.image(), [&] { writer.share_written(world.size(), async); });
      t.step();  // the weights and moments change while the snapshot is written
      t.step();
      writer.wait();
    });
    const auto expected = directory_bytes(sync), got = directory_bytes(async);
    ASSERT_EQ(expected.size(), got.size());
    for (const auto& [file, bytes] : expected) {
      ASSERT_TRUE(got.count(file)) << file;
      EXPECT_TRUE(got.at(file) == bytes) << file << " differs";
    }
    EXPECT_EQ(writer.stats().committed, 1);
    EXPECT_EQ(writer.stats().last_committed_step, 2);
    for (const auto& e : std::filesystem::directory_iterator(root))
      EXPECT_TRUE(e.path().filename() == "sync" || e.path().filename() == "async") << "left behind: " << e.path();
  }
  std::filesystem::remove_all(root);
}

TEST(AsyncCheckpoint, BackgroundWriteEqualsTheSynchronousSave) {
  expect_background_write_equals_sync_save({{"dp2", async_plan("dp=2")}, {"tp2_pp2", async_plan("tp=2,pp=2")}});
}
LLAMA4D_TIER(AsyncCheckpoint, BackgroundWriteEqualsTheSynchronousSave, sanitizer);

TEST(AsyncCheckpoint, BackgroundWriteEqualsTheSynchronousSaveOnZero3And4d) {
  expect_background_write_equals_sync_save(
      {{"zero3_dp2", async_plan("dp=2", ZeroStage::zero3)}, {"4d", async_plan("tp=2,cp=2,pp=2,dp=2", ZeroStage::zero1)}});
}
LLAMA4D_TIER(AsyncCheckpoint, BackgroundWriteEqualsTheSynchronousSaveOnZero3And4d, full);

// A write that fails (here: the files beside the checkpoint cannot be written) is named at the
// next wait(), on every call, with its step and directory; the checkpoint committed before it is
// still there byte for byte, and no staging directory is left. A directory whose parent is a file
// fails as plainly.
TEST(AsyncCheckpoint, AFailedWriteIsNamedAndKeepsThePreviousCheckpoint) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(3, 2);
  const ParallelPlan plan = async_plan("dp=2");
  const std::string root = testing::TempDir() + "/llama4d_async_checkpoint_fail", dir = root + "/checkpoint";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  std::ofstream(root + "/a_file") << "not a directory";
  AsyncCheckpointer<float> writer;
  std::map<std::string, std::string> first;
  std::string failure, again, parent_is_file;
  test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> t(world, model, test::corpus(), opt, plan);
    t.step();
    t.save_state(writer.image());
    if (world.rank() == 0) writer.start(dir);
    writer.wait();
    if (world.rank() == 0) first = directory_bytes(dir);
    t.step();
    world.barrier();
    t.save_state(writer.image());
    if (world.rank() == 0)
      writer.start(dir, [](const std::string&) { throw IoError("no space left on device (test)"); });
    try {
      writer.wait();
    } catch (const IoError& e) {
      if (world.rank() == 0) failure = e.what();
    }
    try {
      writer.wait();
    } catch (const IoError& e) {
      if (world.rank() == 0) again = e.what();
    }
    world.barrier();
    if (world.rank() == 0) {
      writer.start(root + "/a_file/checkpoint");
      try {
        writer.wait();
      } catch (const Error& e) {
        parent_is_file = e.what();
      }
    }
  });
  EXPECT_NE(failure.find("the asynchronous checkpoint of step 2 to " + dir + " failed"), std::string::npos) << failure;
  EXPECT_NE(failure.find("no space left on device (test)"), std::string::npos) << failure;
  EXPECT_EQ(again, failure);
  EXPECT_NE(parent_is_file.find(root + "/a_file/checkpoint"), std::string::npos) << parent_is_file;
  EXPECT_TRUE(directory_bytes(dir) == first) << "the step-1 checkpoint is intact";
  EXPECT_EQ(read_training_state(dir).steps_done, 1);
  for (const auto& e : std::filesystem::directory_iterator(root))
    EXPECT_TRUE(e.path().filename() == "checkpoint" || e.path().filename() == "a_file") << "left behind: " << e.path();
  std::filesystem::remove_all(root);
}
LLAMA4D_TIER(AsyncCheckpoint, AFailedWriteIsNamedAndKeepsThePreviousCheckpoint, quick);

}  // namespace
}  // namespace llama4d
