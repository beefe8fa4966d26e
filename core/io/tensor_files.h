#pragma once
// Tensor files laid out before their data exists, then filled range by range, possibly by many
// writers at once: every rank of a sharded run writes the bytes of the elements it owns (pwrite
// at a known offset), so a checkpoint is saved without any rank holding the whole model.
//
// The files are those write_tensor_files produces (checkpoint.h): `<base>.safetensors`, or HF
// shards `<base>-0000i-of-0000K.safetensors` plus `<base>.safetensors.index.json`. They are
// complete only once every writer has finished, so they are written into a staging directory
// (atomic_dir.h) that is moved into place afterwards.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/safetensors.h"
#include "core/model/params.h"

namespace llama4d {

// dir/file as a path string.
std::string path_join(const std::string& dir, const std::string& file);

// "<base>.safetensors" and "<base>.safetensors.index.json".
std::string single_tensor_file_name(const std::string& base);
std::string tensor_index_file_name(const std::string& base);

struct TensorFilesLayout {
  struct File {
    std::string name;  // file name inside the directory
    SafetensorsLayout layout;
  };
  std::vector<File> files;
  nlohmann::json index;  // the contents of <base>.safetensors.index.json when sharded, else null
  std::string index_name;
};

// Where `tensors` go (their `data` is not looked at): one file, or, when max_shard_bytes > 0
// and they do not fit in one, greedy shards in tensor order (a tensor is never split; one
// larger than the limit gets a shard of its own). InputError as safetensors_layout.
TensorFilesLayout tensor_files_layout(const std::string& base, const std::vector<TensorToWrite>& tensors,
                                      const TensorMetadata& metadata = {}, int64_t max_shard_bytes = 0);

// Done once, by one writer, before any range is written: every file of `layout` in `dir` with
// its header and a data section of full size (zeros until written), and the index when sharded.
// IoError naming the file on failure.
void create_tensor_files(const std::string& dir, const TensorFilesLayout& layout);

// One writer's handle on files create_tensor_files made (in this process or another). Not
// thread-safe; give each rank its own. Disjoint ranges from different writers never overlap
// on disk, so no locking is needed.
class TensorFilesWriter {
 public:
  TensorFilesWriter(std::string dir, const TensorFilesLayout& layout);
  ~TensorFilesWriter();  // closes what is open (without syncing: call finish() to keep the data)
  TensorFilesWriter(const TensorFilesWriter&) = delete;
  TensorFilesWriter& operator=(const TensorFilesWriter&) = delete;

  // Elements [elem_begin, elem_end) of tensor `name` (row-major), from data[elem_end -
  // elem_begin] of `data_dtype`, converted to the stored dtype. InputError naming the tensor if
  // it is unknown, the range lies outside it, or the conversion is unsupported; IoError on a
  // failed write.
  void write(const std::string& name, int64_t elem_begin, int64_t elem_end, const void* data, DType data_dtype);
  // fsync and close every file this writer wrote into. IoError naming the file on failure.
  void finish();

 private:
  int descriptor(size_t file);

  std::string dir_;
  const TensorFilesLayout& layout_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // tensor -> (file, entry in its layout)
  std::vector<int> fds_;                                      // -1 until first written
};

// Flat elements [begin, end) of the buffer `specs` describe, from data[end - begin], into the
// tensors named prefix + spec.name: what a ZeRO rank owns, written without the rest. The
// inverse of read_flat_range (checkpoint.h). InputError if the range is not inside the buffer.
template <class T>
void write_flat_range(TensorFilesWriter& writer, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
                      const T* data, const std::string& prefix = "");

}  // namespace llama4d
