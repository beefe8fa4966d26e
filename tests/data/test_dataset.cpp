// Corpus loading and the train/validation split.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/data/entropy.h"
#include "core/error.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, so tests can run in parallel processes (ctest -j).
class DatasetFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("llama4d_test_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "locked.txt", fs::perms::owner_all, ec);  // so remove_all can delete it
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  fs::path dir_;
};

// Runs f, expects an InputError, and returns its message.
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InputError";
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(DatasetFiles, LoadsAFileByteForByte) {
  const std::string text = "Hello, w\xC3\xB6rld.\n\nSecond paragraph.\n";
  EXPECT_EQ(load_documents(write("a.txt", text)), std::vector<std::string>{text});
}

TEST_F(DatasetFiles, MissingFileNamesThePath) {
  const std::string path = (dir_ / "nope.txt").string();
  const std::string msg = input_error_of([&] { load_documents(path); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "not found")) << msg;
}

TEST_F(DatasetFiles, EmptyFileNamesThePath) {
  const std::string path = write("empty.txt", "");
  const std::string msg = input_error_of([&] { load_documents(path); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "empty")) << msg;
}

TEST_F(DatasetFiles, InvalidUtf8NamesPathOffsetAndLine) {
  // Latin-1 "é" (0xE9) at byte 14, on line 2.
  const std::string path = write("latin1.txt", "first line\ncaf\xE9 au lait\n");
  const std::string msg = input_error_of([&] { load_documents(path); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "UTF-8")) << msg;
  EXPECT_TRUE(contains(msg, "byte 14")) << msg;
  EXPECT_TRUE(contains(msg, "line 2")) << msg;
}

TEST_F(DatasetFiles, UnreadableFileIsAnInputError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of permissions";
  const std::string path = write("locked.txt", "secret");
  fs::permissions(path, fs::perms::none);
  const std::string msg = input_error_of([&] { load_documents(path); });
  EXPECT_TRUE(contains(msg, path)) << msg;
}

TEST_F(DatasetFiles, DirectoryIsOneDocumentPerTxtFileInNameOrder) {
  write("corpus/part-02.txt", "World.\n");
  write("corpus/part-01.txt", "Hello.\n");
  write("corpus/notes.md", "not text for training");
  write("corpus/.hidden.txt", "hidden");
  write("corpus/sub/part-00.txt", "not recursive");
  const std::string dir = (dir_ / "corpus").string();
  EXPECT_EQ(load_documents(dir), (std::vector<std::string>{"Hello.\n", "World.\n"}));
  // Packed: the bytes, <|end_of_text|> (257) between the documents, none after the last.
  const std::vector<int32_t> expected = {'H', 'e', 'l', 'l', 'o', '.', '\n', 257, 'W', 'o', 'r', 'l', 'd', '.', '\n'};
  EXPECT_EQ(pack_documents(load_documents(dir)), expected);
  EXPECT_EQ(pack_documents({"one"}), (std::vector<int32_t>{'o', 'n', 'e'}));
}

TEST_F(DatasetFiles, DirectoryErrorsNameTheCulprit) {
  write("nothing/readme.md", "no txt here");
  const std::string none = (dir_ / "nothing").string();
  EXPECT_TRUE(contains(input_error_of([&] { load_documents(none); }), none));

  write("bad/a.txt", "fine\n");
  const std::string bad_part = write("bad/b.txt", "ok\xFF");
  const std::string msg = input_error_of([&] { load_documents((dir_ / "bad").string()); });
  EXPECT_TRUE(contains(msg, bad_part)) << msg;
  EXPECT_TRUE(contains(msg, "byte 2")) << msg;  // offset within b.txt, not within the join

  write("blank/a.txt", "text\n");
  const std::string empty_part = write("blank/b.txt", "");  // would pack as two <|end_of_text|> in a row
  const std::string empty_msg = input_error_of([&] { load_documents((dir_ / "blank").string()); });
  EXPECT_TRUE(contains(empty_msg, "empty") && contains(empty_msg, empty_part)) << empty_msg;
}

TEST(Dataset, SplitIsTheLastFractionOfTheBytes) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(char('a' + i % 26));
  const TextDataset ds = make_dataset(text, 16, 0.1);
  ASSERT_EQ(ds.tokens.size(), 1000u);
  EXPECT_EQ(ds.train_size, 900);  // floor(1000 * 0.1) = 100 validation tokens
  ASSERT_EQ(ds.train().size(), 900u);
  ASSERT_EQ(ds.validation().size(), 100u);
  for (size_t i = 0; i < 900; ++i) ASSERT_EQ(ds.train()[i], int32_t(text[i]));
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(ds.validation()[i], int32_t(text[900 + i]));

  const TextDataset quarter = make_dataset(text, 16, 0.25);
  EXPECT_EQ(quarter.train_size, 750);
  const TextDataset odd = make_dataset(text.substr(0, 999), 16, 0.1);
  EXPECT_EQ(odd.train_size, 999 - 99);  // floor(99.9) = 99
}

TEST(Dataset, EachSideMustHoldOneWindow) {
  const std::string text(200, 'x');  // 180 train, 20 validation at 10%
  EXPECT_NO_THROW(make_dataset(text, 19, 0.1));  // windows of 20 tokens fit both sides
  const std::string msg = input_error_of([&] { make_dataset(text, 20, 0.1); });
  EXPECT_TRUE(contains(msg, "validation")) << msg;
  EXPECT_TRUE(contains(input_error_of([&] { make_dataset(text, 20, 0.95); }), "training"));
  EXPECT_TRUE(contains(input_error_of([&] { make_dataset(text, 8, 0.0); }), "fraction"));
  EXPECT_TRUE(contains(input_error_of([&] { make_dataset(text, 8, 1.0); }), "fraction"));
  EXPECT_TRUE(contains(input_error_of([&] { make_dataset(text, 0, 0.1); }), "seq_len"));
  EXPECT_THROW(make_dataset("", 8, 0.1), InputError);
}

TEST_F(DatasetFiles, LoadDatasetRemembersItsSource) {
  const std::string path = write("c.txt", std::string(500, 'q'));
  const TextDataset ds = load_dataset(path, 8, 0.2);
  EXPECT_EQ(ds.source, path);
  EXPECT_EQ(ds.train_size, 400);
}

// The shipped corpus: loads offline, is large, and looks like English by its byte statistics.
TEST(DefaultCorpus, LoadsAndHasEnglishByteEntropy) {
  const std::string path = default_corpus_path();
  const std::vector<std::string> documents = load_documents(path);
  EXPECT_GE(documents.size(), 80u) << path;  // sections, short enough that a window often spans two
  std::string text;
  for (const std::string& d : documents) text += d;
  EXPECT_GE(text.size(), 120u * 1024u) << path;

  // Byte-unigram entropy from the raw bytes, computed here independently of entropy.cpp.
  double counts[256] = {};
  for (char c : text) counts[static_cast<unsigned char>(c)] += 1;
  double bits = 0;
  for (double c : counts) {
    if (c > 0) bits -= (c / double(text.size())) * std::log2(c / double(text.size()));
  }
  std::printf("default corpus %s: %zu documents, %zu bytes, byte-unigram entropy %.4f bits (%.4f nats)\n",
              path.c_str(), documents.size(), text.size(), bits, bits * std::log(2.0));
  EXPECT_GT(bits, 3.5);
  EXPECT_LT(bits, 5.5);

  // The packed stream adds one <|end_of_text|> per boundary: the same counts plus that symbol.
  const double n = double(text.size()), eot = double(documents.size() - 1), total = n + eot;
  double packed_bits = -(eot / total) * std::log2(eot / total);
  for (double c : counts)
    if (c > 0) packed_bits -= (c / total) * std::log2(c / total);
  const TextDataset ds = load_dataset(path, 256);
  const UnigramEntropy h = unigram_entropy(ds.tokens);
  ASSERT_EQ(ds.tokens.size(), text.size() + documents.size() - 1);
  EXPECT_NEAR(h.bits, packed_bits, 1e-9);
  const UnigramEntropy val = unigram_entropy(ds.validation());
  const UnigramEntropy base = unigram_cross_entropy(ds.train(), ds.validation());
  std::printf("validation split: %zu tokens, own unigram entropy %.4f nats, train-unigram cross-entropy %.4f nats\n",
              ds.validation().size(), val.nats, base.nats);
  // Gibbs' inequality: a distribution fitted elsewhere can only do worse than the true one.
  EXPECT_GE(base.nats, val.nats);
}

// A test binary (not next to a share/llama4d/) gets the source tree's corpus; the installed and
// copied binaries are tests/cli/installed_binary.cmake's.
TEST(DefaultCorpus, ATestBinaryFallsBackToTheSourceTree) {
  EXPECT_EQ(default_corpus_path(), std::string(LLAMA4D_DATA_DIR) + "/corpus");
}

}  // namespace
}  // namespace llama4d
