#include "core/model/block.h"

#include "core/ops.h"

namespace llama4d {

template <class T>
BlockWeights<T> block_weights(T* p, const BlockDims& d) {
  const int64_t C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;
  BlockWeights<T> w;
  w.ln1 = p, p += C;
  w.wq = p, p += qd * C;
  w.wk = p, p += kvd * C;
  w.wv = p, p += kvd * C;
  w.wo = p, p += C * qd;
  w.ln2 = p, p += C;
  w.wgate = p, p += I * C;
  w.wup = p, p += I * C;
  w.wdown = p;
  return w;
}

template <class T>
void BlockActivations<T>::allocate(MemoryTracker* m, const BlockDims& d) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;
  const auto act = MemoryCategory::activations;
  q = Buffer<T>(m, act, BT * qd, "q"), k = Buffer<T>(m, act, BT * kvd, "k"), v = Buffer<T>(m, act, BT * kvd, "v");
  h = Buffer<T>(m, act, d.rows() * C, "h");
  gate = Buffer<T>(m, act, BT * I, "gate"), up = Buffer<T>(m, act, BT * I, "up");
  allocate_recomputable(m, d);
}

template <class T>
void BlockActivations<T>::allocate_recomputable(MemoryTracker* m, const BlockDims& d) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, I = d.I;
  const auto act_cat = MemoryCategory::activations;
  n1 = Buffer<T>(m, act_cat, BT * C, "n1"), rstd1 = Buffer<T>(m, act_cat, d.rows(), "rstd1");
  att = Buffer<T>(m, act_cat, BT * qd, "att"), lse = Buffer<T>(m, act_cat, BT * d.nh, "lse");
  n2 = Buffer<T>(m, act_cat, BT * C, "n2"), rstd2 = Buffer<T>(m, act_cat, d.rows(), "rstd2");
  act = Buffer<T>(m, act_cat, BT * I, "act");
}

template <class T>
void BlockActivations<T>::release_recomputable() {
  for (Buffer<T>* b : {&n1, &rstd1, &att, &lse, &n2, &rstd2, &act}) b->reset();
}

template <class T>
void BlockActivations<T>::reset() {
  release_recomputable();
  for (Buffer<T>* b : {&q, &k, &v, &h, &gate, &up}) b->reset();
}

template <class T>
int64_t BlockActivations<T>::bytes() const {
  int64_t n = 0;
  for (const Buffer<T>* b : {&q, &k, &v, &h, &gate, &up, &n1, &rstd1, &att, &lse, &n2, &rstd2, &act}) n += b->bytes();
  return n;
}

template <class T>
void BlockScratch<T>::allocate(MemoryTracker* m, const BlockDims& d) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;
  const auto s = MemoryCategory::scratch;
  dn = Buffer<T>(m, s, BT * C, "backward dn"), dh = Buffer<T>(m, s, BT * C, "backward dh");
  dq = Buffer<T>(m, s, BT * qd, "backward dq"), dk = Buffer<T>(m, s, BT * kvd, "backward dk");
  dv = Buffer<T>(m, s, BT * kvd, "backward dv"), datt = Buffer<T>(m, s, BT * qd, "backward datt");
  dgate = Buffer<T>(m, s, BT * I, "backward dgate"), dup = Buffer<T>(m, s, BT * I, "backward dup");
  dact = Buffer<T>(m, s, BT * I, "backward dact");
}

template <class T>
void BlockScratch<T>::reset() {
  for (Buffer<T>* b : {&dn, &dh, &dq, &dk, &dv, &datt, &dgate, &dup, &dact, &gk, &gv, &gnorm}) b->reset();
}

namespace {

template <class T>
ops::AttentionShape attention_shape(const BlockDims& d, int64_t pos_start) {
  return {.B = d.B, .Tq = d.T, .Tk = d.T, .nh = d.nh, .nkv = d.nkv, .hd = d.hd, .q_start = pos_start,
          .k_start = pos_start};
}

template <class T>
BlockComm<T>& comm_or_none(BlockComm<T>* comm) {
  static BlockComm<T> none;  // stateless: every point is a no-op
  return comm ? *comm : none;
}

}  // namespace

// With sequence parallelism the block's input x, h and out hold this rank's rows only; a
// row-parallel output is computed for every row into a [B,T,C] temporary and reduce-scattered to
// them. Without it rows() = B*T, row0() = 0 and the temporaries are the final buffers.
template <class T>
void block_forward(T* out, BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                   const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm_ptr, BlockKvCache<T>* cache) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I, rows = d.rows();
  const int64_t mine = d.row0() * C;  // this rank's rows in a [B,T,C] buffer
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  // [B,T,C] for the row-parallel outputs when the residual stream holds fewer rows.
  Buffer<T> partial;
  if (d.sp > 1) partial = Buffer<T>(a.h.memory(), MemoryCategory::scratch, BT * C, "row-parallel output (all rows)");

  // Attention half: n1 = rmsnorm(x); q, k, v projections; RoPE on q and k.
  ops::rmsnorm_forward(a.n1.data() + mine, a.rstd1.data(), x, w.ln1, rows, C, T(d.eps));
  comm.attention_input(a.n1.data(), d);
  ops::matmul_forward(a.q.data(), a.n1.data(), w.wq, BT, C, qd);
  ops::matmul_forward(a.k.data(), a.n1.data(), w.wk, BT, C, kvd);
  ops::matmul_forward(a.v.data(), a.n1.data(), w.wv, BT, C, kvd);
  ops::rope_forward(a.q.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nh, d.hd, pos_start);
  ops::rope_forward(a.k.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nkv, d.hd, pos_start);
  comm.key_value(a.k.data(), a.v.data(), d);

  ops::AttentionShape s = attention_shape<T>(d, pos_start);
  const T* keys = a.k.data();
  const T* values = a.v.data();
  if (cache) {
    // Append this call's keys/values at [len, len + T) of each batch row, attend over all.
    for (int64_t b = 0; b < d.B; ++b) {
      const int64_t src = b * d.T * kvd, dst = (b * cache->max_len + cache->len) * kvd;
      ops::copy(cache->k + dst, a.k.data() + src, d.T * kvd);
      ops::copy(cache->v + dst, a.v.data() + src, d.T * kvd);
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
  T* y = d.sp > 1 ? partial.data() : a.h.data();
  ops::matmul_forward(y, a.att.data(), w.wo, BT, qd, C);
  comm.attention_output(y, d);
  ops::add_forward(a.h.data(), y + mine, x, rows * C);

  // Feed-forward half: out = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h).
  ops::rmsnorm_forward(a.n2.data() + mine, a.rstd2.data(), a.h.data(), w.ln2, rows, C, T(d.eps));
  comm.mlp_input(a.n2.data(), d);
  ops::matmul_forward(a.gate.data(), a.n2.data(), w.wgate, BT, C, I);
  ops::matmul_forward(a.up.data(), a.n2.data(), w.wup, BT, C, I);
  ops::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), BT * I);
  if (!out) return;  // recompute: the backward needs act, not the output
  T* z = d.sp > 1 ? partial.data() : out;
  ops::matmul_forward(z, a.act.data(), w.wdown, BT, I, C);
  comm.mlp_output(z, d);
  ops::add_forward(out, z + mine, a.h.data(), rows * C);
}

template <class T>
void block_recompute_selective(BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                               const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm_ptr) {
  const int64_t BT = d.BT(), C = d.C, I = d.I, rows = d.rows(), mine = d.row0() * C;
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  ops::rmsnorm_forward(a.n1.data() + mine, a.rstd1.data(), x, w.ln1, rows, C, T(d.eps));
  comm.attention_input(a.n1.data(), d);
  ops::attention_forward(a.att.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), attention_shape<T>(d, pos_start));
  ops::rmsnorm_forward(a.n2.data() + mine, a.rstd2.data(), a.h.data(), w.ln2, rows, C, T(d.eps));
  comm.mlp_input(a.n2.data(), d);
  ops::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), BT * I);
}

namespace {

// dinp[rows,C] += RMSNorm backward; the gain's gradient accumulates into g_gain. With sequence
// parallelism this rank's rows give only part of it: it is taken apart and summed over the ranks.
template <class T>
void norm_backward(T* dinp, T* g_gain, const T* dn, const T* inp, const T* gain, const T* rstd, const BlockDims& d,
                   BlockScratch<T>& s, BlockComm<T>& comm) {
  if (d.sp == 1) {
    ops::rmsnorm_backward(dinp, g_gain, dn, inp, gain, rstd, d.rows(), d.C);
    return;
  }
  if (s.gnorm.empty()) s.gnorm = Buffer<T>(s.dn.memory(), MemoryCategory::scratch, d.C, "backward RMSNorm gain grad");
  ops::fill(s.gnorm.data(), T(0), d.C);
  ops::rmsnorm_backward(dinp, s.gnorm.data(), dn, inp, gain, rstd, d.rows(), d.C);
  comm.norm_weight_grads(s.gnorm.data(), d);
  ops::accumulate(g_gain, s.gnorm.data(), d.C);
}

}  // namespace

template <class T>
void block_backward(T* dx, const BlockWeights<T>& g, const T* dout, const BlockActivations<T>& a,
                    const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                    int64_t pos_start, BlockScratch<T>& s, BlockComm<T>* comm_ptr) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I, rows = d.rows();
  const int64_t mine = d.row0() * C;
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  // The residual stream's gradient, this rank's rows of s.dh [B,T,C].
  T* dh = s.dh.data() + mine;

  // Feed-forward half, last op first. The residual passes dout straight to dh.
  ops::copy(dh, dout, rows * C);
  ops::copy(s.dn.data() + mine, dout, rows * C);  // d(mlp output): the down_proj output's gradient
  comm.mlp_output_backward(s.dn.data(), d);
  ops::fill(s.dact.data(), T(0), BT * I);
  ops::matmul_backward(s.dact.data(), g.wdown, s.dn.data(), a.act.data(), w.wdown, BT, I, C);
  ops::fill(s.dgate.data(), T(0), BT * I);
  ops::fill(s.dup.data(), T(0), BT * I);
  ops::swiglu_backward(s.dgate.data(), s.dup.data(), s.dact.data(), a.gate.data(), a.up.data(), BT * I);
  ops::fill(s.dn.data(), T(0), BT * C);
  ops::matmul_backward(s.dn.data(), g.wgate, s.dgate.data(), a.n2.data(), w.wgate, BT, C, I);
  ops::matmul_backward(s.dn.data(), g.wup, s.dup.data(), a.n2.data(), w.wup, BT, C, I);
  comm.mlp_input_backward(s.dn.data(), d);
  norm_backward(dh, g.ln2, s.dn.data() + mine, a.h.data(), w.ln2, a.rstd2.data(), d, s, comm);

  // Attention half. dout is no longer read, so dx may alias it from here on.
  ops::copy(dx, dh, rows * C);
  comm.attention_output_backward(s.dh.data(), d);
  ops::fill(s.datt.data(), T(0), BT * qd);
  ops::matmul_backward(s.datt.data(), g.wo, s.dh.data(), a.att.data(), w.wo, BT, qd, C);
  ops::fill(s.dq.data(), T(0), BT * qd);
  ops::fill(s.dk.data(), T(0), BT * kvd);
  ops::fill(s.dv.data(), T(0), BT * kvd);
  ops::attention_backward(s.dq.data(), s.dk.data(), s.dv.data(), s.datt.data(), a.q.data(), a.k.data(), a.v.data(),
                          a.att.data(), a.lse.data(), attention_shape<T>(d, pos_start));
  comm.key_value_backward(s.dk.data(), s.dv.data(), d);
  ops::rope_backward(s.dq.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nh, d.hd, pos_start);
  ops::rope_backward(s.dk.data(), rope.cos.data(), rope.sin.data(), d.B, d.T, d.nkv, d.hd, pos_start);
  ops::fill(s.dn.data(), T(0), BT * C);
  ops::matmul_backward(s.dn.data(), g.wq, s.dq.data(), a.n1.data(), w.wq, BT, C, qd);
  if (comm.sums_key_value_weight_grads()) {
    // This micro-batch's k/v weight gradients apart, summed over the head's replicas, then added.
    if (s.gk.empty()) {
      s.gk = Buffer<T>(s.dn.memory(), MemoryCategory::scratch, kvd * C, "backward k_proj grad (replicated heads)");
      s.gv = Buffer<T>(s.dn.memory(), MemoryCategory::scratch, kvd * C, "backward v_proj grad (replicated heads)");
    }
    ops::fill(s.gk.data(), T(0), kvd * C);
    ops::fill(s.gv.data(), T(0), kvd * C);
    ops::matmul_backward(s.dn.data(), s.gk.data(), s.dk.data(), a.n1.data(), w.wk, BT, C, kvd);
    ops::matmul_backward(s.dn.data(), s.gv.data(), s.dv.data(), a.n1.data(), w.wv, BT, C, kvd);
    comm.key_value_weight_grads(s.gk.data(), s.gv.data(), d);
    ops::accumulate(g.wk, s.gk.data(), kvd * C);
    ops::accumulate(g.wv, s.gv.data(), kvd * C);
  } else {
    ops::matmul_backward(s.dn.data(), g.wk, s.dk.data(), a.n1.data(), w.wk, BT, C, kvd);
    ops::matmul_backward(s.dn.data(), g.wv, s.dv.data(), a.n1.data(), w.wv, BT, C, kvd);
  }
  comm.attention_input_backward(s.dn.data(), d);
  norm_backward(dx, g.ln1, s.dn.data() + mine, x, w.ln1, a.rstd1.data(), d, s, comm);
}

#define LLAMA4D_BLOCK(T)                                                                                            \
  template BlockWeights<T> block_weights<T>(T*, const BlockDims&);                                                  \
  template struct BlockActivations<T>;                                                                              \
  template struct BlockScratch<T>;                                                                                  \
  template class BlockComm<T>;                                                                                      \
  template void block_forward<T>(T*, BlockActivations<T>&, const BlockWeights<T>&, const T*, const BlockDims&,       \
                                 const RopeTables<T>&, int64_t, BlockComm<T>*, BlockKvCache<T>*);                   \
  template void block_recompute_selective<T>(BlockActivations<T>&, const BlockWeights<T>&, const T*,                \
                                             const BlockDims&, const RopeTables<T>&, int64_t, BlockComm<T>*);       \
  template void block_backward<T>(T*, const BlockWeights<T>&, const T*, const BlockActivations<T>&,                 \
                                  const BlockWeights<T>&, const T*, const BlockDims&, const RopeTables<T>&, int64_t, \
                                  BlockScratch<T>&, BlockComm<T>*);
LLAMA4D_BLOCK(float)
LLAMA4D_BLOCK(double)
#undef LLAMA4D_BLOCK

}  // namespace llama4d
