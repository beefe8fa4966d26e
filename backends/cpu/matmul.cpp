// Linear layer without bias (nn.Linear layout), as Eigen GEMMs on row-major views.
//
// Threads never share a GEMM. Each product is cut into tasks chosen from the shapes alone,
// every task is one single-threaded Eigen product, and OpenMP hands tasks to threads, so the
// results are bitwise the same for any thread count. (Eigen's own threaded GEMM picks its
// k-blocking by thread count, which changes the rounding; the backend is built with
// EIGEN_DONT_PARALLELIZE.)
#include "backends/cpu/cpu_common.h"
#include "core/ops.h"

namespace llama4d::ops {
namespace {

// Output tiles of at most about this many rows/columns: large enough that re-packing operands
// per tile costs little, small enough to give a few threads work (BT = 2048 -> 4 tiles).
constexpr int64_t kTile = 512;
// Products smaller than this many multiply-adds run on the calling thread alone.
constexpr int64_t kParallelWork = 1 << 21;
// The weight gradient sums over BT: it is split into chunks of about this many rows whose
// partial products are added in chunk order, so every operand is packed only once.
constexpr int64_t kDepthChunk = 512;
constexpr int64_t kMaxDepthChunks = 4;
// ...unless the partial [OC, C] buffers would be large (huge vocabularies): then tiles only.
constexpr int64_t kMaxPartialElements = int64_t(1) << 22;

// A split of [0, n) into equal parts of at most about `tile`, rounded up to multiples of 16 so
// parts start on SIMD-friendly boundaries.
struct Split {
  Split(int64_t n, int64_t tile, int64_t max_parts = INT64_MAX) : n(n) {
    const int64_t parts = std::clamp<int64_t>((n + tile - 1) / tile, 1, max_parts);
    size = std::max<int64_t>(16, ((n + parts - 1) / parts + 15) / 16 * 16);
    count = n == 0 ? 0 : (n + size - 1) / size;
  }
  int64_t begin(int64_t i) const { return i * size; }
  int64_t length(int64_t i) const { return std::min(size, n - i * size); }
  int64_t n, size, count;
};

}  // namespace

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC) {
  report_flops(matmul_forward_flops(BT, C, OC));
  cpu::ConstMatrixMap<T> x(inp, BT, C);     // [BT, C]
  cpu::ConstMatrixMap<T> w(weight, OC, C);  // [OC, C]
  cpu::MatrixMap<T> y(out, BT, OC);         // [BT, OC]
  const Split rows(BT, kTile), cols(OC, kTile);
  cpu::parallel_for_dynamic(rows.count * cols.count, BT * C * OC >= kParallelWork, [&](int64_t t) {
    const int64_t r0 = rows.begin(t / cols.count), nr = rows.length(t / cols.count);
    const int64_t c0 = cols.begin(t % cols.count), nc = cols.length(t % cols.count);
    y.block(r0, c0, nr, nc).noalias() = x.middleRows(r0, nr) * w.middleRows(c0, nc).transpose();
  });
}

template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT,
                     int64_t C, int64_t OC) {
  report_flops(matmul_backward_flops(dinp != nullptr, dweight != nullptr, BT, C, OC));
  cpu::ConstMatrixMap<T> dy(dout, BT, OC);  // [BT, OC]
  const bool parallel = BT * C * OC >= kParallelWork;
  if (dinp != nullptr) {
    cpu::ConstMatrixMap<T> w(weight, OC, C);  // [OC, C]
    cpu::MatrixMap<T> dx(dinp, BT, C);        // [BT, C]
    const Split rows(BT, kTile), cols(C, kTile);
    cpu::parallel_for_dynamic(rows.count * cols.count, parallel, [&](int64_t t) {
      const int64_t r0 = rows.begin(t / cols.count), nr = rows.length(t / cols.count);
      const int64_t c0 = cols.begin(t % cols.count), nc = cols.length(t % cols.count);
      dx.block(r0, c0, nr, nc).noalias() += dy.middleRows(r0, nr) * w.middleCols(c0, nc);
    });
  }
  if (dweight != nullptr) {
    cpu::ConstMatrixMap<T> x(inp, BT, C);  // [BT, C]
    cpu::MatrixMap<T> dw(dweight, OC, C);  // [OC, C]
    // Tasks = (depth chunk, row tile of dweight). Chunk 0 accumulates straight into dweight;
    // chunks 1.. write partial products that are then added in chunk order.
    const Split depth(BT, kDepthChunk, OC * C <= kMaxPartialElements ? kMaxDepthChunks : 1);
    const Split rows(OC, kTile);
    T* partial = depth.count > 1 ? cpu::scratch<T>(7, (depth.count - 1) * OC * C) : nullptr;
    cpu::parallel_for_dynamic(depth.count * rows.count, parallel, [&](int64_t t) {
      const int64_t k0 = depth.begin(t / rows.count), nk = depth.length(t / rows.count);
      const int64_t r0 = rows.begin(t % rows.count), nr = rows.length(t % rows.count);
      auto product = dy.block(k0, r0, nk, nr).transpose() * x.middleRows(k0, nk);
      if (t / rows.count == 0) {
        dw.middleRows(r0, nr).noalias() += product;
      } else {
        cpu::MatrixMap<T> part(partial + (t / rows.count - 1) * OC * C, OC, C);
        part.middleRows(r0, nr).noalias() = product;
      }
    });
    if (depth.count > 1) {
      cpu::parallel_chunks(OC * C, [&](int64_t begin, int64_t end) {
        for (int64_t chunk = 1; chunk < depth.count; ++chunk) {
          const T* p = partial + (chunk - 1) * OC * C;
          for (int64_t i = begin; i < end; ++i) dweight[i] += p[i];
        }
      });
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t,
                                     int64_t);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int64_t, int64_t, int64_t);

}  // namespace llama4d::ops
