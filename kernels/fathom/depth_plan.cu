#include "kernels/fathom/depth_plan.hpp"

#include "core/cuda_check.hpp"

namespace hisparse::kernels::fathom {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per stream; lane l holds channels l + 32 r, r < PER_LANE (channels <= 32 PER_LANE, so
// no lane spends bisection steps on channels that do not exist). Every query and variance load
// of the group is issued before any arithmetic: one memory round trip instead of one per (head,
// channel row). Then 30 bisection steps with a warp reduction of the depth sum each. Arithmetic
// identical to depth_plan_bisection_ref (importance summed in head order, the same log2 and
// midpoints), so depths and theta are bit-identical.
template <int PER_LANE>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) depth_plan_kernel(DepthPlanArgs args) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t s = blockIdx.x * kWarpsPerBlock + warp;
  if (s >= args.streams) return;
  const int d = args.channels, heads = args.heads;
  const float* __restrict__ q = args.queries + static_cast<std::int64_t>(s) * heads * d;
  const float* __restrict__ var =
      args.variances + static_cast<std::int64_t>(s % args.variance_period) * d;
  float qv[kMaxGroupHeads][PER_LANE], v[PER_LANE];
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) {
    const int j = lane + 32 * r;
    v[r] = j < d ? __ldg(var + j) : 0.0f;
#pragma unroll
    for (int h = 0; h < kMaxGroupHeads; ++h)
      qv[h][r] = h < heads && j < d ? __ldg(q + h * d + j) : 0.0f;
  }
  float log2_g[PER_LANE];
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) {
    float sum = 0.0f;
#pragma unroll
    for (int h = 0; h < kMaxGroupHeads; ++h)
      if (h < heads) sum = accumulate_q_squared(sum, qv[h][r]);
    log2_g[r] = lane + 32 * r < d ? reproducible_log2(sum * v[r]) : -1e30f;
  }
  float lo = kBisectionLow, hi = kBisectionHigh;
  for (int step = 0; step < kBisectionSteps; ++step) {
    const float mid = 0.5f * (lo + hi);
    int mine = 0;
#pragma unroll
    for (int r = 0; r < PER_LANE; ++r) mine += depth_at(log2_g[r], mid);
    const int total = __reduce_add_sync(0xffffffffu, mine);
    if (total <= args.budget)
      hi = mid;
    else
      lo = mid;
  }
  std::uint8_t* out = args.depths + static_cast<std::int64_t>(s) * d;
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) {
    const int j = lane + 32 * r;
    if (j < d) out[j] = static_cast<std::uint8_t>(depth_at(log2_g[r], hi));
  }
  if (lane == 0 && args.log2_theta) args.log2_theta[s] = hi;
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
