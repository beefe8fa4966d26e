// Context parallelism: the load-balanced split of a sequence (worked out by hand), attention's
// work per rank as the ops count it, all-gather attention's rows against one device's, the
// bytes each layer moves, activation memory per rank, and training on cp virtual GPUs against
// one device: alone, with data parallelism under ZeRO, with activation checkpointing and with
// pipeline parallelism.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "core/parallel/context_parallel.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

TEST(ContextSlice, RankTakesAChunkAndItsMirror) {
  // Two rows of 8 tokens, cp = 2: 4 chunks of 2. Rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  Batch b;
  b.B = 2, b.seq = 8;
  for (int i = 0; i < 16; ++i) b.tokens.push_back(i), b.targets.push_back(100 + i);
  const Batch r0 = context_slice(b, 2, 0), r1 = context_slice(b, 2, 1);
  EXPECT_EQ(r0.seq, 4);
  EXPECT_EQ(r0.tokens, (std::vector<int32_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(r1.tokens, (std::vector<int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(r0.targets, (std::vector<int32_t>{100, 101, 106, 107, 108, 109, 114, 115}));
  // cp = 3 on 12 tokens: 6 chunks of 2; rank 1 holds chunks 1 and 4.
  b.B = 1, b.seq = 12;
  b.tokens.resize(12), b.targets.resize(12);
  EXPECT_EQ(context_slice(b, 3, 1).tokens, (std::vector<int32_t>{2, 3, 8, 9}));
}

TEST(ContextSlice, BadPlansNameTheConstraint) {
  ParallelPlan p = ParallelPlan::parse("cp=3");
  try {
    p.check_sequence(16);
    FAIL() << "seq 16 over cp=3 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of 2*cp = 6"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(p.check_sequence(18));
  EXPECT_THROW(parse_context_algo("rings"), InputError);
  ParallelPlan no_cp = ParallelPlan::parse("dp=2");
  no_cp.cp_algo = ContextAlgo::ring;
  EXPECT_THROW(no_cp.validate(), InputError);  // --cp-algo without cp
}

// Counts the FLOPs the ops report on one thread.
struct FlopCount final : ops::FlopSink {
  double flops = 0;
  void add_flops(double f) override { flops += f; }
};

// Random q, k, v of one whole sequence of S tokens (one batch row), and each cp rank's share.
struct Sequence {
  int64_t S, nh = 4, nkv = 2, hd = 8;
  std::vector<double> q, k, v;
  std::vector<int32_t> doc;  // [S] document ids (document mask), or empty
  explicit Sequence(int64_t tokens) : S(tokens) {
    std::mt19937_64 gen(7);
    std::normal_distribution<double> n(0, 1);
    for (auto* x : {&q, &k, &v}) x->resize(size_t(S * (x == &q ? nh : nkv) * hd));
    for (auto* x : {&q, &k, &v})
      for (double& e : *x) e = n(gen);
  }
  // Rank r's rows of a [S, heads*hd] tensor: chunks r and 2cp-1-r.
  std::vector<double> share(const std::vector<double>& x, int64_t heads, int cp, int r) const {
    const int64_t c = S / (2 * cp), row = heads * hd;
    std::vector<double> out;
    for (const int64_t g : {int64_t(r), int64_t(2 * cp - 1 - r)})
      out.insert(out.end(), x.begin() + g * c * row, x.begin() + (g + 1) * c * row);
    return out;
  }
  BlockDims dims(int cp, int r) const {
    return {.B = 1, .seq = S / cp, .nh = nh, .nkv = nkv, .hd = hd, .cp = cp, .cp_rank = r, .doc = documents()};
  }
  const int32_t* documents() const { return doc.empty() ? nullptr : doc.data(); }
  // Packs documents of these lengths (summing to S) into the sequence.
  void pack(const std::vector<int64_t>& lengths) {
    doc.clear();
    for (size_t i = 0; i < lengths.size(); ++i) doc.insert(doc.end(), size_t(lengths[i]), int32_t(i));
  }
};

// One device's attention over the whole sequence, [S, nh, hd].
std::vector<double> one_device(const Sequence& seq) {
  std::vector<double> out(size_t(seq.S * seq.nh * seq.hd)), lse(size_t(seq.S * seq.nh));
  ops::attention_forward(out.data(), lse.data(), seq.q.data(), seq.k.data(), seq.v.data(),
                         {.B = 1, .Tq = seq.S, .Tk = seq.S, .nh = seq.nh, .nkv = seq.nkv, .hd = seq.hd,
                          .q_doc = seq.documents(), .k_doc = seq.documents()});
  return out;
}

// Runs context-parallel attention over `seq` on cp virtual ranks; check(rank, its output rows,
// one device's rows at the same positions, the attention FLOPs the rank's ops reported).
template <class Check>
void on_each_rank(const Sequence& seq, int cp, ContextAlgo algo, Check&& check) {
  const std::vector<double> whole = one_device(seq);
  VirtualClusterOptions vo;
  vo.ranks = cp;
  VirtualCluster cluster(vo);
  cluster.run([&](ProcessGroup& g) {
    const int r = g.rank();
    ContextParallelComm<double> comm(g, algo);
    const BlockDims d = seq.dims(cp, r);
    const std::vector<double> q = seq.share(seq.q, seq.nh, cp, r), k = seq.share(seq.k, seq.nkv, cp, r),
                              v = seq.share(seq.v, seq.nkv, cp, r);
    std::vector<double> mine(q.size()), mine_lse(size_t(d.seq * d.nh));
    FlopCount count;
    {
      ops::ScopedFlopSink sink(&count);
      comm.attention(mine.data(), mine_lse.data(), q.data(), k.data(), v.data(), d);
    }
    check(r, mine, seq.share(whole, seq.nh, cp, r), count.flops);
  });
}

// Each rank's attention output rows are one device's rows for the same positions, bit for bit,
// when a chunk is a multiple of the op's 32-row query blocks (chunks of 64 and 32 here): the same
// keys in the same order through the same op, cut into the same blocks. Not otherwise (next test).
TEST(ContextAttention, AllGatherRowsAreOneDevicesBitwise) {
  for (const int cp : {2, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    on_each_rank(Sequence(256), cp, ContextAlgo::allgather,
                 [](int r, const std::vector<double>& mine, const std::vector<double>& expected, double) {
                   EXPECT_EQ(0, std::memcmp(mine.data(), expected.data(), mine.size() * sizeof(double))) << "rank " << r;
                 });
  }
}

// A chunk of 12 tokens starts the op's query blocks at other rows than one device's. A block
// multiplies its probabilities by the values of the keys its LAST row sees, so the length of
// that sum (and the grouping of its terms in the GEMM's unrolled loop) differs: the same value
// up to rounding, not the same bits.
TEST(ContextAttention, AllGatherRowsWithOtherBlocksAgreeToRounding) {
  on_each_rank(Sequence(72), 3, ContextAlgo::allgather,
               [](int r, const std::vector<double>& mine, const std::vector<double>& expected, double) {
                 for (size_t i = 0; i < mine.size(); ++i) ASSERT_NEAR(mine[i], expected[i], 1e-14) << "rank " << r << " element " << i;
               });
}

// Ring attention merges partial results block by block: every row agrees with one device's to
// rounding (the merge adds the partial sums in another order), for cp = 2, 3 and 4; and blocks
// wholly in the future are skipped, so a rank scores the all-gather's balanced pairs.
TEST(ContextAttention, RingRowsAgreeWithOneDeviceToRounding) {
  for (const int cp : {2, 3, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    const Sequence seq(48);
    const double c = double(seq.S) / (2 * cp);
    on_each_rank(seq, cp, ContextAlgo::ring,
                 [&](int r, const std::vector<double>& mine, const std::vector<double>& expected, double flops) {
                   for (size_t i = 0; i < mine.size(); ++i)
                     ASSERT_NEAR(mine[i], expected[i], 1e-14) << "rank " << r << " element " << i;
                   EXPECT_EQ(flops, 4.0 * seq.hd * seq.nh * ((2 * cp - 1) * c * c + c * (c + 1)));
                 });
  }
}

// Document masks: each rank's rows are one device's masked rows (all-gather: bitwise, chunks of
// 64 and 32; ring: to rounding), and the (query, key) pairs all ranks score together are exactly
// the masked pairs, counted here from the documents' lengths: sum of len·(len+1)/2. With these
// lengths ring attention also meets whole blocks it skips for their documents (cp=4: the queries
// of chunk 5, all in the fourth document, and the keys of chunks 0-3, all in the first two).
TEST(ContextAttention, DocumentMaskedRowsMatchOneDevice) {
  Sequence seq(256);
  const std::vector<int64_t> lengths = {40, 90, 3, 100, 23};
  seq.pack(lengths);
  double pairs = 0;
  for (const int64_t n : lengths) pairs += double(n * (n + 1) / 2);
  const double per_pair = 4.0 * seq.hd * seq.nh;
  for (const ContextAlgo algo : {ContextAlgo::allgather, ContextAlgo::ring})
    for (const int cp : {2, 4}) {
      SCOPED_TRACE(std::string(context_algo_name(algo)) + " cp=" + std::to_string(cp));
      std::vector<double> flops(static_cast<size_t>(cp), 0.0);
      on_each_rank(seq, cp, algo, [&](int r, const std::vector<double>& mine, const std::vector<double>& expected, double f) {
        flops[size_t(r)] = f;
        if (algo == ContextAlgo::allgather)
          EXPECT_EQ(0, std::memcmp(mine.data(), expected.data(), mine.size() * sizeof(double))) << "rank " << r;
        else
          for (size_t i = 0; i < mine.size(); ++i) ASSERT_NEAR(mine[i], expected[i], 1e-14) << "rank " << r << " element " << i;
      });
      double total = 0;
      for (const double f : flops) total += f;
      EXPECT_EQ(total, per_pair * pairs);
    }
}

// Attention's FLOPs on each rank, as the ops report them: with the 2·cp split every rank scores
// exactly (2cp-1)·c² + c(c+1) pairs per head (c = S/(2cp)), the same on all ranks. A contiguous
// split (rank r holds tokens [r·S/cp, (r+1)·S/cp), T = S/cp) gives rank r r·T² + T(T+1)/2 pairs:
// the last rank does 1 + 2(cp-1)·T/(T+1) times the first's work (2cp-1 for long sequences: 3x at
// cp=2, 7x at cp=4) and (2cp-1)·T² + T(T+1)/2 over the mean S(S+1)/(2cp) (about 2 - 1/cp).
TEST(ContextAttention, TheTwoChunkSplitBalancesWork) {
  const int64_t S = 96;
  for (const int cp : {2, 3, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    const Sequence seq(S);
    const double c = double(S) / (2 * cp), per_pair = 4.0 * seq.hd * seq.nh;
    on_each_rank(seq, cp, ContextAlgo::allgather, [&](int r, const std::vector<double>&, const std::vector<double>&,
                                                      double flops) {
      EXPECT_EQ(flops, per_pair * ((2 * cp - 1) * c * c + c * (c + 1))) << "rank " << r;
    });
    // The contiguous split: rank r's S/cp queries against every key up to its last.
    const int64_t T = S / cp;
    std::vector<double> contiguous;
    for (int64_t r = 0; r < cp; ++r) {
      FlopCount naive;
      ops::ScopedFlopSink sink(&naive);
      std::vector<double> o(size_t(T * seq.nh * seq.hd)), l(size_t(T * seq.nh));
      ops::attention_forward(o.data(), l.data(), seq.q.data() + r * T * seq.nh * seq.hd, seq.k.data(), seq.v.data(),
                             {.B = 1, .Tq = T, .Tk = (r + 1) * T, .nh = seq.nh, .nkv = seq.nkv, .hd = seq.hd,
                              .q_start = r * T});
      contiguous.push_back(naive.flops);
    }
    const double t = double(T);
    EXPECT_EQ(contiguous[0], per_pair * t * (t + 1) / 2);
    EXPECT_EQ(contiguous[size_t(cp - 1)], per_pair * ((cp - 1) * t * t + t * (t + 1) / 2));
    double total = 0;
    for (double f : contiguous) total += f;
    EXPECT_DOUBLE_EQ(contiguous[size_t(cp - 1)] / contiguous[0], 1 + 2 * (cp - 1) * t / (t + 1));
    EXPECT_DOUBLE_EQ(total, per_pair * S * (S + 1) / 2);
    EXPECT_GT(contiguous[size_t(cp - 1)] / (total / cp), 1.9 - 1.0 / cp);
  }
}

struct CpCase {
  const char* name;
  const char* mesh;
  ZeroStage stage;
  const char* ac;
  int64_t micro_batch_size;  // rows per micro-batch on a data rank
  ContextAlgo algo = ContextAlgo::allgather;
  bool doc_mask = false;  // on test::document_corpus(), whose rows pack two to four documents
};


class ContextParallelEquivalence : public testing::TestWithParam<CpCase> {};

// fp64: every rank's gradients and parameters, loss and gradient norm after 3 AdamW steps with
// clipping active, against one device. Not bitwise: a weight's gradient is a sum over tokens
// that now sit on different ranks, and dK, dV sum over queries of different ranks.
TEST_P(ContextParallelEquivalence, Fp64WithinOneInATrillionOfOneDevice) {
  const CpCase& c = GetParam();
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.plan = ParallelPlan::parse(c.mesh);
  o.plan.zero = c.stage;
  o.plan.ac = Checkpointing::parse(c.ac, int(o.model.num_hidden_layers));
  o.plan.cp_algo = c.algo;
  o.train = test::options(3, c.micro_batch_size);
  o.train.seq_len = 24;  // 2·cp chunks for cp = 2, 3, 4
  o.train.doc_mask = c.doc_mask;
  const TextDataset& data = c.doc_mask ? test::document_corpus() : test::corpus();
  const EquivalenceReport r = verify_plan<double>(o, data, test::virtual_launcher(o.plan.world_size()));
  test::expect_fp64_within_one_in_a_trillion(r, o.plan.world_size());
}

const CpCase kCpCases[] = {
    {"cp2", "cp=2", ZeroStage::none, "none", 12},
    {"cp3", "cp=3", ZeroStage::none, "none", 12},
    {"cp4", "cp=4", ZeroStage::none, "none", 24},
    {"cp2_dp2_zero3", "cp=2,dp=2", ZeroStage::zero3, "none", 6},
    {"cp3_dp2_zero1_full_ac", "cp=3,dp=2", ZeroStage::zero1, "full", 6},
    {"cp2_selective_ac", "cp=2", ZeroStage::none, "selective", 12},
    {"cp2_hsdp_2x2_zero2", "cp=2,dp_shard=2,dp_replicate=2", ZeroStage::zero2, "none", 6},
    {"cp2_pp2", "cp=2,pp=2", ZeroStage::none, "none", 6},
    {"ring_cp2", "cp=2", ZeroStage::none, "none", 12, ContextAlgo::ring},
    {"ring_cp3", "cp=3", ZeroStage::none, "none", 12, ContextAlgo::ring},
    {"ring_cp4_full_ac", "cp=4", ZeroStage::none, "full", 24, ContextAlgo::ring},
    {"ring_cp2_dp2_zero3_selective", "cp=2,dp=2", ZeroStage::zero3, "selective", 6, ContextAlgo::ring},
    {"ring_cp2_pp2", "cp=2,pp=2", ZeroStage::none, "none", 6, ContextAlgo::ring},
    {"doc_cp2", "cp=2", ZeroStage::none, "none", 12, ContextAlgo::allgather, true},
    {"doc_cp3", "cp=3", ZeroStage::none, "none", 12, ContextAlgo::allgather, true},
    {"doc_cp4", "cp=4", ZeroStage::none, "none", 24, ContextAlgo::allgather, true},
    {"doc_cp2_dp2_zero3", "cp=2,dp=2", ZeroStage::zero3, "none", 6, ContextAlgo::allgather, true},
    {"doc_cp3_full_ac", "cp=3", ZeroStage::none, "full", 12, ContextAlgo::allgather, true},
    {"doc_ring_cp2", "cp=2", ZeroStage::none, "none", 12, ContextAlgo::ring, true},
    {"doc_ring_cp3", "cp=3", ZeroStage::none, "none", 12, ContextAlgo::ring, true},
    {"doc_ring_cp4_selective", "cp=4", ZeroStage::none, "selective", 24, ContextAlgo::ring, true},
    {"doc_ring_cp2_dp2_zero3", "cp=2,dp=2", ZeroStage::zero3, "none", 6, ContextAlgo::ring, true},
    {"doc_ring_cp2_pp2", "cp=2,pp=2", ZeroStage::none, "none", 6, ContextAlgo::ring, true},
};
// Tiers: the sanitizer presets run the ring with document masks under ZeRO-3 (and
// Fp32WithinTheBounds the all-gather); the release preset runs every case.
LLAMA4D_INSTANTIATE(ContextParallel, ContextParallelEquivalence, kCpCases, full,
                    {{"doc_ring_cp2_dp2_zero3", test::Tier::sanitizer}});

// fp32 within 1e-6 of one device after one step (the first step's errors are those of the
// split sums alone; later steps add AdamW's amplification, held to tensor parallelism's bounds).
TEST(ContextParallelEquivalence, Fp32WithinTheBounds) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.plan = ParallelPlan::parse("cp=2");
  o.train = test::options(3, 12);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(2));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_LE(r.errors_per_step[0].grad_tensor, 1e-6) << r.table();
}

// Every rank's records of the context-parallel group's traffic in one step, by label (rank 0).
std::map<std::string, std::pair<int64_t, int64_t>> one_step_cp_traffic(const LlamaConfig& cfg, const TrainOptions& opt,
                                                                       const ParallelPlan& plan) {
  VirtualClusterOptions vo;
  vo.ranks = plan.world_size();
  VirtualCluster cluster(vo);
  test::train_steps(cluster, cfg, opt, plan, 1);
  std::map<std::string, std::pair<int64_t, int64_t>> by_label;  // calls, elements
  for (const TrafficRecord& t : cluster.traffic())
    if (t.world_rank == 0 && t.label.rfind("context parallelism", 0) == 0) {
      by_label[t.label].first += 1;
      by_label[t.label].second += t.count;
    }
  return by_label;
}

// Per layer and micro-batch: forward, one all-gather of K and V (n = B·(S/cp)·nkv·hd elements
// each per rank: 2n in, a gathered buffer of cp·2n); backward, the same all-gather again and a
// reduce-scatter of dK, dV (cp·2n in, 2n out per rank). The log counts the buffer the op is
// named after (the gathered one, the one scattered). Full checkpointing repeats the forward's
// all-gather in the recompute.
TEST(ContextParallelTraffic, AllGatherAttentionMovesKeysAndValuesOnly) {
  for (const char* ac : {"none", "full"}) {
    SCOPED_TRACE(ac);
    const LlamaConfig cfg = LlamaConfig::preset("tiny");  // 2 layers, 2 KV heads of 16
    TrainOptions opt = test::options(1, 12);              // 2 micro-batches of 12 rows x 16 tokens
    ParallelPlan plan = ParallelPlan::parse("cp=2");
    plan.ac = Checkpointing::parse(ac, 2);
    const auto by_label = one_step_cp_traffic(cfg, opt, plan);
    const int64_t cp = 2, M = 2, L = 2, n = cp * 12 * (16 / 2) * 2 * 16, recompute = std::string(ac) == "full" ? 2 : 1;
    using P = std::pair<int64_t, int64_t>;
    auto at = [&](const char* label) { return by_label.count(label) ? by_label.at(label) : P(0, 0); };
    EXPECT_EQ(at("context parallelism: all-gather keys and values"), P(M * L * recompute, M * L * recompute * 2 * n));
    EXPECT_EQ(at("context parallelism: all-gather keys and values (backward)"), P(M * L, M * L * 2 * n));
    EXPECT_EQ(at("context parallelism: reduce-scatter key/value gradients"), P(M * L, M * L * 2 * n));
  }
}

// Ring attention, per layer and micro-batch and rank: forward cp-1 sends of K and V (2n, n =
// B·(S/cp)·nkv·hd); backward cp-1 sends of K, V, dK, dV (4n) and one of dK, dV (2n) home.
TEST(ContextParallelTraffic, RingPassesBlocksAroundTheRing) {
  for (const int cp : {2, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    const LlamaConfig cfg = LlamaConfig::preset("tiny");
    TrainOptions opt = test::options(1, 12);  // 2 micro-batches of 12 rows x 16 tokens
    ParallelPlan plan = ParallelPlan::parse("cp=" + std::to_string(cp));
    plan.cp_algo = ContextAlgo::ring;
    VirtualClusterOptions vo;
    vo.ranks = cp;
    VirtualCluster cluster(vo);
    test::train_steps(cluster, cfg, opt, plan, 1);
    std::map<std::string, std::pair<int64_t, int64_t>> sent;  // rank 0's sends by label: calls, elements
    for (const TrafficRecord& t : cluster.traffic())
      if (t.world_rank == 0 && t.op == "send") {
        sent[t.label].first += 1;
        sent[t.label].second += t.count;
      }
    const int64_t M = 2, L = 2, n = 12 * (16 / cp) * 2 * 16, passes = M * L * (cp - 1);
    using P = std::pair<int64_t, int64_t>;
    EXPECT_EQ(sent["context parallelism: ring keys and values"], P(passes, passes * 2 * n));
    EXPECT_EQ(sent["context parallelism: ring keys, values and gradients"], P(passes, passes * 4 * n));
    EXPECT_EQ(sent["context parallelism: ring key/value gradients home"], P(M * L, M * L * 2 * n));
    EXPECT_EQ(sent.size(), 3u);
  }
}

// A cp rank's activations are exactly half of one device's (the same rows, half the tokens):
// measured by each rank's allocator, one step of the same global batch.
TEST(ContextParallelMemory, ActivationsAreDividedByCp) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(1, 0);
  std::vector<int64_t> one, two;
  for (const auto& [mesh, out] : {std::pair{"dp=1", &one}, std::pair{"cp=2", &two}}) {
    const ParallelPlan plan = ParallelPlan::parse(mesh);
    VirtualClusterOptions vo;
    vo.ranks = plan.world_size();
    VirtualCluster cluster(vo);
    std::vector<int64_t> peaks(size_t(plan.world_size()));
    cluster.run([&](ProcessGroup& world) {
      ops::set_backend_threads(1);
      Llama<float> model(cfg, &world.memory());
      ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
      trainer.step();
      peaks[size_t(world.rank())] = trainer.strategy().peak_memory().activations;
    });
    *out = peaks;
  }
  ASSERT_EQ(two.size(), 2u);
  EXPECT_GT(one[0], 0);
  EXPECT_EQ(two[0] * 2, one[0]);
  EXPECT_EQ(two[1] * 2, one[0]);
}

}  // namespace
}  // namespace llama4d
