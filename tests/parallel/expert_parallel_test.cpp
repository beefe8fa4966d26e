// Expert parallelism (core/parallel/expert_parallel.cpp) on virtual GPUs against one device: on
// every rank the output, the load-balancing loss, the input gradient and the router's gradient
// are bitwise those of one device running that rank's tokens alone, and each held expert's
// weight gradients bitwise those of one device running every rank's tokens back to back; the
// group's per-expert counts equal that device's, and the traffic log's token bytes and the
// activations the forward keeps equal the file's formulas with the rows this test routes itself.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/traffic_labels.h"
#include "core/error.h"
#include "core/parallel/expert_parallel.h"
#include "tests/model/model_test_util.h"

namespace llama4d {
namespace {

template <class T>
std::vector<T> random_values(int64_t n, uint64_t seed, double scale) {
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = T(scale * (2.0 * test::next_uniform(seed) - 1.0));
  return v;
}

template <class T>
Buffer<T> on_backend(MemoryTracker* m, const std::vector<T>& v) {
  Buffer<T> b(m, MemoryCategory::other, int64_t(v.size()));
  ops::device_memcpy(b.data(), v.data(), int64_t(v.size() * sizeof(T)));
  return b;
}

template <class T>
std::vector<T> on_host(const Buffer<T>& b) {
  std::vector<T> v(static_cast<size_t>(b.size()));
  ops::device_memcpy(v.data(), b.data(), b.bytes());
  return v;
}

// One device's run of the whole layer: output, aux loss, counts, dx and every parameter gradient.
template <class T>
struct OneDevice {
  std::vector<T> out, dx, grads;
  std::vector<int64_t> counts;
  double aux = 0.0;
};

template <class T>
OneDevice<T> one_device(const std::vector<T>& x, const std::vector<T>& dout, const std::vector<T>& params, MoeDims d) {
  MemoryTracker m(0, 0);
  d.BT = int64_t(x.size()) / d.C;
  Buffer<T> xb = on_backend(&m, x), db = on_backend(&m, dout), pb = on_backend(&m, params);
  Buffer<T> gb = on_backend(&m, std::vector<T>(params.size(), T(0)));
  Buffer<T> out(&m, MemoryCategory::other, d.BT * d.C), dx(&m, MemoryCategory::other, d.BT * d.C);
  MoeActivations<T> a;
  moe_forward(out.data(), a, moe_weights(pb.data(), d), xb.data(), d, &m);
  moe_backward(dx.data(), moe_weights(gb.data(), d), db.data(), a, moe_weights(pb.data(), d), xb.data(), d, 1.0, &m);
  return {on_host(out), on_host(dx), on_host(gb), a.dispatch.counts, a.aux_loss};
}

template <class T>
void expect_bitwise(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << what;
}

template <class T>
void expect_one_device_bits(int P) {
  const MoeDims base{.BT = 0, .C = 8, .I = 12, .E = 4, .k = 2, .aux_coef = 0.3};
  const int64_t C = base.C, E = base.E, El = E / P, expert_numel = 3 * base.I * C;
  const std::vector<T> params = random_values<T>(moe_numel(base), 99, 0.5);
  // Rank r holds 5 + r tokens (the ranks' batches need not be equal).
  std::vector<std::vector<T>> x(static_cast<size_t>(P)), dout(static_cast<size_t>(P));
  std::vector<T> x_all, dout_all;
  for (int r = 0; r < P; ++r) {
    x[size_t(r)] = random_values<T>((5 + r) * C, 10 + uint64_t(r), 1.0);
    dout[size_t(r)] = random_values<T>((5 + r) * C, 50 + uint64_t(r), 1.0);
    x_all.insert(x_all.end(), x[size_t(r)].begin(), x[size_t(r)].end());
    dout_all.insert(dout_all.end(), dout[size_t(r)].begin(), dout[size_t(r)].end());
  }
  std::vector<OneDevice<T>> alone;
  for (int r = 0; r < P; ++r) alone.push_back(one_device(x[size_t(r)], dout[size_t(r)], params, base));
  const OneDevice<T> together = one_device(x_all, dout_all, params, base);

  std::vector<OneDevice<T>> ranks(static_cast<size_t>(P));
  std::vector<std::vector<int64_t>> global_counts(static_cast<size_t>(P));
  std::vector<int64_t> activation_bytes(static_cast<size_t>(P)), scratch_bytes(static_cast<size_t>(P));
  VirtualClusterOptions o;
  o.ranks = P;
  VirtualCluster cluster(o);
  cluster.run([&](ProcessGroup& ep) {
    const int r = ep.rank();
    MemoryTracker* m = &ep.memory();
    MoeDims d = base;
    d.BT = 5 + r;
    const ExpertShard shard = ExpertShard::of(d, P, r);
    // This rank's parameters: the whole router, then its experts.
    std::vector<T> mine(params.begin(), params.begin() + E * C);
    mine.insert(mine.end(), params.begin() + E * C + shard.first * expert_numel,
                params.begin() + E * C + (shard.first + shard.count) * expert_numel);
    Buffer<T> xb = on_backend(m, x[size_t(r)]), db = on_backend(m, dout[size_t(r)]), pb = on_backend(m, mine);
    Buffer<T> gb = on_backend(m, std::vector<T>(mine.size(), T(0)));
    Buffer<T> out(m, MemoryCategory::other, d.BT * C), dx(m, MemoryCategory::other, d.BT * C);
    MoeActivations<T> a;
    moe_forward_expert_parallel(out.data(), a, moe_weights(pb.data(), d), xb.data(), d, ep, m);
    activation_bytes[size_t(r)] = m->live(MemoryCategory::activations);
    scratch_bytes[size_t(r)] = m->live(MemoryCategory::scratch);
    moe_backward_expert_parallel(dx.data(), moe_weights(gb.data(), d), db.data(), a, moe_weights(pb.data(), d),
                                 xb.data(), d, 1.0, ep, m);
    ranks[size_t(r)] = {on_host(out), on_host(dx), on_host(gb), a.dispatch.counts, a.aux_loss};
    global_counts[size_t(r)] = a.exchange.global_counts;
  });

  for (int r = 0; r < P; ++r) {
    const std::string at = "rank " + std::to_string(r) + " of ep=" + std::to_string(P) + ": ";
    const OneDevice<T>& got = ranks[size_t(r)];
    expect_bitwise(got.out, alone[size_t(r)].out, at + "output");
    expect_bitwise(got.dx, alone[size_t(r)].dx, at + "input gradient");
    EXPECT_EQ(got.aux, alone[size_t(r)].aux) << at << "aux loss";
    EXPECT_EQ(got.counts, alone[size_t(r)].counts) << at << "this rank's routing";
    EXPECT_EQ(global_counts[size_t(r)], together.counts) << at << "the group's counts";
    const std::vector<T>& g = alone[size_t(r)].grads;
    expect_bitwise(std::vector<T>(got.grads.begin(), got.grads.begin() + E * C),
                   std::vector<T>(g.begin(), g.begin() + E * C), at + "router gradient");
    const auto held = together.grads.begin() + E * C + r * El * expert_numel;
    expect_bitwise(std::vector<T>(got.grads.begin() + E * C, got.grads.end()),
                   std::vector<T>(held, held + El * expert_numel), at + "held experts' gradients");

    // Traffic: the rows rank r sends to q are those its routing gives q's experts (counted here from
    // one device's routing of its tokens), C values each, once out and once as gradients.
    int64_t rows_out = 0, rows_back = 0;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      for (int64_t e = q * El; e < (q + 1) * El; ++e) rows_out += alone[size_t(r)].counts[size_t(e)];
      for (int64_t e = r * El; e < (r + 1) * El; ++e) rows_back += alone[size_t(q)].counts[size_t(e)];
    }
    int64_t dispatch = 0, combine = 0, dispatch_grad = 0, combine_grad = 0;
    for (const TrafficRecord& t : cluster.accounting(r).traffic.records()) {
      if (t.label == label::kEpDispatch) dispatch += t.bytes_sent;
      if (t.label == label::kEpCombine) combine += t.bytes_sent;
      if (t.label == label::kEpDispatchGrad) dispatch_grad += t.bytes_sent;
      if (t.label == label::kEpCombineGrad) combine_grad += t.bytes_sent;
    }
    EXPECT_GT(rows_out, 0) << at << "no token left this rank: the exchange went untested";
    const int64_t row_bytes = C * int64_t(sizeof(T));
    // Memory: what the forward keeps is the file's formula, with m the rows this rank's experts
    // received (its own included) and n = BT·k.
    const int64_t n = (5 + r) * base.k, m = rows_back + [&] {
      int64_t own = 0;
      for (int64_t e = r * El; e < (r + 1) * El; ++e) own += alone[size_t(r)].counts[size_t(e)];
      return own;
    }();
    const int64_t values = (E + base.k + base.k * C) * (5 + r) + m * C + 3 * m * base.I;
    EXPECT_EQ(activation_bytes[size_t(r)], values * int64_t(sizeof(T)) + (3 * n + 2 * m) * 4) << at;
    EXPECT_EQ(scratch_bytes[size_t(r)], 0) << at << "the forward's scratch outlived it";
    EXPECT_EQ(dispatch, rows_out * row_bytes) << at;
    EXPECT_EQ(dispatch_grad, rows_out * row_bytes) << at;
    EXPECT_EQ(combine, rows_back * row_bytes) << at;
    EXPECT_EQ(combine_grad, rows_back * row_bytes) << at;
  }
}

TEST(ExpertParallel, Ep2BitwiseWithOneDeviceFp32) { expect_one_device_bits<float>(2); }
TEST(ExpertParallel, Ep4BitwiseWithOneDeviceFp32) { expect_one_device_bits<float>(4); }
TEST(ExpertParallel, Ep2BitwiseWithOneDeviceFp64) { expect_one_device_bits<double>(2); }

TEST(ExpertParallel, EpNotDividingTheExpertsIsRefusedNamingBoth) {
  const MoeDims d{.BT = 4, .C = 8, .I = 12, .E = 4, .k = 2};
  try {
    ExpertShard::of(d, 3, 0);
    FAIL() << "ep=3 over 4 experts was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ep=3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_local_experts=4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ExpertShard::of(d, 2, 1).first, 2);
  EXPECT_EQ(ExpertShard::of(d, 2, 1).count, 2);
}

}  // namespace
}  // namespace llama4d
