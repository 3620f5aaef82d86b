#include "kernels/fathom/depth_plan.hpp"

#include "core/cuda_check.hpp"
#include "kernels/fathom/depth_plan_warp.cuh"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per stream (depth_plan_warp.cuh has the arithmetic).
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) depth_plan_kernel(DepthPlanArgs args) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= args.streams) return;
  plan_stream_warp<PER_LANE>(args, s, lane,
                             args.depths + static_cast<std::int64_t>(s) * args.channels,
                             args.log2_theta ? args.log2_theta + s : nullptr);
}

}  // namespace

void launch_depth_plan(const DepthPlanArgs& args, cudaStream_t stream) {
  if (args.streams == 0) return;
  static_assert(kMaxChannels == 256, "the PER_LANE instances below cover 32 x 8 channels");
  const unsigned grid = static_cast<unsigned>((args.streams + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const unsigned threads = 32 * kWarpsPerBlock;
  if (args.channels <= 32)
    depth_plan_kernel<1><<<grid, threads, 0, stream>>>(args);
  else if (args.channels <= 64)
    depth_plan_kernel<2><<<grid, threads, 0, stream>>>(args);
  else if (args.channels <= 128)
    depth_plan_kernel<4><<<grid, threads, 0, stream>>>(args);
  else
    depth_plan_kernel<8><<<grid, threads, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
