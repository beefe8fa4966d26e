#pragma once
// Unigram baselines for the loss. A model that ignores context and predicts each token from
// its overall frequency gets the unigram entropy as its loss; a trained model must do better,
// and the gap is what context bought. English bytes sit around 4.1-4.5 bits (2.9-3.1 nats).
#include <cstdint>

#include "core/data/tokenizer.h"

namespace llama4d {

struct UnigramEntropy {
  double nats = 0;       // comparable to the cross-entropy loss (natural log)
  double bits = 0;       // nats / ln 2
  int64_t tokens = 0;    // tokens counted
  int64_t distinct = 0;  // distinct token ids seen in the counted span
};

// H = -sum_v p_v ln p_v with p_v = count_v / n over `tokens` itself: the loss of the best
// context-free predictor that knew the span's frequencies in advance. Ids must lie in
// [0, kByteVocabSize), else InputError; an empty span gives all zeros.
UnigramEntropy unigram_entropy(TokenSpan tokens);

// Cross-entropy of `eval` under a unigram model fitted on `fit` with add-alpha smoothing over
// the first vocab_size ids (default: the bytes and the special tokens, since packed documents hold
// <|end_of_text|>): q_v = (count_fit_v + alpha) / (n_fit + alpha * vocab_size), loss =
// -(1/n_eval) sum_i ln q_{eval_i}. This is the honest baseline for a validation loss: it uses
// only training statistics. tokens/distinct describe `eval`. alpha > 0 keeps unseen ids finite.
UnigramEntropy unigram_cross_entropy(TokenSpan fit, TokenSpan eval, int64_t vocab_size = kByteVocabSize,
                                     double alpha = 1.0);

}  // namespace llama4d
