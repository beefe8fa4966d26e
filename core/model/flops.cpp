#include "core/model/flops.h"

namespace llama4d {

int64_t ffn_matmul_parameters(const LlamaConfig& cfg) {
  const int64_t C = cfg.hidden_size, I = cfg.intermediate_size;
  if (!cfg.moe()) return 3 * I * C;
  return cfg.num_local_experts * C + cfg.num_experts_per_tok * 3 * I * C;  // router, k experts
}

int64_t matmul_parameters(const LlamaConfig& cfg) {
  const int64_t C = cfg.hidden_size;
  const int64_t per_layer = 2 * cfg.q_dim() * C + 2 * cfg.kv_dim() * C + ffn_matmul_parameters(cfg);
  return cfg.num_hidden_layers * per_layer + cfg.vocab_size * C;  // + LM head
}

double training_flops_per_token(const LlamaConfig& cfg, int64_t seq_len) {
  return 6.0 * double(matmul_parameters(cfg)) +
         12.0 * double(cfg.num_hidden_layers) * double(cfg.q_dim()) * double(seq_len);
}

UnitFlops unit_flops(const LlamaConfig& cfg, int64_t B, int64_t T, int unit) {
  const double BT = double(B * T), C = double(cfg.hidden_size), I = double(cfg.intermediate_size);
  const double q = double(cfg.q_dim()), kv = double(cfg.kv_dim()), ffn = double(ffn_matmul_parameters(cfg));
  UnitFlops f;
  if (unit == embedding_unit()) return f;
  if (unit == head_unit(cfg.num_hidden_layers)) {
    f.forward = 2 * BT * C * double(cfg.vocab_size);
    f.backward = 2 * f.forward;
    return f;
  }
  const double products = 2 * BT * C * (q + 2 * kv) + 2 * BT * q * C + 2 * BT * ffn;
  f.attention_forward = 4.0 * double(cfg.head_dim) * double(B * cfg.num_attention_heads) * double(T * (T + 1) / 2);
  f.down_proj = cfg.moe() ? 0.0 : 2 * BT * I * C;  // a recomputed MoE layer runs whole
  f.forward = products + f.attention_forward;
  f.backward = 2 * products + 2.5 * f.attention_forward;
  return f;
}

double recompute_flops_per_token(const LlamaConfig& cfg, int64_t seq_len, const Checkpointing& ac) {
  const double attention_forward = 4.0 * double(cfg.num_hidden_layers) * double(cfg.q_dim()) * double(seq_len);
  switch (ac.kind) {
    case Checkpointing::Kind::none: return 0;
    case Checkpointing::Kind::selective: return attention_forward;
    case Checkpointing::Kind::every: {
      const double segments = double((cfg.num_hidden_layers + ac.every - 1) / ac.every);
      const double down = cfg.moe() ? 0.0 : 2.0 * double(cfg.hidden_size) * double(cfg.intermediate_size);
      return 2.0 * double(matmul_parameters(cfg) - cfg.vocab_size * cfg.hidden_size) + attention_forward - down * segments;
    }
  }
  return 0;
}

}  // namespace llama4d
