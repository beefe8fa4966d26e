#pragma once
// A 64-bit hash for keying caches (token caches, tokenizer fingerprints): FNV-1a, whose value
// is fixed by its definition, so a cache written by one build is recognised by another. Not for
// security; a collision would only reuse a wrong cache, and the token cache also compares sizes.
#include <cstdint>
#include <string_view>

namespace llama4d {

inline constexpr uint64_t kHashSeed = 0xcbf29ce484222325ull;  // FNV-1a's offset basis

// Continues hash `h` over `bytes`.
inline uint64_t hash_bytes(std::string_view bytes, uint64_t h = kHashSeed) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;  // FNV's 64-bit prime
  }
  return h;
}

// Continues `h` over the 8 little-endian bytes of `v`.
inline uint64_t hash_u64(uint64_t v, uint64_t h) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace llama4d
