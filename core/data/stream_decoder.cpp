#include "core/data/stream_decoder.h"

#include "core/data/utf8.h"

namespace llama4d {

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.decode(std::span<const int32_t>(&id, 1), opt_);
  size_t used = 0;
  std::string out = replace_invalid_utf8(pending_, /*hold_tail=*/true, &used);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = replace_invalid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace llama4d
