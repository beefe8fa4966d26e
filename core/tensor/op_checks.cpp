// Argument checks the forwarders of core/ops.h make before any backend runs an op, so that every
// backend refuses the same input with the same message.
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

void check_attention_shape(const AttentionShape& s) {
  if (s.B < 0 || s.Tq < 0 || s.Tk < 0 || s.nh < 1 || s.nkv < 1 || s.hd < 1)
    throw InputError("attention: sizes must be non-negative and heads/head_dim positive");
  if (s.nh % s.nkv != 0)
    throw InputError("attention: query heads (" + std::to_string(s.nh) + ") must be a multiple of key/value heads (" +
                     std::to_string(s.nkv) + ")");
  if (s.kv_batch_stride != 0 && s.kv_batch_stride < s.Tk * s.nkv * s.hd)
    throw InputError("attention: kv_batch_stride " + std::to_string(s.kv_batch_stride) +
                     " is smaller than Tk * nkv * hd");
  if ((s.q_doc == nullptr) != (s.k_doc == nullptr))
    throw InputError("attention: document ids need both q_doc and k_doc, or neither");
}

void check_merge_shape(int64_t B, int64_t Tq, int64_t nh, int64_t hd) {
  if (B < 0 || Tq < 0 || nh < 1 || hd < 1)
    throw InputError("attention_merge: sizes must be non-negative and heads/head_dim positive");
}

void check_router_shape(int64_t BT, int64_t E, int64_t k) {
  if (BT < 0 || E < 1) throw InputError("router: tokens must be non-negative and experts positive");
  if (k < 1 || k > E)
    throw InputError("router: experts per token (" + std::to_string(k) + ") must be in [1, experts = " +
                     std::to_string(E) + "]");
}

}  // namespace llama4d::ops
