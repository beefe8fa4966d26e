// The document mask under the strategies other than context parallelism (whose own tests cover
// it with both attention algorithms): each rank applies the mask to its own rows, heads or layers
// exactly as one device does. Data parallelism and ZeRO stay bitwise against the replay in fp32;
// tensor and pipeline parallelism are held to fp64's bounds.
#include <gtest/gtest.h>

#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

EquivalenceOptions masked(const char* mesh, ZeroStage stage) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.plan = ParallelPlan::parse(mesh);
  o.plan.zero = stage;
  o.train = test::options(2, 6);
  o.train.seq_len = 24;  // two to four documents of test::document_corpus() per row
  o.train.doc_mask = true;
  return o;
}

TEST(DocumentMaskEquivalence, DataParallelZero3IsBitwise) {
  const EquivalenceOptions o = masked("dp=2", ZeroStage::zero3);
  const EquivalenceReport r = verify_plan<float>(o, test::document_corpus(), test::virtual_launcher(2));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
}

TEST(DocumentMaskEquivalence, TensorAndPipelineParallelismMatchOneDevice) {
  for (const char* mesh : {"tp=2", "pp=2", "tp=2,dp=2"}) {
    SCOPED_TRACE(mesh);
    const EquivalenceOptions o = masked(mesh, ZeroStage::none);
    const EquivalenceReport r =
        verify_plan<double>(o, test::document_corpus(), test::virtual_launcher(o.plan.world_size()));
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_TRUE(r.plain_checked);
    EXPECT_LE(r.plain_max_rel_err, 1e-12) << r.table();
  }
}
// Document masks run in the ContextParallel sanitizer case.
LLAMA4D_TIER(DocumentMaskEquivalence, TensorAndPipelineParallelismMatchOneDevice, full);

}  // namespace
}  // namespace llama4d
