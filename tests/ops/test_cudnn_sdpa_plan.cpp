// The CUDA backend's fast attention as cuDNN sees it (backends/cuda/cudnn_sdpa_plan.h), checked on
// the CPU: a stand-in executes a plan with the semantics the cuDNN frontend documents for its
// scaled-dot-product attention (each tensor read through its [b, h, s, d] dims and strides,
// query head h reading key head h / (h_q / h_k), scores scaled by attn_scale, the causal mask
// keeping key j <= query i, Stats the natural-log log-sum-exp of each scaled row), never reading
// past a buffer, and the result must be the CPU backend's attention_forward (out and lse) in
// fp64 within 1e-6 (the plan's scale is cuDNN's fp32 attn_scale; a wrong stride or head is off by
// O(1)), on grouped-query heads and a KV cache's batch stride.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cudnn_sdpa_plan.h"
#include "core/ops.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

using cuda::SdpaPlan;
using cuda::SdpaTensor;

// Offset of element (b, h, s, d), checked to lie inside `size` elements.
int64_t at(const SdpaTensor& t, int64_t b, int64_t h, int64_t s, int64_t d, size_t size, const char* name) {
  const int64_t i = b * t.stride[0] + h * t.stride[1] + s * t.stride[2] + d * t.stride[3];
  if (i < 0 || size_t(i) >= size) throw std::out_of_range(std::string(name) + ": the plan reaches past the buffer");
  return i;
}

// cuDNN's SDPA forward as documented, in fp64 on the CPU.
void run_plan_on_cpu(const SdpaPlan& p, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, std::vector<double>& o, std::vector<double>& stats) {
  const int64_t B = p.q.dim[0], hq = p.q.dim[1], sq = p.q.dim[2], hd = p.q.dim[3];
  const int64_t hk = p.k.dim[1], skv = p.k.dim[2];
  for (const SdpaTensor* t : {&p.k, &p.v})
    if (t->dim[0] != B || t->dim[3] != hd) throw std::invalid_argument("k, v: batch or head dim differ from q's");
  if (p.v.dim[1] != hk || p.v.dim[2] != skv) throw std::invalid_argument("v: heads or rows differ from k's");
  if (hq % hk != 0) throw std::invalid_argument("h_q is not a multiple of h_k");
  for (int i = 0; i < 4; ++i)
    if (p.o.dim[i] != p.q.dim[i]) throw std::invalid_argument("o: dims differ from q's");
  if (p.stats.dim[0] != B || p.stats.dim[1] != hq || p.stats.dim[2] != sq || p.stats.dim[3] != 1)
    throw std::invalid_argument("stats: dims are not [b, h_q, s_q, 1]");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hk);
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t n = p.causal_top_left ? std::min(skv, i + 1) : skv;
        std::vector<double> score(n);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d)
            dot += q[at(p.q, b, h, i, d, q.size(), "q")] * k[at(p.k, b, g, j, d, k.size(), "k")];
          score[j] = dot * double(p.scale);
          max = std::max(max, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(score[j] - max);
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += std::exp(score[j] - max) / sum * v[at(p.v, b, g, j, d, v.size(), "v")];
          o[at(p.o, b, h, i, d, o.size(), "o")] = acc;
        }
        stats[at(p.stats, b, h, i, 0, stats.size(), "stats")] = max + std::log(sum);
      }
    }
}

ops::AttentionShape shape(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t kv_batch_stride = 0) {
  ops::AttentionShape s;
  s.B = B, s.Tq = T, s.Tk = T, s.nh = nh, s.nkv = nkv, s.hd = hd, s.kv_batch_stride = kv_batch_stride;
  s.operands = ops::GemmOperands::bf16;
  return s;
}

// The plan run by the stand-in against the CPU backend's attention on the same inputs.
void expect_cpu_attention(const ops::AttentionShape& s) {
  ASSERT_EQ(cuda::sdpa_refusal(s), "");
  const int64_t kv = s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd;
  const std::vector<double> q = random_vector(s.B * s.Tq * s.nh * s.hd, 1, -2, 2);
  const std::vector<double> k = random_vector(s.B * kv, 2, -2, 2), v = random_vector(s.B * kv, 3);
  std::vector<double> out(q.size()), lse(s.B * s.nh * s.Tq), o(q.size()), stats(lse.size());
  ops::AttentionShape fp64 = s;
  fp64.operands = ops::GemmOperands::as_stored;
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), fp64);
  // The plan's scale is fp32's 1/sqrt(hd) (exact for hd = 16 and 64, not for 8): scores differ
  // from the fp64 backend's by about 1e-8 relative.
  run_plan_on_cpu(cuda::plan_sdpa(s), q, k, v, o, stats);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(o[i], out[i], 1e-6) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(stats[i], lse[i], 1e-6) << "lse " << i;
}

TEST(CudnnSdpaPlan, GivesTheCpuAttentionOnGroupedHeads) { expect_cpu_attention(shape(2, 7, 4, 2, 8)); }
TEST(CudnnSdpaPlan, GivesTheCpuAttentionWithOneKeyHead) { expect_cpu_attention(shape(1, 5, 3, 1, 16)); }
// Batch items of a KV cache further apart than Tk * nkv * hd.
TEST(CudnnSdpaPlan, GivesTheCpuAttentionOnACacheStride) { expect_cpu_attention(shape(2, 6, 4, 2, 8, 2 * 6 * 2 * 8)); }

TEST(CudnnSdpaPlan, ScaleIsOneOverSqrtHeadDim) {
  EXPECT_EQ(cuda::plan_sdpa(shape(1, 4, 2, 2, 64)).scale, 0.125f);
}

TEST(CudnnSdpaPlan, RefusesWhatCudnnCannotExpress) {
  ops::AttentionShape s = shape(1, 4, 2, 2, 64);
  EXPECT_EQ(cuda::sdpa_refusal(s), "");
  ops::AttentionShape fp32 = s;
  fp32.operands = ops::GemmOperands::as_stored;
  EXPECT_EQ(cuda::sdpa_refusal(fp32), "operands are not bf16 values");
  const int32_t ids[4] = {0, 0, 1, 1};
  ops::AttentionShape docs = s;
  docs.q_doc = docs.k_doc = ids;
  EXPECT_EQ(cuda::sdpa_refusal(docs), "document mask");
  ops::AttentionShape chunk = s;
  chunk.q_start = 4;
  EXPECT_EQ(cuda::sdpa_refusal(chunk), "query and key rows start at different positions");
  EXPECT_NE(cuda::sdpa_refusal(shape(1, 4, 2, 2, 12)), "");
  EXPECT_NE(cuda::sdpa_refusal(shape(1, 4, 2, 2, 136)), "");
  EXPECT_EQ(cuda::sdpa_refusal(shape(1, 4, 2, 2, 128)), "");
}

TEST(CudnnSdpaPlan, KeysTellShapesAndDirectionsApart) {
  const SdpaPlan a = cuda::plan_sdpa(shape(2, 7, 4, 2, 8)), b = cuda::plan_sdpa(shape(2, 7, 4, 1, 8));
  EXPECT_NE(cuda::sdpa_plan_key(a, false), cuda::sdpa_plan_key(b, false));
  EXPECT_NE(cuda::sdpa_plan_key(a, false), cuda::sdpa_plan_key(a, true));
  EXPECT_EQ(cuda::sdpa_plan_key(a, true), cuda::sdpa_plan_key(cuda::plan_sdpa(shape(2, 7, 4, 2, 8)), true));
}

}  // namespace
}  // namespace llama4d::test
