// Merging two attention results over disjoint sets of keys (ring attention's step, see
// core/ops.h). One query row at a time, in plain scalar arithmetic: each output element is
// computed by the same operations whatever the thread count or the vector width.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/ops.h"

namespace llama4d::ops {

template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq, int64_t nh,
                     int64_t hd) {
  const T minus_inf = -std::numeric_limits<T>::infinity();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t l = (b * nh + h) * Tq + i;   // [B, nh, Tq]
        T* o = out + ((b * Tq + i) * nh + h) * hd;  // [B, Tq, nh, hd]
        const T* p = part_out + ((b * Tq + i) * nh + h) * hd;
        const T a = lse[l], c = part_lse[l];
        if (c == minus_inf) continue;  // the part saw no key: nothing to add
        if (a == minus_inf) {           // nothing seen yet: the part is the result, bit for bit
          std::copy(p, p + hd, o);
          lse[l] = c;
          continue;
        }
        // lse' = log(e^a + e^c) = max + log1p(e^(min - max)); each side is weighted by its
        // share of the new normaliser, e^(side - lse').
        const T hi = std::max(a, c), lo = std::min(a, c);
        const T merged = hi + std::log1p(std::exp(lo - hi));
        const T wa = std::exp(a - merged), wc = std::exp(c - merged);
        for (int64_t e = 0; e < hd; ++e) o[e] = o[e] * wa + p[e] * wc;
        lse[l] = merged;
      }
}

template void attention_merge<float>(float*, float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_merge<double>(double*, double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t);

}  // namespace llama4d::ops
