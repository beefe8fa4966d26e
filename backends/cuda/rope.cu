// Rotary position embedding (Su et al. 2021) on the GPU, rotate-half layout of Hugging Face
// Llama as backends/cpu/rope.cpp: dimension i of a head is paired with i + hd/2.
//
// One thread per pair (b, t, h, i), i < hd/2, in a grid-stride loop: a pair is read and written
// by its thread alone, in place. Consecutive threads take consecutive i, so the loads of both
// halves and of the cos/sin row coalesce.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

// x[B, T, nh, hd] rotated in place by the angles of position pos_start + t, read from the tables
// cos/sin[max_pos, hd/2]. sign = +1 applies the rotation, -1 its transpose (the inverse), which is
// the backward: the CPU's formula with sn = sign * sin, exact for sign = -1.
template <class T>
__global__ void rope_kernel(T* x, const T* cos, const T* sin, int64_t seq, int64_t nh, int64_t hd, int64_t pos_start,
                            int64_t pairs, T sign) {
  const int64_t half = hd / 2;
  for (int64_t p = first_index(); p < pairs; p += index_stride()) {
    const int64_t i = p % half;
    const int64_t row = p / half;  // (b * T + t) * nh + h
    const int64_t pos = pos_start + (row / nh) % seq;
    T* lo = x + row * hd;  // head vector of (b, t, h); an odd hd leaves its last element alone
    const T c = cos[pos * half + i];
    const T sn = sign * sin[pos * half + i];
    const T a = lo[i], b = lo[i + half];
    lo[i] = a * c - b * sn;
    lo[i + half] = b * c + a * sn;
  }
}

template <class T>
void rope_rotate(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd, int64_t pos_start,
                 T sign, const char* op) {
  const int64_t pairs = B * seq * nh * (hd / 2);
  if (pairs <= 0) return;
  rope_kernel<<<grid_for(pairs), kThreads, 0, stream()>>>(x, cos, sin, seq, nh, hd, pos_start, pairs, sign);
  finish_op(op);
}

}  // namespace

template <class T>
void rope_forward(T* x, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd, int64_t pos_start) {
  rope_rotate(x, cos, sin, B, seq, nh, hd, pos_start, T(1), "rope_forward");
}

template <class T>
void rope_backward(T* dx, const T* cos, const T* sin, int64_t B, int64_t seq, int64_t nh, int64_t hd,
                   int64_t pos_start) {
  rope_rotate(dx, cos, sin, B, seq, nh, hd, pos_start, T(-1), "rope_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                        \
  template void rope_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void rope_backward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
