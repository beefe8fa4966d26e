#include "core/comm/rank_failure.h"

namespace llama4d {

int first_failed_rank(ProcessGroup& group, int32_t failed, const std::string& label) {
  int32_t first = failed ? group.rank() : group.size();
  AllReduceOptions o{.label = label};
  group.all_reduce(&first, 1, DType::i32, ReduceOp::min, o)->wait();
  return first < group.size() ? first : -1;
}

}  // namespace llama4d
