// Corpus encoding: the same ids on 1, 2, 3 and 7 threads, the token cache file (hit, miss,
// corruption, another tokenizer), progress reports, and Meta's tiktoken format of the project's
// vocabulary against its tokenizer.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/data/bpe_tokenizer.h"
#include "core/data/byte_level.h"
#include "core/data/encode_corpus.h"
#include "core/data/tokenized_corpus.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> documents() {
  std::vector<std::string> docs = test::corpus_documents();
  for (const std::string& s : test::multilingual_strings()) docs.push_back(s);
  return docs;
}

TEST(EncodeDocuments, SameIdsOnAnyThreadCount) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const std::vector<std::string> docs = documents();
  const EncodedDocuments one = encode_documents(tok, docs, 1);
  ASSERT_EQ(one.size(), docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::vector<int32_t> want = tok.encode(docs[d]);
    ASSERT_EQ(std::vector<int32_t>(one.document(d).begin(), one.document(d).end()), want) << "document " << d;
  }
  for (int threads : {2, 3, 7}) {
    const EncodedDocuments many = encode_documents(tok, docs, threads, {.add_bos = true});
    const EncodedDocuments ref = encode_documents(tok, docs, 1, {.add_bos = true});
    EXPECT_EQ(many.ids, ref.ids) << threads << " threads";
    EXPECT_EQ(many.offsets, ref.offsets) << threads << " threads";
  }
  EXPECT_THROW(encode_documents(tok, docs, 0), InputError);
  std::vector<std::string> bad = docs;
  bad[5] = "bad \xFF";
  EXPECT_THROW(encode_documents(tok, bad, 3), InputError);  // a document's error reaches the caller
}

TEST(EncodeDocuments, ProgressCountsUpToTheTotals) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const std::vector<std::string> docs = documents();
  int64_t calls = 0, last_docs = 0, last_bytes = 0, total_bytes = 0;
  for (const auto& d : docs) total_bytes += int64_t(d.size());
  encode_documents(tok, docs, 3, {}, [&](int64_t d, int64_t dt, int64_t b, int64_t bt) {
    ++calls;
    EXPECT_GT(d, last_docs);
    EXPECT_GE(b, last_bytes);
    EXPECT_EQ(dt, int64_t(docs.size()));
    EXPECT_EQ(bt, total_bytes);
    last_docs = d, last_bytes = b;
  });
  EXPECT_EQ(calls, int64_t(docs.size()));
  EXPECT_EQ(last_bytes, total_bytes);
}

// What `llama4d train/eval/verify` print while a large corpus is encoded: nothing for a corpus
// under min_bytes; otherwise the first report, then at most one per interval, and always the last.
TEST(EncodeDocuments, ProgressPrinterWritesTheFirstAndLastLinesOfALargeCorpus) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const std::vector<std::string> docs = documents();
  int64_t total_bytes = 0;
  for (const auto& d : docs) total_bytes += int64_t(d.size());
  const auto printed = [&](int64_t min_bytes) {
    std::FILE* f = std::tmpfile();
    encode_documents(tok, docs, 3, {}, progress_printer(f, "docs", min_bytes, /*interval_s=*/3600));
    std::rewind(f);
    std::string out;
    for (int c; (c = std::fgetc(f)) != EOF;) out += char(c);
    std::fclose(f);
    return out;
  };
  EXPECT_EQ(printed(total_bytes + 1), "");
  const std::string out = printed(total_bytes);
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  char last[160];
  std::snprintf(last, sizeof last, "tokenize: docs: %.1f of %.1f MB, %zu of %zu documents\n", total_bytes / 1e6,
                total_bytes / 1e6, docs.size(), docs.size());
  EXPECT_EQ(out.substr(out.find('\n') + 1), last);
}

// tokenize_corpus hands its progress to the encoder: the last report counts every document.
TEST(EncodeDocuments, TokenizeCorpusReportsProgress) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const fs::path dir = fs::path(testing::TempDir()) / "llama4d_progress_corpus";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "a.txt") << "The first document.";
  std::ofstream(dir / "b.txt") << "The second one, a little longer.";
  int64_t docs_done = 0, docs_total = 0;
  tokenize_corpus(tok, dir.string(), 2, [&](int64_t d, int64_t dt, int64_t, int64_t) { docs_done = d, docs_total = dt; });
  EXPECT_EQ(docs_total, 2);
  EXPECT_EQ(docs_done, 2);
  fs::remove_all(dir);
}

TEST(TokenCache, WrittenOnceReadBackAndRefusedWhenStale) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  test::TempDir dir("cache");
  const std::string data = (dir.path / "corpus").string();
  const std::vector<std::string> docs = documents();
  bool hit = true;
  const EncodedDocuments first = encode_documents_cached(tok, data, docs, 2, {}, {}, &hit);
  EXPECT_FALSE(hit);
  const std::string path = token_cache_path(data, tok, docs);
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_NE(path.find("corpus.llama4d-tokens-"), std::string::npos);
  const EncodedDocuments second = encode_documents_cached(tok, data, docs, 2, {}, {}, &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(second.ids, first.ids);
  EXPECT_EQ(second.offsets, first.offsets);
  // Other options, other text or another tokenizer: another file.
  EXPECT_NE(token_cache_path(data, tok, docs, {.add_bos = true}), path);
  std::vector<std::string> changed = docs;
  changed[0] += "!";
  EXPECT_NE(token_cache_path(data, tok, changed), path);
  EXPECT_NE(token_cache_path(data, ByteTokenizer(), docs), path);
  // A flipped byte among the ids, or a cut-short file: encoded again and rewritten.
  for (int damage = 0; damage < 2; ++damage) {
    std::string bytes = test::read_file(path);
    if (damage == 0) bytes[bytes.size() / 2] ^= 0x40;
    else bytes.resize(bytes.size() - 7);
    test::write_file(path, bytes);
    const EncodedDocuments again = encode_documents_cached(tok, data, docs, 2, {}, {}, &hit);
    EXPECT_FALSE(hit) << "damage " << damage;
    EXPECT_EQ(again.ids, first.ids);
    encode_documents_cached(tok, data, docs, 2, {}, {}, &hit);
    EXPECT_TRUE(hit) << "not rewritten after damage " << damage;
  }
  for (const auto& e : fs::directory_iterator(dir.path))  // no temporary left behind
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

// Meta's format of the project's own vocabulary. Its merges were learnt (not made from ranks as
// Llama 3's were), so tiktoken's rule -- lowest rank of the concatenation -- could in principle
// pick a pair that is no merge of the file; on the corpus and the strings here it gives the
// file's ids.
TEST(Tiktoken, ProjectVocabularyInMetasFormatGivesTheSameIds) {
  const BpeTokenizer json_tok = load_tokenizer_json(test::project_tokenizer_path());
  const std::string file = test::tiktoken_text(json_tok);
  TiktokenOptions opt;
  for (int32_t id = json_tok.bos_id(); id < json_tok.vocab_size(); ++id) opt.specials.push_back(json_tok.id_to_token(id));
  const BpeTokenizer tik = parse_tiktoken(file, opt, "project.tiktoken");
  EXPECT_EQ(tik.vocab_size(), json_tok.vocab_size());
  EXPECT_EQ(tik.fingerprint() == json_tok.fingerprint(), false);  // the merge tables differ in form
  for (const std::string& d : documents()) {
    for (bool special : {false, true}) {
      const EncodeOptions o{.add_bos = true, .allow_special = special};
      ASSERT_EQ(tik.encode(d, o), json_tok.encode(d, o)) << test::printable(d);
    }
  }
  // Meta's default layouts: 256 specials each, <|begin_of_text|> first.
  for (Llama3Specials layout : {Llama3Specials::kLlama3_0, Llama3Specials::kLlama3_1, Llama3Specials::kLlama3_2}) {
    const std::vector<std::string> names = llama3_special_tokens(layout);
    EXPECT_EQ(names.size(), 256u);
    EXPECT_EQ(names[0], "<|begin_of_text|>");
    EXPECT_EQ(names[9], "<|eot_id|>");
  }
  EXPECT_EQ(llama3_special_tokens(Llama3Specials::kLlama3_1)[5], "<|step_id|>");
  EXPECT_EQ(llama3_special_tokens(Llama3Specials::kLlama3_1)[255], "<|reserved_special_token_246|>");
  EXPECT_EQ(llama3_special_tokens(Llama3Specials::kLlama3_0)[255], "<|reserved_special_token_250|>");
  EXPECT_EQ(llama3_special_tokens(Llama3Specials::kLlama3_2)[11], "<|image|>");
  const BpeTokenizer meta = parse_tiktoken(file, {}, "default specials");
  EXPECT_EQ(meta.token_to_id("<|eot_id|>"), std::optional<int32_t>(json_tok.bos_id() + 9));
  EXPECT_EQ(meta.bos_id(), json_tok.bos_id());
}

}  // namespace
}  // namespace llama4d
