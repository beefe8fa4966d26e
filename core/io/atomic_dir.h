#pragma once
// Crash-safe directory writes, for checkpoints made of several files (config.json,
// model.safetensors, optimizer.safetensors, trainer_state.json, ...).
//
// Everything is written into a sibling staging directory `<dir>.tmp-<pid>-<n>`, fsync'ed, and
// only then moved into place with rename(). An existing `dir` is swapped out atomically
// (renameat2 RENAME_EXCHANGE on Linux; two renames where the filesystem lacks it) and deleted
// afterwards. A crash, a full disk or a throwing callback therefore leaves either the old
// checkpoint or the new one, never a mix. (A crash can leave a stale `*.tmp-*` sibling behind;
// it is never read.)
#include <functional>
#include <string>

namespace llama4d {

// The checks StagedDirectory makes, without writing anything: for callers that should fail before
// a long run rather than when they save at its end.
void check_directory_replaceable(const std::string& dir, const std::string& replace_marker = "");

// Removes the staging directories of `dir` (see above) that processes of this machine left behind
// when they were killed mid-save; a live process's are kept, and so are other machines' (their
// pids mean nothing here). Returns how many were removed.
int remove_stale_staging(const std::string& dir);

// The same, in steps, for writers that are not one function call (the ranks of a sharded save
// fill one staging directory together): the constructor checks `dir` and creates the staging
// directory, commit() moves it into place, and destruction without commit() removes it.
class StagedDirectory {
 public:
  // The checks and errors of write_directory_atomically, before anything is written.
  StagedDirectory(const std::string& dir, const std::string& replace_marker = "");
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& staging() const { return staging_; }  // where to write the files
  // fsyncs the staging directory and moves it into place (replacing an old `dir`); IoError.
  void commit();

 private:
  std::string dir_, staging_, parent_;
  bool exists_ = false, committed_ = false;
};

// Creates (or replaces) directory `dir` with the files `write_files(staging_dir)` writes into
// `staging_dir`. Parent directories are created as needed.
//
// Replacing is guarded, because it deletes the old directory: an existing non-empty `dir` is
// replaced only if `replace_marker` is non-empty and `dir/replace_marker` exists (checkpoints
// pass "config.json"), so a mistyped `--out .` or `--out ~` can never wipe a user's folder.
// Throws InputError if `dir` exists but is not a replaceable directory, IoError if the
// filesystem refuses (naming the path and the reason), or whatever the callback throws; in
// every case the staging directory is removed and `dir` is left as it was.
void write_directory_atomically(const std::string& dir,
                                const std::function<void(const std::string& staging_dir)>& write_files,
                                const std::string& replace_marker = "");

}  // namespace llama4d
