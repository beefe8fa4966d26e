#include "core/model/vocabulary.h"

#include "core/ops.h"

namespace llama4d {

template <class T>
void Vocabulary<T>::embed(T* x, const int32_t* tokens, const T* table, int64_t BT, int64_t C, int64_t,
                          MemoryTracker*) {
  ops::embedding_forward(x, tokens, table, BT, C);
}

template <class T>
void Vocabulary<T>::embed_backward(T* g_table, const T* dx, const int32_t* tokens, int64_t BT, int64_t C, int64_t,
                                   MemoryTracker*) {
  ops::embedding_backward(g_table, dx, tokens, BT, C);
}

template <class T>
void Vocabulary<T>::cross_entropy(T* losses, T*, const T* logits, const int32_t* targets, int64_t BT, int64_t V,
                                  MemoryTracker*) {
  ops::cross_entropy_forward(losses, logits, targets, BT, V);
}

template <class T>
void Vocabulary<T>::cross_entropy_backward(T* dlogits, const T* logits, const T*, const int32_t* targets,
                                           T loss_scale, int64_t BT, int64_t V) {
  ops::cross_entropy_backward(dlogits, logits, targets, loss_scale, BT, V);
}

template class Vocabulary<float>;
template class Vocabulary<double>;

}  // namespace llama4d
