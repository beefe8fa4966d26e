// LlamaConfig: presets, exact parameter counts, validation and Hugging Face config.json I/O.
#include "core/model/config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "core/strict_json.h"

namespace llama4d {

using nlohmann::json;

namespace {

// ---- Typed access to config.json values, each failure naming the key ------------------------

[[noreturn]] void wrong_type(const char* key, const char* want, const json& v) {
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  throw InputError(std::string("config key '") + key + "' must be " + want + ", got " +
                   v.type_name() + " " + shown);
}

int64_t as_int(const json& v, const char* key) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) wrong_type(key, "an int64", v);
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  wrong_type(key, "an integer", v);
}

double as_double(const json& v, const char* key) {
  if (!v.is_number()) wrong_type(key, "a number", v);
  return v.get<double>();
}

// A present, non-null value, or nullptr.
const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t required_int(const json& j, const char* key) {
  const json* v = find(j, key);
  if (!v) throw InputError(std::string("config is missing required key '") + key + "'");
  return as_int(*v, key);
}

int64_t optional_int(const json& j, const char* key, int64_t fallback) {
  const json* v = find(j, key);
  return v ? as_int(*v, key) : fallback;
}

double optional_double(const json& j, const char* key, double fallback) {
  const json* v = find(j, key);
  return v ? as_double(*v, key) : fallback;
}

bool optional_bool(const json& j, const char* key, bool fallback) {
  const json* v = find(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

// bos/eos ids: an int, or a list of ints (Llama 3.1 Instruct lists several eos ids; generation
// stops at the first, which is what we keep).
int64_t token_id(const json& j, const char* key, int64_t fallback) {
  const json* v = find(j, key);
  if (!v) return fallback;
  if (v->is_array()) {
    if (v->empty()) wrong_type(key, "an integer or a non-empty list of integers", *v);
    return as_int((*v)[0], key);
  }
  return as_int(*v, key);
}

// The RoPE scaling fields of one object: classic `rope_scaling` (transformers < 5; "rope_type",
// or "type" in older files) or current `rope_parameters` (transformers 5, which puts rope_theta
// in the same object). "default" means no scaling; any other type than llama3 is refused rather
// than silently run as plain RoPE.
std::optional<RopeScaling> parse_scaling(const json& v, const std::string& key) {
  if (!v.is_object()) wrong_type(key.c_str(), "an object or null", v);
  const json* type = find(v, "rope_type");
  if (!type) type = find(v, "type");
  if (!type) throw InputError("config key '" + key + "' has no 'rope_type' (or 'type')");
  if (!type->is_string()) wrong_type((key + ".rope_type").c_str(), "a string", *type);
  const std::string name = type->get<std::string>();
  if (name == "default") return std::nullopt;
  if (name != "llama3")
    throw InputError("config: " + key + " type '" + name + "' is not supported (only 'llama3' or 'default')");
  RopeScaling rs;
  const json* factor = find(v, "factor");
  if (!factor) throw InputError("config key '" + key + "' is missing 'factor'");
  rs.factor = as_double(*factor, (key + ".factor").c_str());
  rs.low_freq_factor = optional_double(v, "low_freq_factor", rs.low_freq_factor);
  rs.high_freq_factor = optional_double(v, "high_freq_factor", rs.high_freq_factor);
  const json* orig = find(v, "original_max_position_embeddings");
  if (!orig) throw InputError("config key '" + key + "' is missing 'original_max_position_embeddings'");
  rs.original_max_position_embeddings = as_int(*orig, (key + ".original_max_position_embeddings").c_str());
  return rs;
}

// partial_rotary_factor < 1 rotates only part of each head (other architectures do); Llama rotates
// all of it, so any other value than 1 would run as another model.
void refuse_partial_rotary(const json& j, const char* key) {
  const json* f = find(j, "partial_rotary_factor");
  if (f && as_double(*f, key) != 1.0)
    throw InputError(std::string("config: ") + key + " " + f->dump() +
                     " is not supported: Llama rotates the whole head (only 1)");
}

// rope_theta and the scaling, from either spelling. A file may carry both (ours do, so old and
// new readers take it); then they must agree, or it is an error naming both.
void parse_rope(const json& j, LlamaConfig& c) {
  refuse_partial_rotary(j, "partial_rotary_factor");
  const json* classic_theta = find(j, "rope_theta");
  const json* classic_scaling = find(j, "rope_scaling");
  c.rope_theta = classic_theta ? as_double(*classic_theta, "rope_theta") : 10000.0;  // transformers' default
  c.rope_scaling = classic_scaling ? parse_scaling(*classic_scaling, "rope_scaling") : std::nullopt;
  const json* current = find(j, "rope_parameters");
  if (!current) return;
  if (!current->is_object()) wrong_type("rope_parameters", "an object or null", *current);
  refuse_partial_rotary(*current, "rope_parameters.partial_rotary_factor");
  const json* theta = find(*current, "rope_theta");
  const double current_theta = theta ? as_double(*theta, "rope_parameters.rope_theta") : c.rope_theta;
  const std::optional<RopeScaling> current_scaling = parse_scaling(*current, "rope_parameters");
  if (classic_theta && current_theta != c.rope_theta)
    throw InputError("config: rope_theta (" + classic_theta->dump() + ") and rope_parameters.rope_theta (" +
                     theta->dump() + ") disagree");
  if (classic_scaling && current_scaling != c.rope_scaling)
    throw InputError("config: rope_scaling and rope_parameters describe different RoPE scaling");
  c.rope_theta = current_theta;
  c.rope_scaling = current_scaling;
}

// Llama 3.1 shapes share everything but the widths and depth (Meta's params.json, HF config.json).
LlamaConfig llama3_shape(int64_t C, int64_t I, int64_t L, int64_t nh) {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = C;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = nh;
  c.num_key_value_heads = 8;
  c.head_dim = C / nh;
  c.max_position_embeddings = 131072;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = false;
  c.rope_scaling = RopeScaling{};  // Llama 3.1: llama3, factor 8, low 1, high 4, original 8192
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

// The byte-level presets: 256 byte tokens + 8 special tokens (bos 256, eos 257, ...).
LlamaConfig byte_shape(int64_t C, int64_t I, int64_t L, int64_t nh, int64_t nkv, int64_t max_pos) {
  LlamaConfig c;
  c.vocab_size = 264;
  c.hidden_size = C;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = nh;
  c.num_key_value_heads = nkv;
  c.head_dim = C / nh;
  c.max_position_embeddings = max_pos;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = false;
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  return c;
}

LlamaConfig moe_shape(LlamaConfig c, int64_t experts, int64_t per_token) {
  c.num_local_experts = experts;
  c.num_experts_per_tok = per_token;
  c.router_aux_loss_coef = 0.02;
  c.output_router_logits = true;
  return c;
}

}  // namespace

// ---- Parameter counts -----------------------------------------------------------------------

int64_t LlamaConfig::num_parameters_per_layer() const {
  const int64_t C = hidden_size;
  const int64_t ffn = moe() ? num_local_experts * C                          // block_sparse_moe.gate
                                  + num_local_experts * 3 * C * intermediate_size  // experts' w1, w2, w3
                            : 3 * C * intermediate_size;                      // gate_proj, up_proj, down_proj
  return 2 * C                       // input_layernorm + post_attention_layernorm
         + C * q_dim() + q_dim() * C  // q_proj, o_proj
         + 2 * C * kv_dim()           // k_proj, v_proj
         + ffn;
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t embed = vocab_size * hidden_size;
  return embed + num_hidden_layers * num_parameters_per_layer() + hidden_size  // final norm
         + (tie_word_embeddings ? 0 : embed);
}

// ---- Validation -----------------------------------------------------------------------------

void LlamaConfig::validate() const {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw InputError(std::string("config: ") + key + " must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_local_experts < 0)
    throw InputError("config: num_local_experts must be 0 (dense) or positive, got " + std::to_string(num_local_experts));
  if (moe()) {
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_local_experts)
      throw InputError("config: num_experts_per_tok (" + std::to_string(num_experts_per_tok) +
                       ") must be in [1, num_local_experts = " + std::to_string(num_local_experts) + "]");
    if (!std::isfinite(router_aux_loss_coef) || router_aux_loss_coef < 0)
      throw InputError("config: router_aux_loss_coef must be a finite number >= 0");
  } else if (num_experts_per_tok != 0 || router_aux_loss_coef != 0.0 || output_router_logits) {
    throw InputError("config: num_experts_per_tok, router_aux_loss_coef and output_router_logits need "
                     "num_local_experts > 0 (a mixture of experts)");
  }
  if (num_attention_heads % num_key_value_heads != 0)
    throw InputError("config: num_attention_heads (" + std::to_string(num_attention_heads) +
                     ") is not divisible by num_key_value_heads (" +
                     std::to_string(num_key_value_heads) + ")");
  if (head_dim % 2 != 0)
    throw InputError("config: head_dim (" + std::to_string(head_dim) +
                     ") must be even: RoPE rotates pairs of dimensions");
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    throw InputError("config: rms_norm_eps must be a positive finite number");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    throw InputError("config: rope_theta must be a positive finite number");
  if (bos_token_id < 0 || bos_token_id >= vocab_size)
    throw InputError("config: bos_token_id " + std::to_string(bos_token_id) +
                     " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  if (eos_token_id < 0 || eos_token_id >= vocab_size)
    throw InputError("config: eos_token_id " + std::to_string(eos_token_id) +
                     " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  if (rope_scaling) {
    const RopeScaling& rs = *rope_scaling;
    if (rs.rope_type != "llama3")
      throw InputError("config: rope_scaling type '" + rs.rope_type + "' is not supported (only 'llama3')");
    if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor))
      throw InputError("config: rope_scaling.factor must be >= 1");
    if (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
        !std::isfinite(rs.high_freq_factor))
      throw InputError("config: rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    if (rs.original_max_position_embeddings <= 0)
      throw InputError("config: rope_scaling.original_max_position_embeddings must be positive");
  }
  // Counts are int64 everywhere (offsets into the flat buffer); refuse shapes that would overflow.
  long double C = hidden_size, q = (long double)num_attention_heads * head_dim,
              kv = (long double)num_key_value_heads * head_dim;
  long double per_layer = 2 * C + 2 * C * q + 2 * C * kv + 3 * C * intermediate_size;
  long double total = 2 * (long double)vocab_size * C + num_hidden_layers * per_layer + C;
  if (total > (long double)(int64_t(1) << 60))
    throw InputError("config: the model shape has more than 2^60 parameters");
}

// ---- JSON -----------------------------------------------------------------------------------

json LlamaConfig::to_json() const {
  json j;
  j["architectures"] = json::array({moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = moe() ? "mixtral" : "llama";
  if (moe()) {
    j["num_local_experts"] = num_local_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
    j["router_jitter_noise"] = 0.0;  // transformers' default; we add no noise to the router's logits
    j["sliding_window"] = nullptr;   // full causal attention, as Llama's
  }
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling->rope_type},
        {"factor", rope_scaling->factor},
        {"low_freq_factor", rope_scaling->low_freq_factor},
        {"high_freq_factor", rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  // transformers 5 reads RoPE from `rope_parameters`; older readers from the keys above. Both
  // are written, saying the same thing.
  json rp = {{"rope_type", rope_scaling ? rope_scaling->rope_type : std::string("default")}, {"rope_theta", rope_theta}};
  if (rope_scaling)
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      rp[k] = j["rope_scaling"][k];
  j["rope_parameters"] = rp;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  // Fixed by the architecture we implement; written so transformers builds the same model.
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";  // checkpoint writers overwrite this with the storage dtype
  return j;
}

LlamaConfig LlamaConfig::from_json(const json& j) {
  if (!j.is_object())
    throw InputError(std::string("config must be a JSON object, got ") + j.type_name());
  // Keys that would change the architecture into one we do not implement. model_type names the
  // architecture in every Hugging Face config.json; another one's weights (mistral, qwen2, ...)
  // share most Llama tensor names and would otherwise load and run as a different model.
  bool mixtral = false;
  if (const json* type = find(j, "model_type")) {
    if (!type->is_string()) wrong_type("model_type", "a string", *type);
    const std::string name = type->get<std::string>();
    if (name != "llama" && name != "mixtral")
      throw InputError("config: model_type '" + name + "' is not supported (only 'llama' or 'mixtral')");
    mixtral = name == "mixtral";
  }
  // Mixtral's keys: on a Llama config transformers ignores them, and so would we; refused
  // instead, so a config never means something other than what it says.
  for (const char* key : {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
                          "router_jitter_noise", "sliding_window"})
    if (!mixtral && find(j, key))
      throw InputError(std::string("config key '") + key + "' needs model_type 'mixtral'");
  if (mixtral) {
    if (const json* w = find(j, "sliding_window"); w && !w->is_null())
      throw InputError("config: sliding_window " + w->dump() + " is not supported (only null: full causal attention)");
    if (optional_double(j, "router_jitter_noise", 0.0) != 0.0)
      throw InputError("config: router_jitter_noise other than 0 is not supported (the router is deterministic)");
  }
  if (const json* act = find(j, "hidden_act")) {
    if (!act->is_string()) wrong_type("hidden_act", "a string", *act);
    if (act->get<std::string>() != "silu")
      throw InputError("config: hidden_act '" + act->get<std::string>() + "' is not supported (only 'silu')");
  }
  if (optional_bool(j, "attention_bias", false))
    throw InputError("config: attention_bias=true is not supported (Llama has no biases)");
  if (optional_bool(j, "mlp_bias", false))
    throw InputError("config: mlp_bias=true is not supported (Llama has no biases)");

  LlamaConfig c;
  c.vocab_size = required_int(j, "vocab_size");
  c.hidden_size = required_int(j, "hidden_size");
  c.intermediate_size = required_int(j, "intermediate_size");
  c.num_hidden_layers = required_int(j, "num_hidden_layers");
  c.num_attention_heads = required_int(j, "num_attention_heads");
  // Defaults below are transformers' LlamaConfig defaults where they matter for the shape.
  c.num_key_value_heads = optional_int(j, "num_key_value_heads", c.num_attention_heads);
  c.head_dim = optional_int(j, "head_dim", 0);
  if (c.head_dim == 0 && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError("config: hidden_size (" + std::to_string(c.hidden_size) +
                       ") is not divisible by num_attention_heads (" +
                       std::to_string(c.num_attention_heads) + ") and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = optional_int(j, "max_position_embeddings", 2048);
  parse_rope(j, c);
  c.rms_norm_eps = optional_double(j, "rms_norm_eps", 1e-6);
  c.tie_word_embeddings = optional_bool(j, "tie_word_embeddings", false);
  // Absent ids keep our byte-vocabulary defaults (bos 256, eos 257).
  c.bos_token_id = token_id(j, "bos_token_id", c.bos_token_id);
  c.eos_token_id = token_id(j, "eos_token_id", c.eos_token_id);
  if (mixtral) {  // transformers' MixtralConfig defaults
    c.num_local_experts = optional_int(j, "num_local_experts", 8);
    c.num_experts_per_tok = optional_int(j, "num_experts_per_tok", 2);
    c.router_aux_loss_coef = optional_double(j, "router_aux_loss_coef", 0.001);
    c.output_router_logits = optional_bool(j, "output_router_logits", false);
    if (c.num_local_experts < 1)
      throw InputError("config: num_local_experts must be positive for model_type 'mixtral', got " +
                       std::to_string(c.num_local_experts));
  }
  c.validate();
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path) {
  const json j =
      parse_strict_json(read_regular_file(path, "config file", kMaxJsonFileBytes), "config file '" + path + "'");
  try {
    return from_json(j);
  } catch (const InputError& e) {
    throw InputError("config file '" + path + "': " + e.what());
  }
}

void refuse_moe(const LlamaConfig& cfg, const std::string& what) {
  if (cfg.moe())
    throw InputError(what + ": mixture-of-experts layers (num_local_experts = " + std::to_string(cfg.num_local_experts) +
                     ") are not supported here yet: it covers dense Llama layers only");
}

// ---- Presets --------------------------------------------------------------------------------

std::vector<std::string> LlamaConfig::preset_names() {
  return {"tiny", "small", "medium", "tiny-moe", "small-moe", "llama3-8b", "llama3-70b", "llama3-405b"};
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  // tiny: a full training step in milliseconds, for tests. small: trainable on a laptop, and
  // long enough (4,096 positions) to train at long context with context parallelism.
  if (name == "tiny") return byte_shape(64, 176, 2, 4, 2, 128);
  if (name == "small") return byte_shape(288, 768, 6, 6, 2, 4096);
  // medium (~91 M): enough work per GEMM for a 16-core workstation, in Llama 3's proportions:
  // heads of 64, 4 query heads per KV head (8B: 32/8), SwiGLU width 8/3 C rounded up to a
  // multiple of 256 (Meta's multiple_of), 8 layers so pp = 2, 4, 8 cut evenly, and Llama 3's
  // pre-training context of 8,192 positions for long-context lessons.
  if (name == "medium") return byte_shape(1024, 2816, 8, 16, 4, 8192);
  // Mixtures of experts (Mixtral's layer, core/model/moe.h): tiny's and small's attention, every
  // FFN replaced by experts of half the dense width with 2 chosen per token, so a token's FFN
  // FLOPs equal the dense preset's; the load-balancing loss added with Mixtral-8x7B's weight
  // 0.02 (its Hugging Face config.json).
  if (name == "tiny-moe") return moe_shape(byte_shape(64, 88, 2, 4, 2, 128), 4, 2);
  if (name == "small-moe") return moe_shape(byte_shape(288, 384, 6, 6, 2, 4096), 8, 2);
  // Llama 3.1 shapes (Llama 3 herd paper, Table 3; HF meta-llama/Llama-3.1-*/config.json).
  if (name == "llama3-8b") return llama3_shape(4096, 14336, 32, 32);
  if (name == "llama3-70b") return llama3_shape(8192, 28672, 80, 64);
  if (name == "llama3-405b") return llama3_shape(16384, 53248, 126, 128);
  std::string valid;
  for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw InputError("unknown preset '" + name + "' (valid: " + valid + ")");
}

}  // namespace llama4d
