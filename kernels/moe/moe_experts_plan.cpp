// Which path launch_moe_experts takes and the scratch it needs (host code, built without CUDA
// too, so the engine and the tests can size buffers on either backend).
#include "kernels/moe/detail/moe_workspace.hpp"
#include "kernels/moe/moe_experts.hpp"

namespace hisparse::kernels {

bool moe_experts_use_tensor_cores(const MoeExpertsArgs& a) {
  // weight_rows_mma: depths (hidden for gate/up, width for down) in pieces of 32, output rows
  // (width, hidden) in tiles of 16.
  return a.bf16 && a.hidden > 0 && a.width > 0 && a.hidden % 32 == 0 && a.width % 32 == 0;
}

std::size_t moe_experts_workspace_bytes(const MoeExpertsArgs& a) {
  if (!moe_experts_use_tensor_cores(a) || a.tokens <= 0 || a.experts <= 0) return 0;
  return detail::carve_moe_workspace(nullptr, a.tokens, a.experts, a.hidden, a.width).bytes;
}

}  // namespace hisparse::kernels
