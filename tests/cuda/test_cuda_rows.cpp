// The row-wise ops on the GPU against the CPU backend: RMSNorm, RoPE, the token embedding (whole
// table and vocabulary-parallel rows) and the cross-entropy (whole vocabulary and the
// vocabulary-parallel pieces). Odd shapes (rows of 33 or 37 elements, and rows longer than a
// block) so every reduction has a ragged tail. Ops that reduce or call exp are held to
// kGpuTolerance; the embedding copies and adds in the CPU's order and must give its bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

using test::DeviceBuffer;
using test::OnGpu;

using Types = ::testing::Types<float, double>;

template <class T>
class CudaRmsNorm : public ::testing::Test {};
TYPED_TEST_SUITE(CudaRmsNorm, Types);
template <class T>
class CudaRope : public ::testing::Test {};
TYPED_TEST_SUITE(CudaRope, Types);
template <class T>
class CudaEmbedding : public ::testing::Test {};
TYPED_TEST_SUITE(CudaEmbedding, Types);
template <class T>
class CudaCrossEntropy : public ::testing::Test {};
TYPED_TEST_SUITE(CudaCrossEntropy, Types);

// Token ids uniform in [0, V), reproducible from the seed.
std::vector<int32_t> tokens_below(int64_t n, int32_t V, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(gen);
  return t;
}

struct RowShape {
  int64_t BT, C;
};

// ---- RMSNorm ----------------------------------------------------------------------------------

TYPED_TEST(CudaRmsNorm, ForwardAndBackwardMatchTheCpu) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const T eps = T(1e-5);
  // A row shorter and longer than a block; rows over three chunks of the weight gradient's sum
  // (128 rows each), the last one partial, and columns over three groups of 32, the last partial.
  for (const RowShape s : {RowShape{7, 33}, RowShape{5, 700}, RowShape{300, 70}}) {
    SCOPED_TRACE("BT=" + std::to_string(s.BT) + " C=" + std::to_string(s.C));
    const size_t n = size_t(s.BT * s.C);
    const auto x = test::random_values<T>(n, 1, -2, 2), w = test::random_values<T>(size_t(s.C), 2, 0.5, 1.5),
               dout = test::random_values<T>(n, 3);
    // The backward accumulates: start both gradients from nonzero values.
    const auto dx0 = test::random_values<T>(n, 4), dw0 = test::random_values<T>(size_t(s.C), 5);
    std::vector<T> y(n), rstd(size_t(s.BT)), dx = dx0, dw = dw0;
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), s.BT, s.C, eps);
    ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), s.BT, s.C);

    OnGpu gpu;
    DeviceBuffer<T> gx(x), gw(w), gdout(dout), gy(static_cast<int64_t>(n)), grstd(s.BT), gdx(dx0), gdw(dw0);
    ops::rmsnorm_forward(gy.data(), grstd.data(), gx.data(), gw.data(), s.BT, s.C, eps);
    test::expect_close(gy.host(), y, "rmsnorm_forward out");
    test::expect_close(grstd.host(), rstd, "rmsnorm_forward rstd");
    ops::rmsnorm_backward(gdx.data(), gdw.data(), gdout.data(), gx.data(), gw.data(), grstd.data(), s.BT, s.C);
    test::expect_close(gdx.host(), dx, "rmsnorm_backward dinp");
    test::expect_close(gdw.host(), dw, "rmsnorm_backward dweight");
  }
}

// Either gradient may be skipped (null) and the other keeps its bits; the same call twice gives the
// same bits (the GPU's run-to-run repeatability).
TYPED_TEST(CudaRmsNorm, SkippedGradientAndRepeatedRunKeepTheBits) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 260, C = 301;  // the weight gradient over three chunks of rows
  const size_t n = size_t(BT * C);
  const auto x = test::random_values<T>(n, 6), w = test::random_values<T>(size_t(C), 7, 0.5, 1.5),
             dout = test::random_values<T>(n, 8), dx0 = test::random_values<T>(n, 9),
             dw0 = test::random_values<T>(size_t(C), 10);
  OnGpu gpu;
  DeviceBuffer<T> gx(x), gw(w), gdout(dout), gy(static_cast<int64_t>(n)), grstd(BT), gy2(static_cast<int64_t>(n)), grstd2(BT);
  ops::rmsnorm_forward(gy.data(), grstd.data(), gx.data(), gw.data(), BT, C, T(1e-6));
  ops::rmsnorm_forward(gy2.data(), grstd2.data(), gx.data(), gw.data(), BT, C, T(1e-6));
  test::expect_bitwise(gy2.host(), gy.host(), "rmsnorm_forward run twice");
  test::expect_bitwise(grstd2.host(), grstd.host(), "rmsnorm_forward rstd run twice");

  DeviceBuffer<T> both_dx(dx0), both_dw(dw0), only_dx(dx0), only_dw(dw0), again_dx(dx0), again_dw(dw0);
  ops::rmsnorm_backward(both_dx.data(), both_dw.data(), gdout.data(), gx.data(), gw.data(), grstd.data(), BT, C);
  ops::rmsnorm_backward(again_dx.data(), again_dw.data(), gdout.data(), gx.data(), gw.data(), grstd.data(), BT, C);
  ops::rmsnorm_backward(only_dx.data(), static_cast<T*>(nullptr), gdout.data(), gx.data(), gw.data(), grstd.data(),
                        BT, C);
  ops::rmsnorm_backward(static_cast<T*>(nullptr), only_dw.data(), gdout.data(), gx.data(), gw.data(), grstd.data(),
                        BT, C);
  test::expect_bitwise(again_dx.host(), both_dx.host(), "rmsnorm_backward dinp run twice");
  test::expect_bitwise(again_dw.host(), both_dw.host(), "rmsnorm_backward dweight run twice");
  test::expect_bitwise(only_dx.host(), both_dx.host(), "rmsnorm_backward dinp alone");
  test::expect_bitwise(only_dw.host(), both_dw.host(), "rmsnorm_backward dweight alone");
}

// ---- RoPE -------------------------------------------------------------------------------------

// Tables [max_pos, hd/2] with the frequencies theta^(-2i/hd), computed in double, rounded to T.
template <class T>
void rope_tables(std::vector<T>& cos, std::vector<T>& sin, int64_t max_pos, int64_t hd) {
  const int64_t half = hd / 2;
  cos.assign(size_t(max_pos * half), T(0));
  sin.assign(size_t(max_pos * half), T(0));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(hd));
      cos[size_t(p * half + i)] = T(std::cos(angle));
      sin[size_t(p * half + i)] = T(std::sin(angle));
    }
}

TYPED_TEST(CudaRope, ForwardAndBackwardMatchTheCpu) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  struct Shape {
    int64_t B, seq, nh, hd, pos_start;
  };
  // hd = 10: half = 5, so pairs do not line up with warps; the second shape spans many blocks.
  for (const Shape s : {Shape{2, 7, 3, 10, 5}, Shape{3, 33, 5, 64, 0}}) {
    SCOPED_TRACE("T=" + std::to_string(s.seq) + " hd=" + std::to_string(s.hd));
    const int64_t max_pos = s.pos_start + s.seq + 3;
    std::vector<T> cos, sin;
    rope_tables(cos, sin, max_pos, s.hd);
    const size_t n = size_t(s.B * s.seq * s.nh * s.hd);
    const auto x = test::random_values<T>(n, 11), dx0 = test::random_values<T>(n, 12);
    auto y = x, dx = dx0;
    ops::rope_forward(y.data(), cos.data(), sin.data(), s.B, s.seq, s.nh, s.hd, s.pos_start);
    ops::rope_backward(dx.data(), cos.data(), sin.data(), s.B, s.seq, s.nh, s.hd, s.pos_start);

    OnGpu gpu;
    DeviceBuffer<T> gcos(cos), gsin(sin), gy(x), gdx(dx0);
    ops::rope_forward(gy.data(), gcos.data(), gsin.data(), s.B, s.seq, s.nh, s.hd, s.pos_start);
    test::expect_close(gy.host(), y, "rope_forward");
    ops::rope_backward(gdx.data(), gcos.data(), gsin.data(), s.B, s.seq, s.nh, s.hd, s.pos_start);
    test::expect_close(gdx.host(), dx, "rope_backward");
    // The backward is the inverse rotation: applied to the forward's output it gives x back.
    ops::rope_backward(gy.data(), gcos.data(), gsin.data(), s.B, s.seq, s.nh, s.hd, s.pos_start);
    test::expect_close(gy.host(), x, "rope_backward undoes rope_forward");
  }
}

// ---- Embedding --------------------------------------------------------------------------------

TYPED_TEST(CudaEmbedding, ForwardAndBackwardAreTheCpuBits) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int32_t V = 5;  // far fewer ids than rows: every id repeats, so row order matters
  // 300 and 600 rows: ids in several pieces of 256; 2,100 columns: past the 2,048 a block holds at once.
  for (const RowShape s : {RowShape{7, 33}, RowShape{300, 70}, RowShape{600, 2100}}) {
    SCOPED_TRACE("BT=" + std::to_string(s.BT) + " C=" + std::to_string(s.C));
    const size_t n = size_t(s.BT * s.C);
    const auto wte = test::random_values<T>(size_t(V * s.C), 13), dout = test::random_values<T>(n, 14),
               dwte0 = test::random_values<T>(size_t(V * s.C), 15);
    const auto tokens = tokens_below(s.BT, V, 16);
    auto skipping = tokens;  // the backward skips negative ids (the CPU treats it as rows [0, max))
    skipping[1] = -1;
    std::vector<T> out(n, T(9)), dwte = dwte0;
    ops::embedding_forward(out.data(), tokens.data(), wte.data(), s.BT, s.C);
    ops::embedding_backward(dwte.data(), dout.data(), skipping.data(), s.BT, s.C);

    OnGpu gpu;
    DeviceBuffer<T> gwte(wte), gdout(dout), gout(std::vector<T>(n, T(9))), gdwte(dwte0);
    DeviceBuffer<int32_t> gtokens(tokens), gskipping(skipping);
    ops::embedding_forward(gout.data(), gtokens.data(), gwte.data(), s.BT, s.C);
    test::expect_bitwise(gout.host(), out, "embedding_forward");
    ops::embedding_backward(gdwte.data(), gdout.data(), gskipping.data(), s.BT, s.C);
    test::expect_bitwise(gdwte.host(), dwte, "embedding_backward");
  }
}

// Vocabulary-parallel rows over an uneven split of [0, V): ids of other slices and a negative id
// give zero rows in the forward (which overwrites) and nothing in the backward (which accumulates).
TYPED_TEST(CudaEmbedding, RowsMatchTheCpuBitsAndAddUpToTheWholeTable) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 37, C = 33;
  const int32_t V = 11;
  const std::vector<int64_t> bounds = {0, 4, V};
  const size_t n = size_t(BT * C);
  const auto wte = test::random_values<T>(size_t(V * C), 17), dout = test::random_values<T>(n, 18),
             dwte0 = test::random_values<T>(size_t(V * C), 19);
  auto tokens = tokens_below(BT, V, 20);
  tokens[2] = -1;
  tokens[3] = 3;  // the last row of the first slice
  tokens[4] = 4;  // the first row of the second
  std::vector<T> whole_out(n), whole_dwte = dwte0;
  auto valid = tokens;
  valid[2] = 0;  // the whole-table forward needs every id in [0, V)
  ops::embedding_forward(whole_out.data(), valid.data(), wte.data(), BT, C);
  ops::embedding_backward(whole_dwte.data(), dout.data(), tokens.data(), BT, C);

  std::vector<T> gpu_sum(n, T(0)), gpu_dwte(size_t(V * C));
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const int64_t begin = bounds[k], rows = bounds[k + 1] - bounds[k];
    SCOPED_TRACE("rows [" + std::to_string(begin) + ", " + std::to_string(begin + rows) + ")");
    const std::vector<T> wte_rows(wte.begin() + begin * C, wte.begin() + (begin + rows) * C);
    const std::vector<T> dshard0(dwte0.begin() + begin * C, dwte0.begin() + (begin + rows) * C);
    std::vector<T> out(n, T(9)), dshard = dshard0;
    ops::embedding_forward_rows(out.data(), tokens.data(), wte_rows.data(), BT, C, begin, rows);
    ops::embedding_backward_rows(dshard.data(), dout.data(), tokens.data(), BT, C, begin, rows);

    std::vector<T> got_out, got_dshard;
    {
      OnGpu gpu;
      DeviceBuffer<T> gwte(wte_rows), gdout(dout), gout(std::vector<T>(n, T(9))), gdshard(dshard0);
      DeviceBuffer<int32_t> gtokens(tokens);
      ops::embedding_forward_rows(gout.data(), gtokens.data(), gwte.data(), BT, C, begin, rows);
      ops::embedding_backward_rows(gdshard.data(), gdout.data(), gtokens.data(), BT, C, begin, rows);
      got_out = gout.host();
      got_dshard = gdshard.host();
    }
    test::expect_bitwise(got_out, out, "embedding_forward_rows");
    test::expect_bitwise(got_dshard, dshard, "embedding_backward_rows");
    for (size_t i = 0; i < n; ++i) gpu_sum[i] += got_out[i];  // the all-reduce, in rank order
    std::copy(got_dshard.begin(), got_dshard.end(), gpu_dwte.begin() + begin * C);
  }
  // Row 2's id is -1: zero in every slice, where the whole-table forward had row 0 for it.
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(gpu_sum[size_t(2 * C + c)], T(0));
    gpu_sum[size_t(2 * C + c)] = whole_out[size_t(2 * C + c)];
  }
  test::expect_bitwise(gpu_sum, whole_out, "embedding_forward_rows summed over the slices");
  test::expect_bitwise(gpu_dwte, whole_dwte, "embedding_backward_rows shards side by side");
}

// ---- Cross-entropy ----------------------------------------------------------------------------

// Targets in [0, V) with every `ignore_every`-th row ignored (-1, and -100 as PyTorch writes it).
std::vector<int32_t> loss_targets(int64_t BT, int32_t V, uint64_t seed) {
  auto t = tokens_below(BT, V, seed);
  for (int64_t r = 1; r < BT; r += 3) t[size_t(r)] = r % 2 ? -1 : -100;
  return t;
}

TYPED_TEST(CudaCrossEntropy, ForwardAndBackwardMatchTheCpu) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  for (const RowShape s : {RowShape{7, 37}, RowShape{9, 1000}}) {  // V shorter and longer than a block
    const int64_t BT = s.BT, V = s.C;
    SCOPED_TRACE("BT=" + std::to_string(BT) + " V=" + std::to_string(V));
    auto logits = test::random_values<T>(size_t(BT * V), 21, -10, 10);
    logits[5] = T(80);  // a large logit: the max is subtracted before exp
    auto targets = loss_targets(BT, int32_t(V), 22);
    targets[0] = 5;  // the row with the large logit, as target
    targets[2] = int32_t(V - 1);
    const T scale = T(1) / T(5);
    const auto dlogits0 = test::random_values<T>(size_t(BT * V), 23);  // the backward accumulates
    std::vector<T> losses(size_t(BT), T(7)), dlogits = dlogits0;
    ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V);
    ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), scale, BT, V);

    OnGpu gpu;
    DeviceBuffer<T> glogits(logits), glosses(std::vector<T>(size_t(BT), T(7))), gdlogits(dlogits0);
    DeviceBuffer<int32_t> gtargets(targets);
    ops::cross_entropy_forward(glosses.data(), glogits.data(), gtargets.data(), BT, V);
    const auto got_losses = glosses.host();
    test::expect_close(got_losses, losses, "cross_entropy_forward");
    ops::cross_entropy_backward(gdlogits.data(), glogits.data(), gtargets.data(), scale, BT, V);
    const auto got = gdlogits.host();
    test::expect_close(got, dlogits, "cross_entropy_backward");
    for (int64_t r = 0; r < BT; ++r) {
      if (targets[size_t(r)] >= 0) continue;
      EXPECT_EQ(got_losses[size_t(r)], T(0)) << "ignored row " << r;
      const std::vector<T> row(got.begin() + r * V, got.begin() + (r + 1) * V);
      const std::vector<T> row0(dlogits0.begin() + r * V, dlogits0.begin() + (r + 1) * V);
      test::expect_bitwise(row, row0, "ignored row " + std::to_string(r) + " keeps its gradient");
    }
  }
}

// A target >= V is the CPU's InputError, with its message, and no output is touched.
TYPED_TEST(CudaCrossEntropy, RejectsTargetsOutsideTheVocabularyLikeTheCpu) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 4, V = 5;
  const auto logits = test::random_values<T>(size_t(BT * V), 24);
  const std::vector<int32_t> targets = {1, -1, 7, 5};  // row 2 is the first bad one
  const auto dlogits0 = test::random_values<T>(size_t(BT * V), 25);
  auto message = [](auto&& op) {
    try {
      op();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  std::vector<T> losses(size_t(BT), T(3)), dlogits = dlogits0;
  const std::string cpu_forward =
      message([&] { ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V); });
  const std::string cpu_backward =
      message([&] { ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), T(1), BT, V); });
  ASSERT_NE(cpu_forward, "no InputError");

  OnGpu gpu;
  DeviceBuffer<T> glogits(logits), glosses(std::vector<T>(size_t(BT), T(3))), gdlogits(dlogits0);
  DeviceBuffer<int32_t> gtargets(targets);
  EXPECT_EQ(message([&] { ops::cross_entropy_forward(glosses.data(), glogits.data(), gtargets.data(), BT, V); }),
            cpu_forward);
  EXPECT_EQ(message([&] {
              ops::cross_entropy_backward(gdlogits.data(), glogits.data(), gtargets.data(), T(1), BT, V);
            }),
            cpu_backward);
  test::expect_bitwise(glosses.host(), std::vector<T>(size_t(BT), T(3)), "losses after a rejected target");
  test::expect_bitwise(gdlogits.host(), dlogits0, "dlogits after a rejected target");
}

// The vocabulary-parallel pieces over two uneven slices of the columns: each piece matches the
// CPU's, and the pieces combined as the all-reduces would (max, then sums in rank order) give the
// whole-vocabulary loss and gradient.
TYPED_TEST(CudaCrossEntropy, VocabularySlicesMatchTheCpuAndTheWholeLoss) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 7, V = 37;
  const std::vector<int64_t> bounds = {0, 20, V};
  const auto logits = test::random_values<T>(size_t(BT * V), 26, -6, 6);
  auto targets = loss_targets(BT, int32_t(V), 27);
  targets[0] = 3;   // in the first slice
  targets[2] = 36;  // the last column, in the second
  targets[3] = 20;  // the first column of the second slice
  const T scale = T(1) / T(3);
  std::vector<T> whole_losses(static_cast<size_t>(BT)), whole_dlogits(size_t(BT * V), T(0));
  ops::cross_entropy_forward(whole_losses.data(), logits.data(), targets.data(), BT, V);
  ops::cross_entropy_backward(whole_dlogits.data(), logits.data(), targets.data(), scale, BT, V);

  const size_t slices = bounds.size() - 1;
  std::vector<std::vector<T>> parts(slices), dparts0(slices);
  for (size_t k = 0; k < slices; ++k) {
    const int64_t begin = bounds[k], width = bounds[k + 1] - begin;
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t j = 0; j < width; ++j) parts[k].push_back(logits[size_t(r * V + begin + j)]);
    dparts0[k] = test::random_values<T>(size_t(BT * width), 28 + k);  // the backward accumulates
  }

  // Runs every piece on the CPU (host vectors) or on the GPU (device copies of them), combining
  // the per-slice statistics on the host as the all-reduces would.
  struct Pieces {
    std::vector<std::vector<T>> row_max, target, sum_exp, dpart;
    std::vector<T> losses, lse;
  };
  auto run = [&](bool on_gpu) {
    Pieces p;
    p.row_max.resize(slices), p.target.resize(slices), p.sum_exp.resize(slices), p.dpart.resize(slices);
    std::vector<T> gmax(static_cast<size_t>(BT)), gtarget(size_t(BT), T(0)), gsum(size_t(BT), T(0));
    auto call = [&](auto&& op, std::vector<std::vector<T>> outs, std::vector<std::vector<T>> ins) {
      // op(outs, ins, targets) gets pointers to the values, or to device copies of them; returns
      // the outputs' values after the call.
      if (!on_gpu) {
        std::vector<T*> o;
        std::vector<const T*> i;
        for (auto& v : outs) o.push_back(v.data());
        for (auto& v : ins) i.push_back(v.data());
        op(o, i, targets.data());
        return outs;
      }
      OnGpu gpu;
      std::vector<std::unique_ptr<DeviceBuffer<T>>> go, gi;
      std::vector<T*> o;
      std::vector<const T*> i;
      for (auto& v : outs) go.push_back(std::make_unique<DeviceBuffer<T>>(v)), o.push_back(go.back()->data());
      for (auto& v : ins) gi.push_back(std::make_unique<DeviceBuffer<T>>(v)), i.push_back(gi.back()->data());
      DeviceBuffer<int32_t> gt(targets);
      op(o, i, gt.data());
      for (size_t k = 0; k < outs.size(); ++k) outs[k] = go[k]->host();
      return outs;
    };
    for (size_t k = 0; k < slices; ++k) {
      const int64_t begin = bounds[k], width = bounds[k + 1] - begin;
      auto got = call(
          [&](auto& o, auto& i, const int32_t* t) {
            ops::vocab_slice_max_and_target(o[0], o[1], i[0], t, BT, width, begin);
          },
          {std::vector<T>(size_t(BT)), std::vector<T>(size_t(BT))}, {parts[k]});
      p.row_max[k] = got[0], p.target[k] = got[1];
      for (int64_t r = 0; r < BT; ++r) {
        gmax[size_t(r)] = k == 0 ? got[0][size_t(r)] : std::max(gmax[size_t(r)], got[0][size_t(r)]);
        gtarget[size_t(r)] += got[1][size_t(r)];
      }
    }
    for (size_t k = 0; k < slices; ++k) {
      const int64_t width = bounds[k + 1] - bounds[k];
      p.sum_exp[k] = call([&](auto& o, auto& i, const int32_t*) { ops::vocab_slice_sum_exp(o[0], i[0], i[1], BT, width); },
                          {std::vector<T>(size_t(BT))}, {parts[k], gmax})[0];
      for (int64_t r = 0; r < BT; ++r) gsum[size_t(r)] += p.sum_exp[k][size_t(r)];
    }
    auto stats = call(
        [&](auto& o, auto& i, const int32_t* t) { ops::cross_entropy_from_stats(o[0], o[1], i[0], i[1], i[2], t, BT); },
        {std::vector<T>(size_t(BT)), std::vector<T>(size_t(BT))}, {gmax, gsum, gtarget});
    p.losses = stats[0], p.lse = stats[1];
    for (size_t k = 0; k < slices; ++k) {
      const int64_t begin = bounds[k], width = bounds[k + 1] - begin;
      p.dpart[k] = call(
          [&](auto& o, auto& i, const int32_t* t) {
            ops::cross_entropy_backward_slice(o[0], i[0], i[1], t, scale, BT, width, begin);
          },
          {dparts0[k]}, {parts[k], p.lse})[0];
    }
    return p;
  };
  const Pieces cpu = run(false), gpu = run(true);
  for (size_t k = 0; k < slices; ++k) {
    SCOPED_TRACE("slice " + std::to_string(k));
    test::expect_bitwise(gpu.row_max[k], cpu.row_max[k], "vocab_slice_max_and_target row_max");
    test::expect_bitwise(gpu.target[k], cpu.target[k], "vocab_slice_max_and_target target_logit");
    test::expect_close(gpu.sum_exp[k], cpu.sum_exp[k], "vocab_slice_sum_exp");
    test::expect_close(gpu.dpart[k], cpu.dpart[k], "cross_entropy_backward_slice");
  }
  test::expect_close(gpu.losses, cpu.losses, "cross_entropy_from_stats losses");
  test::expect_close(gpu.lse, cpu.lse, "cross_entropy_from_stats lse");
  test::expect_close(gpu.losses, whole_losses, "slices' losses against the whole vocabulary's");
  // The slices' gradients (accumulated onto dparts0) less their starting values, side by side,
  // are the whole vocabulary's gradient.
  std::vector<T> assembled(size_t(BT * V));
  for (size_t k = 0; k < slices; ++k) {
    const int64_t begin = bounds[k], width = bounds[k + 1] - begin;
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t j = 0; j < width; ++j)
        assembled[size_t(r * V + begin + j)] = gpu.dpart[k][size_t(r * width + j)] - dparts0[k][size_t(r * width + j)];
  }
  test::expect_close(assembled, whole_dlogits, "slices' gradients against the whole vocabulary's");

  // An empty slice is an error on both backends.
  OnGpu on;
  DeviceBuffer<T> one(BT), two(BT), lg(BT);
  DeviceBuffer<int32_t> gt(targets);
  EXPECT_THROW(ops::vocab_slice_max_and_target(one.data(), two.data(), lg.data(), gt.data(), BT, 0, 0), Error);
}

// The whole-vocabulary loss and gradient run twice on the GPU give the same bits: the reductions'
// order is fixed by the sizes alone.
TYPED_TEST(CudaCrossEntropy, RunTwiceGivesTheSameBits) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 33, V = 2001;
  const auto logits = test::random_values<T>(size_t(BT * V), 30, -8, 8);
  const auto targets = loss_targets(BT, int32_t(V), 31);
  OnGpu gpu;
  DeviceBuffer<T> glogits(logits);
  DeviceBuffer<int32_t> gtargets(targets);
  std::vector<T> losses[2], dlogits[2];
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<T> l(BT), d(BT * V);
    ops::cross_entropy_forward(l.data(), glogits.data(), gtargets.data(), BT, V);
    ops::cross_entropy_backward(d.data(), glogits.data(), gtargets.data(), T(1) / T(BT), BT, V);
    losses[run] = l.host();
    dlogits[run] = d.host();
  }
  test::expect_bitwise(losses[1], losses[0], "cross_entropy_forward run twice");
  test::expect_bitwise(dlogits[1], dlogits[0], "cross_entropy_backward run twice");
}

}  // namespace
}  // namespace llama4d
