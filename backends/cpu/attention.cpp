// Causal grouped-query attention (Ainslie et al. 2023) in the style of flash attention
// (Dao et al. 2022): the forward saves only the log-sum-exp of each softmax row, and the
// backward recomputes the probabilities from it instead of storing [Tq, Tk] per head.
//
// Work is organised per (batch, KV head): the `group` query heads that share a KV head are
// stacked into one matrix of rows (query position, head), so each GEMM against that KV head's
// keys/values is `group` times taller (fewer, larger Eigen products; K and V packed once).
// Query positions are cut into blocks (attention_tasks.h); a block multiplies only against the keys
// its last position can see, which skips the fully masked part of the causal square. With
// document ids the block's key range also drops the keys before the first (and after the last)
// key of any document its rows belong to: with packed documents, the earlier documents.
// Inside the range, a key of another document gets score -inf, which exp_det turns into a
// probability of exactly 0.
//
// Every product is an Eigen GEMM, run single-threaded inside our own OpenMP loop. A loop item
// owns its outputs (forward: one block of one KV group; backward: one run of blocks of one KV
// group, whose dk/dv its query heads accumulate into in a fixed order, the runs after the first
// through partial buffers added in run order), so there are no races, and every result is the
// same bit for bit whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/attention_tasks.h"
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {
namespace {

// Below this many multiply-adds (Tq * Tk * nh * hd summed over the batch) a call is cheaper
// than waking the thread team (decode steps, tests).
constexpr int64_t kParallelWork = 1 << 18;

// Query positions per block: small enough to skip most of the masked triangle, large enough
// (times the group size) to keep the GEMMs efficient.
constexpr int64_t kBlockRows = kAttentionBlockRows;

// Keys [lo, hi) of one KV view that a block of query rows scores.
struct KeyRange {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
};

// Shared geometry of one call.
struct Layout {
  explicit Layout(const AttentionShape& shape)
      : s(shape),
        group(shape.nh / shape.nkv),
        blocks(attention_tasks(shape.Tq).blocks),
        kv_stride(shape.kv_batch_stride != 0 ? shape.kv_batch_stride
                                             : shape.Tk * shape.nkv * shape.hd) {}
  const AttentionShape& s;
  int64_t group, blocks, kv_stride;

  bool worth_threads() const { return s.B * s.Tq * s.Tk * s.nh * s.hd >= kParallelWork; }

  bool has_docs() const { return s.q_doc != nullptr; }

  // Keys visible to query row i: those with k_start + j <= q_start + i.
  int64_t visible_keys(int64_t i) const {
    return std::clamp<int64_t>(s.q_start + i - s.k_start + 1, 0, s.Tk);
  }
  // Keys of `range` row i can see causally, counted from range.lo.
  int64_t row_keys(int64_t i, const KeyRange& range) const {
    return std::clamp<int64_t>(visible_keys(i) - range.lo, 0, range.size());
  }

  // Keys the query rows i0 .. i0+rows-1 of batch b must score. Causally: [0, what the last row
  // sees). With documents, trimmed at both ends to keys whose id is one of the rows' ids; any
  // visible pair has such a key, so nothing visible is lost, and with packed documents (runs of
  // one id) the cut-off prefix is every earlier document. Ids need not be sorted for this.
  KeyRange block_keys(int64_t b, int64_t i0, int64_t rows) const {
    KeyRange range{0, visible_keys(i0 + rows - 1)};
    if (!has_docs()) return range;
    int32_t ids[kBlockRows];  // the block's distinct ids: one or two for packed documents
    int64_t n_ids = 0;
    const int32_t* q_doc = s.q_doc + b * s.Tq + i0;
    for (int64_t r = 0; r < rows; ++r)
      if (std::find(ids, ids + n_ids, q_doc[r]) == ids + n_ids) ids[n_ids++] = q_doc[r];
    const int32_t* k_doc = s.k_doc + b * s.Tk;
    auto wanted = [&](int64_t j) { return std::find(ids, ids + n_ids, k_doc[j]) != ids + n_ids; };
    while (range.lo < range.hi && !wanted(range.lo)) ++range.lo;
    while (range.hi > range.lo && !wanted(range.hi - 1)) --range.hi;
    return range;
  }

  // Sets the scores of keys range.lo .. range.lo+n-1 that are not in query row i's document to
  // -inf and returns how many keys keep their score (n without documents).
  template <class T>
  int64_t mask_other_documents(T* scores, int64_t b, int64_t i, const KeyRange& range,
                               int64_t n) const {
    if (!has_docs()) return n;
    const int32_t doc = s.q_doc[b * s.Tq + i];
    const int32_t* k_doc = s.k_doc + b * s.Tk + range.lo;
    int64_t kept = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (k_doc[j] == doc) {
        ++kept;
      } else {
        scores[j] = -std::numeric_limits<T>::infinity();
      }
    }
    return kept;
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
    const KeyRange range = L.block_keys(b, i0, rows);
    const int64_t keys = range.size();
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
    auto K = L.kv_view(k, b, g).middleRows(range.lo, keys);  // [keys, hd]
    auto V = L.kv_view(v, b, g).middleRows(range.lo, keys);  // [keys, hd]
    P.noalias() = Q * K.transpose();
    for (int64_t row = 0; row < stacked; ++row) {
      const int64_t r = row / L.group, h = g * L.group + row % L.group;
      T* p = p_buf + row * keys;
      T& row_lse = lse[(b * s.nh + h) * s.Tq + i0 + r];
      const int64_t n = L.row_keys(i0 + r, range);
      // No visible key (causally or in the row's document): zero output row, lse = -inf.
      if (L.mask_other_documents(p, b, i0 + r, range, n) == 0) {
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
  const Layout L(s);
  const AttentionTasks tasks = attention_tasks(s.Tq);
  const T scale = T(1) / std::sqrt(static_cast<T>(s.hd));
  const int64_t pairs = s.B * s.nkv, kv_elems = s.Tk * s.hd;
  // The keys the rows of run `run` can see: the rows of a partial buffer that run writes.
  auto run_keys = [&](int64_t run) {
    return L.visible_keys(std::min(s.Tq, (run + 1) * tasks.blocks_per_run * kBlockRows) - 1);
  };
  // dk then dv of runs 1.. of each pair, [pair][run - 1][2][Tk, hd], in the calling thread's
  // scratch, which the team shares for this call.
  T* partial = tasks.runs > 1 ? cpu::scratch<T>(6, pairs * (tasks.runs - 1) * 2 * kv_elems) : nullptr;
  auto partial_of = [&](int64_t pair, int64_t run) { return partial + (pair * (tasks.runs - 1) + run - 1) * 2 * kv_elems; };
  // One item = one run of query blocks of one (batch, KV head) pair: it alone writes its blocks'
  // dq, and adds its heads' dk/dv into the pair's (run 0) or into its partial buffer (runs 1..),
  // block by block in order, so the accumulation order is fixed.
  cpu::parallel_for_dynamic(pairs * tasks.runs, L.worth_threads(), [&](int64_t item) {
    const int64_t run = item % tasks.runs, pair = item / tasks.runs;
    const int64_t g = pair % s.nkv;
    const int64_t b = pair / s.nkv;
    const int64_t max_stacked = std::min(kBlockRows, s.Tq) * L.group;
    T* q_buf = cpu::scratch<T>(0, max_stacked * s.hd);
    T* do_buf = cpu::scratch<T>(1, max_stacked * s.hd);
    T* dq_buf = cpu::scratch<T>(2, max_stacked * s.hd);
    T* p_buf = cpu::scratch<T>(3, max_stacked * s.Tk);
    T* ds_buf = cpu::scratch<T>(4, max_stacked * s.Tk);
    T* D = cpu::scratch<T>(5, max_stacked);
    auto K_all = L.kv_view(k, b, g);
    auto V_all = L.kv_view(v, b, g);
    T* dk_run = run == 0 ? dk + b * L.kv_stride + g * s.hd : partial_of(pair, run);
    T* dv_run = run == 0 ? dv + b * L.kv_stride + g * s.hd : partial_of(pair, run) + kv_elems;
    const int64_t run_stride = run == 0 ? s.nkv * s.hd : s.hd;  // [Tk, hd] rows, in place or packed
    if (run > 0) {  // zero the key rows this run can reach (the reduction below reads no others)
      std::fill_n(dk_run, run_keys(run) * s.hd, T(0));
      std::fill_n(dv_run, run_keys(run) * s.hd, T(0));
    }
    cpu::StridedMap<T> dK_all(dk_run, s.Tk, s.hd, Eigen::OuterStride<>(run_stride));
    cpu::StridedMap<T> dV_all(dv_run, s.Tk, s.hd, Eigen::OuterStride<>(run_stride));
    const int64_t first = run * tasks.blocks_per_run, last = std::min(tasks.blocks, first + tasks.blocks_per_run);
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t i0 = blk * kBlockRows;
      const int64_t rows = std::min(kBlockRows, s.Tq - i0);
      const int64_t stacked = rows * L.group;
      const KeyRange range = L.block_keys(b, i0, rows);
      const int64_t keys = range.size();
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
      auto K = K_all.middleRows(range.lo, keys);
      auto V = V_all.middleRows(range.lo, keys);
      P.noalias() = Q * K.transpose();
      dS.noalias() = dO * V.transpose();  // dP for now
      for (int64_t row = 0; row < stacked; ++row) {
        const int64_t r = row / L.group, h = g * L.group + row % L.group;
        T* p = p_buf + row * keys;
        T* d = ds_buf + row * keys;
        int64_t n = L.row_keys(i0 + r, range);
        if (L.mask_other_documents(p, b, i0 + r, range, n) == 0) n = 0;  // lse is -inf: no share
        const T l = lse[(b * s.nh + h) * s.Tq + i0 + r];
        const T Dr = D[row];
        cpu::exp_affine(p, p, n, scale, l);  // a masked key's -inf score gives p = 0, ds = 0
        for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - Dr) * scale;
        std::memset(p + n, 0, sizeof(T) * (keys - n));
        std::memset(d + n, 0, sizeof(T) * (keys - n));
      }
      dV_all.middleRows(range.lo, keys).noalias() += P.transpose() * dO;
      dK_all.middleRows(range.lo, keys).noalias() += dS.transpose() * Q;
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
  if (tasks.runs < 2) return;
  // Each key row of each pair: dk and dv += its partials, run 1 first. Rows past what a run's
  // queries can see stayed zero there and are skipped.
  cpu::parallel_for(pairs * s.Tk, pairs * kv_elems >= cpu::kParallelElements, [&](int64_t key_row) {
    const int64_t pair = key_row / s.Tk, j = key_row % s.Tk;
    const int64_t offset = (pair / s.nkv) * L.kv_stride + j * s.nkv * s.hd + (pair % s.nkv) * s.hd;
    for (int64_t run = 1; run < tasks.runs; ++run) {
      if (j >= run_keys(run)) continue;
      const T* p = partial_of(pair, run) + j * s.hd;
      for (int64_t e = 0; e < s.hd; ++e) dk[offset + e] += p[e];
      for (int64_t e = 0; e < s.hd; ++e) dv[offset + e] += p[kv_elems + e];
    }
  });
}

namespace {

// Folds the partial result (part[hd], part_lse) of one (batch, position, head) row into
// (o[hd], o_lse); the formulas and the -inf cases are those of attention_merge in core/ops.h.
template <class T>
void merge_row(T* o, T& o_lse, const T* part, T part_lse, int64_t hd) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (part_lse == neg_inf) return;  // the part saw no key: the row stays as it is
  if (o_lse == neg_inf) {           // only the part saw keys: its row, bit for bit
    std::memcpy(o, part, sizeof(T) * hd);
    o_lse = part_lse;
    return;
  }
  const T hi = std::max(o_lse, part_lse), lo = std::min(o_lse, part_lse);
  const T merged = hi + std::log1p(std::exp(lo - hi));  // exp never overflows: lo - hi <= 0
  const T a = std::exp(o_lse - merged), c = std::exp(part_lse - merged);
  for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * a + part[d] * c;
  o_lse = merged;
}

}  // namespace

template <class T>
void attention_merge(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t Tq,
                     int64_t nh, int64_t hd) {
  // Row (b, i, h) = index (b * Tq + i) * nh + h: its hd outputs are contiguous in out, its lse
  // sits at (b * nh + h) * Tq + i. Each row is merged by one thread, alone.
  const int64_t rows = B * Tq * nh;
  const int64_t per_chunk = std::max<int64_t>(1, cpu::kElementChunk / hd);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  cpu::parallel_for(chunks, rows * hd >= cpu::kParallelElements, [&](int64_t c) {
    const int64_t end = std::min(rows, (c + 1) * per_chunk);
    for (int64_t row = c * per_chunk; row < end; ++row) {
      const int64_t h = row % nh, i = (row / nh) % Tq, b = row / (nh * Tq);
      const int64_t l = (b * nh + h) * Tq + i;
      merge_row(out + row * hd, lse[l], part_out + row * hd, part_lse[l], hd);
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
template void attention_merge<float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, int64_t);
template void attention_merge<double>(double*, double*, const double*, const double*, int64_t,
                                      int64_t, int64_t, int64_t);

}  // namespace llama4d::cpu
