#include "core/data/bpe_model.h"

#include <algorithm>
#include <array>
#include <climits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"

namespace llama4d {

namespace {

// Open-addressing map from a pair of ids to (rank, merged id): the merge loop's hot lookup.
// Linear probing over a power-of-two table at most half full; the empty key is all ones (no
// pair of valid ids is).
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  // Sets the value of (a, b), replacing an earlier one. The table must have room (reserve).
  void set(int32_t a, int32_t b, Value v) {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = k;
    values_[i] = v;
  }
  const Value* get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) f(int32_t(keys_[i] >> 32), int32_t(uint32_t(keys_[i])), values_[i]);
  }
  size_t size() const { return size_; }

 private:
  size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0, size_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

constexpr size_t kSmallWord = 64;      // longest word merged in the flat array, and cached
constexpr size_t kCacheShards = 64;
constexpr size_t kCacheShardCap = 4096;  // words per shard; a full shard stops taking new ones

}  // namespace

struct BpeModel::Impl {
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab;
  std::array<int32_t, 256> byte_id{};
  PairMap pairs;
  bool ignore_merges = false;

  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  mutable std::array<Shard, kCacheShards> cache;

  int32_t rank(int32_t a, int32_t b, int32_t* merged) const {
    const PairMap::Value* v = pairs.get(a, b);
    if (!v) return INT32_MAX;
    *merged = v->merged;
    return v->rank;
  }
  static std::shared_ptr<Impl> make(std::vector<Entry>& vocab);
  void merge_small(std::string_view word, std::vector<int32_t>& out) const;
  void merge_long(std::string_view word, std::vector<int32_t>& out) const;
};

std::shared_ptr<BpeModel::Impl> BpeModel::Impl::make(std::vector<Entry>& vocab) {
  auto impl = std::make_shared<Impl>();
  impl->vocab.reserve(vocab.size());
  for (Entry& e : vocab) {
    if (e.id < 0) throw InputError("tokenizer vocabulary: negative id " + std::to_string(e.id));
    if (!impl->vocab.emplace(std::move(e.bytes), e.id).second)
      throw InputError("tokenizer vocabulary: two tokens with the same bytes (id " + std::to_string(e.id) + ")");
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = impl->vocab.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it == impl->vocab.end())
      throw InputError("tokenizer vocabulary has no token for the byte " + std::to_string(b) +
                       ": a byte-level BPE must be able to spell every byte");
    impl->byte_id[size_t(b)] = it->second;
  }
  return impl;
}

BpeModel BpeModel::from_merges(std::vector<Entry> vocab, const std::vector<std::pair<int32_t, int32_t>>& merges,
                               bool ignore_merges) {
  std::unordered_map<int32_t, std::string> bytes_of;
  bytes_of.reserve(vocab.size());
  for (const Entry& e : vocab) bytes_of.emplace(e.id, e.bytes);
  auto impl = Impl::make(vocab);
  impl->ignore_merges = ignore_merges;
  impl->pairs.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const auto [a, b] = merges[k];
    const auto ia = bytes_of.find(a), ib = bytes_of.find(b);
    if (ia == bytes_of.end() || ib == bytes_of.end())
      throw InputError("merge " + std::to_string(k) + " names token id " + std::to_string(ia == bytes_of.end() ? a : b) +
                       ", which is not in the vocabulary");
    const auto merged = impl->vocab.find(ia->second + ib->second);
    if (merged == impl->vocab.end())
      throw InputError("merge " + std::to_string(k) + " makes a token that is not in the vocabulary");
    impl->pairs.set(a, b, {int32_t(k), merged->second});
  }
  BpeModel m;
  m.impl_ = std::move(impl);
  return m;
}

BpeModel BpeModel::from_ranks(std::vector<Entry> vocab) {
  auto impl = Impl::make(vocab);
  impl->ignore_merges = true;
  // Every way to write a token as two shorter tokens is a merge of the token's rank. Splits are
  // found by lookup of both halves; a pair that could make two tokens cannot exist (the
  // concatenation of a given pair is one byte string).
  std::vector<std::array<int32_t, 3>> merges;
  for (const auto& [bytes, id] : impl->vocab) {
    const std::string_view s = bytes;
    for (size_t cut = 1; cut < s.size(); ++cut) {
      const auto l = impl->vocab.find(s.substr(0, cut));
      if (l == impl->vocab.end()) continue;
      const auto r = impl->vocab.find(s.substr(cut));
      if (r == impl->vocab.end()) continue;
      merges.push_back({l->second, r->second, id});
    }
  }
  impl->pairs.reserve(merges.size());
  for (const auto& [l, r, id] : merges) impl->pairs.set(l, r, {id, id});
  BpeModel m;
  m.impl_ = std::move(impl);
  return m;
}

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  const auto it = impl_->vocab.find(bytes);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

bool BpeModel::ignore_merges() const { return impl_->ignore_merges; }

std::vector<std::array<int32_t, 4>> BpeModel::merge_table() const {
  std::vector<std::array<int32_t, 4>> t;
  t.reserve(impl_->pairs.size());
  impl_->pairs.for_each([&](int32_t a, int32_t b, PairMap::Value v) { t.push_back({v.rank, a, b, v.merged}); });
  std::sort(t.begin(), t.end());
  for (auto& row : t) row = {row[1], row[2], row[0], row[3]};
  return t;
}

// Flat array: ids[0, n) with rank[i] the rank of (ids[i], ids[i+1]). Each step finds the lowest
// rank (the first of equal ones, so the leftmost), merges, and refreshes the two ranks around it.
void BpeModel::Impl::merge_small(std::string_view word, std::vector<int32_t>& out) const {
  int32_t ids[kSmallWord], ranks[kSmallWord], merged[kSmallWord];
  size_t n = word.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_id[static_cast<unsigned char>(word[i])];
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = rank(ids[i], ids[i + 1], &merged[i]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT32_MAX) break;
    ids[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) ranks[best] = rank(ids[best], ids[best + 1], &merged[best]);
    if (best > 0) ranks[best - 1] = rank(ids[best - 1], ids[best], &merged[best - 1]);
  }
  out.insert(out.end(), ids, ids + n);
}

// Linked list of symbols and a min-heap of candidate merges ordered by (rank, position); an
// entry whose two symbols have changed since it was pushed is skipped when it comes up. The
// position of a symbol is its first byte's index, so "leftmost" is "smallest position", the
// same order the flat loop uses.
void BpeModel::Impl::merge_long(std::string_view word, std::vector<int32_t>& out) const {
  const int32_t n = int32_t(word.size());
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) sym[size_t(i)] = {byte_id[static_cast<unsigned char>(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    int32_t m = 0;
    const int32_t r = rank(sym[size_t(pos)].id, sym[size_t(nx)].id, &m);
    if (r != INT32_MAX) heap.push({r, pos, sym[size_t(pos)].id, sym[size_t(nx)].id, m});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(size_t(n), false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[size_t(c.pos)]) continue;
    Sym& s = sym[size_t(c.pos)];
    if (s.id != c.left || s.next < 0 || sym[size_t(s.next)].id != c.right) continue;  // stale
    const int32_t gone = s.next;
    dead[size_t(gone)] = true;
    s.id = c.merged;
    s.next = sym[size_t(gone)].next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const Impl& m = *impl_;
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(m.byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (m.ignore_merges) {
    const auto it = m.vocab.find(word);
    if (it != m.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kSmallWord) {
    m.merge_long(word, out);
    return;
  }
  Impl::Shard& shard = m.cache[std::hash<std::string_view>{}(word) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    const auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  m.merge_small(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() < kCacheShardCap)
    shard.words.emplace(std::string(word), std::vector<int32_t>(out.begin() + std::ptrdiff_t(start), out.end()));
}

}  // namespace llama4d
