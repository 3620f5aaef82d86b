#include "kernels/fathom/depth_plan.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kPerLane = kMaxChannels / 32;
constexpr int kWarpsPerBlock = 4;

// One warp per stream: each lane holds up to 8 channels' log2 importance; 30 bisection steps with a
// warp reduction of the depth sum each. Arithmetic identical to depth_plan_bisection_ref.
__global__ void depth_plan_kernel(DepthPlanArgs args) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= args.streams) return;
  const float* q = args.queries + static_cast<std::int64_t>(s) * args.heads * args.channels;
  const float* var =
      args.variances + static_cast<std::int64_t>(s % args.variance_period) * args.channels;
  float log2_g[kPerLane];
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int j = lane + 32 * r;
    log2_g[r] = -1e30f;
    if (j < args.channels) {
      float sum = 0.0f;
      for (int h = 0; h < args.heads; ++h)
        sum = accumulate_q_squared(sum, q[h * args.channels + j]);
      log2_g[r] = reproducible_log2(sum * var[j]);
    }
  }
  float lo = kBisectionLow, hi = kBisectionHigh;
  for (int step = 0; step < kBisectionSteps; ++step) {
    const float mid = 0.5f * (lo + hi);
    int mine = 0;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) mine += depth_at(log2_g[r], mid);
    const int total = __reduce_add_sync(0xffffffffu, mine);
    if (total <= args.budget)
      hi = mid;
    else
      lo = mid;
  }
  std::uint8_t* out = args.depths + static_cast<std::int64_t>(s) * args.channels;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int j = lane + 32 * r;
    if (j < args.channels) out[j] = static_cast<std::uint8_t>(depth_at(log2_g[r], hi));
  }
  if (lane == 0 && args.log2_theta) args.log2_theta[s] = hi;
}

}  // namespace

void launch_depth_plan(const DepthPlanArgs& args, cudaStream_t stream) {
  if (args.streams == 0) return;
  const unsigned grid = static_cast<unsigned>((args.streams + kWarpsPerBlock - 1) / kWarpsPerBlock);
  depth_plan_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(args);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

}  // namespace hisparse::kernels::fathom
