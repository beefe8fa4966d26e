// The backward split into its input and weight passes (zero-bubble pipeline schedules) under
// tensor parallelism, with and without sequence parallelism, with key/value heads split (tp=2) and
// replicated (tp=3): each rank's gradients, after three micro-batches in ZB-H1's order, are
// bitwise those of the whole backward on that rank. The communication points move between the
// passes (the norm gains' and replicated k/v weight gradients' sums go with the weight pass), so
// this also checks every rank makes the same calls in the same order (a mismatch deadlocks or
// mixes tensors).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/model/llama.h"
#include "core/model/tp_layout.h"
#include "core/ops.h"
#include "core/parallel/tensor_parallel.h"

namespace llama4d {
namespace {

LlamaConfig tp_config() {
  LlamaConfig c = LlamaConfig::preset("tiny");  // vocabulary 264
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 64;
  return c;
}

// Each rank's flat gradients after forward + backward of three micro-batches, whole or split in
// the order input(0), input(1), weight(0), input(2), weight(1), weight(2).
std::vector<std::vector<double>> rank_grads(int tp, bool sp, const char* ac, bool split) {
  const LlamaConfig cfg = tp_config();
  const int64_t B = 2, T = 7, M = 3;
  std::vector<std::vector<double>> out(static_cast<size_t>(tp));
  VirtualClusterOptions vo;
  vo.ranks = tp;
  VirtualCluster cluster(vo);
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    const TpLayout layout = tp_layout(cfg, tp, world.rank(), sp);
    Llama<double> m(cfg, &world.memory(), layout);
    TensorParallelComm<double> comm(world, cfg, layout);
    m.set_block_comm(&comm);
    m.set_vocabulary(&comm);
    m.set_checkpointing(Checkpointing::parse(ac, int(cfg.num_hidden_layers)));
    m.init_weights(7);
    m.zero_grad();
    std::vector<MicroBatchState<double>> st(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) {
      std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
      for (int64_t j = 0; j < B * T; ++j) {
        tokens[size_t(j)] = int32_t((j * 37 + i * 11) % cfg.vocab_size);
        targets[size_t(j)] = int32_t((j * 53 + i * 7 + 3) % cfg.vocab_size);
      }
      m.forward(st[size_t(i)], m.all_units(), tokens.data(), targets.data(), nullptr, B, T);
    }
    const double scale = 1.0 / double(M * B * T);
    if (!split) {
      for (auto& s : st) m.backward(s, scale);
    } else {
      auto input = [&](int i) { m.backward(st[size_t(i)], scale, nullptr, BackwardPass::input); };
      auto weight = [&](int i) { m.backward(st[size_t(i)], scale, nullptr, BackwardPass::weight); };
      input(0), input(1), weight(0), input(2), weight(1), weight(2);
    }
    out[size_t(world.rank())].assign(m.grads(), m.grads() + m.num_params());
  });
  return out;
}

TEST(SplitBackwardTensorParallel, BitwiseWholeBackwardOnEveryRank) {
  for (int tp : {2, 3})
    for (bool sp : {false, true})
      for (const char* ac : {"none", "selective"}) {
        SCOPED_TRACE("tp=" + std::to_string(tp) + (sp ? " sequence-parallel" : "") + " checkpointing " + ac);
        const auto whole = rank_grads(tp, sp, ac, false);
        const auto split = rank_grads(tp, sp, ac, true);
        for (size_t r = 0; r < size_t(tp); ++r) {
          ASSERT_EQ(whole[r].size(), split[r].size());
          EXPECT_EQ(std::memcmp(whole[r].data(), split[r].data(), whole[r].size() * sizeof(double)), 0) << "rank " << r;
        }
      }
}

}  // namespace
}  // namespace llama4d
