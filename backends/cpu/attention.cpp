// Causal grouped-query attention (Ainslie et al. 2023) in the style of flash attention
// (Dao et al. 2022): the forward saves only the log-sum-exp of each softmax row, and the
// backward recomputes the probabilities from it instead of storing [Tq, Tk] per head.
//
// Work is organised per (batch, KV head): the `group` query heads that share a KV head are
// stacked into one matrix of rows (query position, head), so each product against that KV head's
// keys/values is `group` times taller. Query positions are cut into blocks (attention_tasks.h); a
// block multiplies only against the keys its last position can see, which skips the fully masked
// part of the causal square. With document ids the block's key range also drops the keys before
// the first (and after the last) key of any document its rows belong to: with packed documents,
// the earlier documents. Inside the range, a key of another document gets score -inf, which
// exp_det turns into a probability of exactly 0.
//
// A block's products run on the GEMM's micro-kernel (gemm_kernel.h) over buffers laid out and
// zero-padded for it, so nothing is packed inside a product: the keys and values as [keys, hd]
// rows, the block's queries (and output gradients) both as [stacked, hd] rows and transposed as
// [hd, stacked]. Scores are kept transposed, S^T [keys, stacked]: every product then reads its
// operands where they lie (S^T = K Q^T and O = P V forward; S^T, dP^T = V dO^T, dV += P^T dO,
// dK += dS^T Q and dQ = dS K backward), and the softmax runs down the key rows with a vector
// across the block's queries.
// Each element of a product is summed in gemm.h's order, which depends on the product's depth
// alone; a query row's result depends on its block's key range, which depends on the block's
// positions (context parallelism keeps blocks aligned to get one device's bits).
//
// A loop item owns its outputs (forward: one block of one KV group; backward: one run of blocks
// of one KV group, whose dk/dv its query heads accumulate into in a fixed order, the runs after
// the first through partial buffers added in run order), so there are no races, and every
// result is the same bit for bit whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/attention_tasks.h"
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm_kernel.h"
#include "core/ops.h"

namespace llama4d::cpu {
namespace {

// Below this many multiply-adds (Tq * Tk * nh * hd summed over the batch) a call is cheaper
// than waking the thread team (decode steps, tests).
constexpr int64_t kParallelWork = 1 << 18;

// Query positions per block: small enough to skip most of the masked triangle, large enough
// (times the group size) to keep the products efficient.
constexpr int64_t kBlockRows = kAttentionBlockRows;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

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

  // First element of query heads g*group .. (g+1)*group-1 at row i of batch b; the group's
  // head vectors are contiguous there ([B, Tq, nh, hd] layout).
  int64_t query_offset(int64_t b, int64_t i, int64_t g) const {
    return ((b * s.Tq + i) * s.nh + g * group) * s.hd;
  }
  // Key (or value) j of KV head g in batch b: hd values, rows nkv * hd apart.
  int64_t kv_offset(int64_t b, int64_t g, int64_t j) const { return b * kv_stride + j * s.nkv * s.hd + g * s.hd; }
};

// One block's buffers, carved from one scratch slot. `stacked` rows (query position, head of the
// group) by `keys` keys; every size is padded to what the micro-kernel reads (gemm_kernel.h):
// key rows to kRows, head columns to kLanes, and the scores' rows, whose columns are read as
// adjacent rows of an operand, to kRows columns. Padding holds zeros.
template <class T>
struct BlockBuffers {
  static constexpr int64_t kRows = Kernel<T>::kRows, kLanes = Kernel<T>::kLanes;
  BlockBuffers(int64_t stacked, int64_t keys, int64_t hd, bool backward)
      : stacked(stacked),
        keys(keys),
        hd(hd),
        hdl(round_up(hd, kLanes)),
        sp(round_up(stacked, kLanes)),
        lds(round_up(stacked, kRows)),
        kp(round_up(keys, kRows)) {
    const int64_t sizes[] = {kp * hdl, kp * hdl, hd * sp, stacked * hdl, kp * lds, lds, lds, lds,
                             backward ? hd * sp : 0, backward ? stacked * hdl : 0, backward ? kp * lds : 0};
    T** parts[] = {&k, &v, &q_t, &q, &s, &col_a, &col_b, &col_c, &do_t, &dout, &ds};
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    T* p = scratch<T>(0, total);
    for (size_t i = 0; i < std::size(sizes); ++i) {
      *parts[i] = sizes[i] > 0 ? p : nullptr;
      p += sizes[i];
    }
  }
  int64_t stacked, keys, hd;
  int64_t hdl;  // columns of a [*, hd] operand (head vectors padded to whole vectors)
  int64_t sp;   // columns of a transposed [hd, stacked] operand
  int64_t lds;  // columns of the scores S^T [keys, stacked]
  int64_t kp;   // rows of the keys, values and scores
  T *k, *v;          // [kp, hdl]
  T *q_t, *q;        // [hd, sp] and [stacked, hdl]
  T* s;              // S^T then P^T (unnormalised in the forward): [kp, lds]
  T *col_a, *col_b, *col_c;  // per-column values: [lds] each
  T *do_t, *dout;    // backward: the output gradient as q_t and q
  T* ds;             // backward: dP^T then dS^T, [kp, lds]
};

// Copies keys [lo, lo + keys) of KV head g in batch b into dst [kp, hdl], zeros elsewhere.
template <class T>
void load_keys(T* dst, const T* src, const Layout& L, const BlockBuffers<T>& buf, int64_t b, int64_t g, int64_t lo) {
  for (int64_t j = 0; j < buf.keys; ++j) {
    std::memcpy(dst + j * buf.hdl, src + L.kv_offset(b, g, lo + j), sizeof(T) * buf.hd);
    std::fill(dst + j * buf.hdl + buf.hd, dst + (j + 1) * buf.hdl, T(0));
  }
  std::fill(dst + buf.keys * buf.hdl, dst + buf.kp * buf.hdl, T(0));
}

// Copies the group's head vectors of query rows i0 .. i0+rows-1 (row r*group + h is position
// i0 + r, head h of the group) transposed into cols [hd, sp] and, unless rows_dst is null, into
// rows [stacked, hdl].
template <class T>
void load_queries(T* rows_dst, T* cols_dst, const T* src, const Layout& L, const BlockBuffers<T>& buf, int64_t b,
                  int64_t g, int64_t i0) {
  const int64_t hd = buf.hd;
  for (int64_t c = 0; c < buf.stacked; ++c) {
    const T* x = src + L.query_offset(b, i0 + c / L.group, g) + (c % L.group) * hd;
    for (int64_t d = 0; d < hd; ++d) cols_dst[d * buf.sp + c] = x[d];
    if (rows_dst == nullptr) continue;
    T* row = rows_dst + c * buf.hdl;
    std::memcpy(row, x, sizeof(T) * hd);
    std::fill(row + hd, row + buf.hdl, T(0));
  }
  for (int64_t d = 0; d < hd; ++d) std::fill(cols_dst + d * buf.sp + buf.stacked, cols_dst + (d + 1) * buf.sp, T(0));
}

// Gives the scores S^T [keys, lds] a query row must not see -inf: keys past its causal limit and
// (with documents) keys of other documents.
template <class T>
void mask_scores(T* s, const Layout& L, const BlockBuffers<T>& buf, int64_t b, int64_t i0, int64_t rows,
                 const KeyRange& range) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = L.row_keys(i0 + r, range);
    T* col = s + r * L.group;
    for (int64_t j = n; j < buf.keys; ++j) std::fill_n(col + j * buf.lds, L.group, neg_inf);
    if (!L.has_docs()) continue;
    const int32_t doc = L.s.q_doc[b * L.s.Tq + i0 + r];
    const int32_t* k_doc = L.s.k_doc + b * L.s.Tk + range.lo;
    for (int64_t j = 0; j < n; ++j)
      if (k_doc[j] != doc) std::fill_n(col + j * buf.lds, L.group, neg_inf);
  }
}

// Zeros what the products read of a scores buffer and no step writes: columns [stacked, lds) of
// the key rows, and the padding rows [keys, kp). Their products land only in rows of the output
// that are never stored, so this changes no result; it keeps stale scratch (a NaN, a subnormal
// that would slow the multiply-adds) out of them.
template <class T>
void zero_score_padding(T* s, const BlockBuffers<T>& buf) {
  for (int64_t j = 0; j < buf.keys; ++j) std::fill(s + j * buf.lds + buf.stacked, s + (j + 1) * buf.lds, T(0));
  std::fill(s + buf.keys * buf.lds, s + buf.kp * buf.lds, T(0));
}

// row[c] = max(row[c], x[c]) and the softmax's other column loops below are kept out of line
// so GCC sees plain loops over c and vectorises them (exp_det's lanes and tail agree bitwise).
template <class T>
[[gnu::noinline]] void max_into(T* m, const T* x, int64_t n) {
  for (int64_t c = 0; c < n; ++c) m[c] = x[c] > m[c] ? x[c] : m[c];
}
// x[c] = exp(x[c] * scale - shift[c]); sum[c] += x[c].
template <class T>
[[gnu::noinline]] void exp_and_sum(T* x, T* sum, const T* shift, int64_t n, T scale) {
  for (int64_t c = 0; c < n; ++c) {
    x[c] = exp_det(x[c] * scale - shift[c]);
    sum[c] += x[c];
  }
}
// p[c] = exp(s[c] * scale - lse[c]); ds[c] = p[c] * (dp[c] - D[c]) * scale, with ds holding dp.
template <class T>
[[gnu::noinline]] void softmax_gradient(T* s, T* ds, const T* lse, const T* D, int64_t n, T scale) {
  for (int64_t c = 0; c < n; ++c) {
    const T p = exp_det(s[c] * scale - lse[c]);
    s[c] = p;
    ds[c] = p * (ds[c] - D[c]) * scale;
  }
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
    BlockBuffers<T> buf(stacked, keys, s.hd, false);
    load_keys(buf.k, k, L, buf, b, g, range.lo);
    load_keys(buf.v, v, L, buf, b, g, range.lo);
    load_queries<T>(nullptr, buf.q_t, q, L, buf, b, g, i0);
    // S^T [keys, stacked] = K [keys, hd] Q^T [hd, stacked]
    padded_product(buf.s, buf.lds, buf.k, buf.hdl, int64_t(1), buf.q_t, buf.sp, keys, stacked, s.hd, false);
    mask_scores(buf.s, L, buf, b, i0, rows, range);
    // Softmax down each column: m = the largest score, then P = exp(scale * (S - m)) and its sum.
    // A column with no visible key (causally or in its document) keeps all -inf: shift 0 makes
    // its P zeros, and it gets a zero output row and lse = -inf.
    T* m = buf.col_a;
    T* shift = buf.col_b;
    T* sum = buf.col_c;
    std::fill_n(m, stacked, neg_inf);
    for (int64_t j = 0; j < keys; ++j) max_into(m, buf.s + j * buf.lds, stacked);
    for (int64_t c = 0; c < stacked; ++c) shift[c] = m[c] == neg_inf ? T(0) : m[c] * scale;
    std::fill_n(sum, stacked, T(0));
    for (int64_t j = 0; j < keys; ++j) exp_and_sum(buf.s + j * buf.lds, sum, shift, stacked, scale);
    for (int64_t c = 0; c < stacked; ++c) {
      T& row_lse = lse[(b * s.nh + g * L.group + c % L.group) * s.Tq + i0 + c / L.group];
      row_lse = m[c] == neg_inf ? neg_inf : shift[c] + std::log(sum[c]);
      sum[c] = m[c] == neg_inf ? T(0) : T(1) / sum[c];  // applied to the [stacked, hd] output, not to P
    }
    zero_score_padding(buf.s, buf);
    // O [stacked, hd] = P [stacked, keys] V [keys, hd], into the query rows' buffer (the forward
    // reads the queries transposed only); each row then lands, divided by its sum, in
    // [B, Tq, nh, hd].
    padded_product(buf.q, s.hd, buf.s, int64_t(1), buf.lds, buf.v, buf.hdl, stacked, s.hd, keys, false);
    for (int64_t c = 0; c < stacked; ++c) {
      T* o = out + L.query_offset(b, i0 + c / L.group, g) + (c % L.group) * s.hd;
      for (int64_t d = 0; d < s.hd; ++d) o[d] = buf.q[c * s.hd + d] * sum[c];
    }
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
  const T neg_inf = -std::numeric_limits<T>::infinity();
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
    T* dk_run = run == 0 ? dk + L.kv_offset(b, g, 0) : partial_of(pair, run);
    T* dv_run = run == 0 ? dv + L.kv_offset(b, g, 0) : partial_of(pair, run) + kv_elems;
    const int64_t run_stride = run == 0 ? s.nkv * s.hd : s.hd;  // [Tk, hd] rows, in place or packed
    if (run > 0) {  // zero the key rows this run can reach (the reduction below reads no others)
      std::fill_n(dk_run, run_keys(run) * s.hd, T(0));
      std::fill_n(dv_run, run_keys(run) * s.hd, T(0));
    }
    const int64_t first = run * tasks.blocks_per_run, last = std::min(tasks.blocks, first + tasks.blocks_per_run);
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t i0 = blk * kBlockRows;
      const int64_t rows = std::min(kBlockRows, s.Tq - i0);
      const int64_t stacked = rows * L.group;
      const KeyRange range = L.block_keys(b, i0, rows);
      const int64_t keys = range.size();
      if (keys == 0) continue;  // no visible key: no gradient flows
      BlockBuffers<T> buf(stacked, keys, s.hd, true);
      load_keys(buf.k, k, L, buf, b, g, range.lo);
      load_keys(buf.v, v, L, buf, b, g, range.lo);
      load_queries(buf.q, buf.q_t, q, L, buf, b, g, i0);
      load_queries(buf.dout, buf.do_t, dout, L, buf, b, g, i0);
      // Per column: its lse (0 for a row that saw no key: all its scores are -inf, so P = 0) and
      // D = dO . O.
      T* row_lse = buf.col_a;
      T* D = buf.col_b;
      for (int64_t c = 0; c < stacked; ++c) {
        const int64_t r = c / L.group, h = g * L.group + c % L.group;
        const T l = lse[(b * s.nh + h) * s.Tq + i0 + r];
        row_lse[c] = l == neg_inf ? T(0) : l;
        D[c] = cpu::reduce_dot(buf.dout + c * buf.hdl, out + L.query_offset(b, i0 + r, g) + (c % L.group) * s.hd, s.hd);
      }
      // S^T = K Q^T and dP^T = V dO^T, [keys, stacked]; then P and dS in place.
      padded_product(buf.s, buf.lds, buf.k, buf.hdl, int64_t(1), buf.q_t, buf.sp, keys, stacked, s.hd, false);
      padded_product(buf.ds, buf.lds, buf.v, buf.hdl, int64_t(1), buf.do_t, buf.sp, keys, stacked, s.hd, false);
      mask_scores(buf.s, L, buf, b, i0, rows, range);  // a masked key's -inf score gives p = 0, ds = 0
      for (int64_t j = 0; j < keys; ++j)
        softmax_gradient(buf.s + j * buf.lds, buf.ds + j * buf.lds, row_lse, D, stacked, scale);
      zero_score_padding(buf.s, buf);
      zero_score_padding(buf.ds, buf);
      // dV [keys, hd] += P^T dO and dK += dS^T Q, over the block's stacked rows; dQ = dS K.
      padded_product(dv_run + range.lo * run_stride, run_stride, buf.s, buf.lds, int64_t(1), buf.dout, buf.hdl, keys,
                     s.hd, stacked, true);
      padded_product(dk_run + range.lo * run_stride, run_stride, buf.ds, buf.lds, int64_t(1), buf.q, buf.hdl, keys,
                     s.hd, stacked, true);
      T* dq_block = buf.do_t;  // no longer read
      padded_product(dq_block, s.hd, buf.ds, int64_t(1), buf.lds, buf.k, buf.hdl, stacked, s.hd, keys, false);
      for (int64_t c = 0; c < stacked; ++c) {
        T* dst = dq + L.query_offset(b, i0 + c / L.group, g) + (c % L.group) * s.hd;
        const T* src = dq_block + c * s.hd;
        for (int64_t e = 0; e < s.hd; ++e) dst[e] += src[e];
      }
    }
  });
  if (tasks.runs < 2) return;
  // Each key row of each pair: dk and dv += its partials, run 1 first. Rows past what a run's
  // queries can see stayed zero there and are skipped.
  cpu::parallel_for(pairs * s.Tk, pairs * kv_elems >= cpu::kParallelElements, [&](int64_t key_row) {
    const int64_t pair = key_row / s.Tk, j = key_row % s.Tk;
    const int64_t offset = L.kv_offset(pair / s.nkv, pair % s.nkv, j);
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
