#pragma once
// Small vocabulary shared by every communication backend: reduction operators, reduction
// algorithms, collective kinds and link classes, with their printable names.
#include <cstdint>
#include <string_view>

#include "core/tensor/dtype.h"

namespace llama4d {

// What a reduction computes per element. `avg` is the sum divided by the group size once, at
// the end (floats: a true division, so DP-averaged gradients equal "sum then / N" bitwise;
// integers: truncating division).
enum class ReduceOp : uint8_t { sum, avg, max, min };

// In which order a reduction adds the ranks' contributions.
//   ordered: every element is (((x0 + x1) + x2) + ... + x[N-1]), rank order, identical bits on
//            every rank and identical to a single process summing micro-batches in that order.
//            Modelled on the wire as a "two-shot" all-reduce: each rank pulls its chunk from
//            every peer (direct reduce-scatter), then sends the result to every peer.
//   ring:    NCCL's ring. Chunk k starts at rank k+1 and travels the ring, each rank adding its
//            own contribution, so chunk k is ((x[k+1] + x[k+2]) + ...) + x[k]: a different
//            order for every chunk, which is why a ring all-reduce is not bitwise equal to the
//            sequential sum. bf16 partial sums are rounded to bf16 at every hop, as on the wire.
enum class ReduceAlgo : uint8_t { ordered, ring };

// The operations a ProcessGroup performs (the _v variants share their base kind).
enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv, barrier };

// Which wire a byte crosses in the cluster model.
enum class LinkClass : uint8_t { self, nvlink, infiniband };

std::string_view reduce_op_name(ReduceOp op);
std::string_view reduce_algo_name(ReduceAlgo algo);
std::string_view comm_op_name(CommOp op);
std::string_view link_class_name(LinkClass link);

// Parsers for flags; InputError listing the valid names on anything else.
ReduceOp parse_reduce_op(std::string_view name);
ReduceAlgo parse_reduce_algo(std::string_view name);

// Reductions are defined for f32, f64, bf16 and the integer types; f16 only moves.
bool reduction_supported(DType t);

}  // namespace llama4d
