// The backend a run's decode engine uses: `auto` picks CUDA when a GPU is present and the engine
// runs on it, else the CPU (saying why); `cuda` and `cpu` are taken as asked.
#pragma once

#include <string>
#include <string_view>

#include "core/device.hpp"

namespace hisparse {

struct BackendChoice {
  Backend backend = Backend::cpu;
  std::string note;  ///< one line for the user when `auto` fell back; empty otherwise
};

/// `resolved` is what resolve_backend() gave for the request; `requested_auto` whether it was
/// "auto". An automatic CUDA choice becomes the CPU when the engine cannot run on CUDA yet; an
/// explicit "cuda" is kept (each point then fails with the engine's clear error).
[[nodiscard]] BackendChoice engine_backend_for(Backend resolved, bool requested_auto);

/// resolve_backend() followed by engine_backend_for(). Throws Error naming `where` for an unknown
/// name or for "cuda" without a usable GPU.
[[nodiscard]] BackendChoice choose_engine_backend(std::string_view requested,
                                                  const std::string& where);

}  // namespace hisparse
