// Rotary position embedding (Su et al. 2021) in the rotate-half layout of Hugging Face Llama:
// dimension i is paired with i + hd/2 rather than with its neighbour.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

// Rotates every head vector of row (b, t) by the angles of position pos_start + t.
// `sign` = +1 applies the rotation, -1 its transpose (the inverse), which is the backward.
template <class T>
static void rope_rotate(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh,
                        int64_t hd, int64_t pos_start, T sign) {
  const int64_t half = hd / 2;
  cpu::parallel_for(B * seq, B * seq * nh * hd >= (1 << 14), [&](int64_t bt) {
    const int64_t pos = pos_start + bt % seq;
    const T* c = cos + pos * half;
    const T* s = sin + pos * half;
    for (int64_t h = 0; h < nh; ++h) {
      T* lo = x + (bt * nh + h) * hd;
      T* hi = lo + half;
      for (int64_t i = 0; i < half; ++i) {
        const T a = lo[i], b = hi[i], sn = sign * s[i];
        lo[i] = a * c[i] - b * sn;
        hi[i] = b * c[i] + a * sn;
      }
    }
  });
}

template <class T>
void rope_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd,
                  int64_t pos_start) {
  rope_rotate(x, cos, sin, B, seq, nh, hd, pos_start, T(1));
}

template <class T>
void rope_backward(T* dx, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd,
                   int64_t pos_start) {
  rope_rotate(dx, cos, sin, B, seq, nh, hd, pos_start, T(-1));
}

template void rope_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                  int64_t, int64_t);
template void rope_forward<double>(double*, const double*, const double*, int64_t, int64_t, int64_t,
                                   int64_t, int64_t);
template void rope_backward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                   int64_t, int64_t);
template void rope_backward<double>(double*, const double*, const double*, int64_t, int64_t,
                                    int64_t, int64_t, int64_t);

}  // namespace llama4d::cpu
