// Device half of the copy-engine staging probe (bench_plane_copy.cpp): the kernel that turns a
// GPU-side depth plan into the conditions of a graph's switch nodes.
#pragma once

#if HISPARSE_WITH_CUDA
#include <cuda_runtime.h>

#include <cstdint>

namespace hisparse::microbench {

/// Arguments of the condition kernel: condition i becomes depths[i] - 1 (the switch body that
/// copies that many planes), or `none` (no body) when depths[i] is 0.
struct SwitchConditionArgs {
  const std::uint8_t* depths = nullptr;
  const cudaGraphConditionalHandle* handles = nullptr;
  int count = 0;
  unsigned none = 0;
};

/// The kernel as a graph kernel node's function (one thread per condition).
[[nodiscard]] const void* switch_condition_kernel();
inline constexpr int kSwitchConditionThreads = 256;

}  // namespace hisparse::microbench
#endif
