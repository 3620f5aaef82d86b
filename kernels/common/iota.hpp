// The smallest kernel of the project: out[i] = start + i * step. It exists to check that the
// CUDA toolchain, the launcher convention and the CPU-twin convention work end to end.
#pragma once

#include <cstddef>

#include "core/stream.hpp"

namespace hisparse::kernels {

struct IotaArgs {
  float* out = nullptr;  ///< n floats, device memory (host memory for the twin)
  std::size_t n = 0;
  float start = 0.0f;
  float step = 1.0f;
};

#if HISPARSE_WITH_CUDA
void launch_iota(const IotaArgs& args, cudaStream_t stream);
#endif
void iota_ref(const IotaArgs& args);

}  // namespace hisparse::kernels
