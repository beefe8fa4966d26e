#pragma once
// Everything the cluster model tracks for one rank: its HBM, its timeline, its traffic and its
// flight recorder of the last collectives.
// Shared by all the groups a rank belongs to (a rank has one memory, whatever group it talks in).
#include <cstdint>

#include "core/comm/cluster.h"
#include "core/comm/flight_recorder.h"
#include "core/comm/trace.h"
#include "core/comm/traffic_log.h"
#include "core/tensor/memory_tracker.h"

namespace llama4d {

struct RankAccounting {
  RankAccounting(int world_rank, const ClusterSpec& cluster, RankTrace::Clock::time_point origin)
      : memory(world_rank, cluster.hbm_bytes), trace(world_rank, origin, cluster.gpu_tflops) {}
  MemoryTracker memory;
  RankTrace trace;
  TrafficLog traffic;
  FlightRecorder flight;
};

}  // namespace llama4d
