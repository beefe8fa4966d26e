#pragma once
// Crash-safe file writes: content goes to `<path>.tmp-<pid>-<n>` in the same directory, is
// flushed and fsync'ed, then renamed over `path`. rename() within one filesystem is atomic, so a
// reader (or a crash) sees either the old file or the complete new one, never half of it.
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

namespace llama4d {

// Sequential writer handed to a fill callback; throws IoError naming the destination on failure.
class FileSink {
 public:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void write(const void* data, size_t bytes);
  size_t bytes_written() const { return written_; }

 private:
  int fd_;
  std::string path_;  // the destination, for messages
  size_t written_ = 0;
};

// Writes `path` atomically with whatever `fill` writes. If fill throws or any step fails, the
// temporary file is removed, `path` is untouched, and the exception propagates (IoError for
// filesystem failures, naming `path` and the system's reason).
void write_file_atomically(const std::string& path, const std::function<void(FileSink&)>& fill);
void write_text_file_atomically(const std::string& path, const std::string& text);

// fsync a directory so renames/creations inside it survive a power loss. Throws IoError.
void fsync_directory(const std::string& dir);

// "<stem>.tmp-<host>-<pid>-<n>": unique per machine, process and call, so threads and the ranks
// of a multi-node run sharing a filesystem never collide.
std::string temporary_sibling_name(const std::string& path);

// Who made a temporary name, from the part after ".tmp-": its pid if it was a process of this
// machine, nullopt if another machine's (or not a name temporary_sibling_name gives).
std::optional<long> temporary_owner(const std::string& suffix);
// True while process `pid` of this machine exists.
bool process_alive(long pid);

}  // namespace llama4d
