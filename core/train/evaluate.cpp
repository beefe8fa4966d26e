#include "core/train/evaluate.h"

#include <algorithm>

#include "core/data/batch_sampler.h"
#include "core/error.h"

namespace llama4d {

template <class T>
LossSum evaluate_loss(Llama<T>& model, TokenSpan split, int64_t seq_len, int64_t rows_per_forward,
                      int64_t max_windows, bool doc_mask, int32_t doc_separator) {
  if (rows_per_forward < 1) throw InputError("evaluation batch must be >= 1");
  int64_t windows = num_eval_windows(int64_t(split.size()), seq_len);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  LossSum total;
  for (int64_t w = 0; w < windows; w += rows_per_forward) {
    Batch b = eval_windows(split, seq_len, w, std::min(windows, w + rows_per_forward));
    if (doc_mask) mark_documents(b, doc_separator);
    const LossSum part = model.forward(b.tokens.data(), b.targets.data(), b.B, b.seq, b.documents());
    total.loss_sum += part.loss_sum;
    total.tokens += part.tokens;
  }
  return total;
}

template LossSum evaluate_loss<float>(Llama<float>&, TokenSpan, int64_t, int64_t, int64_t, bool, int32_t);
template LossSum evaluate_loss<double>(Llama<double>&, TokenSpan, int64_t, int64_t, int64_t, bool, int32_t);

}  // namespace llama4d
