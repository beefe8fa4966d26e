#pragma once
// The store's messages. One request, then one answer, per round trip; integers little-endian.
//
//   request  [op u8][key_len u32][wait_ms u32][value_len u64][key][value]
//   answer   [status u8][value_len u64][value]
//
//   set    key = value                                    answer: ok
//   get    value of key, waiting up to wait_ms for a set  answer: ok + value, or not_found
//   add    key += value (8-byte signed), 0 if absent      answer: ok + the new 8-byte value
//   check  does key exist                                 answer: ok + 1 byte (0 or 1)
//
// A malformed request (unknown op, oversized key or value, add on a value that is not 8 bytes)
// gets `bad_request` and the server closes that connection.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace llama4d::store {

enum class Op : uint8_t { set = 1, get = 2, add = 3, check = 4 };
enum class Status : uint8_t { ok = 0, not_found = 1, bad_request = 2 };

constexpr size_t kRequestHeader = 1 + 4 + 4 + 8;
constexpr size_t kAnswerHeader = 1 + 8;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t(256) << 20;  // a NCCL id is 128 bytes; this is a sanity bound

inline void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
inline uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

inline std::vector<uint8_t> encode_int64(int64_t v) {
  std::vector<uint8_t> out;
  put_le(out, uint64_t(v), 8);
  return out;
}
inline int64_t decode_int64(const std::vector<uint8_t>& bytes) { return int64_t(get_le(bytes.data(), 8)); }

}  // namespace llama4d::store
