#include "core/model/block.h"

#include <algorithm>
#include <cstring>

#include "core/ops.h"

namespace llama4d {

namespace {

template <class T>
void zero(std::vector<T>& v, int64_t n) {
  std::fill_n(v.data(), n, T(0));
}

}  // namespace

template <class T>
void BlockActivations<T>::resize(const BlockDims& d) {
  const auto BT = size_t(d.BT()), C = size_t(d.C), qd = size_t(d.nh * d.hd), kvd = size_t(d.nkv * d.hd),
             I = size_t(d.I);
  n1.resize(BT * C), rstd1.resize(BT);
  q.resize(BT * qd), k.resize(BT * kvd), v.resize(BT * kvd);
  att.resize(BT * qd), lse.resize(BT * size_t(d.nh));
  h.resize(BT * C);
  n2.resize(BT * C), rstd2.resize(BT);
  gate.resize(BT * I), up.resize(BT * I), act.resize(BT * I);
  out.resize(BT * C);
}

template <class T>
int64_t BlockActivations<T>::bytes() const {
  size_t n = 0;
  for (const auto* vec : {&n1, &rstd1, &q, &k, &v, &att, &lse, &h, &n2, &rstd2, &gate, &up, &act, &out})
    n += vec->size();
  return int64_t(n * sizeof(T));
}

template <class T>
void BlockScratch<T>::resize(const BlockDims& d) {
  const auto BT = size_t(d.BT()), C = size_t(d.C), qd = size_t(d.nh * d.hd), kvd = size_t(d.nkv * d.hd),
             I = size_t(d.I);
  dn.resize(BT * C), dh.resize(BT * C);
  dq.resize(BT * qd), dk.resize(BT * kvd), dv.resize(BT * kvd), datt.resize(BT * qd);
  dgate.resize(BT * I), dup.resize(BT * I), dact.resize(BT * I);
}

template <class T>
void block_forward(BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                   const RopeTables<T>& rope, int64_t pos_start, BlockKvCache<T>* cache) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;

  // Attention half: n1 = rmsnorm(x); q, k, v projections; RoPE on q and k.
  ops::rmsnorm_forward(a.n1.data(), a.rstd1.data(), x, w.ln1, BT, C, T(d.eps));
  ops::matmul_forward(a.q.data(), a.n1.data(), w.wq, BT, C, qd);
  ops::matmul_forward(a.k.data(), a.n1.data(), w.wk, BT, C, kvd);
  ops::matmul_forward(a.v.data(), a.n1.data(), w.wv, BT, C, kvd);
  ops::rope_forward(a.q.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nh, d.hd, pos_start);
  ops::rope_forward(a.k.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nkv, d.hd, pos_start);

  ops::AttentionShape s{.B = d.B, .Tq = d.T, .Tk = d.T, .nh = d.nh, .nkv = d.nkv, .hd = d.hd,
                        .q_start = pos_start, .k_start = pos_start};
  const T* keys = a.k.data();
  const T* values = a.v.data();
  if (cache) {
    // Append this call's keys/values at [len, len + T) of each batch row, attend over all.
    for (int64_t b = 0; b < d.B; ++b) {
      const size_t src = size_t(b * d.T * kvd), dst = size_t((b * cache->max_len + cache->len) * kvd);
      std::memcpy(cache->k + dst, a.k.data() + src, size_t(d.T * kvd) * sizeof(T));
      std::memcpy(cache->v + dst, a.v.data() + src, size_t(d.T * kvd) * sizeof(T));
    }
    s.Tk = cache->len + d.T;
    s.k_start = 0;
    s.q_start = cache->len;
    s.kv_batch_stride = cache->max_len * kvd;
    keys = cache->k;
    values = cache->v;
  }
  ops::attention_forward(a.att.data(), a.lse.data(), a.q.data(), keys, values, s);

  // h = x + o_proj(att)
  ops::matmul_forward(a.h.data(), a.att.data(), w.wo, BT, qd, C);
  ops::add_forward(a.h.data(), a.h.data(), x, BT * C);

  // Feed-forward half: out = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h).
  ops::rmsnorm_forward(a.n2.data(), a.rstd2.data(), a.h.data(), w.ln2, BT, C, T(d.eps));
  ops::matmul_forward(a.gate.data(), a.n2.data(), w.wgate, BT, C, I);
  ops::matmul_forward(a.up.data(), a.n2.data(), w.wup, BT, C, I);
  ops::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), BT * I);
  ops::matmul_forward(a.out.data(), a.act.data(), w.wdown, BT, I, C);
  ops::add_forward(a.out.data(), a.out.data(), a.h.data(), BT * C);
}

template <class T>
void block_backward(T* dx, const BlockWeights<T>& g, const T* dout, const BlockActivations<T>& a,
                    const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                    int64_t pos_start, BlockScratch<T>& s) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;

  // Feed-forward half, last op first. The residual passes dout straight to dh.
  std::memcpy(s.dh.data(), dout, size_t(BT * C) * sizeof(T));
  zero(s.dact, BT * I);
  ops::matmul_backward(s.dact.data(), g.wdown, dout, a.act.data(), w.wdown, BT, I, C);
  zero(s.dgate, BT * I);
  zero(s.dup, BT * I);
  ops::swiglu_backward(s.dgate.data(), s.dup.data(), s.dact.data(), a.gate.data(), a.up.data(), BT * I);
  zero(s.dn, BT * C);
  ops::matmul_backward(s.dn.data(), g.wgate, s.dgate.data(), a.n2.data(), w.wgate, BT, C, I);
  ops::matmul_backward(s.dn.data(), g.wup, s.dup.data(), a.n2.data(), w.wup, BT, C, I);
  ops::rmsnorm_backward(s.dh.data(), g.ln2, s.dn.data(), a.h.data(), w.ln2, a.rstd2.data(), BT, C);

  // Attention half. dout is no longer read, so dx may alias it from here on.
  std::memcpy(dx, s.dh.data(), size_t(BT * C) * sizeof(T));
  zero(s.datt, BT * qd);
  ops::matmul_backward(s.datt.data(), g.wo, s.dh.data(), a.att.data(), w.wo, BT, qd, C);
  zero(s.dq, BT * qd);
  zero(s.dk, BT * kvd);
  zero(s.dv, BT * kvd);
  const ops::AttentionShape shape{.B = d.B, .Tq = d.T, .Tk = d.T, .nh = d.nh, .nkv = d.nkv, .hd = d.hd,
                                  .q_start = pos_start, .k_start = pos_start};
  ops::attention_backward(s.dq.data(), s.dk.data(), s.dv.data(), s.datt.data(), a.q.data(), a.k.data(),
                          a.v.data(), a.att.data(), a.lse.data(), shape);
  ops::rope_backward(s.dq.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nh, d.hd, pos_start);
  ops::rope_backward(s.dk.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nkv, d.hd, pos_start);
  zero(s.dn, BT * C);
  ops::matmul_backward(s.dn.data(), g.wq, s.dq.data(), a.n1.data(), w.wq, BT, C, qd);
  ops::matmul_backward(s.dn.data(), g.wk, s.dk.data(), a.n1.data(), w.wk, BT, C, kvd);
  ops::matmul_backward(s.dn.data(), g.wv, s.dv.data(), a.n1.data(), w.wv, BT, C, kvd);
  ops::rmsnorm_backward(dx, g.ln1, s.dn.data(), x, w.ln1, a.rstd1.data(), BT, C);
}

template struct BlockActivations<float>;
template struct BlockActivations<double>;
template struct BlockScratch<float>;
template struct BlockScratch<double>;
template void block_forward<float>(BlockActivations<float>&, const BlockWeights<float>&, const float*,
                                   const BlockDims&, const RopeTables<float>&, int64_t, BlockKvCache<float>*);
template void block_forward<double>(BlockActivations<double>&, const BlockWeights<double>&, const double*,
                                    const BlockDims&, const RopeTables<double>&, int64_t, BlockKvCache<double>*);
template void block_backward<float>(float*, const BlockWeights<float>&, const float*, const BlockActivations<float>&,
                                    const BlockWeights<float>&, const float*, const BlockDims&,
                                    const RopeTables<float>&, int64_t, BlockScratch<float>&);
template void block_backward<double>(double*, const BlockWeights<double>&, const double*,
                                     const BlockActivations<double>&, const BlockWeights<double>&, const double*,
                                     const BlockDims&, const RopeTables<double>&, int64_t, BlockScratch<double>&);

}  // namespace llama4d
