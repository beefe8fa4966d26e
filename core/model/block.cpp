#include "core/model/block.h"

#include <string>
#include <utility>

#include "core/error.h"
#include "core/model/bf16_parking.h"
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
  if (d.moe()) {
    w.moe = p;
    return w;
  }
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
  if (!d.moe()) gate = Buffer<T>(m, act, BT * I, "gate"), up = Buffer<T>(m, act, BT * I, "up");
  allocate_recomputable(m, d);
}

template <class T>
void BlockActivations<T>::allocate_recomputable(MemoryTracker* m, const BlockDims& d) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, I = d.I;
  const auto act_cat = MemoryCategory::activations;
  n1 = Buffer<T>(m, act_cat, BT * C, "n1"), rstd1 = Buffer<T>(m, act_cat, d.rows(), "rstd1");
  att = Buffer<T>(m, act_cat, BT * qd, "att"), lse = Buffer<T>(m, act_cat, BT * d.nh, "lse");
  n2 = Buffer<T>(m, act_cat, BT * C, "n2"), rstd2 = Buffer<T>(m, act_cat, d.rows(), "rstd2");
  if (!d.moe()) act = Buffer<T>(m, act_cat, BT * I, "act");
}

template <class T>
void BlockActivations<T>::release_recomputable() {
  for (Buffer<T>* b : {&n1, &rstd1, &att, &lse, &n2, &rstd2, &act}) b->reset();
}

template <class T>
std::array<NamedTensor<T>, 10> BlockActivations<T>::bf16_valued() {
  return {{{&q, "q"}, {&k, "k"}, {&v, "v"}, {&h, "h"}, {&gate, "gate"}, {&up, "up"}, {&n1, "n1"}, {&att, "att"},
           {&n2, "n2"}, {&act, "act"}}};
}

template <class T>
void BlockActivations<T>::park_bf16(MemoryTracker* m) {
  park_all_bf16(bf16_valued(), parked, m);
}

template <class T>
void BlockActivations<T>::unpark_bf16(MemoryTracker* m) {
  unpark_all_bf16(bf16_valued(), parked, m);
}

template <class T>
void BlockActivations<T>::reset() {
  release_recomputable();
  for (Buffer<T>* b : {&q, &k, &v, &h, &gate, &up}) b->reset();
  for (Buffer<bf16>& b : parked) b.reset();
  moe.reset();
}

template <class T>
int64_t BlockActivations<T>::bytes() const {
  int64_t n = 0;
  for (const Buffer<T>* b : {&q, &k, &v, &h, &gate, &up, &n1, &rstd1, &att, &lse, &n2, &rstd2, &act}) n += b->bytes();
  for (const Buffer<bf16>& b : parked) n += b.bytes();
  for (const Buffer<T>* b : {&moe.probs, &moe.weights, &moe.ys, &moe.expert.xs, &moe.expert.h1, &moe.expert.h3,
                             &moe.expert.act})
    n += b->bytes();
  for (const Buffer<int32_t>* b : {&moe.experts, &moe.token, &moe.row}) n += b->bytes();
  return n;
}

template <class T>
void BlockScratch<T>::allocate(MemoryTracker* m, const BlockDims& d) {
  memory = m;
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;
  const auto s = MemoryCategory::scratch;
  dn = Buffer<T>(m, s, BT * C, "backward dn"), dh = Buffer<T>(m, s, BT * C, "backward dh");
  dq = Buffer<T>(m, s, BT * qd, "backward dq"), dk = Buffer<T>(m, s, BT * kvd, "backward dk");
  dv = Buffer<T>(m, s, BT * kvd, "backward dv"), datt = Buffer<T>(m, s, BT * qd, "backward datt");
  if (d.moe()) return;  // the MoE layer's backward allocates its own temporaries
  dgate = Buffer<T>(m, s, BT * I, "backward dgate"), dup = Buffer<T>(m, s, BT * I, "backward dup");
  dact = Buffer<T>(m, s, BT * I, "backward dact");
}

template <class T>
void BlockScratch<T>::allocate_input_pass(MemoryTracker* m, const BlockDims& d) {
  memory = m;
  // Under sequence parallelism, dn: the norms' output gradients of every row, summed before this
  // rank's rows are kept for the weight pass (without it they go straight into what is kept).
  if (d.sp > 1) dn = Buffer<T>(m, MemoryCategory::scratch, d.BT() * d.C, "backward dn");
  datt = Buffer<T>(m, MemoryCategory::scratch, d.BT() * d.nh * d.hd, "backward datt");
  dact = Buffer<T>(m, MemoryCategory::scratch, d.BT() * d.I, "backward dact");
}

template <class T>
void BlockScratch<T>::reset() {
  for (Buffer<T>* b : {&dn, &dh, &dq, &dk, &dv, &datt, &dgate, &dup, &dact, &gk, &gv, &gnorm}) b->reset();
}

template <class T>
void BlockWeightGradInputs<T>::allocate(MemoryTracker* m, const BlockDims& d, const std::string& owner) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I;
  auto buffer = [&](int64_t n, const char* what) {
    return Buffer<T>(m, MemoryCategory::activations, n, "weight-gradient inputs of " + owner + ": " + what);
  };
  ddown = buffer(BT * C, "d(down_proj out)");
  dgate = buffer(BT * I, "d(gate_proj out)"), dup = buffer(BT * I, "d(up_proj out)");
  dn2 = buffer(d.rows() * C, "dn2 (this rank's rows)");
  dattn = buffer(BT * C, "d(o_proj out)");
  dq = buffer(BT * qd, "dq"), dk = buffer(BT * kvd, "dk"), dv = buffer(BT * kvd, "dv");
  dn1 = buffer(d.rows() * C, "dn1 (this rank's rows)");
}

template <class T>
void BlockWeightGradInputs<T>::take_inputs(BlockActivations<T>& a, Buffer<T>& block_input) {
  act = std::move(a.act), n2 = std::move(a.n2), att = std::move(a.att), n1 = std::move(a.n1);
  h = std::move(a.h), rstd2 = std::move(a.rstd2), rstd1 = std::move(a.rstd1), x = std::move(block_input);
}

template <class T>
void BlockWeightGradInputs<T>::reset() {
  for (Buffer<T>* b : {&ddown, &dgate, &dup, &dn2, &dattn, &dq, &dk, &dv, &dn1, &act, &n2, &att, &n1, &h, &rstd2,
                       &x, &rstd1})
    b->reset();
  for (Buffer<bf16>& b : parked) b.reset();
}

template <class T>
int64_t BlockWeightGradInputs<T>::bytes() const {
  int64_t n = 0;
  for (const Buffer<T>* b : {&ddown, &dgate, &dup, &dn2, &dattn, &dq, &dk, &dv, &dn1, &act, &n2, &att, &n1, &h,
                             &rstd2, &x, &rstd1})
    n += b->bytes();
  for (const Buffer<bf16>& b : parked) n += b.bytes();
  return n;
}

namespace {

template <class T>
ops::AttentionShape attention_shape(const BlockDims& d, int64_t pos_start) {
  // Without context parallelism this rank's rows are the whole rows, so d.doc serves queries and keys.
  return {.B = d.B, .Tq = d.seq, .Tk = d.seq, .nh = d.nh, .nkv = d.nkv, .hd = d.hd, .q_start = pos_start,
          .k_start = pos_start, .q_doc = d.doc, .k_doc = d.doc, .operands = d.operands()};
}

template <class T>
BlockComm<T>& comm_or_none(BlockComm<T>* comm) {
  static BlockComm<T> none;  // stateless: every point is a no-op
  return comm ? *comm : none;
}

// RoPE (or its backward) on x [B,T,heads,hd] at each token's true position: pos_start + t, or
// under context parallelism the two chunks' own positions (one call per row and chunk).
template <class T>
void rope_at_positions(T* x, int64_t heads, const BlockDims& d, const RopeTables<T>& rope, int64_t pos_start,
                       bool backward) {
  auto apply = [&](T* p, int64_t B, int64_t seq, int64_t start) {
    if (start < 0 || start + seq > rope.max_pos)
      throw Error("RoPE: positions [" + std::to_string(start) + ", " + std::to_string(start + seq) +
                  ") are outside the tables' " + std::to_string(rope.max_pos));
    if (backward)
      ops::rope_backward(p, rope.cos.data(), rope.sin.data(), B, seq, heads, d.hd, start);
    else
      ops::rope_forward(p, rope.cos.data(), rope.sin.data(), B, seq, heads, d.hd, start);
  };
  if (d.cp == 1) return apply(x, d.B, d.seq, pos_start);
  const int64_t c = d.cp_chunk(), row = heads * d.hd;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t part = 0; part < 2; ++part) apply(x + (b * d.seq + part * c) * row, 1, c, d.cp_part_start(part));
}

// att, lse = causal attention of a.q over a.k, a.v: local, or through the context-parallel point.
template <class T>
void attend(BlockActivations<T>& a, const BlockDims& d, int64_t pos_start, BlockComm<T>& comm) {
  if (d.cp > 1)
    comm.attention(a.att.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), d);
  else
    ops::attention_forward(a.att.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), attention_shape<T>(d, pos_start));
  round_if_bf16(a.att.data(), a.att.size(), d.bf16);
}

// The mixture of experts' half: out[BT,C] = h + moe(n2) (out null, a recompute: the layer's
// activations only, its output into a temporary), the layer through comm's moe point. No
// sequence or tensor parallelism, no bf16 rounding (refused by the model before it gets here).
template <class T>
void moe_block_forward(T* out, BlockActivations<T>& a, const BlockWeights<T>& w, const BlockDims& d,
                       BlockComm<T>& comm) {
  if (d.sp > 1 || d.bf16)
    throw Error("block: a mixture-of-experts layer runs without sequence parallelism and bf16 so far");
  const MoeDims md = d.moe_dims();
  MemoryTracker* memory = a.h.memory();
  Buffer<T> y(memory, MemoryCategory::scratch, md.BT * md.C, "MoE layer output");
  comm.moe(y.data(), a.moe, moe_weights(w.moe, md), a.n2.data(), md, memory);
  if (out) ops::add_forward(out, y.data(), a.h.data(), md.BT * md.C);
}

}  // namespace

template <class T>
void BlockComm<T>::attention(T*, T*, const T*, const T*, const T*, const BlockDims& d) {
  throw Error("block: context parallelism (cp=" + std::to_string(d.cp) + ") needs a communication that implements attention");
}

template <class T>
void BlockComm<T>::attention_backward(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,
                                      const BlockDims& d) {
  throw Error("block: context parallelism (cp=" + std::to_string(d.cp) + ") needs a communication that implements attention");
}

// With sequence parallelism the block's input x, h and out hold this rank's rows only; a
// row-parallel output is computed for every row into a [B,T,C] temporary and reduce-scattered to
// them. Without it rows() = B*T, row0() = 0 and the temporaries are the final buffers.
template <class T>
void block_forward(T* out, BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                   const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm_ptr, BlockKvCache<T>* cache) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I, rows = d.rows();
  const int64_t mine = d.row0() * C;  // this rank's rows in a [B,T,C] buffer
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  if (cache && d.cp > 1) throw Error("block: a KV cache runs without context parallelism");
  // [B,T,C] for the row-parallel outputs when the residual stream holds fewer rows.
  Buffer<T> partial;
  if (d.sp > 1) partial = Buffer<T>(a.h.memory(), MemoryCategory::scratch, BT * C, "row-parallel output (all rows)");

  // Attention half: n1 = rmsnorm(x); q, k, v projections; RoPE on q and k.
  ops::rmsnorm_forward(a.n1.data() + mine, a.rstd1.data(), x, w.ln1, rows, C, T(d.eps));
  round_if_bf16(a.n1.data() + mine, rows * C, d.bf16);
  comm.attention_input(a.n1.data(), d);
  ops::matmul_forward(a.q.data(), a.n1.data(), w.wq, BT, C, qd, d.operands());
  ops::matmul_forward(a.k.data(), a.n1.data(), w.wk, BT, C, kvd, d.operands());
  ops::matmul_forward(a.v.data(), a.n1.data(), w.wv, BT, C, kvd, d.operands());
  for (Buffer<T>* p : {&a.q, &a.k, &a.v}) round_if_bf16(p->data(), p->size(), d.bf16);
  rope_at_positions(a.q.data(), d.nh, d, rope, pos_start, false);
  rope_at_positions(a.k.data(), d.nkv, d, rope, pos_start, false);
  for (Buffer<T>* p : {&a.q, &a.k}) round_if_bf16(p->data(), p->size(), d.bf16);
  ops::AttentionShape s = attention_shape<T>(d, pos_start);
  const T* keys = a.k.data();
  const T* values = a.v.data();
  if (cache) {
    if (d.doc) throw Error("block_forward: decoding with a KV cache takes no document mask");
    // Append this call's keys/values at [len, len + T) of each batch row, attend over all.
    for (int64_t b = 0; b < d.B; ++b) {
      const int64_t src = b * d.seq * kvd, dst = (b * cache->max_len + cache->len) * kvd;
      ops::copy(cache->k + dst, a.k.data() + src, d.seq * kvd);
      ops::copy(cache->v + dst, a.v.data() + src, d.seq * kvd);
    }
    s.Tk = cache->len + d.seq;
    s.k_start = 0;
    s.q_start = cache->len;
    s.kv_batch_stride = cache->max_len * kvd;
    keys = cache->k;
    values = cache->v;
    ops::attention_forward(a.att.data(), a.lse.data(), a.q.data(), keys, values, s);
    round_if_bf16(a.att.data(), a.att.size(), d.bf16);
  } else {
    attend(a, d, pos_start, comm);
  }

  // h = x + o_proj(att)
  T* y = d.sp > 1 ? partial.data() : a.h.data();
  ops::matmul_forward(y, a.att.data(), w.wo, BT, qd, C, d.operands());
  comm.attention_output(y, d);
  round_if_bf16(y + mine, rows * C, d.bf16);
  ops::add_forward(a.h.data(), y + mine, x, rows * C);
  round_if_bf16(a.h.data(), rows * C, d.bf16);

  // Feed-forward half: out = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h).
  ops::rmsnorm_forward(a.n2.data() + mine, a.rstd2.data(), a.h.data(), w.ln2, rows, C, T(d.eps));
  round_if_bf16(a.n2.data() + mine, rows * C, d.bf16);
  if (d.moe()) {
    moe_block_forward(out, a, w, d, comm);
    return;
  }
  comm.mlp_input(a.n2.data(), d);
  ops::matmul_forward(a.gate.data(), a.n2.data(), w.wgate, BT, C, I, d.operands());
  ops::matmul_forward(a.up.data(), a.n2.data(), w.wup, BT, C, I, d.operands());
  for (Buffer<T>* p : {&a.gate, &a.up}) round_if_bf16(p->data(), p->size(), d.bf16);
  ops::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), BT * I);
  round_if_bf16(a.act.data(), BT * I, d.bf16);
  if (!out) return;  // recompute: the backward needs act, not the output
  T* z = d.sp > 1 ? partial.data() : out;
  ops::matmul_forward(z, a.act.data(), w.wdown, BT, I, C, d.operands());
  comm.mlp_output(z, d);
  round_if_bf16(z + mine, rows * C, d.bf16);
  ops::add_forward(out, z + mine, a.h.data(), rows * C);
  round_if_bf16(out, rows * C, d.bf16);
}

template <class T>
void block_recompute_selective(BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                               const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm_ptr) {
  const int64_t BT = d.BT(), C = d.C, I = d.I, rows = d.rows(), mine = d.row0() * C;
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  ops::rmsnorm_forward(a.n1.data() + mine, a.rstd1.data(), x, w.ln1, rows, C, T(d.eps));
  round_if_bf16(a.n1.data() + mine, rows * C, d.bf16);
  comm.attention_input(a.n1.data(), d);
  attend(a, d, pos_start, comm);
  ops::rmsnorm_forward(a.n2.data() + mine, a.rstd2.data(), a.h.data(), w.ln2, rows, C, T(d.eps));
  round_if_bf16(a.n2.data() + mine, rows * C, d.bf16);
  if (d.moe()) return;  // the MoE layer's activations are kept, not recomputed
  comm.mlp_input(a.n2.data(), d);
  ops::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), BT * I);
  round_if_bf16(a.act.data(), BT * I, d.bf16);
}

namespace {

// dinp[rows,C] += RMSNorm backward; the gain's gradient accumulates into g_gain. Either may be
// null (the input and weight passes of a split backward; gain is read only for dinp). With
// sequence parallelism this rank's rows give only part of the gain's gradient: it is taken apart
// and summed over the ranks.
template <class T>
void norm_backward(T* dinp, T* g_gain, const T* dn, const T* inp, const T* gain, const T* rstd, const BlockDims& d,
                   BlockScratch<T>& s, BlockComm<T>& comm) {
  if (d.sp == 1 || !g_gain) {
    ops::rmsnorm_backward(dinp, g_gain, dn, inp, gain, rstd, d.rows(), d.C);
    return;
  }
  if (s.gnorm.empty()) s.gnorm = Buffer<T>(s.memory, MemoryCategory::scratch, d.C, "backward RMSNorm gain grad");
  ops::fill(s.gnorm.data(), T(0), d.C);
  ops::rmsnorm_backward(dinp, s.gnorm.data(), dn, inp, gain, rstd, d.rows(), d.C);
  comm.norm_weight_grads(s.gnorm.data(), d);
  ops::accumulate(g_gain, s.gnorm.data(), d.C);
}

// The k and v projections' backward: dn[B,T,C] += dk @ wk + dv @ wv (dn null: skipped);
// g.wk, g.wv += their weight gradients (null: skipped; w.wk, w.wv are read only for dn).
template <class T>
void key_value_projection_backward(T* dn, const BlockWeights<T>& g, const T* dk, const T* dv, const T* n1,
                                   const BlockWeights<T>& w, const BlockDims& d, BlockScratch<T>& s,
                                   BlockComm<T>& comm) {
  const int64_t BT = d.BT(), C = d.C, kvd = d.nkv * d.hd;
  if (!g.wk || !comm.sums_key_value_weight_grads()) {
    ops::matmul_backward(dn, g.wk, dk, n1, w.wk, BT, C, kvd, d.operands());
    ops::matmul_backward(dn, g.wv, dv, n1, w.wv, BT, C, kvd, d.operands());
    return;
  }
  // This micro-batch's k/v weight gradients apart, summed over the head's replicas, then added.
  if (s.gk.empty()) {
    s.gk = Buffer<T>(s.memory, MemoryCategory::scratch, kvd * C, "backward k_proj grad (replicated heads)");
    s.gv = Buffer<T>(s.memory, MemoryCategory::scratch, kvd * C, "backward v_proj grad (replicated heads)");
  }
  ops::fill(s.gk.data(), T(0), kvd * C);
  ops::fill(s.gv.data(), T(0), kvd * C);
  ops::matmul_backward(dn, s.gk.data(), dk, n1, w.wk, BT, C, kvd, d.operands());
  ops::matmul_backward(dn, s.gv.data(), dv, n1, w.wv, BT, C, kvd, d.operands());
  comm.key_value_weight_grads(s.gk.data(), s.gv.data(), d);
  ops::accumulate(g.wk, s.gk.data(), kvd * C);
  ops::accumulate(g.wv, s.gv.data(), kvd * C);
}

// Where a block's backward computes the gradients of its matmul and norm outputs. The full
// backward consumes each at once, so they share scratch (dn serves d(down out), dn2 and dn1 in
// turn); the input pass keeps them for the weight pass, each in its own buffer.
// The input pass also keeps this rank's rows of dn2 and dn1 (kept_dn2, kept_dn1; null: not kept).
template <class T>
struct BlockGradBuffers {
  T *ddown, *dact, *dgate, *dup, *dn2, *dh, *datt, *dq, *dk, *dv, *dn1;
  T *kept_dn2 = nullptr, *kept_dn1 = nullptr;
};

// block_backward with the weight gradients g (all null: the input pass, none computed).
template <class T>
void block_backward_into(T* dx, const BlockWeights<T>& g, const BlockGradBuffers<T>& b, const T* dout,
                         const BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                         const RopeTables<T>& rope, int64_t pos_start, BlockScratch<T>& s, BlockComm<T>& comm) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, kvd = d.nkv * d.hd, I = d.I, rows = d.rows();
  const int64_t mine = d.row0() * C;
  // The residual stream's gradient, this rank's rows of b.dh [B,T,C].
  T* dh = b.dh + mine;

  // Feed-forward half, last op first. The residual passes dout straight to dh.
  ops::copy(dh, dout, rows * C);
  if (d.moe()) {
    // The MoE layer's input gradient into its own temporary: b.dn2 may share b.ddown's buffer.
    if (!g.ln1 && !g.wq) throw Error("block: a mixture-of-experts layer has no split (input/weight) backward yet");
    const MoeDims md = d.moe_dims();
    Buffer<T> dn2(s.memory, MemoryCategory::scratch, BT * C, "backward MoE input gradient");
    comm.moe_backward(dn2.data(), moe_weights(g.moe, md), dout, a.moe, moe_weights(w.moe, md), a.n2.data(), md,
                      d.aux_scale, s.memory);
    norm_backward(dh, g.ln2, dn2.data(), a.h.data(), w.ln2, a.rstd2.data(), d, s, comm);
  } else {
    ops::copy(b.ddown + mine, dout, rows * C);  // d(mlp output): the down_proj output's gradient
    comm.mlp_output_backward(b.ddown, d);
    // An input gradient's first source writes over its buffer (GradWrite::overwrite), later ones
    // add: no buffer is zeroed first.
    ops::matmul_backward(b.dact, g.wdown, b.ddown, a.act.data(), w.wdown, BT, I, C, d.operands(),
                         ops::GradWrite::overwrite);
    round_if_bf16(b.dact, BT * I, d.bf16);
    ops::swiglu_backward(b.dgate, b.dup, b.dact, a.gate.data(), a.up.data(), BT * I);
    round_if_bf16(b.dgate, BT * I, d.bf16);
    round_if_bf16(b.dup, BT * I, d.bf16);
    ops::matmul_backward(b.dn2, g.wgate, b.dgate, a.n2.data(), w.wgate, BT, C, I, d.operands(),
                         ops::GradWrite::overwrite);
    ops::matmul_backward(b.dn2, g.wup, b.dup, a.n2.data(), w.wup, BT, C, I, d.operands());
    comm.mlp_input_backward(b.dn2, d);
    round_if_bf16(b.dn2 + mine, rows * C, d.bf16);
    if (b.kept_dn2) ops::copy(b.kept_dn2, b.dn2 + mine, rows * C);
    norm_backward(dh, g.ln2, b.dn2 + mine, a.h.data(), w.ln2, a.rstd2.data(), d, s, comm);
  }
  round_if_bf16(dh, rows * C, d.bf16);

  // Attention half. dout is no longer read, so dx may alias it from here on.
  ops::copy(dx, dh, rows * C);
  comm.attention_output_backward(b.dh, d);
  ops::matmul_backward(b.datt, g.wo, b.dh, a.att.data(), w.wo, BT, qd, C, d.operands(),
                       ops::GradWrite::overwrite);
  round_if_bf16(b.datt, BT * qd, d.bf16);
  ops::fill(b.dq, T(0), BT * qd);
  ops::fill(b.dk, T(0), BT * kvd);
  ops::fill(b.dv, T(0), BT * kvd);
  if (d.cp > 1)
    comm.attention_backward(b.dq, b.dk, b.dv, b.datt, a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.lse.data(), d);
  else
    ops::attention_backward(b.dq, b.dk, b.dv, b.datt, a.q.data(), a.k.data(), a.v.data(), a.att.data(),
                            a.lse.data(), attention_shape<T>(d, pos_start));
  round_if_bf16(b.dq, BT * qd, d.bf16);
  round_if_bf16(b.dk, BT * kvd, d.bf16);
  round_if_bf16(b.dv, BT * kvd, d.bf16);
  rope_at_positions(b.dq, d.nh, d, rope, pos_start, true);
  rope_at_positions(b.dk, d.nkv, d, rope, pos_start, true);
  round_if_bf16(b.dq, BT * qd, d.bf16);
  round_if_bf16(b.dk, BT * kvd, d.bf16);
  ops::matmul_backward(b.dn1, g.wq, b.dq, a.n1.data(), w.wq, BT, C, qd, d.operands(),
                       ops::GradWrite::overwrite);
  key_value_projection_backward(b.dn1, g, b.dk, b.dv, a.n1.data(), w, d, s, comm);
  comm.attention_input_backward(b.dn1, d);
  round_if_bf16(b.dn1 + mine, rows * C, d.bf16);
  if (b.kept_dn1) ops::copy(b.kept_dn1, b.dn1 + mine, rows * C);
  norm_backward(dx, g.ln1, b.dn1 + mine, x, w.ln1, a.rstd1.data(), d, s, comm);
  round_if_bf16(dx, rows * C, d.bf16);
}

}  // namespace

template <class T>
void block_backward(T* dx, const BlockWeights<T>& g, const T* dout, const BlockActivations<T>& a,
                    const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                    int64_t pos_start, BlockScratch<T>& s, BlockComm<T>* comm) {
  const BlockGradBuffers<T> b{.ddown = s.dn.data(), .dact = s.dact.data(), .dgate = s.dgate.data(),
                              .dup = s.dup.data(), .dn2 = s.dn.data(), .dh = s.dh.data(), .datt = s.datt.data(),
                              .dq = s.dq.data(), .dk = s.dk.data(), .dv = s.dv.data(), .dn1 = s.dn.data()};
  block_backward_into(dx, g, b, dout, a, w, x, d, rope, pos_start, s, comm_or_none(comm));
}

template <class T>
void block_backward_input(T* dx, BlockWeightGradInputs<T>& keep, const T* dout, const BlockActivations<T>& a,
                          const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                          int64_t pos_start, BlockScratch<T>& s, BlockComm<T>* comm) {
  const bool sp = d.sp > 1;  // dn2, dn1 summed in scratch over every row, then this rank's kept
  const BlockGradBuffers<T> b{.ddown = keep.ddown.data(), .dact = s.dact.data(), .dgate = keep.dgate.data(),
                              .dup = keep.dup.data(), .dn2 = sp ? s.dn.data() : keep.dn2.data(),
                              .dh = keep.dattn.data(), .datt = s.datt.data(), .dq = keep.dq.data(),
                              .dk = keep.dk.data(), .dv = keep.dv.data(), .dn1 = sp ? s.dn.data() : keep.dn1.data(),
                              .kept_dn2 = sp ? keep.dn2.data() : nullptr, .kept_dn1 = sp ? keep.dn1.data() : nullptr};
  block_backward_into(dx, BlockWeights<T>{}, b, dout, a, w, x, d, rope, pos_start, s, comm_or_none(comm));
}

template <class T>
void block_backward_weight(const BlockWeights<T>& g, const BlockWeightGradInputs<T>& in, const BlockDims& d,
                           BlockScratch<T>& s, BlockComm<T>* comm_ptr) {
  const int64_t BT = d.BT(), C = d.C, qd = d.nh * d.hd, I = d.I;
  BlockComm<T>& comm = comm_or_none(comm_ptr);
  const BlockWeights<T> none{};  // no input gradient: the parameters are not read
  // block_backward's weight-gradient calls, in its order.
  ops::matmul_backward<T>(nullptr, g.wdown, in.ddown.data(), in.act.data(), nullptr, BT, I, C, d.operands());
  ops::matmul_backward<T>(nullptr, g.wgate, in.dgate.data(), in.n2.data(), nullptr, BT, C, I, d.operands());
  ops::matmul_backward<T>(nullptr, g.wup, in.dup.data(), in.n2.data(), nullptr, BT, C, I, d.operands());
  norm_backward<T>(nullptr, g.ln2, in.dn2.data(), in.h.data(), nullptr, in.rstd2.data(), d, s, comm);
  ops::matmul_backward<T>(nullptr, g.wo, in.dattn.data(), in.att.data(), nullptr, BT, qd, C, d.operands());
  ops::matmul_backward<T>(nullptr, g.wq, in.dq.data(), in.n1.data(), nullptr, BT, C, qd, d.operands());
  key_value_projection_backward<T>(nullptr, g, in.dk.data(), in.dv.data(), in.n1.data(), none, d, s, comm);
  norm_backward<T>(nullptr, g.ln1, in.dn1.data(), in.x.data(), nullptr, in.rstd1.data(), d, s, comm);
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
  template struct BlockWeightGradInputs<T>;                                                                          \
  template void block_backward<T>(T*, const BlockWeights<T>&, const T*, const BlockActivations<T>&,                 \
                                  const BlockWeights<T>&, const T*, const BlockDims&, const RopeTables<T>&, int64_t, \
                                  BlockScratch<T>&, BlockComm<T>*);                                                 \
  template void block_backward_input<T>(T*, BlockWeightGradInputs<T>&, const T*, const BlockActivations<T>&,        \
                                        const BlockWeights<T>&, const T*, const BlockDims&, const RopeTables<T>&,   \
                                        int64_t, BlockScratch<T>&, BlockComm<T>*);                                  \
  template void block_backward_weight<T>(const BlockWeights<T>&, const BlockWeightGradInputs<T>&, const BlockDims&, \
                                         BlockScratch<T>&, BlockComm<T>*);
LLAMA4D_BLOCK(float)
LLAMA4D_BLOCK(double)
#undef LLAMA4D_BLOCK

}  // namespace llama4d
