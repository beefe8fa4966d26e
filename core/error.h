#pragma once
// Typed errors. Library code never calls exit(): it throws one of these, and the CLI turns
// it into a one-line message and an exit code (InputError -> 2, everything else -> 1).
#include <stdexcept>
#include <string>

namespace llama4d {

// Base of every llama4d error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Something the user gave us is wrong: a flag, a preset name, a config, a data file, a
// checkpoint whose header lies. The CLI exits with code 2.
class InputError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written (permissions, disk full, missing directory).
class IoError : public Error {
 public:
  using Error::Error;
};

// A collective failed: a peer rank threw, timed out, or called a different collective.
class CommError : public Error {
 public:
  using Error::Error;
};

// Training produced a non-finite loss, gradient norm or weight: the run stops at that step and
// nothing from it is saved (a checkpoint of NaN weights would only hide the failure).
class DivergenceError : public Error {
 public:
  using Error::Error;
};

// A virtual GPU ran out of its simulated HBM.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

}  // namespace llama4d
