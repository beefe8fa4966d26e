#pragma once
// The `llama4d` CLI beside a lesson program, run as a learner types it: lessons 09, 10 and 11 run
// their phases as commands, print each one, and read its --json.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "lessons/common/lesson.h"

namespace llama4d::lesson {

// One shell word: 'it''s' quoted so the shell passes it unchanged.
std::string shell_word(const std::string& s);

// A flag's value as the shortest text that reads back as the same double ("0.003", "1e-05", "30").
std::string number_text(double v);

// Runs `llama4d ARGS --json` and returns its one JSON object. Its stderr goes to `log`, and
// last_stderr() holds what this run wrote there (what it printed about failures and restarts).
// Exit code 2 (bad input) throws InputError with that stderr; any other failure Error.
class Cli {
 public:
  Cli(Narrator& say, std::string log);
  nlohmann::json run(const std::string& args, const std::string& stdin_text = "");
  const std::string& last_stderr() const { return last_stderr_; }

 private:
  Narrator& say_;
  std::string log_, bin_, last_stderr_;
};

// Where a lesson writes: the --work directory given (kept), or, when `given` is empty, a fresh
// temporary one named after the lesson, removed however the lesson ends.
class WorkDirectory {
 public:
  WorkDirectory(const std::string& given, const std::string& lesson);
  ~WorkDirectory();
  WorkDirectory(const WorkDirectory&) = delete;
  WorkDirectory& operator=(const WorkDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  bool own_ = false;
};

}  // namespace llama4d::lesson
