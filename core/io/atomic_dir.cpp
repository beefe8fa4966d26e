// Staging-directory-then-rename implementation of write_directory_atomically.
#include "core/io/atomic_dir.h"

#include <fcntl.h>   // AT_FDCWD
#include <stdio.h>   // renameat2, RENAME_EXCHANGE (glibc >= 2.28 with _GNU_SOURCE)

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/io/atomic_file.h"

#include <optional>

namespace llama4d {

namespace fs = std::filesystem;

namespace {

// Swaps two existing paths atomically. Returns false if the kernel or filesystem cannot.
bool exchange_paths(const fs::path& a, const fs::path& b) {
#if defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw IoError("cannot move '" + a.string() + "' into place at '" + b.string() + "': " +
                std::strerror(errno));
#else
  (void)a;
  (void)b;
  return false;
#endif
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw IoError("cannot move '" + from.string() + "' to '" + to.string() + "': " + ec.message());
}

}  // namespace

namespace {

struct Target {
  fs::path path, parent;
  bool exists = false;
};

// Whether `dir` may be created or replaced, decided before anything is written.
Target check_target(const std::string& dir, const std::string& replace_marker, bool create_parent) {
  Target t;
  t.path = fs::path(dir).lexically_normal();
  if (!t.path.empty() && t.path.filename().empty()) t.path = t.path.parent_path();  // "a/b/"
  const std::string name = t.path.filename().string();
  if (t.path.empty() || name.empty() || name == "." || name == ".." || t.path == t.path.root_path())
    throw InputError("cannot write a directory at '" + dir + "': give a path that names a new directory");
  t.parent = t.path.parent_path();
  if (t.parent.empty()) t.parent = ".";

  std::error_code ec;
  if (create_parent) {
    fs::create_directories(t.parent, ec);
    if (ec) throw IoError("cannot create directory '" + t.parent.string() + "' for '" + dir + "': " + ec.message());
  }
  fs::file_status st = fs::symlink_status(t.path, ec);
  t.exists = !ec && fs::exists(st);
  if (t.exists) {
    if (fs::is_symlink(st))
      throw InputError("'" + dir + "' is a symbolic link; refusing to replace it");
    if (!fs::is_directory(st)) throw InputError("'" + dir + "' exists and is not a directory");
    const bool empty = fs::is_empty(t.path, ec);
    if (ec) throw IoError("cannot list '" + dir + "': " + ec.message());
    if (!empty && (replace_marker.empty() || !fs::exists(t.path / replace_marker)))
      throw InputError("refusing to replace non-empty directory '" + dir + "'" +
                       (replace_marker.empty() ? std::string()
                                               : ": it has no " + replace_marker +
                                                     ", so it is not a checkpoint this program wrote"));
  }
  return t;
}

}  // namespace

void check_directory_replaceable(const std::string& dir, const std::string& replace_marker) {
  check_target(dir, replace_marker, false);
}

namespace {

// The counter n of a temporary name's "<host>-<pid>-<n>" suffix (0 if it has none).
unsigned long temporary_counter(const std::string& suffix) {
  const size_t last = suffix.rfind('-');
  const std::string n = last == std::string::npos ? "" : suffix.substr(last + 1);
  if (n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoul(n);
}

}  // namespace

bool recover_interrupted_replace(const std::string& dir) {
  const fs::path target = fs::path(dir).lexically_normal();
  std::error_code ec;
  if (target.filename().empty() || fs::exists(fs::symlink_status(target, ec))) return false;
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  const std::string stem = target.filename().string() + ".old.tmp-";
  std::optional<fs::path> newest;
  unsigned long newest_n = 0;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string sibling = entry.path().filename().string();
    if (sibling.rfind(stem, 0) != 0 || !entry.is_directory(ec)) continue;
    const std::string suffix = sibling.substr(stem.size());
    const std::optional<long> pid = temporary_owner(suffix);
    if (pid && process_alive(*pid)) continue;  // a save between its two renames right now
    if (!newest || temporary_counter(suffix) >= newest_n) {
      newest = entry.path();
      newest_n = temporary_counter(suffix);
    }
  }
  if (!newest) return false;
  rename_or_throw(*newest, target);
  fsync_directory(parent.string());
  return true;
}

int remove_stale_staging(const std::string& dir) {
  recover_interrupted_replace(dir);
  const fs::path target = fs::path(dir).lexically_normal();
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  const std::string name = target.filename().string();
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string sibling = entry.path().filename().string();
    for (const std::string& stem : {name + ".tmp-", name + ".old.tmp-"}) {
      if (sibling.rfind(stem, 0) != 0) continue;
      const std::optional<long> pid = temporary_owner(sibling.substr(stem.size()));
      if (!pid || process_alive(*pid)) break;  // not ours to judge, or a save in progress
      std::error_code rm;
      if (fs::remove_all(entry.path(), rm) > 0 && !rm) ++removed;
      break;
    }
  }
  return removed;
}

StagedDirectory::StagedDirectory(const std::string& dir, const std::string& replace_marker) : dir_(dir) {
  const Target t = check_target(dir, replace_marker, true);
  const fs::path& target = t.path;
  const fs::path& parent = t.parent;
  exists_ = t.exists;
  std::error_code ec;

  const fs::path staging = temporary_sibling_name(target.string());
  fs::remove_all(staging, ec);
  fs::create_directory(staging, ec);
  if (ec) throw IoError("cannot create directory '" + staging.string() + "' for '" + dir + "': " + ec.message());
  dir_ = target.string();
  staging_ = staging.string();
  parent_ = parent.string();
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDirectory::commit(Replace how, const std::function<void()>& between_renames) {
  if (committed_) throw Error("StagedDirectory::commit called twice for '" + dir_ + "'");
  const fs::path staging = staging_, target = dir_;
  std::error_code ec;
  fsync_directory(staging_);
  if (!exists_) {
    rename_or_throw(staging, target);
  } else if (how == Replace::exchange_if_supported && exchange_paths(staging, target)) {
    fs::remove_all(staging, ec);  // now holds the old checkpoint; a leftover is harmless
  } else {
    // No atomic exchange: move the old one aside, move the new one in, then delete the old. A
    // kill between the two renames leaves no `dir`: recover_interrupted_replace undoes it.
    const fs::path old = temporary_sibling_name(target.string() + ".old");
    rename_or_throw(target, old);
    try {
      if (between_renames) between_renames();
      rename_or_throw(staging, target);
    } catch (...) {
      fs::rename(old, target, ec);  // put the old checkpoint back
      throw;
    }
    fs::remove_all(old, ec);
  }
  committed_ = true;
  fsync_directory(parent_);
}

void write_directory_atomically(const std::string& dir,
                                const std::function<void(const std::string&)>& write_files,
                                const std::string& replace_marker) {
  StagedDirectory staged(dir, replace_marker);
  write_files(staged.staging());
  staged.commit();
}

}  // namespace llama4d
