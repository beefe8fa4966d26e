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
//   hello  key = the job token: a connection's first      answer: ok, or refused (and the
//          request, before any other is served                   connection closed)
//
// A malformed request (unknown op, add on a value that is not 8 bytes) gets `bad_request` and the
// server closes that connection. A request past one of the server's caps (StoreLimits) gets
// `refused`, its value the reason naming the cap; a key or value over its cap also closes the
// connection (its bytes are not read), a set past the key count or total bytes does not.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace llama4d::store {

enum class Op : uint8_t { set = 1, get = 2, add = 3, check = 4, hello = 5 };
enum class Status : uint8_t { ok = 0, not_found = 1, bad_request = 2, refused = 3 };

constexpr size_t kRequestHeader = 1 + 4 + 4 + 8;
constexpr size_t kAnswerHeader = 1 + 8;
// What the store holds for a job: a NCCL unique id (128 bytes) per communicator, barrier and
// "done" keys of a few bytes per rank. The caps bound what any client that presents the job's
// token can make rank 0 hold (the token keeps out other jobs, and is a secret only when the
// launcher sets LLAMA4D_STORE_TOKEN: launch_env.h).
struct StoreLimits {
  uint64_t max_key_bytes = 1024;
  uint64_t max_value_bytes = uint64_t(4) << 20;
  uint64_t max_keys = 1 << 16;                      // 65,536: barriers of 4 names on 16k ranks
  uint64_t max_total_bytes = uint64_t(64) << 20;    // keys and values together
};
// Bounds of the framing itself: the client refuses an answer longer than this.
constexpr uint64_t kMaxValueBytes = StoreLimits{}.max_value_bytes;

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
