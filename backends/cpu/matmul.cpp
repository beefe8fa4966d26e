// Linear layer without bias (nn.Linear layout): three GEMMs on the row-major buffers, as
// strided views, through the backend's packed GEMM (gemm.h). Its tasks are fixed by the shapes
// and each element is summed in a fixed K order, so the results are bitwise the same for any
// thread count. bf16 operands (GemmOperands::bf16) are summed the same way: each of their
// products is exact in T, so reading them as bf16 would change only how the sum is done.
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemm.h"
#include "core/ops.h"

namespace llama4d::cpu {
namespace {

// Products smaller than this many multiply-adds run on the calling thread alone.
constexpr int64_t kParallelWork = 1 << 21;

}  // namespace

// out[BT, OC] = inp[BT, C] @ weight[OC, C]^T
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, int64_t BT, int64_t C, int64_t OC, GemmOperands) {
  const cpu::GemmOperand<T> x{inp, C, 1};     // (token, c)
  const cpu::GemmOperand<T> w{weight, C, 1};  // (oc, c): the transpose of the right operand
  cpu::gemm(out, OC, x, w, BT, OC, C, false, false, BT * C * OC >= kParallelWork);
}

template <class T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int64_t BT,
                     int64_t C, int64_t OC, GemmOperands, GradWrite dinp_write) {
  const bool parallel = BT * C * OC >= kParallelWork;
  // dinp[BT, C] += (or =) dout[BT, OC] @ weight[OC, C]
  if (dinp != nullptr) {
    const cpu::GemmOperand<T> dy{dout, OC, 1};   // (token, oc)
    const cpu::GemmOperand<T> w_t{weight, 1, C};  // (c, oc)
    cpu::gemm(dinp, C, dy, w_t, BT, C, OC, dinp_write == GradWrite::add, false, parallel);
  }
  // dweight[OC, C] += dout[BT, OC]^T @ inp[BT, C]: a sum over the tokens, cut into depth chunks.
  if (dweight != nullptr) {
    const cpu::GemmOperand<T> dy_t{dout, 1, OC};  // (oc, token)
    const cpu::GemmOperand<T> x_t{inp, 1, C};     // (c, token)
    cpu::gemm(dweight, C, dy_t, x_t, OC, C, BT, true, true, parallel);
  }
}

template void matmul_forward<float>(float*, const float*, const float*, int64_t, int64_t, int64_t,
                                    GemmOperands);
template void matmul_forward<double>(double*, const double*, const double*, int64_t, int64_t,
                                     int64_t, GemmOperands);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t, int64_t, int64_t, GemmOperands, GradWrite);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int64_t, int64_t, int64_t, GemmOperands, GradWrite);

}  // namespace llama4d::cpu
