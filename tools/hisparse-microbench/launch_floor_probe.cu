#include "launch_floor_probe.hpp"

#include "core/cuda_check.hpp"
#include "kernels/common/dependent_launch.cuh"

namespace hisparse::microbench {
namespace {

// Lets the dependent kernel launch at once (as the swap-in's resolve does), then stores -1s.
__global__ void floor_first(std::int32_t* sink, int writes_per_block) {
  asm volatile("griddepcontrol.launch_dependents;");
  std::int32_t* out = sink + static_cast<std::int64_t>(blockIdx.x) *
                                 max(writes_per_block, static_cast<int>(blockDim.x));
  for (int i = static_cast<int>(threadIdx.x); i < writes_per_block;
       i += static_cast<int>(blockDim.x))
    out[i] = -1;
}

// Waits for the first kernel's stores (griddepcontrol.wait returns at once without PDL), then
// one store per block.
__global__ void floor_second(std::int32_t* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) sink[blockIdx.x] = static_cast<std::int32_t>(blockIdx.x);
}

}  // namespace

void launch_floor_kernels(const LaunchFloorArgs& a, cudaStream_t stream) {
  floor_first<<<static_cast<unsigned>(a.blocks), static_cast<unsigned>(a.threads), 0, stream>>>(
      a.sink, a.writes_per_block);
  HISPARSE_CUDA_CHECK_LAUNCH();
  if (a.nodes < 2) return;
  kernels::launch_dependent(floor_second, dim3(static_cast<unsigned>(a.blocks)),
                            dim3(static_cast<unsigned>(a.threads)), 0, stream, a.pdl, a.sink);
}

}  // namespace hisparse::microbench
