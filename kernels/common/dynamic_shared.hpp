// allow_dynamic_shared: a kernel's dynamic shared-memory limit, raised once per device and kernel.
// Launchers call it before every launch; only a launch that needs more than the kernel was
// allowed before makes the CUDA call, so the launch path costs one cudaGetDevice and a lookup
// instead of a driver call per kernel (host time on every layer of an uncaptured decode step).
#pragma once

#include <cstddef>

#include "core/config.hpp"

#if HISPARSE_WITH_CUDA
namespace hisparse::kernels {

/// Lets `kernel` launch on the current device with up to `bytes` of dynamic shared memory
/// (cudaFuncAttributeMaxDynamicSharedMemorySize). Never lowers what an earlier call allowed.
/// What it set is remembered per device, so after a cudaDeviceReset it would be stale (the
/// project never resets a device). Thread-safe.
void allow_dynamic_shared(const void* kernel, std::size_t bytes);

template <class... Params>
void allow_dynamic_shared(void (*kernel)(Params...), std::size_t bytes) {
  allow_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace hisparse::kernels
#endif
