#include "bench/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/comm_model.h"
#include "core/comm/text_table.h"
#include "core/error.h"
#ifdef LLAMA4D_HAVE_MPI
#include "backends/mpi/mpi_session.h"
#endif
#ifdef LLAMA4D_HAVE_NCCL
#include "backends/nccl/nccl_job.h"
#endif

namespace llama4d {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool reduces(const std::string& op) { return op == "all_reduce" || op == "reduce_scatter"; }

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return double(n - 1) / n;
  return 1.0;
}

// One of a point's buffers: the group's symmetric memory or this rank's private heap.
struct Buffer {
  std::shared_ptr<void> memory;
  int64_t bytes = 0;
  unsigned char* data() const { return static_cast<unsigned char*>(memory.get()); }
};

Buffer allocate(ProcessGroup& pg, int64_t bytes, bool symmetric) {
  if (symmetric) return {pg.allocate_symmetric(bytes), bytes};  // collective: every rank, same order
  return {std::shared_ptr<void>(new unsigned char[size_t(std::max<int64_t>(bytes, 1))],
                                std::default_delete<unsigned char[]>()),
          bytes};
}

// One (op, size) point: buffers of this rank and how to issue the call once.
struct Point {
  Buffer in, out;
  int64_t count = 0;  // elements of the nccl-tests "size" buffer
  int64_t per_rank = 0;
};

void fill(const Buffer& b, DType t, int rank) {
  // Small integers in the dtype (bf16 / f16 as their bit patterns of small values), so
  // reductions stay finite however many iterations run.
  const int64_t elem = int64_t(dtype_size(t)), n = b.bytes / elem;
  for (int64_t i = 0; i < n; ++i) {
    const int v = int((i + rank) % 3);
    unsigned char* p = b.data() + i * elem;
    switch (t) {
      case DType::f32: { float x = float(v); std::memcpy(p, &x, 4); break; }
      case DType::f64: { double x = v; std::memcpy(p, &x, 8); break; }
      case DType::bf16: { bf16 x = float_to_bf16(float(v)); std::memcpy(p, &x.bits, 2); break; }
      case DType::f16: { uint16_t x = uint16_t(v ? 0x3c00 : 0); std::memcpy(p, &x, 2); break; }
      case DType::i32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
      case DType::i64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
      case DType::u8: *p = uint8_t(v); break;
    }
  }
}

Point make_point(ProcessGroup& pg, const std::string& op, int64_t bytes, DType t, bool symmetric) {
  const int n = pg.size();
  const int64_t elem = int64_t(dtype_size(t));
  Point p;
  int64_t in_bytes = 0, out_bytes = 0;
  if (op == "all_reduce" || op == "broadcast" || op == "sendrecv") {
    p.count = std::max<int64_t>(1, bytes / elem);
    p.per_rank = p.count;
    in_bytes = p.count * elem;
    out_bytes = op == "sendrecv" ? in_bytes : 0;
  } else {  // reduce_scatter, all_gather, all_to_all: `bytes` is the full N-block buffer
    p.per_rank = std::max<int64_t>(1, bytes / (elem * n));
    p.count = p.per_rank * n;
    const int64_t big = p.count * elem, small = p.per_rank * elem;
    in_bytes = op == "all_gather" ? small : big;
    out_bytes = op == "reduce_scatter" ? small : big;
  }
  p.in = allocate(pg, in_bytes, symmetric);
  p.out = allocate(pg, out_bytes, symmetric);
  fill(p.in, t, pg.rank());
  if (out_bytes > 0) std::memset(p.out.data(), 0, size_t(out_bytes));  // touched: no page faults timed
  return p;
}

void issue(ProcessGroup& pg, const std::string& op, Point& p, DType t) {
  const int n = pg.size(), me = pg.rank();
  if (op == "all_reduce") {
    pg.all_reduce(p.in.data(), p.count, t, ReduceOp::sum);
  } else if (op == "reduce_scatter") {
    pg.reduce_scatter(p.out.data(), p.in.data(), p.per_rank, t, ReduceOp::sum);
  } else if (op == "all_gather") {
    pg.all_gather(p.out.data(), p.in.data(), p.per_rank, t);
  } else if (op == "broadcast") {
    pg.broadcast(p.in.data(), p.count, t);
  } else if (op == "all_to_all") {
    pg.all_to_all(p.out.data(), p.in.data(), p.per_rank, t);
  } else if (op == "sendrecv") {
    SendOptions so{.async_op = true};
    auto w = pg.send(p.in.data(), p.count, t, (me + 1) % n, so);
    pg.recv(p.out.data(), p.count, t, (me + n - 1) % n);
    w->wait();
  }
}

double modelled_us(const ProcessGroup& pg, const std::string& op, const Point& p, DType t) {
  const int64_t elem = int64_t(dtype_size(t));
  const int n = pg.size();
  const std::vector<int64_t> per(size_t(n), p.per_rank);
  if (op == "all_reduce") return plan_all_reduce(pg.cluster(), pg.world_ranks(), p.count, elem, pg.algo()).sim_us;
  if (op == "reduce_scatter") return plan_reduce_scatter(pg.cluster(), pg.world_ranks(), per, elem, pg.algo()).sim_us;
  if (op == "all_gather") return plan_all_gather(pg.cluster(), pg.world_ranks(), per, elem, pg.algo()).sim_us;
  if (op == "broadcast") return plan_broadcast(pg.cluster(), pg.world_ranks(), p.count * elem, 0).sim_us;
  if (op == "all_to_all") {
    std::vector<std::vector<int64_t>> bytes(size_t(n), std::vector<int64_t>(size_t(n), p.per_rank * elem));
    return plan_all_to_all(pg.cluster(), pg.world_ranks(), bytes).sim_us;
  }
  return plan_p2p(pg.cluster(), pg.world_ranks(), 0, n > 1 ? 1 : 0, p.count * elem).sim_us;
}

// The slowest rank's value.
double max_over_ranks(ProcessGroup& pg, double v) {
  pg.all_reduce(&v, 1, DType::f64, ReduceOp::max);
  return v;
}

void check_options(const CommBenchOptions& o) {
  if (o.backend != "virtual" && o.backend != "mpi" && o.backend != "nccl")
    throw InputError("unknown backend '" + o.backend + "' (expected virtual, mpi or nccl)");
  if (o.ranks < 1) throw InputError("--ranks must be >= 1");
  if (o.gpus_per_node < 1) throw InputError("--gpus-per-node must be >= 1");
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
    throw InputError("need 1 <= --min-bytes <= --max-bytes (got " + std::to_string(o.min_bytes) + " and " +
                     std::to_string(o.max_bytes) + ")");
  if (o.max_bytes > (int64_t(1) << 34)) throw InputError("--max-bytes is limited to 16 GiB");
  if (o.iters < 0 || o.warmup < 0) throw InputError("--iters and --warmup must be >= 0");
  const std::vector<std::string> known = comm_bench_ops();
  for (const std::string& op : o.ops)
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      std::string list;
      for (const std::string& k : known) {
        list += list.empty() ? "" : ", ";
        list += k;
      }
      throw InputError("unknown op '" + op + "' (expected all or one of " + list + ")");
    }
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::vector<std::string> comm_bench_ops() {
  return {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "sendrecv"};
}

double measure_memcpy_gbps(int64_t bytes) {
  std::vector<unsigned char> a(size_t(bytes), 1), b(size_t(bytes), 2);  // touched: no page faults timed
  double best = 1e300;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), size_t(bytes));
    best = std::min(best, seconds_since(t0));
    a[size_t(rep)] = b[size_t(bytes - 1 - rep)];  // keep the copies observable
  }
  return double(bytes) / best / 1e9;
}

std::vector<CommBenchRow> run_comm_bench_on(ProcessGroup& pg, const CommBenchOptions& o) {
  check_options(o);
  const int n = pg.size();
  std::vector<std::string> ops = o.ops.empty() ? comm_bench_ops() : o.ops;
  std::vector<CommBenchRow> rows;
  for (const std::string& op : ops) {
    if (reduces(op) && !reduction_supported(o.dtype)) continue;  // f16 only moves
    if (op == "sendrecv" && n < 2) continue;
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      Point p = make_point(pg, op, bytes, o.dtype, o.symmetric);
      for (int i = 0; i < o.warmup; ++i) issue(pg, op, p, o.dtype);
      int iters = o.iters;
      if (iters == 0) {  // one timed call decides, identically on every rank
        pg.barrier();
        const auto t0 = Clock::now();
        issue(pg, op, p, o.dtype);
        const double one = max_over_ranks(pg, seconds_since(t0));
        iters = int(std::clamp(0.2 / std::max(one, 1e-7), 2.0, 100.0));
      }
      pg.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) issue(pg, op, p, o.dtype);
      const double t = max_over_ranks(pg, seconds_since(t0) / iters);
      CommBenchRow row;
      row.op = op;
      row.count = p.count;
      row.bytes = p.count * int64_t(dtype_size(o.dtype));
      row.iters = iters;
      row.time_us = t * 1e6;
      row.algbw_gbps = double(row.bytes) / t / 1e9;
      row.busbw_gbps = row.algbw_gbps * bus_factor(op, n);
      row.sim_us = modelled_us(pg, op, p, o.dtype);
      if (row.sim_us > 0) row.sim_busbw_gbps = double(row.bytes) / (row.sim_us * 1e3) * bus_factor(op, n);
      rows.push_back(row);
      if (bytes > (int64_t(1) << 62) / 2) break;
    }
  }
  return rows;
}

CommBenchReport run_comm_bench(const CommBenchOptions& o) {
  check_options(o);
  CommBenchReport report;
  report.options = o;
  if (o.backend == "virtual") {
    report.memcpy_gbps = measure_memcpy_gbps(std::max<int64_t>(o.max_bytes, 64 << 20));
    VirtualClusterOptions vo;
    vo.ranks = o.ranks;
    vo.algo = o.algo;
    vo.cluster.gpus_per_node = o.gpus_per_node;
    VirtualCluster cluster(vo);
    std::mutex mu;
    cluster.run([&](ProcessGroup& world) {
      std::vector<CommBenchRow> rows = run_comm_bench_on(world, o);
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        report.rows = std::move(rows);
      }
    });
    report.ranks = o.ranks;
    if (!o.trace_path.empty()) cluster.write_trace(o.trace_path);
    return report;
  }
  // One process per rank (MPI, NCCL): every rank measures, rank 0 reports.
  auto on_processes = [&](ProcessGroup& world) {
    // Rank 0 measures memcpy alone, so other ranks do not compete for memory bandwidth.
    if (world.rank() == 0) report.memcpy_gbps = measure_memcpy_gbps(std::max<int64_t>(o.max_bytes, 64 << 20));
    world.barrier();
    report.rows = run_comm_bench_on(world, report.options);
    report.ranks = world.size();
    report.rank = world.rank();
    if (!o.trace_path.empty())
      write_chrome_trace(
          world.size() == 1 ? o.trace_path : o.trace_path + ".rank" + std::to_string(world.rank()) + ".json",
          {&world.trace()});
  };
  if (o.backend == "nccl") {
#ifdef LLAMA4D_HAVE_NCCL
    // The buffers live on the GPU (the group's symmetric memory), as in nccl-tests: host memory
    // would be staged through it, and the table would time the staging.
    report.options.symmetric = true;
    if (const std::string why = nccl_unusable_reason(); !why.empty()) throw InputError("--backend " + why);
    NcclOptions no;
    no.algo = o.algo;
    no.cluster.gpus_per_node = o.gpus_per_node;
    NcclJob job(no, 0);
    on_processes(job.session().world());
    return report;
#else
    throw InputError("--backend nccl: this build has no NCCL backend (it needs CUDA's nvcc and nccl.h)");
#endif
  }
#ifdef LLAMA4D_HAVE_MPI
  MpiOptions mo;
  mo.algo = o.algo;
  mo.cluster.gpus_per_node = o.gpus_per_node;
  MpiSession session(mo);
  on_processes(session.world());
  return report;
#else
  throw InputError("this build has no MPI backend (MPI was not found when it was configured)");
#endif
}

nlohmann::json CommBenchReport::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const CommBenchRow& r : rows)
    rows_json.push_back({{"op", r.op},
                         {"bytes", r.bytes},
                         {"count", r.count},
                         {"iters", r.iters},
                         {"time_us", r.time_us},
                         {"algbw_gbps", r.algbw_gbps},
                         {"busbw_gbps", r.busbw_gbps},
                         {"busbw_over_memcpy", memcpy_gbps > 0 ? r.busbw_gbps / memcpy_gbps : 0.0},
                         {"sim_us", r.sim_us},
                         {"sim_busbw_gbps", r.sim_busbw_gbps}});
  return {{"backend", options.backend},
          {"ranks", ranks},
          {"gpus_per_node", options.gpus_per_node},
          {"algo", std::string(reduce_algo_name(options.algo))},
          {"buffers", options.symmetric ? "symmetric" : "private"},
          {"dtype", std::string(dtype_name(options.dtype))},
          {"redop", "sum"},
          {"memcpy_gbps", memcpy_gbps},
          {"rows", rows_json}};
}

std::string CommBenchReport::table() const {
  std::string out = "# llama4d bench comm: backend " + options.backend + ", " + std::to_string(ranks) +
                    " ranks, algo " + std::string(reduce_algo_name(options.algo)) + ", dtype " +
                    std::string(dtype_name(options.dtype)) + ", " +
                    (options.symmetric ? "symmetric" : "private") + " buffers\n";
  out += "# memcpy bandwidth (1 thread, this machine): " + fmt("%.2f", memcpy_gbps) + " GB/s\n";
  out += "# busbw = algbw x 2(N-1)/N for all_reduce, x (N-1)/N for reduce_scatter/all_gather/all_to_all;"
         " sim = cluster model (NVLink 450 GB/s, IB 50 GB/s per direction)\n";
  std::vector<std::vector<std::string>> t = {{"op", "size(B)", "count", "type", "redop", "iters", "time(us)",
                                              "algbw(GB/s)", "busbw(GB/s)", "busbw/memcpy", "sim(us)",
                                              "sim busbw(GB/s)"}};
  for (const CommBenchRow& r : rows)
    t.push_back({r.op, std::to_string(r.bytes), std::to_string(r.count), std::string(dtype_name(options.dtype)),
                 reduces(r.op) ? "sum" : "-", std::to_string(r.iters), fmt("%.1f", r.time_us),
                 fmt("%.3f", r.algbw_gbps), fmt("%.3f", r.busbw_gbps),
                 fmt("%.2f", memcpy_gbps > 0 ? r.busbw_gbps / memcpy_gbps : 0.0), fmt("%.2f", r.sim_us),
                 fmt("%.1f", r.sim_busbw_gbps)});
  return out + format_table(t);
}

}  // namespace llama4d
