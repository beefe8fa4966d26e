#pragma once
// The Llama 3 model configuration, spelled with Hugging Face `config.json` keys so a
// checkpoint directory written here loads in transformers and vice versa.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

// Llama 3.1 "llama3" RoPE frequency scaling (HF rope_scaling, or transformers 5's rope_parameters,
// with rope_type "llama3"):
// wavelengths longer than original_max_position_embeddings / low_freq_factor are divided by
// `factor`, shorter than .../high_freq_factor are kept, and the band between is interpolated.
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;              // C
  int64_t intermediate_size = 0;        // I, SwiGLU width
  int64_t num_hidden_layers = 0;        // L
  int64_t num_attention_heads = 0;      // nh
  int64_t num_key_value_heads = 0;      // nkv, divides nh (GQA); nkv == nh is plain MHA
  int64_t head_dim = 0;                 // hd; 0 in JSON means hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;  // longest sequence RoPE tables are built for
  double rope_theta = 500000.0;         // Llama 3 uses 500,000 (Llama 2 used 10,000)
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  std::optional<RopeScaling> rope_scaling;
  int64_t bos_token_id = 256;           // byte vocabulary: ids >= 256 are special tokens
  int64_t eos_token_id = 257;
  // Mixture of experts (Hugging Face Mixtral's keys, model_type "mixtral"): every layer's SwiGLU
  // FFN becomes num_local_experts experts of width intermediate_size and a router choosing
  // num_experts_per_tok of them per token (core/model/moe.h). 0 experts: a dense Llama, and the
  // other three keep their defaults (validate refuses anything else).
  int64_t num_local_experts = 0;     // E
  int64_t num_experts_per_tok = 0;   // k, in [1, E]
  double router_aux_loss_coef = 0.0; // the load-balancing loss's weight (HF's default 0.001)
  bool output_router_logits = false; // HF: add the load-balancing loss to the training loss
  bool moe() const { return num_local_experts > 0; }
  // The load-balancing loss's weight in the training objective: Hugging Face adds it only with
  // output_router_logits (MixtralForCausalLM.forward), so 0 without.
  double moe_aux_coef() const { return output_router_logits ? router_aux_loss_coef : 0.0; }

  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }

  // Exact parameter count of this shape (embedding, L blocks, final norm, untied head).
  int64_t num_parameters() const;
  int64_t num_parameters_per_layer() const;

  // Throws InputError naming the first inconsistency (non-positive size, nh % nkv != 0, ...).
  void validate() const;

  // Hugging Face config.json. from_json throws InputError on missing keys or wrong types.
  nlohmann::json to_json() const;
  static LlamaConfig from_json(const nlohmann::json& j);
  static LlamaConfig from_file(const std::string& path);

  // Presets: "tiny", "small", "medium", "tiny-moe", "small-moe", "llama3-8b", "llama3-70b", "llama3-405b".
  // Throws InputError listing the valid names for an unknown one.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

// InputError naming `what` when cfg has mixture-of-experts layers, for what does not cover them
// yet (the planner's memory, traffic and FLOP formulas are the dense layers').
void refuse_moe(const LlamaConfig& cfg, const std::string& what);

}  // namespace llama4d
