// Checkpoint directories: config.json + (sharded) safetensors, in the Hugging Face layout.
#include "core/io/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/regular_file.h"
#include "core/strict_json.h"
#include "core/io/atomic_file.h"
#include "core/io/tensor_files.h"

namespace llama4d {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Shard names must stay inside the checkpoint directory: no separators, no "..".
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

}  // namespace

// ---- JSON files -------------------------------------------------------------------------------

json read_json_file(const std::string& path) {
  return parse_strict_json(read_regular_file(path, "JSON file", kMaxJsonFileBytes), "'" + path + "'");
}

void write_json_file(const std::string& path, const json& j) {
  write_text_file_atomically(path, j.dump(2) + "\n");
}

// ---- Flat buffers <-> named tensors -----------------------------------------------------------

template <class T>
std::vector<TensorToWrite> flat_tensors(const std::vector<ParamSpec>& specs, const T* flat, DType storage,
                                        const std::string& prefix) {
  std::vector<TensorToWrite> out;
  out.reserve(specs.size());
  for (const ParamSpec& s : specs)
    out.push_back(TensorToWrite{prefix + s.name, s.shape, storage, flat ? flat + s.offset : nullptr, dtype_of<T>()});
  return out;
}

void write_tensor_files(const std::string& dir, const std::string& base,
                        const std::vector<TensorToWrite>& tensors, const TensorMetadata& metadata,
                        int64_t max_shard_bytes) {
  const TensorFilesLayout layout = tensor_files_layout(base, tensors, metadata, max_shard_bytes);
  create_tensor_files(dir, layout);
  TensorFilesWriter writer(dir, layout);
  size_t i = 0;  // files hold the tensors in their given order
  for (const TensorFilesLayout::File& f : layout.files)
    for (const TensorInfo& t : f.layout.tensors) {
      writer.write(t.name, 0, t.numel, tensors[i].data, tensors[i].data_dtype);
      ++i;
    }
  writer.finish();
}

// ---- TensorStore ------------------------------------------------------------------------------

bool TensorStore::exists(const std::string& dir, const std::string& base) {
  std::error_code ec;
  return fs::is_regular_file(path_join(dir, single_tensor_file_name(base)), ec) ||
         fs::is_regular_file(path_join(dir, tensor_index_file_name(base)), ec);
}

TensorStore TensorStore::open(const std::string& dir, const std::string& base) {
  TensorStore store;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError("checkpoint directory '" + dir + "' does not exist");
  const std::string single = path_join(dir, single_tensor_file_name(base));
  const std::string index = path_join(dir, tensor_index_file_name(base));

  // An entry of that name, whatever it is: a FIFO, a device or a symlink loop is then refused by
  // name when opened, not taken for "no such file".
  const auto present = [&](const std::string& p) { return fs::exists(fs::symlink_status(p, ec)); };
  if (present(single)) {
    store.where_ = single;
    store.files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const TensorInfo& t : store.files_[0]->tensors()) store.owner_[t.name] = 0;
    return store;
  }
  if (!present(index))
    throw InputError("checkpoint directory '" + dir + "' has neither " + single_tensor_file_name(base) + " nor " +
                     tensor_index_file_name(base));

  store.where_ = index;
  json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError("sharded index '" + index + "' has no \"weight_map\" object");
  std::map<std::string, size_t> file_slot;  // shard file name -> index into files_
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string() || !is_plain_file_name(file.get<std::string>()))
      throw InputError("sharded index '" + index + "': tensor '" + tensor + "' maps to " + file.dump() +
                       ", which is not a file name in the checkpoint directory");
    const std::string name = file.get<std::string>();
    auto it = file_slot.find(name);
    if (it == file_slot.end()) {
      try {
        store.files_.push_back(std::make_unique<SafetensorsFile>(path_join(dir, name)));
      } catch (const InputError& e) {
        throw InputError("sharded index '" + index + "': shard '" + name + "' (holding '" + tensor +
                         "') is unusable: " + e.what());
      }
      it = file_slot.emplace(name, store.files_.size() - 1).first;
    }
    if (!store.files_[it->second]->find(tensor))
      throw InputError("sharded index '" + index + "' says tensor '" + tensor + "' is in '" + name +
                       "', but that shard has no such tensor");
    store.owner_[tensor] = it->second;
  }
  return store;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, slot] : owner_) out.push_back(name);
  return out;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->find(name);
}

const SafetensorsFile& TensorStore::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) throw InputError("checkpoint '" + where_ + "' is missing tensor '" + name + "'");
  return *files_[it->second];
}

template <class T>
void TensorStore::read(const std::string& name, const std::vector<int64_t>& shape, T* out) const {
  file_of(name).read(name, shape, out);
}

template <class T>
void TensorStore::read_range(const std::string& name, const std::vector<int64_t>& shape, int64_t elem_begin,
                             int64_t elem_end, T* out) const {
  file_of(name).read_range(name, shape, elem_begin, elem_end, out);
}

void TensorStore::read_raw(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                           void* out) const {
  file_of(name).read_raw(name, dtype, shape, out);
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The layer index of an HF Llama name "model.layers.<i>.<rest>", or -1.
int64_t layer_of(const std::string& name) {
  static const std::string head = "model.layers.";
  if (name.rfind(head, 0) != 0) return -1;
  const size_t dot = name.find('.', head.size());
  if (dot == std::string::npos || dot == head.size()) return -1;
  int64_t i = 0;
  for (size_t k = head.size(); k < dot; ++k) {
    if (name[k] < '0' || name[k] > '9' || i > (int64_t(1) << 40)) return -1;
    i = i * 10 + (name[k] - '0');
  }
  return i;
}

}  // namespace

void check_no_unexpected_tensors(const TensorStore& store, const std::vector<ParamSpec>& specs,
                                 const std::vector<std::string>& prefixes) {
  std::set<std::string> expected;
  int64_t layers = 0;
  for (const ParamSpec& s : specs) {
    for (const std::string& p : prefixes) expected.insert(p + s.name);
    layers = std::max(layers, layer_of(s.name) + 1);
  }
  for (const std::string& name : store.names()) {
    if (expected.count(name) || ends_with(name, ".rotary_emb.inv_freq")) continue;
    std::string base = name;  // without the prefix, to say what kind of tensor it is
    bool prefixed = false;
    std::string wanted;
    for (const std::string& p : prefixes) {
      if (name.rfind(p, 0) == 0) base = name.substr(p.size()), prefixed = true;
      wanted += (wanted.empty() ? "'" : ", '") + p + "'";
    }
    std::string why = "which the configured model does not have";
    if (!prefixed)
      why = "without any of the prefixes " + wanted + " of the tensors there (model weights in the optimizer's file?)";
    else if (base == "lm_head.weight")
      why = "but the config says tie_word_embeddings: true (the LM head is the embedding)";
    else if (const int64_t l = layer_of(base); l >= layers)
      why = "a layer beyond the config's num_hidden_layers (" + std::to_string(layers) + ")";
    throw InputError("checkpoint '" + store.description() + "' holds tensor '" + name + "', " + why +
                     ": config and weights disagree");
  }
}

template <class T>
void read_flat_tensors(const TensorStore& store, const std::vector<ParamSpec>& specs, T* flat,
                       const std::string& prefix) {
  read_flat_range(store, specs, 0, flat_numel(specs), flat, prefix);
}

template <class T>
void read_flat_range(const TensorStore& store, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
                     T* out, const std::string& prefix) {
  const int64_t total = flat_numel(specs);
  if (begin < 0 || begin > end || end > total)
    throw InputError("checkpoint '" + store.description() + "': cannot read flat elements [" + std::to_string(begin) +
                     ", " + std::to_string(end) + ") of " + std::to_string(total) + " parameters");
  const std::vector<SpecOverlap> pieces = overlapping_specs(specs, begin, end);
  // Check every name first, so a wrong checkpoint fails before any element of out is overwritten.
  for (const SpecOverlap& p : pieces) {
    const std::string name = prefix + p.spec->name;
    const TensorInfo* t = store.find(name);
    if (!t) throw InputError("checkpoint '" + store.description() + "' is missing tensor '" + name + "'");
    if (t->shape != p.spec->full_shape())
      throw InputError("checkpoint '" + store.description() + "': tensor '" + name + "' has shape " +
                       shape_string(t->shape) + ", expected " + shape_string(p.spec->full_shape()));
  }
  // A tensor-parallel slice reads its runs of the whole tensor.
  for (const SpecOverlap& p : pieces) {
    const ParamSpec& s = *p.spec;
    for_each_whole_run(s, p.lo - s.offset, p.hi - s.offset, [&](int64_t at, int64_t whole, int64_t n) {
      T* run = out + (s.offset + at - begin);
      store.read_range(prefix + s.name, s.full_shape(), whole, whole + n, run);
      // Weights and optimizer moments are finite: a NaN or inf read in would only show later, as a
      // loss of nan or tokens sampled from nothing.
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(run[i]))
          throw InputError("checkpoint '" + store.description() + "': tensor '" + prefix + s.name + "' holds " +
                           (std::isnan(run[i]) ? "NaN" : "inf") + " at element " + std::to_string(whole + i));
    });
  }
}

// ---- Model checkpoints ------------------------------------------------------------------------

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "float32";
}

void write_config_file(const std::string& dir, const LlamaConfig& cfg, DType storage) {
  json j = cfg.to_json();
  j["torch_dtype"] = torch_dtype_name(storage);
  write_json_file(path_join(dir, kConfigFile), j);
}

template <class T>
void write_model_files(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs,
                       const T* params, DType storage, int64_t max_shard_bytes) {
  write_config_file(dir, cfg, storage);
  write_tensor_files(dir, kModelBase, flat_tensors(specs, params, storage), kModelMetadata, max_shard_bytes);
}

template <class T>
void save_model(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs,
                const T* params, DType storage, int64_t max_shard_bytes) {
  write_directory_atomically(
      dir, [&](const std::string& staging) { write_model_files(staging, cfg, specs, params, storage, max_shard_bytes); },
      kConfigFile);
}

LlamaConfig load_config(const std::string& dir) {
  recover_interrupted_replace(dir);  // a save killed between its two renames (no atomic exchange)
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return LlamaConfig::from_file(dir);
  return LlamaConfig::from_file(path_join(dir, kConfigFile));
}

template <class T>
void load_model(const std::string& dir, const std::vector<ParamSpec>& specs, T* params) {
  const TensorStore store = TensorStore::open(dir, kModelBase);
  check_no_unexpected_tensors(store, specs);
  read_flat_tensors(store, specs, params);
}

// Every templated function of this file, for float and double.
#define LLAMA4D_CHECKPOINT_INSTANTIATE(T)                                                                          \
  template std::vector<TensorToWrite> flat_tensors<T>(const std::vector<ParamSpec>&, const T*, DType,              \
                                                      const std::string&);                                         \
  template void TensorStore::read<T>(const std::string&, const std::vector<int64_t>&, T*) const;                   \
  template void read_flat_tensors<T>(const TensorStore&, const std::vector<ParamSpec>&, T*, const std::string&);   \
  template void TensorStore::read_range<T>(const std::string&, const std::vector<int64_t>&, int64_t, int64_t, T*)  \
      const;                                                                                                       \
  template void read_flat_range<T>(const TensorStore&, const std::vector<ParamSpec>&, int64_t, int64_t, T*,        \
                                   const std::string&);                                                            \
  template void write_model_files<T>(const std::string&, const LlamaConfig&, const std::vector<ParamSpec>&,        \
                                     const T*, DType, int64_t);                                                    \
  template void save_model<T>(const std::string&, const LlamaConfig&, const std::vector<ParamSpec>&, const T*,     \
                              DType, int64_t);                                                                     \
  template void load_model<T>(const std::string&, const std::vector<ParamSpec>&, T*);
LLAMA4D_CHECKPOINT_INSTANTIATE(float)
LLAMA4D_CHECKPOINT_INSTANTIATE(double)
#undef LLAMA4D_CHECKPOINT_INSTANTIATE

}  // namespace llama4d
