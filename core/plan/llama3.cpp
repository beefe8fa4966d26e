#include "core/plan/llama3.h"

namespace llama4d {

const std::vector<Llama3Layout>& llama3_405b_layouts() {
  static const std::vector<Llama3Layout> layouts = {
      {"tp=8,cp=1,pp=16,dp=64", 8192, 32, 0.43},
      {"tp=8,cp=1,pp=16,dp=128", 8192, 16, 0.41},
      {"tp=8,cp=16,pp=16,dp=8", 131072, 16, 0.38},
  };
  return layouts;
}

StepShape llama3_405b_shape(const Llama3Layout& layout, const std::string& ac) {
  StepShape s;
  s.model = LlamaConfig::preset("llama3-405b");
  s.plan = ParallelPlan::parse(layout.mesh);
  s.plan.zero = ZeroStage::zero3;
  s.plan.reshard_after_forward = false;
  s.plan.schedule = PipelineScheduleKind::interleaved;
  s.plan.pp_chunks = 4;
  s.plan.pp_layers.assign(64, 2);
  s.plan.pp_layers.front() = s.plan.pp_layers.back() = 1;
  s.plan.ac = Checkpointing::parse(ac, int(s.model.num_hidden_layers));
  s.seq_len = layout.seq_len;
  s.batch_size = layout.batch_per_dp * s.plan.dp();
  s.micro_batch_size = 1;
  s.precision = Precision::parse("bf16");
  return s;
}

ClusterModel h100_cluster() {
  ClusterModel m;
  m.cluster.hbm_bytes = kH100HbmBytes;
  return m;
}

}  // namespace llama4d
