// POSIX implementation of atomic file writes (open, write, fsync, rename).
#include "core/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_of(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

}  // namespace

std::string temporary_sibling_name(const std::string& path) {
  static std::atomic<unsigned long> counter{0};
  return path + ".tmp-" + host_name() + "-" + std::to_string(long(::getpid())) + "-" + std::to_string(counter++);
}

std::optional<long> temporary_owner(const std::string& suffix) {
  // <host>-<pid>-<n>; the host may itself contain '-', so read from the right.
  const size_t last = suffix.rfind('-');
  if (last == std::string::npos || last == 0) return std::nullopt;
  const size_t mid = suffix.rfind('-', last - 1);
  if (mid == std::string::npos) return std::nullopt;
  const std::string host = suffix.substr(0, mid), pid = suffix.substr(mid + 1, last - mid - 1),
                    n = suffix.substr(last + 1);
  long owner = 0, count = 0;
  if (host != host_name() || read_number(std::string_view(pid), owner) || read_number(std::string_view(n), count) ||
      owner < 0 || count < 0)
    return std::nullopt;
  return owner;
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;  // EPERM: it exists, owned by someone else
}

void FileSink::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write '" + path_ + "': " + errno_text(errno));
    }
    p += n;
    bytes -= size_t(n);
    written_ += size_t(n);
  }
}

void write_file_atomically(const std::string& path, const std::function<void(FileSink&)>& fill) {
  const std::string tmp = temporary_sibling_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("cannot write '" + path + "': " + errno_text(errno));
  try {
    FileSink sink(fd, path);
    fill(sink);
    if (::fsync(fd) != 0) throw IoError("cannot flush '" + path + "': " + errno_text(errno));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw IoError("cannot write '" + path + "': " + errno_text(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw IoError("cannot move '" + tmp + "' to '" + path + "': " + errno_text(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent_of(path));
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](FileSink& sink) { sink.write(text.data(), text.size()); });
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open directory '" + dir + "': " + errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems (e.g. certain network/overlay mounts) refuse fsync on directories; the
  // data files themselves were already synced, so that is not worth failing a save over.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    throw IoError("cannot flush directory '" + dir + "': " + errno_text(err));
}

}  // namespace llama4d
