#pragma once
// Checkpoint directories in the Hugging Face layout, so transformers can load what we save and
// we can load Meta's released Llama 3 weights (after HF conversion):
//   config.json                      LlamaConfig (HF keys)
//   model.safetensors                all parameters, HF names   -- or, for big models --
//   model.safetensors.index.json     {"metadata": {"total_size": N}, "weight_map": {name: file}}
//   model-00001-of-0000K.safetensors ...
// Trainers add their own files (optimizer.safetensors, trainer_state.json) through the same
// building blocks: flat_tensors / write_tensor_files / TensorStore / write_directory_atomically.
//
// Generic on purpose: it knows parameter specs and flat buffers, not the Llama class.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/io/atomic_dir.h"
#include "core/io/safetensors.h"
#include "core/model/config.h"
#include "core/model/params.h"

namespace llama4d {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kModelBase = "model";  // model.safetensors / model.safetensors.index.json
// "format": "pt" is what transformers checks for in a model file's safetensors metadata.
inline const TensorMetadata kModelMetadata = {{"format", "pt"}};

// ---- JSON files -------------------------------------------------------------------------------

// Parses a JSON file; InputError naming the path (and the parser's complaint) if it is missing,
// unreadable or malformed.
nlohmann::json read_json_file(const std::string& path);
// Writes pretty-printed JSON atomically; IoError naming the path on failure.
void write_json_file(const std::string& path, const nlohmann::json& j);

// ---- Flat buffers <-> named tensors -----------------------------------------------------------

// One TensorToWrite per spec, viewing flat[spec.offset ...], stored as `storage` and named
// prefix + spec.name (a prefix such as "exp_avg." lets optimizer moments share one file).
// The result points into `flat`: keep it alive until written. A null `flat` gives tensors
// without data, enough for a layout (tensor_files.h).
template <class T>
std::vector<TensorToWrite> flat_tensors(const std::vector<ParamSpec>& specs, const T* flat, DType storage,
                                        const std::string& prefix = "");

// Writes `tensors` into the new (staging) directory `dir` as `<base>.safetensors`, or, when
// max_shard_bytes > 0 and they do not fit in one shard, as HF shards
// `<base>-0000i-of-0000K.safetensors` plus `<base>.safetensors.index.json`. Tensors are never
// split; shards fill in order (tensor_files_layout). Files are synced, not renamed: a caller
// wanting all-or-nothing writes into write_directory_atomically's staging directory.
void write_tensor_files(const std::string& dir, const std::string& base,
                        const std::vector<TensorToWrite>& tensors, const TensorMetadata& metadata = {},
                        int64_t max_shard_bytes = 0);

// Named tensors from `<base>.safetensors` or from the shards listed in
// `<base>.safetensors.index.json` (the single file wins if both exist).
class TensorStore {
 public:
  // True if dir holds either form.
  static bool exists(const std::string& dir, const std::string& base = kModelBase);
  // Opens and validates the file(s). InputError naming the path if neither form exists, the
  // index is malformed, a shard is missing, or a shard lacks a tensor the index promises.
  static TensorStore open(const std::string& dir, const std::string& base = kModelBase);

  const std::string& description() const { return where_; }  // path(s), for messages
  std::vector<std::string> names() const;
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent

  // Converting read into T (float/double); InputError naming the tensor and the checkpoint if
  // it is missing or has the wrong shape.
  template <class T>
  void read(const std::string& name, const std::vector<int64_t>& shape, T* out) const;
  // Elements [elem_begin, elem_end) of the row-major tensor into out[elem_end - elem_begin];
  // see SafetensorsFile::read_range.
  template <class T>
  void read_range(const std::string& name, const std::vector<int64_t>& shape, int64_t elem_begin, int64_t elem_end,
                  T* out) const;
  void read_raw(const std::string& name, DType dtype, const std::vector<int64_t>& shape, void* out) const;

 private:
  const SafetensorsFile& file_of(const std::string& name) const;

  std::string where_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

// InputError naming the first tensor of `store` that no spec names under any of `prefixes`:
// weights that config.json does not describe (a layer beyond num_hidden_layers, an lm_head.weight
// of a model with tie_word_embeddings: true) mean the two disagree, and loading only the named
// tensors would silently run another model. The one exception is `*.rotary_emb.inv_freq`, a
// buffer older transformers exports carry; it is recomputed from rope_theta.
void check_no_unexpected_tensors(const TensorStore& store, const std::vector<ParamSpec>& specs,
                                 const std::vector<std::string>& prefixes = {""});

// Reads every spec (named prefix + spec.name) from `store` into flat[spec.offset ...]. Tensors
// in the store that no spec names are not read (load_model refuses them first, through
// check_no_unexpected_tensors); a spec without a tensor is an InputError naming it.
template <class T>
void read_flat_tensors(const TensorStore& store, const std::vector<ParamSpec>& specs, T* flat,
                       const std::string& prefix = "");

// Flat elements [begin, end) of the buffer `specs` describe into out[end - begin]: what a ZeRO
// rank owns, read without ever holding the rest. Each spec overlapping the range contributes
// only its overlap; tensors outside the range are neither checked nor read. InputError if the
// range is not inside [0, total], or if an overlapping spec's tensor is missing or misshapen
// (checked before anything is written to out).
template <class T>
void read_flat_range(const TensorStore& store, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
                     T* out, const std::string& prefix = "");

// ---- Model checkpoints ------------------------------------------------------------------------

// Writes config.json (HF keys, torch_dtype set from `storage`) into `dir`.
void write_config_file(const std::string& dir, const LlamaConfig& cfg, DType storage);

// Writes config.json (torch_dtype set from `storage`) and the model weights into an existing
// directory `dir`. Use inside a write_directory_atomically callback to add more files.
template <class T>
void write_model_files(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs,
                       const T* params, DType storage = DType::f32, int64_t max_shard_bytes = 0);

// Saves a complete checkpoint directory atomically (replacing an older checkpoint there).
template <class T>
void save_model(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs,
                const T* params, DType storage = DType::f32, int64_t max_shard_bytes = 0);

// config.json of a checkpoint directory (or the path of a config file itself).
LlamaConfig load_config(const std::string& dir);

// Fills params (the flat buffer `specs` describes) from dir's model.safetensors or sharded
// index, converting from whatever floating dtype is stored. InputError if a spec's tensor is
// missing or misshapen, or if the files hold a tensor no spec names (check_no_unexpected_tensors).
template <class T>
void load_model(const std::string& dir, const std::vector<ParamSpec>& specs, T* params);

// "float32" / "bfloat16" / ..., as config.json's torch_dtype spells it.
std::string torch_dtype_name(DType t);

}  // namespace llama4d
