// Replacing a checkpoint where the filesystem has no atomic exchange (NFS and others) takes two
// renames: the old directory aside, then the staged one in. A process killed between them leaves
// no checkpoint under its name, only the old one aside and the new one staged. Whoever comes
// next, a reader or the next save, must find the last committed checkpoint and keep it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/atomic_file.h"
#include "io_test_util.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;
using test::read_bytes;
using test::write_bytes;

// The scenario's directory for the test process `pid`. The threadsafe death-test style runs the
// death statement in a fresh exec of this binary whose parent is the test, so the child names
// it by getppid() and the test by getpid().
std::string scenario_root(long pid) {
  return (fs::temp_directory_path() / ("llama4d_interrupted_replace_" + std::to_string(pid))).string();
}

// Runs in the child: a committed checkpoint "old" at <root>/ck, then a save of "new" by the two
// renames, killed between them (no destructor, no cleanup: what kill -9 leaves).
void save_killed_between_renames(const std::string& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string target = root + "/ck";
  {
    StagedDirectory first(target, "config.json");
    write_bytes(first.staging() + "/config.json", "old");
    first.commit();
  }
  StagedDirectory second(target, "config.json");
  write_bytes(second.staging() + "/config.json", "new");
  second.commit(StagedDirectory::Replace::two_renames, [] { std::_Exit(0); });
  std::_Exit(1);  // not reached: the commit is killed between its renames
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class InterruptedReplace : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // Leaves <root_> as the killed save did, and checks that it is the state this test is about.
  void kill_a_save() {
    EXPECT_EXIT(save_killed_between_renames(scenario_root(long(::getppid()))), testing::ExitedWithCode(0), "");
    const std::vector<std::string> left = names_in(root_);
    ASSERT_EQ(left.size(), 2u);
    EXPECT_EQ(left[0].rfind("ck.old.tmp-", 0), 0u) << left[0];
    EXPECT_EQ(left[1].rfind("ck.tmp-", 0), 0u) << left[1];
    EXPECT_EQ(read_bytes(root_ + "/" + left[0] + "/config.json"), "old");
    EXPECT_EQ(read_bytes(root_ + "/" + left[1] + "/config.json"), "new");
  }
  const std::string root_ = scenario_root(long(::getpid()));
  const std::string ck_ = root_ + "/ck";
};

// A reader (load_config and read_training_state call this first) moves the old checkpoint back.
TEST_F(InterruptedReplace, AReaderFindsTheLastCommittedCheckpoint) {
  kill_a_save();
  EXPECT_TRUE(recover_interrupted_replace(ck_));
  EXPECT_EQ(read_bytes(ck_ + "/config.json"), "old");
  EXPECT_FALSE(recover_interrupted_replace(ck_)) << "nothing left to recover";
  EXPECT_EQ(remove_stale_staging(ck_), 1) << "the uncommitted new one is stale staging";
  EXPECT_EQ(names_in(root_), std::vector<std::string>{"ck"});
}

// The next save's start (train --out removes stale staging) keeps the old checkpoint; it used to
// delete both copies as staging.
TEST_F(InterruptedReplace, TheNextSaveKeepsTheLastCommittedCheckpoint) {
  kill_a_save();
  EXPECT_EQ(remove_stale_staging(ck_), 1);
  EXPECT_EQ(names_in(root_), std::vector<std::string>{"ck"});
  EXPECT_EQ(read_bytes(ck_ + "/config.json"), "old");
  StagedDirectory again(ck_, "config.json");
  write_bytes(again.staging() + "/config.json", "newer");
  again.commit(StagedDirectory::Replace::two_renames);
  EXPECT_EQ(read_bytes(ck_ + "/config.json"), "newer");
  EXPECT_EQ(names_in(root_), std::vector<std::string>{"ck"});
}

// A live process's old directory is its save in progress, not an interrupted one.
TEST_F(InterruptedReplace, ALiveSavesOldDirectoryIsLeftAlone) {
  fs::create_directories(root_);
  const std::string aside = temporary_sibling_name(ck_ + ".old");  // this process: alive
  fs::create_directories(aside);
  EXPECT_FALSE(recover_interrupted_replace(ck_));
  EXPECT_FALSE(fs::exists(ck_));
  EXPECT_EQ(remove_stale_staging(ck_), 0);
  EXPECT_TRUE(fs::exists(aside));
}

// The two-rename path on purpose: it replaces, and a failure between the renames puts the old
// checkpoint back before the error propagates.
TEST_F(InterruptedReplace, TwoRenamesReplaceOrPutTheOldOneBack) {
  fs::create_directories(root_);
  for (const std::string text : {"1", "2"}) {
    StagedDirectory staged(ck_, "config.json");
    write_bytes(staged.staging() + "/config.json", text);
    staged.commit(StagedDirectory::Replace::two_renames);
    EXPECT_EQ(read_bytes(ck_ + "/config.json"), text);
  }
  {
    StagedDirectory staged(ck_, "config.json");
    write_bytes(staged.staging() + "/config.json", "3");
    EXPECT_THROW(staged.commit(StagedDirectory::Replace::two_renames, [] { throw IoError("injected"); }), IoError);
  }
  EXPECT_EQ(read_bytes(ck_ + "/config.json"), "2");
  EXPECT_EQ(names_in(root_), std::vector<std::string>{"ck"});
}

}  // namespace
}  // namespace llama4d
