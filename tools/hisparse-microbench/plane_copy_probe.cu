#include "plane_copy_probe.hpp"

namespace hisparse::microbench {
namespace {

__global__ void set_switch_conditions(SwitchConditionArgs a) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < a.count)
    cudaGraphSetConditional(a.handles[i], a.depths[i] > 0 ? a.depths[i] - 1u : a.none);
}

}  // namespace

const void* switch_condition_kernel() {
  return reinterpret_cast<const void*>(&set_switch_conditions);
}

}  // namespace hisparse::microbench
