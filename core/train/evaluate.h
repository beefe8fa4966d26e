#pragma once
// Mean next-token cross-entropy of a model over a token span, in consecutive windows of
// seq_len + 1 tokens (see eval_windows in core/data/batch_sampler.h): every token from the
// second on is predicted exactly once.
#include <cstdint>

#include "core/data/tokenizer.h"
#include "core/model/llama.h"

namespace llama4d {

// rows_per_forward windows go through the model at a time; max_windows = 0 means all windows.
// doc_mask: attention keeps to each window's documents, cut after doc_separator
// (TrainOptions::doc_mask, doc_separator).
template <class T>
LossSum evaluate_loss(Llama<T>& model, TokenSpan split, int64_t seq_len, int64_t rows_per_forward,
                      int64_t max_windows = 0, bool doc_mask = false, int32_t doc_separator = kEndOfTextToken);

}  // namespace llama4d
