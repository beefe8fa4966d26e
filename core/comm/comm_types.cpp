#include "core/comm/comm_types.h"

#include <string>

#include "core/error.h"

namespace llama4d {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string_view reduce_algo_name(ReduceAlgo algo) {
  switch (algo) {
    case ReduceAlgo::ordered: return "ordered";
    case ReduceAlgo::ring: return "ring";
  }
  return "?";
}

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::barrier: return "barrier";
  }
  return "?";
}

std::string_view link_class_name(LinkClass link) {
  switch (link) {
    case LinkClass::self: return "self";
    case LinkClass::nvlink: return "nvlink";
    case LinkClass::infiniband: return "ib";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min})
    if (reduce_op_name(op) == name) return op;
  throw InputError("unknown reduce op '" + std::string(name) + "' (expected sum, avg, max or min)");
}

ReduceAlgo parse_reduce_algo(std::string_view name) {
  for (ReduceAlgo a : {ReduceAlgo::ordered, ReduceAlgo::ring})
    if (reduce_algo_name(a) == name) return a;
  throw InputError("unknown reduction algorithm '" + std::string(name) + "' (expected ordered or ring)");
}

bool reduction_supported(DType t) { return t != DType::f16; }

}  // namespace llama4d
