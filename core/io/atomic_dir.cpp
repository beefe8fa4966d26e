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

StagedDirectory::StagedDirectory(const std::string& dir, const std::string& replace_marker) : dir_(dir) {
  fs::path target = fs::path(dir).lexically_normal();
  if (!target.empty() && target.filename().empty()) target = target.parent_path();  // "a/b/"
  const std::string name = target.filename().string();
  if (target.empty() || name.empty() || name == "." || name == ".." || target == target.root_path())
    throw InputError("cannot write a directory at '" + dir + "': give a path that names a new directory");
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";

  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw IoError("cannot create directory '" + parent.string() + "' for '" + dir + "': " + ec.message());

  // Decide up front whether an existing `dir` may be replaced, before writing anything.
  fs::file_status st = fs::symlink_status(target, ec);
  exists_ = !ec && fs::exists(st);
  if (exists_) {
    if (fs::is_symlink(st))
      throw InputError("'" + dir + "' is a symbolic link; refusing to replace it");
    if (!fs::is_directory(st)) throw InputError("'" + dir + "' exists and is not a directory");
    const bool empty = fs::is_empty(target, ec);
    if (ec) throw IoError("cannot list '" + dir + "': " + ec.message());
    if (!empty && (replace_marker.empty() || !fs::exists(target / replace_marker)))
      throw InputError("refusing to replace non-empty directory '" + dir + "'" +
                       (replace_marker.empty() ? std::string()
                                               : ": it has no " + replace_marker +
                                                     ", so it is not a checkpoint this program wrote"));
  }

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

void StagedDirectory::commit() {
  if (committed_) throw Error("StagedDirectory::commit called twice for '" + dir_ + "'");
  const fs::path staging = staging_, target = dir_;
  std::error_code ec;
  fsync_directory(staging_);
  if (!exists_) {
    rename_or_throw(staging, target);
  } else if (exchange_paths(staging, target)) {
    fs::remove_all(staging, ec);  // now holds the old checkpoint; a leftover is harmless
  } else {
    // No atomic exchange: move the old one aside, move the new one in, then delete the old.
    const fs::path old = temporary_sibling_name(target.string() + ".old");
    rename_or_throw(target, old);
    try {
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
