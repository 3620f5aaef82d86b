// Dense GEMM in the orientation of a linear layer: Y = alpha * X * W^T + beta * Y, with X [m x k]
// (activations, one row per token), W [n x k] (weights, one row per output feature, as stored in
// checkpoints, fp32 or bf16) and Y [m x n] fp32, all row-major with leading dimensions. The CUDA
// version wraps cuBLASLt; the twin is plain loop-blocked float math, deterministic (each output is
// one sequential dot product over k).
#pragma once

#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

struct GemmArgs {
  const float* x = nullptr;  ///< [m x k], row stride ldx
  const float* w = nullptr;  ///< [n x k], row stride ldw
  float* y = nullptr;        ///< [m x n], row stride ldy
  int m = 0;
  int n = 0;
  int k = 0;
  int ldx = 0;  ///< 0: k
  int ldw = 0;  ///< 0: k
  int ldy = 0;  ///< 0: n
  float alpha = 1.0f;
  float beta = 0.0f;  ///< 0: Y is overwritten (never read), 1: accumulate (residual add)
  /// bf16 weights instead of w, as a bf16 checkpoint holds them. X is then rounded to bf16 (as a
  /// bf16 deployment feeds its GEMMs) and the exact products summed in fp32 (tensor cores on
  /// CUDA). On CUDA the rounded X goes to x_bf16 ([m x k], contiguous), which the caller provides.
  const std::uint16_t* w_bf16 = nullptr;
  std::uint16_t* x_bf16 = nullptr;
};

#if HISPARSE_WITH_CUDA
void launch_gemm(const GemmArgs& args, cudaStream_t stream);
/// out[r][c] = bf16(x[r * ldx + c]) for r < rows, c < cols (out contiguous).
void launch_round_to_bf16(const float* x, int rows, int cols, int ldx, std::uint16_t* out,
                          cudaStream_t stream);
#endif
void gemm_ref(const GemmArgs& args);

}  // namespace hisparse::kernels
