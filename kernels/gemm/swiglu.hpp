// SwiGLU activation of a fused gate/up projection: out[i] = silu(gate[i]) * up[i], where each row
// of `gate_up` holds the gate half followed by the up half (width each).
#pragma once

#include "core/stream.hpp"

namespace hisparse::kernels {

struct SwigluArgs {
  const float* gate_up = nullptr;  ///< [rows x 2 * width]
  float* out = nullptr;            ///< [rows x width]
  int rows = 0;
  int width = 0;
};

#if HISPARSE_WITH_CUDA
void launch_swiglu(const SwigluArgs& args, cudaStream_t stream);
#endif
void swiglu_ref(const SwigluArgs& args);

}  // namespace hisparse::kernels
