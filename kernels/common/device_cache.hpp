// Properties of the current device that launchers need on every call, read from the driver once
// per device: the launch path of an uncaptured decode step runs once per layer, so its host time
// counts (swap_in_enqueue measures it).
#pragma once

#include "core/config.hpp"

#if HISPARSE_WITH_CUDA
namespace hisparse::kernels {

/// The current device's SM count (cudaDevAttrMultiProcessorCount), cached per device: a repeated
/// call costs one cudaGetDevice. Thread-safe.
[[nodiscard]] int multiprocessors();

}  // namespace hisparse::kernels
#endif
