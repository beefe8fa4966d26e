#pragma once
// How a context-parallel rank's queries reach the keys and values the other ranks hold
// (core/parallel/context_parallel.cpp tells the whole story).
//   allgather  Llama 3's choice: all-gather K and V, attend, reduce-scatter dK and dV.
//   ring       K/V blocks pass around the ring (Liu et al. 2023, "Ring Attention").
#include <string_view>

namespace llama4d {

enum class ContextAlgo { allgather, ring };
std::string_view context_algo_name(ContextAlgo a);
ContextAlgo parse_context_algo(std::string_view name);  // InputError naming the choices

}  // namespace llama4d
