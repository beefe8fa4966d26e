#pragma once
// The safetensors format (https://github.com/huggingface/safetensors), written and read here:
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data]
// The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
// with byte offsets relative to the start of the data, plus an optional
// "__metadata__": {string: string}. Data is tightly packed, little-endian, row-major.
//
// The reader trusts nothing: every length, offset and dtype in the header is checked against
// the file before any byte of data is used, and each failure names the file and the tensor.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor/dtype.h"

namespace llama4d {

using TensorMetadata = std::map<std::string, std::string>;

// One tensor to write. `data` holds numel(shape) elements of `data_dtype` (what sits in memory);
// they are stored as `dtype` (converted on the fly, e.g. float -> BF16; see convert.h).
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::f32;       // stored dtype
  const void* data = nullptr;
  DType data_dtype = DType::f32;  // in-memory dtype of `data`
};

// A tensor's entry in a validated header. begin/end are byte offsets into the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;
};

// A safetensors file's layout, fixed before any data exists: the bytes before the data (8-byte
// length + JSON header, space-padded so data starts 8-byte aligned, as the reference writer does)
// and where each tensor's bytes go. write_safetensors fills it in one pass; TensorFilesWriter
// (checkpoint.h) lets many ranks fill disjoint ranges of it at once.
struct SafetensorsLayout {
  std::string prefix;
  std::vector<TensorInfo> tensors;  // in file order; begin/end relative to the data section
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return prefix.size() + data_bytes; }
};

// The layout write_safetensors(path, tensors, metadata) produces; `data` is not looked at. Throws
// InputError (naming `path`) for duplicate or invalid names, bad shapes or unsupported conversions.
SafetensorsLayout safetensors_layout(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                     const TensorMetadata& metadata = {});

// Writes a safetensors file atomically (temporary sibling + fsync + rename, see atomic_file.h).
// Tensors are stored in the given order. Throws InputError for duplicate or empty names or an
// unsupported conversion, IoError (naming `path`) if the file cannot be written.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const TensorMetadata& metadata = {});

// "[4096, 128256]"
std::string shape_string(const std::vector<int64_t>& shape);

// An open, validated safetensors file. Reads use pread on one descriptor, so concurrent reads
// from several threads are safe.
class SafetensorsFile {
 public:
  // Opens and validates `path`. Throws InputError naming the file and the problem (missing
  // file, header length past the end, bad JSON, unknown dtype, shape/size mismatch, offsets
  // outside the data or overlapping).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorMetadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const TensorInfo* find(const std::string& name) const;                // nullptr if absent
  const TensorInfo& info(const std::string& name) const;                // InputError if absent

  // Reads tensor `name` into out[numel], converting from its stored dtype (F32/F64/BF16/F16)
  // to T (float or double). Throws InputError if it is absent, has another shape than
  // `expected_shape`, or has a non-floating dtype.
  template <class T>
  void read(const std::string& name, const std::vector<int64_t>& expected_shape, T* out) const;

  // Reads elements [elem_begin, elem_end) of the row-major tensor into out[elem_end - elem_begin],
  // converting as read() does; only those elements' bytes are read from disk, so a ZeRO rank
  // loading its shard never holds the whole tensor. Same checks as read(), plus InputError
  // naming the file and tensor unless 0 <= elem_begin <= elem_end <= numel.
  template <class T>
  void read_range(const std::string& name, const std::vector<int64_t>& expected_shape, int64_t elem_begin,
                  int64_t elem_end, T* out) const;

  // Reads the stored bytes unchanged; the stored dtype must equal `dtype`.
  void read_raw(const std::string& name, DType dtype, const std::vector<int64_t>& expected_shape,
                void* out) const;

 private:
  const TensorInfo& checked(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  void pread_all(void* out, uint64_t bytes, uint64_t file_offset) const;
  const TensorInfo& checked_floating(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // The one conversion path behind read() and read_range(): elements [elem_begin, elem_end) of
  // `t`, already validated, into out as `out_dtype`.
  void read_converted(const TensorInfo& t, DType out_dtype, int64_t elem_begin, int64_t elem_end, void* out) const;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + N
  TensorMetadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
};

extern template void SafetensorsFile::read<float>(const std::string&, const std::vector<int64_t>&, float*) const;
extern template void SafetensorsFile::read<double>(const std::string&, const std::vector<int64_t>&, double*) const;
extern template void SafetensorsFile::read_range<float>(const std::string&, const std::vector<int64_t>&, int64_t,
                                                        int64_t, float*) const;
extern template void SafetensorsFile::read_range<double>(const std::string&, const std::vector<int64_t>&, int64_t,
                                                         int64_t, double*) const;

}  // namespace llama4d
