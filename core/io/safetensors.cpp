// safetensors writer and validating reader.
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "core/strict_json.h"
#include "core/io/atomic_file.h"
#include "core/io/convert.h"

namespace llama4d {

// The format is little-endian; so are x86-64 and aarch64, which lets data be copied as is.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The safetensors reference implementation refuses headers above 100 MB; so do we, so a
// corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// Conversions stream through a buffer of this many bytes instead of a full-size copy.
constexpr size_t kChunkBytes = size_t(4) << 20;

int64_t checked_numel(const std::vector<int64_t>& shape, bool* overflow) {
  int64_t n = 1;
  *overflow = false;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) {
      *overflow = true;
      return 0;
    }
    n *= d;
  }
  return n;
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- Writer ---------------------------------------------------------------------------------

SafetensorsLayout safetensors_layout(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                     const TensorMetadata& metadata) {
  // Metadata leads, as the reference writer puts it.
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  SafetensorsLayout layout;
  std::set<std::string> seen;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw InputError("cannot write '" + path + "': invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second)
      throw InputError("cannot write '" + path + "': tensor '" + t.name + "' appears twice");
    if (!can_convert(t.dtype, t.data_dtype))
      throw InputError("cannot write '" + path + "': tensor '" + t.name + "' cannot be stored as " +
                       std::string(dtype_name(t.dtype)) + " from " + std::string(dtype_name(t.data_dtype)));
    bool overflow;
    const int64_t numel = checked_numel(t.shape, &overflow);
    if (overflow)
      throw InputError("cannot write '" + path + "': tensor '" + t.name + "' has invalid shape " + shape_string(t.shape));
    const uint64_t begin = layout.data_bytes, end = begin + uint64_t(numel) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {begin, end}}};
    layout.tensors.push_back(TensorInfo{t.name, t.dtype, t.shape, numel, begin, end});
    layout.data_bytes = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  layout.prefix.resize(8);
  for (int i = 0; i < 8; ++i) layout.prefix[size_t(i)] = char((n >> (8 * i)) & 0xff);
  layout.prefix += text;
  return layout;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const TensorMetadata& metadata) {
  const SafetensorsLayout layout = safetensors_layout(path, tensors, metadata);  // fixes every offset
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].data == nullptr && layout.tensors[i].numel > 0)
      throw InputError("cannot write '" + path + "': tensor '" + tensors[i].name + "' has no data");
  write_file_atomically(path, [&](FileSink& sink) {
    sink.write(layout.prefix.data(), layout.prefix.size());
    for (size_t i = 0; i < tensors.size(); ++i)
      emit_converted(tensors[i].dtype, tensors[i].data, tensors[i].data_dtype, size_t(layout.tensors[i].numel),
                     [&](const void* bytes, size_t size, size_t) { sink.write(bytes, size); });
  });
}

// ---- Reader ---------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string where = "safetensors file '" + path + "'";
  struct stat st {};
  fd_ = open_regular_file(path, "safetensors file", st);
  try {
    const uint64_t file_size = uint64_t(st.st_size);
    if (file_size < 8)
      throw InputError(where + " is too small (" + std::to_string(file_size) +
                       " bytes) to hold the 8-byte header length");

    unsigned char len[8];
    pread_all(len, 8, 0);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
    if (n > file_size - 8)
      throw InputError(where + ": header length " + std::to_string(n) +
                       " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
    if (n > kMaxHeaderBytes)
      throw InputError(where + ": header length " + std::to_string(n) + " exceeds the 100 MB limit");
    data_start_ = 8 + n;
    const uint64_t data_size = file_size - data_start_;

    std::string text(n, '\0');
    pread_all(text.data(), n, 8);
    const json header = parse_strict_json(text, where + ": header");
    if (!header.is_object()) throw InputError(where + ": header is not a JSON object");

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) throw InputError(where + ": __metadata__ is not an object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            throw InputError(where + ": __metadata__ value for '" + mk + "' is not a string");
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      const std::string tw = where + ": tensor '" + key + "'";
      if (!value.is_object()) throw InputError(tw + " entry is not an object");
      auto dt = value.find("dtype");
      if (dt == value.end() || !dt->is_string()) throw InputError(tw + " has no string 'dtype'");
      TensorInfo t;
      t.name = key;
      try {
        t.dtype = dtype_from_name(dt->get<std::string>());
      } catch (const InputError& e) {
        throw InputError(tw + ": " + e.what());
      }
      auto sh = value.find("shape");
      if (sh == value.end() || !sh->is_array()) throw InputError(tw + " has no 'shape' list");
      for (const json& d : *sh) {
        if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(INT64_MAX)) ||
            d.get<int64_t>() < 0)
          throw InputError(tw + ": shape " + sh->dump() + " has an entry that is not a non-negative integer");
        t.shape.push_back(d.get<int64_t>());
      }
      auto off = value.find("data_offsets");
      if (off == value.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
          !(*off)[1].is_number_unsigned())
        throw InputError(tw + ": 'data_offsets' must be two non-negative integers");
      t.begin = (*off)[0].get<uint64_t>();
      t.end = (*off)[1].get<uint64_t>();
      if (t.begin > t.end)
        throw InputError(tw + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] end before they begin");
      if (t.end > data_size)
        throw InputError(tw + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] lie outside the data section (" + std::to_string(data_size) + " bytes)");
      bool overflow;
      t.numel = checked_numel(t.shape, &overflow);
      const uint64_t bytes = uint64_t(t.numel) * dtype_size(t.dtype);
      if (overflow || uint64_t(t.numel) > std::numeric_limits<uint64_t>::max() / dtype_size(t.dtype) ||
          bytes != t.end - t.begin)
        throw InputError(tw + ": shape " + shape_string(t.shape) + " of " + std::string(dtype_name(t.dtype)) +
                         " needs " + (overflow ? std::string("too many") : std::to_string(bytes)) +
                         " bytes but data_offsets span " + std::to_string(t.end - t.begin));
      tensors_.push_back(std::move(t));
    }

    // The tensors must tile the data section exactly, in offset order: no overlap (two tensors
    // sharing bytes), no gap and no trailing bytes. A header that lies about its own length
    // shifts every tensor by a few bytes and leaves the data section the wrong size; this is
    // where it is caught, as the reference implementation does (MetadataIncompleteBuffer).
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors_) {
      if (t.begin < at)
        throw InputError(where + ": tensors '" + prev->name + "' and '" + t.name + "' overlap in the data section");
      if (t.begin > at)
        throw InputError(where + ": " + std::to_string(t.begin - at) + " bytes before tensor '" + t.name +
                         "' belong to no tensor (data_offsets must tile the data section)");
      at = t.end;
      prev = &t;
    }
    if (at != data_size)
      throw InputError(where + ": the tensors end at byte " + std::to_string(at) + " of a " + std::to_string(data_size) +
                       "-byte data section (a wrong header length, or trailing bytes)");
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(o.fd_),
      data_start_(o.data_start_),
      metadata_(std::move(o.metadata_)),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)) {
  o.fd_ = -1;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    data_start_ = o.data_start_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    o.fd_ = -1;
  }
  return *this;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw InputError("safetensors file '" + path_ + "' has no tensor '" + name + "'");
  return *t;
}

const TensorInfo& SafetensorsFile::checked(const std::string& name,
                                           const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = info(name);
  if (t.shape != expected_shape)
    throw InputError("safetensors file '" + path_ + "': tensor '" + name + "' has shape " +
                     shape_string(t.shape) + ", expected " + shape_string(expected_shape));
  return t;
}

void SafetensorsFile::pread_all(void* out, uint64_t bytes, uint64_t file_offset) const {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = ::pread(fd_, p, std::min<uint64_t>(bytes, uint64_t(1) << 30), off_t(file_offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read safetensors file '" + path_ + "': " + std::strerror(errno));
    }
    if (n == 0) throw IoError("safetensors file '" + path_ + "' ended early (truncated while open?)");
    p += n;
    bytes -= uint64_t(n);
    file_offset += uint64_t(n);
  }
}

const TensorInfo& SafetensorsFile::checked_floating(const std::string& name,
                                                    const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = checked(name, expected_shape);
  if (!is_floating(t.dtype))
    throw InputError("safetensors file '" + path_ + "': tensor '" + name + "' has dtype " +
                     std::string(dtype_name(t.dtype)) + ", expected a floating type (F32, F64, BF16, F16)");
  return t;
}

void SafetensorsFile::read_converted(const TensorInfo& t, DType out_dtype, int64_t elem_begin, int64_t elem_end,
                                     void* out) const {
  const size_t in_size = dtype_size(t.dtype), out_size = dtype_size(out_dtype);
  const size_t count = size_t(elem_end - elem_begin);
  const uint64_t start = data_start_ + t.begin + uint64_t(elem_begin) * in_size;
  if (t.dtype == out_dtype) {
    pread_all(out, count * in_size, start);
    return;
  }
  const size_t per_chunk = std::max<size_t>(1, kChunkBytes / in_size);
  std::vector<unsigned char> buf(std::min(count, per_chunk) * in_size);
  auto* dst = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < count; i += per_chunk) {
    const size_t n = std::min(per_chunk, count - i);
    pread_all(buf.data(), n * in_size, start + i * in_size);
    convert_elements(dst + i * out_size, out_dtype, buf.data(), t.dtype, n);
  }
}

template <class T>
void SafetensorsFile::read(const std::string& name, const std::vector<int64_t>& expected_shape, T* out) const {
  const TensorInfo& t = checked_floating(name, expected_shape);
  read_converted(t, dtype_of<T>(), 0, t.numel, out);
}

template <class T>
void SafetensorsFile::read_range(const std::string& name, const std::vector<int64_t>& expected_shape,
                                 int64_t elem_begin, int64_t elem_end, T* out) const {
  const TensorInfo& t = checked_floating(name, expected_shape);
  if (elem_begin < 0 || elem_begin > elem_end || elem_end > t.numel)
    throw InputError("safetensors file '" + path_ + "': cannot read elements [" + std::to_string(elem_begin) + ", " +
                     std::to_string(elem_end) + ") of tensor '" + name + "', which has " + std::to_string(t.numel));
  read_converted(t, dtype_of<T>(), elem_begin, elem_end, out);
}

void SafetensorsFile::read_raw(const std::string& name, DType dtype, const std::vector<int64_t>& expected_shape,
                               void* out) const {
  const TensorInfo& t = checked(name, expected_shape);
  if (t.dtype != dtype)
    throw InputError("safetensors file '" + path_ + "': tensor '" + name + "' has dtype " +
                     std::string(dtype_name(t.dtype)) + ", expected " + std::string(dtype_name(dtype)));
  pread_all(out, t.end - t.begin, data_start_ + t.begin);
}

template void SafetensorsFile::read<float>(const std::string&, const std::vector<int64_t>&, float*) const;
template void SafetensorsFile::read<double>(const std::string&, const std::vector<int64_t>&, double*) const;
template void SafetensorsFile::read_range<float>(const std::string&, const std::vector<int64_t>&, int64_t, int64_t,
                                                 float*) const;
template void SafetensorsFile::read_range<double>(const std::string&, const std::vector<int64_t>&, int64_t, int64_t,
                                                  double*) const;

}  // namespace llama4d
