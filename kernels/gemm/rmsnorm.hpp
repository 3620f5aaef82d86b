// RMSNorm over rows: y = x / sqrt(mean(x^2) + eps) * weight (weight may be null: all ones).
// In place is allowed (y == x). Used before attention, FFN, the LM head, on q_a and the MLA
// latent, and per head for QK-norm (rows = heads, n = head_dim).
#pragma once

#include "core/stream.hpp"

namespace hisparse::kernels {

struct RmsNormArgs {
  const float* x = nullptr;       ///< [rows x n], row stride ldx
  const float* weight = nullptr;  ///< [n] or nullptr
  float* y = nullptr;             ///< [rows x n], row stride ldy
  int rows = 0;
  int n = 0;
  int ldx = 0;  ///< 0: n
  int ldy = 0;  ///< 0: n
  float eps = 1e-6f;
};

#if HISPARSE_WITH_CUDA
void launch_rmsnorm(const RmsNormArgs& args, cudaStream_t stream);
#endif
void rmsnorm_ref(const RmsNormArgs& args);

}  // namespace hisparse::kernels
