#include "scenario/backend_choice.hpp"

#include "model/engine_support.hpp"

namespace hisparse {

BackendChoice engine_backend_for(Backend resolved, bool requested_auto) {
  BackendChoice choice{resolved, {}};
  if (requested_auto && !engine_supports(resolved) && engine_supports(Backend::cpu)) {
    choice.backend = Backend::cpu;
    choice.note = "auto: CUDA decode engine not available yet; running the CPU backend";
  }
  return choice;
}

BackendChoice choose_engine_backend(std::string_view requested, const std::string& where) {
  return engine_backend_for(resolve_backend(requested, where), requested == "auto");
}

}  // namespace hisparse
