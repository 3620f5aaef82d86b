// HISPARSE_CUDA_CHECK(call): every CUDA runtime call goes through it. Throws hisparse::CudaError.
// HISPARSE_CUDA_CHECK_LAUNCH(): checks the last launch error right after a kernel launch.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#if HISPARSE_WITH_CUDA
#include <cuda_runtime_api.h>

namespace hisparse::detail {
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
}  // namespace hisparse::detail

#define HISPARSE_CUDA_CHECK(call)                                                             \
  do {                                                                                        \
    const cudaError_t hisparse_cuda_status_ = (call);                                         \
    if (hisparse_cuda_status_ != cudaSuccess)                                                 \
      ::hisparse::detail::throw_cuda_error(hisparse_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define HISPARSE_CUDA_CHECK_LAUNCH() HISPARSE_CUDA_CHECK(cudaGetLastError())
#endif
