// Laid-out tensor files and the range writer that fills them (see tensor_files.h).
#include "core/io/tensor_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/io/convert.h"

namespace llama4d {

std::string path_join(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

namespace {

std::string shard_name(const std::string& base, size_t i, size_t k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i, k);
  return base + buf;
}

void pwrite_all(int fd, const void* data, size_t bytes, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, off_t(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write '" + path + "': " + std::strerror(errno));
    }
    p += n, bytes -= size_t(n), offset += uint64_t(n);
  }
}

}  // namespace

std::string single_tensor_file_name(const std::string& base) { return base + ".safetensors"; }
std::string tensor_index_file_name(const std::string& base) { return base + ".safetensors.index.json"; }

TensorFilesLayout tensor_files_layout(const std::string& base, const std::vector<TensorToWrite>& tensors,
                                      const TensorMetadata& metadata, int64_t max_shard_bytes) {
  TensorFilesLayout out;
  const std::string single = single_tensor_file_name(base);
  SafetensorsLayout whole = safetensors_layout(single, tensors, metadata);  // validates every tensor
  if (max_shard_bytes <= 0 || whole.data_bytes <= uint64_t(max_shard_bytes)) {
    out.files.push_back({single, std::move(whole)});
    return out;
  }
  std::vector<std::vector<TensorToWrite>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = whole.tensors[i].end - whole.tensors[i].begin;
    if (!shards.back().empty() && in_shard + bytes > uint64_t(max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(tensors[i]);
    in_shard += bytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shard_name(base, s + 1, shards.size());
    out.files.push_back({name, safetensors_layout(name, shards[s], metadata)});
    for (const TensorToWrite& t : shards[s]) weight_map[t.name] = name;
  }
  out.index_name = tensor_index_file_name(base);
  out.index = {{"metadata", {{"total_size", whole.data_bytes}}}, {"weight_map", weight_map}};
  return out;
}

void create_tensor_files(const std::string& dir, const TensorFilesLayout& layout) {
  for (const TensorFilesLayout::File& f : layout.files) {
    const std::string path = path_join(dir, f.name);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError("cannot create '" + path + "': " + std::strerror(errno));
    try {
      pwrite_all(fd, f.layout.prefix.data(), f.layout.prefix.size(), 0, path);
      if (::ftruncate(fd, off_t(f.layout.file_bytes())) != 0)
        throw IoError("cannot size '" + path + "' to " + std::to_string(f.layout.file_bytes()) +
                      " bytes: " + std::strerror(errno));
      if (::fsync(fd) != 0) throw IoError("cannot flush '" + path + "': " + std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw IoError("cannot write '" + path + "': " + std::strerror(errno));
  }
  if (!layout.index.is_null()) write_text_file_atomically(path_join(dir, layout.index_name), layout.index.dump(2) + "\n");
}

TensorFilesWriter::TensorFilesWriter(std::string dir, const TensorFilesLayout& layout)
    : dir_(std::move(dir)), layout_(layout), fds_(layout.files.size(), -1) {
  for (size_t f = 0; f < layout.files.size(); ++f)
    for (size_t t = 0; t < layout.files[f].layout.tensors.size(); ++t)
      where_[layout.files[f].layout.tensors[t].name] = {f, t};
}

TensorFilesWriter::~TensorFilesWriter() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

int TensorFilesWriter::descriptor(size_t file) {
  if (fds_[file] < 0) {
    const std::string path = path_join(dir_, layout_.files[file].name);
    fds_[file] = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // never creates: create_tensor_files did
    if (fds_[file] < 0) throw IoError("cannot open '" + path + "' for writing: " + std::strerror(errno));
  }
  return fds_[file];
}

void TensorFilesWriter::write(const std::string& name, int64_t elem_begin, int64_t elem_end, const void* data,
                              DType data_dtype) {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InputError("cannot write tensor '" + name + "': the checkpoint layout has no such tensor");
  const auto [file, entry] = it->second;
  const TensorInfo& t = layout_.files[file].layout.tensors[entry];
  if (elem_begin < 0 || elem_begin > elem_end || elem_end > t.numel)
    throw InputError("cannot write elements [" + std::to_string(elem_begin) + ", " + std::to_string(elem_end) +
                     ") of tensor '" + name + "', which has " + std::to_string(t.numel));
  if (!can_convert(t.dtype, data_dtype))
    throw InputError("tensor '" + name + "' cannot be stored as " + std::string(dtype_name(t.dtype)) + " from " +
                     std::string(dtype_name(data_dtype)));
  const size_t n = size_t(elem_end - elem_begin);
  if (n == 0) return;
  if (data == nullptr) throw InputError("cannot write tensor '" + name + "': no data");
  const std::string path = path_join(dir_, layout_.files[file].name);
  const int fd = descriptor(file);
  const size_t out_size = dtype_size(t.dtype);
  const uint64_t at = layout_.files[file].layout.prefix.size() + t.begin + uint64_t(elem_begin) * out_size;
  emit_converted(t.dtype, data, data_dtype, n, [&](const void* bytes, size_t size, size_t element) {
    pwrite_all(fd, bytes, size, at + element * out_size, path);
  });
}

void TensorFilesWriter::finish() {
  for (size_t f = 0; f < fds_.size(); ++f) {
    if (fds_[f] < 0) continue;
    const std::string path = path_join(dir_, layout_.files[f].name);
    const int fd = fds_[f];
    fds_[f] = -1;
    const bool synced = ::fsync(fd) == 0;
    const int err = errno;
    if (::close(fd) != 0 || !synced)
      throw IoError("cannot flush '" + path + "': " + std::strerror(synced ? errno : err));
  }
}

template <class T>
void write_flat_range(TensorFilesWriter& writer, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
                      const T* data, const std::string& prefix) {
  const int64_t total = flat_numel(specs);
  if (begin < 0 || begin > end || end > total)
    throw InputError("cannot write flat elements [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                     std::to_string(total) + " parameters");
  // A tensor-parallel slice writes the elements it counts (replicas are another rank's to
  // write, so every element is written once), each run at its place in the whole tensor.
  for (const SpecOverlap& p : overlapping_specs(specs, begin, end)) {
    const ParamSpec& s = *p.spec;
    const int64_t lo = std::max(p.lo - s.offset, s.counted_begin), hi = std::min(p.hi - s.offset, s.counted_hi());
    for_each_whole_run(s, lo, hi, [&](int64_t at, int64_t whole, int64_t n) {
      writer.write(prefix + s.name, whole, whole + n, data + (s.offset + at - begin), dtype_of<T>());
    });
  }
}

template void write_flat_range<float>(TensorFilesWriter&, const std::vector<ParamSpec>&, int64_t, int64_t,
                                      const float*, const std::string&);
template void write_flat_range<double>(TensorFilesWriter&, const std::vector<ParamSpec>&, int64_t, int64_t,
                                       const double*, const std::string&);

}  // namespace llama4d
