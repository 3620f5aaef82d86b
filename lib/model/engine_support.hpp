// Which backends the DecodeEngine can run on in this build. Backend selection asks this, so that
// `backend: auto` picks the CUDA engine on a GPU machine of a CUDA build and the CPU elsewhere.
#pragma once

#include "core/config.hpp"
#include "core/device.hpp"

namespace hisparse {

/// True when DecodeEngine runs on `backend`: the CPU always, CUDA in builds with the CUDA backend.
[[nodiscard]] constexpr bool engine_supports(Backend backend) noexcept {
  return backend == Backend::cpu || (backend == Backend::cuda && HISPARSE_WITH_CUDA);
}

}  // namespace hisparse
