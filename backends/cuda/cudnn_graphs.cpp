// cuDNN's fused attention graphs for --kernels fast (see cudnn_graphs.h): host C++ for the host
// compiler, since the frontend's headers hold no kernel and cost nvcc five minutes (measured on
// the 2-core build machine) against well under one here. Every tensor attribute comes from
// cudnn_sdpa_plan.h's plan, which tests/ops/test_cudnn_sdpa_plan.cpp checks on the CPU.
#include "backends/cuda/cudnn_graphs.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backends/cuda/cudnn_library.h"
#include "core/error.h"

#ifdef LLAMA4D_CUDNN_FRONTEND
#include <cudnn_frontend.h>

// The frontend's dynamic loading reads every cuDNN call from this handle (cudnn_frontend_shim.h
// declares it and leaves its definition to the program).
// It also opens a CUDA runtime of its own (libcudart.so.12 or .13, cudnn_frontend_shim.h) for
// cudaGetDevice and cudaDeviceGetAttribute; the build's static runtime and that one share the
// device's primary context, so pointers and cudaStreamPerThread mean the same to both.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace llama4d::cuda {

#ifndef LLAMA4D_CUDNN_FRONTEND

void open_cudnn_attention() {
  throw InputError("--kernels fast needs cuDNN attention, and this build has none (configured with "
                   "-DLLAMA4D_CUDNN=OFF); reconfigure with it ON, or use --kernels exact");
}
void sdpa_forward(const SdpaPlan&, const void*, const void*, const void*, void*, float*) { open_cudnn_attention(); }
void sdpa_backward(const SdpaPlan&, const void*, const void*, const void*, const void*, const void*, const float*,
                   void*, void*, void*) {
  open_cudnn_attention();
}

#else

namespace fe = cudnn_frontend;

namespace {

std::once_flag opened;

void check_fe(fe::error_t e, const char* what) {
  if (e.is_bad()) throw Error(std::string("cuDNN ") + what + ": " + e.get_message());
}

// One virtual GPU's (one thread's) handle on its stream.
struct Handle {
  cudnnHandle_t h = nullptr;
  Handle() {
    if (fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) throw Error("cudnnCreate failed");
    if (fe::detail::set_stream(h, cudaStreamPerThread) != CUDNN_STATUS_SUCCESS) throw Error("cudnnSetStream failed");
  }
  ~Handle() {
    if (h) fe::detail::destroy_handle(h);  // nothing to do about an error at thread exit
  }
};
cudnnHandle_t handle() {
  static thread_local Handle h;
  return h.h;
}

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

Tensor input(fe::graph::Graph& g, const char* name, const SdpaTensor& t) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_dim({t.dim[0], t.dim[1], t.dim[2], t.dim[3]})
                      .set_stride({t.stride[0], t.stride[1], t.stride[2], t.stride[3]}));
}
void output(const Tensor& x, const SdpaTensor& t, fe::DataType_t type) {
  x->set_output(true)
      .set_dim({t.dim[0], t.dim[1], t.dim[2], t.dim[3]})
      .set_stride({t.stride[0], t.stride[1], t.stride[2], t.stride[3]})
      .set_data_type(type);
}

// One built graph and the tensors its variant pack names (the backward's also dout, dq, dk, dv).
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  Tensor q, k, v, o, stats, dout, dq, dk, dv;
  int64_t workspace = 0;
};

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

void finish_build(Built& b) {
  cudnnHandle_t h = handle();
  check_fe(b.graph->validate(), "graph validate");
  check_fe(b.graph->build_operation_graph(h), "build_operation_graph");
  check_fe(b.graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check_fe(b.graph->check_support(h), "check_support");
  check_fe(b.graph->build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  check_fe(b.graph->get_workspace_size(b.workspace), "get_workspace_size");
}

Built build_forward(const SdpaPlan& p) {
  Built b;
  b.graph = new_graph();
  fe::graph::Graph& g = *b.graph;
  b.q = input(g, "q", p.q), b.k = input(g, "k", p.k), b.v = input(g, "v", p.v);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)  // the log-sum-exp core/ops.h saves
                     .set_causal_mask(p.causal_top_left)
                     .set_attn_scale(p.scale);
  auto [o, stats] = g.sdpa(b.q, b.k, b.v, options);
  output(o, p.o, fe::DataType_t::BFLOAT16);
  output(stats, p.stats, fe::DataType_t::FLOAT);
  b.o = o, b.stats = stats;
  finish_build(b);
  return b;
}

Built build_backward(const SdpaPlan& p) {
  Built b;
  b.graph = new_graph();
  fe::graph::Graph& g = *b.graph;
  b.q = input(g, "q", p.q), b.k = input(g, "k", p.k), b.v = input(g, "v", p.v);
  b.o = input(g, "o", p.o), b.dout = input(g, "dout", p.o);
  b.stats = input(g, "stats", p.stats);
  b.stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_causal_mask(p.causal_top_left)
                     .set_attn_scale(p.scale)
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g.sdpa_backward(b.q, b.k, b.v, b.o, b.dout, b.stats, options);
  output(dq, p.q, fe::DataType_t::BFLOAT16);
  output(dk, p.k, fe::DataType_t::BFLOAT16);
  output(dv, p.v, fe::DataType_t::BFLOAT16);
  b.dq = dq, b.dk = dk, b.dv = dv;
  finish_build(b);
  return b;
}

// This thread's graphs by sdpa_plan_key: each built once per shape.
const Built& cached(const SdpaPlan& p, bool backward) {
  static thread_local std::unordered_map<std::string, Built> graphs;
  const std::string key = sdpa_plan_key(p, backward);
  auto it = graphs.find(key);
  if (it != graphs.end()) return it->second;
  try {
    it = graphs.emplace(key, backward ? build_backward(p) : build_forward(p)).first;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the frontend's own (a CUDA runtime it could not load)
    throw Error(std::string("cuDNN frontend, building the attention graph ") + key + ": " + e.what());
  }
  return it->second;
}

// The graph's workspace, allocated and freed in stream order around one execution.
void execute(const Built& b, std::unordered_map<Tensor, void*>& pack, const char* what) {
  void* workspace = nullptr;
  if (b.workspace > 0 && cudaMallocAsync(&workspace, size_t(b.workspace), cudaStreamPerThread) != cudaSuccess)
    throw Error(std::string("cuDNN ") + what + ": could not allocate its workspace of " +
                std::to_string(b.workspace) + " bytes");
  const fe::error_t e = b.graph->execute(handle(), pack, workspace);
  if (workspace != nullptr) cudaFreeAsync(workspace, cudaStreamPerThread);
  check_fe(e, what);
}

// The frontend's variant packs name buffers by non-const pointer; cuDNN only reads the inputs.
void* in(const void* p) { return const_cast<void*>(p); }

}  // namespace

void open_cudnn_attention() {
  std::call_once(opened, [] { fe::cudnn_dlhandle = open_cudnn(kCudnnCandidates).handle; });
}

void sdpa_forward(const SdpaPlan& p, const void* q, const void* k, const void* v, void* o, float* stats) {
  const Built& b = cached(p, false);
  std::unordered_map<Tensor, void*> pack = {{b.q, in(q)}, {b.k, in(k)}, {b.v, in(v)}, {b.o, o}, {b.stats, stats}};
  execute(b, pack, "attention_forward");
}

void sdpa_backward(const SdpaPlan& p, const void* q, const void* k, const void* v, const void* o, const void* dout,
                   const float* stats, void* dq, void* dk, void* dv) {
  const Built& b = cached(p, true);
  std::unordered_map<Tensor, void*> pack = {{b.q, in(q)},       {b.k, in(k)},       {b.v, in(v)},
                                            {b.o, in(o)},       {b.dout, in(dout)}, {b.stats, in(stats)},
                                            {b.dq, dq},         {b.dk, dk},         {b.dv, dv}};
  execute(b, pack, "attention_backward");
}

#endif

}  // namespace llama4d::cuda
