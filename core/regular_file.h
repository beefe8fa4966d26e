#pragma once
// Opening a file a person named (config.json, safetensors files and their index, a data file):
// only a regular file, after symlinks, is read. A FIFO would block open() or read() forever and a
// device (/dev/zero) never ends, so both are refused by name before they are read, as are a
// directory, a socket and a symlink loop. The type is checked with stat() before open() and again
// on the open descriptor (open() with O_NONBLOCK, which returns at once even for a FIFO), so a
// FIFO swapped in between the two is refused too, never waited on.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace llama4d {

// The largest JSON file read whole (config.json, an index, tokenizer.json, trainer_state.json):
// Llama 3's tokenizer.json, the largest of them, is 9 MB.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t(64) << 20;

// What a file that is not regular is, for messages.
inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// InputError "<what> '<path>' ..." unless `path` is a regular file after symlinks; its stat.
inline struct stat stat_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ELOOP) throw InputError(what + " '" + path + "' is a symlink loop (or too many levels of symlinks)");
    if (err == ENOENT) throw InputError(what + " '" + path + "' not found: " + std::strerror(err));
    throw InputError("cannot open " + what + " '" + path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode))
    throw InputError(what + " '" + path + "' is " + file_kind(st.st_mode) + ", not a regular file");
  return st;
}

// A read-only descriptor of the regular file `path` (the caller closes it), its stat in `st`.
inline int open_regular_file(const std::string& path, const std::string& what, struct stat& st) {
  stat_regular_file(path, what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw InputError(what + " '" + path + "' is " + file_kind(mode) + ", not a regular file");
  }
  return fd;
}

// The bytes of the regular file `path`, refused (InputError naming it) beyond max_bytes.
inline std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  const int fd = open_regular_file(path, what, st);
  const auto too_large = [&] {
    ::close(fd);
    return InputError(what + " '" + path + "' is larger than the " + std::to_string(max_bytes) +
                      " bytes this reader takes");
  };
  if (uint64_t(st.st_size) > max_bytes) throw too_large();
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError("cannot read " + what + " '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    if (bytes.size() + size_t(n) > max_bytes) throw too_large();  // grew while read
    bytes.append(buf, size_t(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace llama4d
