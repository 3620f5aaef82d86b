// Which backends the DecodeEngine can run on in this build. Backend selection asks this, so that
// `backend: auto` on a GPU machine runs the CPU engine until the CUDA decode engine exists instead
// of failing every sweep point.
#pragma once

#include "core/device.hpp"

namespace hisparse {

/// True when DecodeEngine runs on `backend`. The CUDA decode engine is not implemented yet
/// (DecodeEngine's constructor rejects Backend::cuda): change both together when it lands.
[[nodiscard]] constexpr bool engine_supports(Backend backend) noexcept {
  return backend == Backend::cpu;
}

}  // namespace hisparse
