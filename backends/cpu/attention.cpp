// Causal grouped-query attention (Ainslie et al. 2023) in the style of flash attention
// (Dao et al. 2022): the forward saves only the log-sum-exp of each softmax row, and the
// backward recomputes the probabilities from it instead of storing [Tq, Tk] per head.
//
// Work is organised per (batch, KV head): the `group` query heads that share a KV head are
// stacked into one matrix of rows (query position, head), so each GEMM against that KV head's
// keys/values is `group` times taller (fewer, larger Eigen products; K and V packed once).
// Query positions are cut into blocks of kBlockRows; a block multiplies only against the keys
// its last position can see, which skips the fully masked part of the causal square.
//
// Every product is an Eigen GEMM, run single-threaded inside our own OpenMP loop. A loop item
// owns its outputs (forward: one block of one KV group; backward: one KV group, whose dk/dv all
// its query heads accumulate into in a fixed order), so there are no races, and every result
// is the same bit for bit whatever the thread count.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {
namespace {

// Below this many multiply-adds (Tq * Tk * nh * hd summed over the batch) a call is cheaper
// than waking the thread team (decode steps, tests).
constexpr int64_t kParallelWork = 1 << 18;

// Query positions per block: small enough to skip most of the masked triangle, large enough
// (times the group size) to keep the GEMMs efficient.
constexpr int64_t kBlockRows = 32;

void check_shape(const AttentionShape& s) {
  if (s.B < 0 || s.Tq < 0 || s.Tk < 0 || s.nh < 1 || s.nkv < 1 || s.hd < 1)
    throw InputError("attention: sizes must be non-negative and heads/head_dim positive");
  if (s.nh % s.nkv != 0)
    throw InputError("attention: query heads (" + std::to_string(s.nh) +
                     ") must be a multiple of key/value heads (" + std::to_string(s.nkv) + ")");
  if (s.kv_batch_stride != 0 && s.kv_batch_stride < s.Tk * s.nkv * s.hd)
    throw InputError("attention: kv_batch_stride " + std::to_string(s.kv_batch_stride) +
                     " is smaller than Tk * nkv * hd");
}

// Shared geometry of one call.
struct Layout {
  explicit Layout(const AttentionShape& shape)
      : s(shape),
        group(shape.nh / shape.nkv),
        blocks((shape.Tq + kBlockRows - 1) / kBlockRows),
        kv_stride(shape.kv_batch_stride != 0 ? shape.kv_batch_stride
                                             : shape.Tk * shape.nkv * shape.hd) {}
  const AttentionShape& s;
  int64_t group, blocks, kv_stride;

  bool worth_threads() const { return s.B * s.Tq * s.Tk * s.nh * s.hd >= kParallelWork; }

  // Keys visible to query row i: those with k_start + j <= q_start + i.
  int64_t visible_keys(int64_t i) const {
    return std::clamp<int64_t>(s.q_start + i - s.k_start + 1, 0, s.Tk);
  }
  // First element of query heads g*group .. (g+1)*group-1 at row i of batch b; the group's
  // head vectors are contiguous there ([B, Tq, nh, hd] layout).
  int64_t query_offset(int64_t b, int64_t i, int64_t g) const {
    return ((b * s.Tq + i) * s.nh + g * group) * s.hd;
  }
  // Keys or values of KV head g in batch b, as a [Tk, hd] view.
  template <class T>
  auto kv_view(T* base, int64_t b, int64_t g) const {
    using Map = std::conditional_t<std::is_const_v<T>, cpu::ConstStridedMap<std::remove_const_t<T>>,
                                   cpu::StridedMap<T>>;
    return Map(base + b * kv_stride + g * s.hd, s.Tk, s.hd, Eigen::OuterStride<>(s.nkv * s.hd));
  }
};

// Copies the group's head vectors of query rows i0 .. i0+rows-1 into a [rows*group, hd] matrix
// whose row r*group + h is (position i0 + r, head h of the group).
template <class T>
void gather_rows(T* dst, const T* src, const Layout& L, int64_t b, int64_t g, int64_t i0,
                 int64_t rows) {
  const int64_t width = L.group * L.s.hd;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * width, src + L.query_offset(b, i0 + r, g), sizeof(T) * width);
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const AttentionShape& s) {
  check_shape(s);
  report_flops(attention_forward_flops(s));
  const Layout L(s);
  const T scale = T(1) / std::sqrt(static_cast<T>(s.hd));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  // One item = (batch, KV head, block of query positions). Later blocks see more keys, so the
  // schedule is dynamic.
  cpu::parallel_for_dynamic(s.B * s.nkv * L.blocks, L.worth_threads(), [&](int64_t item) {
    const int64_t blk = item % L.blocks;
    const int64_t g = (item / L.blocks) % s.nkv;
    const int64_t b = item / (L.blocks * s.nkv);
    const int64_t i0 = blk * kBlockRows;
    const int64_t rows = std::min(kBlockRows, s.Tq - i0);
    const int64_t stacked = rows * L.group;
    const int64_t keys = L.visible_keys(i0 + rows - 1);  // the block's last row sees the most
    if (keys == 0) {
      for (int64_t r = 0; r < rows; ++r) {
        std::fill_n(out + L.query_offset(b, i0 + r, g), L.group * s.hd, T(0));
        for (int64_t h = 0; h < L.group; ++h)
          lse[(b * s.nh + g * L.group + h) * s.Tq + i0 + r] = neg_inf;
      }
      return;
    }
    T* q_buf = cpu::scratch<T>(0, stacked * s.hd);
    T* p_buf = cpu::scratch<T>(1, stacked * keys);
    T* inv_sum = cpu::scratch<T>(2, stacked);
    gather_rows(q_buf, q, L, b, g, i0, rows);
    cpu::ConstMatrixMap<T> Q(q_buf, stacked, s.hd);  // [rows*group, hd]
    cpu::MatrixMap<T> P(p_buf, stacked, keys);       // scores, then unnormalised probabilities
    auto K = L.kv_view(k, b, g).topRows(keys);       // [keys, hd]
    auto V = L.kv_view(v, b, g).topRows(keys);       // [keys, hd]
    P.noalias() = Q * K.transpose();
    for (int64_t row = 0; row < stacked; ++row) {
      const int64_t r = row / L.group, h = g * L.group + row % L.group;
      T* p = p_buf + row * keys;
      T& row_lse = lse[(b * s.nh + h) * s.Tq + i0 + r];
      const int64_t n = std::min(keys, L.visible_keys(i0 + r));
      if (n == 0) {  // no visible key: zero output row, lse = -inf
        std::memset(p, 0, sizeof(T) * keys);
        inv_sum[row] = T(0);
        row_lse = neg_inf;
        continue;
      }
      const T m = cpu::reduce_max(p, n) * scale;
      cpu::exp_affine(p, p, n, scale, m);
      std::memset(p + n, 0, sizeof(T) * (keys - n));
      const T sum = cpu::reduce_sum(p, n);
      inv_sum[row] = T(1) / sum;  // applied to the [rows, hd] output, not the [rows, keys] P
      row_lse = m + std::log(sum);
    }
    // The stacked output rows land back in [B, Tq, nh, hd]: position r's group heads are
    // contiguous, so the output is a strided view with one row per position.
    cpu::StridedMap<T> O(out + L.query_offset(b, i0, g), rows, L.group * s.hd,
                         Eigen::OuterStride<>(s.nh * s.hd));
    cpu::MatrixMap<T> O_stacked(q_buf, stacked, s.hd);  // reuses the query buffer
    O_stacked.noalias() = P * V;
    O_stacked.array().colwise() *=
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(inv_sum, stacked);
    O = cpu::ConstMatrixMap<T>(q_buf, rows, L.group * s.hd);
  });
}

// With P = softmax(S), S = scale * Q K^T, O = P V and D_i = dO_i . O_i:
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ += scale dS K,  dK += scale dS^T Q.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const AttentionShape& s) {
  check_shape(s);
  report_flops(attention_backward_flops(s));
  const Layout L(s);
  const T scale = T(1) / std::sqrt(static_cast<T>(s.hd));
  // One item = (batch, KV head): it alone writes that head's dk/dv and its query heads' dq,
  // and walks its blocks in order, so the accumulation order is fixed.
  cpu::parallel_for_dynamic(s.B * s.nkv, L.worth_threads(), [&](int64_t item) {
    const int64_t g = item % s.nkv;
    const int64_t b = item / s.nkv;
    const int64_t max_stacked = std::min(kBlockRows, s.Tq) * L.group;
    T* q_buf = cpu::scratch<T>(0, max_stacked * s.hd);
    T* do_buf = cpu::scratch<T>(1, max_stacked * s.hd);
    T* dq_buf = cpu::scratch<T>(2, max_stacked * s.hd);
    T* p_buf = cpu::scratch<T>(3, max_stacked * s.Tk);
    T* ds_buf = cpu::scratch<T>(4, max_stacked * s.Tk);
    T* D = cpu::scratch<T>(5, max_stacked);
    auto K_all = L.kv_view(k, b, g);
    auto V_all = L.kv_view(v, b, g);
    auto dK_all = L.kv_view(dk, b, g);
    auto dV_all = L.kv_view(dv, b, g);
    for (int64_t blk = 0; blk < L.blocks; ++blk) {
      const int64_t i0 = blk * kBlockRows;
      const int64_t rows = std::min(kBlockRows, s.Tq - i0);
      const int64_t stacked = rows * L.group;
      const int64_t keys = L.visible_keys(i0 + rows - 1);
      if (keys == 0) continue;  // no visible key: no gradient flows
      gather_rows(q_buf, q, L, b, g, i0, rows);
      gather_rows(do_buf, dout, L, b, g, i0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        const T* o = out + L.query_offset(b, i0 + r, g);
        for (int64_t h = 0; h < L.group; ++h) {
          const int64_t row = r * L.group + h;
          D[row] = cpu::reduce_dot(do_buf + row * s.hd, o + h * s.hd, s.hd);
        }
      }
      cpu::ConstMatrixMap<T> Q(q_buf, stacked, s.hd);    // [rows*group, hd]
      cpu::ConstMatrixMap<T> dO(do_buf, stacked, s.hd);  // [rows*group, hd]
      cpu::MatrixMap<T> P(p_buf, stacked, keys);
      cpu::MatrixMap<T> dS(ds_buf, stacked, keys);
      auto K = K_all.topRows(keys);
      auto V = V_all.topRows(keys);
      P.noalias() = Q * K.transpose();
      dS.noalias() = dO * V.transpose();  // dP for now
      for (int64_t row = 0; row < stacked; ++row) {
        const int64_t r = row / L.group, h = g * L.group + row % L.group;
        T* p = p_buf + row * keys;
        T* d = ds_buf + row * keys;
        const int64_t n = std::min(keys, L.visible_keys(i0 + r));
        const T l = lse[(b * s.nh + h) * s.Tq + i0 + r];
        const T Dr = D[row];
        cpu::exp_affine(p, p, n, scale, l);
        for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - Dr) * scale;
        std::memset(p + n, 0, sizeof(T) * (keys - n));
        std::memset(d + n, 0, sizeof(T) * (keys - n));
      }
      dV_all.topRows(keys).noalias() += P.transpose() * dO;
      dK_all.topRows(keys).noalias() += dS.transpose() * Q;
      cpu::MatrixMap<T> dQ(dq_buf, stacked, s.hd);
      dQ.noalias() = dS * K;
      const int64_t width = L.group * s.hd;
      for (int64_t r = 0; r < rows; ++r) {
        T* dst = dq + L.query_offset(b, i0 + r, g);
        const T* src = dq_buf + r * width;
        for (int64_t e = 0; e < width; ++e) dst[e] += src[e];
      }
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*,
                                        const double*, const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, const double*,
                                         const AttentionShape&);

}  // namespace llama4d::ops
