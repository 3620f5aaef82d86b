// launch_dependent: a kernel launch that may use programmatic dependent launch (sm_90+). With
// `pdl`, the kernel's blocks may start while the previous kernel on the stream still runs; the
// kernel must then wait (griddepcontrol.wait) before it reads what that kernel writes. Without,
// it is an ordinary stream-ordered launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "core/cuda_check.hpp"

namespace hisparse::kernels {

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                      cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  HISPARSE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace hisparse::kernels
