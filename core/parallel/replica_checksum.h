#pragma once
// Silent data corruption found by comparison: the ranks of a data-parallel group (with context
// parallelism, the dp_cp group) hold bit-identical weights after every optimizer step, so a
// 64-bit checksum per rank, all-gathered, must agree. One that differs names its rank; with two
// replicas the odd one cannot be told, and both are named.
//
// Cost per step: one read of the rank's weights (N elements, 4N bytes in f32) on the host, and an
// all_gather of 8 bytes per replica; nothing is compared on one replica. The weights must be in
// host memory (the CPU backend; virtual GPUs and MPI processes on it).
#include <cstdint>
#include <span>
#include <string>

#include "core/comm/process_group.h"

namespace llama4d {

// Checksum of `bytes`: 8-byte words (the tail zero-padded) folded by a multiply-xor mix, so any
// single flipped bit changes it.
uint64_t replica_checksum(std::span<const std::byte> bytes);

// Collective over `replicas`. CommError (a corruption is a failure the supervisor restarts)
// naming the step, the world ranks whose checksum disagrees with the majority and the values.
void check_replicas_agree(ProcessGroup& replicas, std::span<const std::byte> weights, int64_t step);

}  // namespace llama4d
