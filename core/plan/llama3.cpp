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
  s.plan.reduce_once = true;  // FP32 gradient accumulation over micro-batches (the paper, section 3.3.2)
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

std::vector<Llama3OwnPlan> llama3_own_plans() {
  auto shape = [](const std::string& preset, const std::string& mesh) {
    StepShape s;
    s.model = LlamaConfig::preset(preset);
    s.plan = ParallelPlan::parse(mesh);
    s.plan.zero = ZeroStage::zero3;
    s.plan.reshard_after_forward = false;
    s.plan.reduce_once = true;
    s.plan.ac = Checkpointing::parse("selective", int(s.model.num_hidden_layers));
    s.seq_len = 8192;
    s.batch_size = 2048;
    s.micro_batch_size = 1;
    s.precision = Precision::parse("bf16");
    return s;
  };
  StepShape b70 = shape("llama3-70b", "tp=8,cp=1,pp=4,dp=256");
  b70.plan.schedule = PipelineScheduleKind::interleaved;
  b70.plan.pp_chunks = 5;
  return {{"llama3-8b", shape("llama3-8b", "tp=1,cp=1,pp=1,dp=2048")}, {"llama3-70b", b70}};
}

ClusterModel h100_cluster() {
  ClusterModel m;
  m.cluster.hbm_bytes = kH100HbmBytes;
  return m;
}

}  // namespace llama4d
