#pragma once
// Crash-safe directory writes, for checkpoints made of several files (config.json,
// model.safetensors, optimizer.safetensors, trainer_state.json, ...).
//
// Everything is written into a sibling staging directory `<dir>.tmp-<pid>-<n>`, fsync'ed, and
// only then moved into place with rename(). An existing `dir` is swapped out atomically
// (renameat2 RENAME_EXCHANGE on Linux; two renames where the filesystem lacks it) and deleted
// afterwards. A crash, a full disk or a throwing callback therefore leaves either the old
// checkpoint or the new one, never a mix. (A crash can leave a stale `*.tmp-*` sibling behind;
// it is never read. A crash between the two renames leaves the old one under a `.old.tmp-`
// name: every reader and the next writer move it back first, recover_interrupted_replace.)
#include <functional>
#include <string>

namespace llama4d {

// The checks StagedDirectory makes, without writing anything: for callers that should fail before
// a long run rather than when they save at its end.
void check_directory_replaceable(const std::string& dir, const std::string& replace_marker = "");

// Where the filesystem has no atomic exchange (NFS and others), replacing `dir` takes two renames:
// `dir` -> `dir.old.tmp-*`, then the staging directory -> `dir`. A process killed between them
// leaves no `dir`, only those two siblings. This undoes the interrupted replace: when `dir` is
// missing and a `dir.old.tmp-*` sibling is not a live process's of this machine (another
// machine's cannot be told apart from a dead one), the old checkpoint is renamed back to `dir`
// (the newest, by its counter, if there are several). The new one was never committed, so the
// save is rolled back, never half-applied. Returns true if it moved a directory back; IoError if
// the rename fails.
bool recover_interrupted_replace(const std::string& dir);

// Removes the staging directories of `dir` (see above) that processes of this machine left behind
// when they were killed mid-save; a live process's are kept, and so are other machines' (their
// pids mean nothing here). An interrupted replace is recovered first
// (recover_interrupted_replace), so the last committed checkpoint is never among what is
// removed. Returns how many were removed.
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

  // How commit() replaces an existing `dir`: the kernel's atomic exchange where the filesystem
  // has one (else two renames), or always the two renames, so tests run that path on purpose.
  enum class Replace { exchange_if_supported, two_renames };
  // fsyncs the staging directory and moves it into place (replacing an old `dir`); IoError.
  // `between_renames`, if given, runs after the two-rename path moved the old `dir` aside and
  // before the new one moves in: the place a fault test kills the process or throws.
  void commit(Replace how = Replace::exchange_if_supported, const std::function<void()>& between_renames = {});

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
