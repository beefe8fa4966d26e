#pragma once
// Per-call options, one struct per operation as in c10d. Every field has a default, so
// `pg.all_reduce(buf, n, DType::f32, ReduceOp::sum)` needs none of them, and a caller sets only
// what it means: `BroadcastOptions o; o.root = 3; o.async_op = true;`.
//
// Common fields:
//   timeout   how long a rank waits for its peers before failing with a CommError that names
//             the missing ranks; 0 means the group's default.
//   async_op  return at once with a Work handle; the operation completes in the background on
//             the rank's communication stream (call wait() before touching the buffers).
//   label     free text copied into the traffic log and trace ("grad bucket 3").
#include <chrono>
#include <string>

namespace llama4d {

struct AllReduceOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct ReduceScatterOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct AllGatherOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct BroadcastOptions {
  int root = 0;  // group rank whose buffer everyone receives
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct AllToAllOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct SendOptions {
  int tag = 0;  // a recv matches a send with the same (source, tag), in order
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct RecvOptions {
  int tag = 0;
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
  bool async_op = false;
  std::string label{};
};

}  // namespace llama4d
