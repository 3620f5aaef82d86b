// The DepthPlanner's per-stream work for one warp, shared by the planner kernel (depth_plan.cu)
// and the plane scan's fused plan (plane_scan.cu), so that both give the same bits as
// depth_plan_bisection_ref.
#pragma once

#include <cstdint>

#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/depth_search.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::kernels::fathom {

// The bisection on log2(theta) (depth_search.hpp: several levels per round, bit-identical to
// the 30 sequential steps), then the depths at the final upper end, which is returned. Lane l
// holds log2 g of channels l + 32 r.
template <int PER_LANE>
__device__ __forceinline__ float bisect_depths(const float (&log2_g)[PER_LANE], int budget, int d,
                                               int lane, std::uint8_t* out) {
  const float hi = warp_search_log2_theta<PER_LANE>(log2_g, budget);
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) {
    const int j = lane + 32 * r;
    if (j < d) out[j] = static_cast<std::uint8_t>(depth_at(log2_g[r], hi));
  }
  return hi;
}

// Lane l holds channels l + 32 r, r < PER_LANE (channels <= 32 PER_LANE). Every query and
// variance load of the group is issued before any arithmetic: one memory round trip instead of
// one per (head, channel row). Then 30 bisection steps with a warp reduction of the depth sum
// each. Importance is summed in head order with the twin's log2 and midpoints, so depths and
// theta are bit-identical to depth_plan_bisection_ref. `out` may be global or shared memory.
template <int PER_LANE>
__device__ __forceinline__ void plan_stream_warp(const DepthPlanArgs& args, std::int32_t s,
                                                 int lane, std::uint8_t* out, float* log2_theta) {
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
  const float hi = bisect_depths<PER_LANE>(log2_g, args.budget_of(s), d, lane, out);
  if (lane == 0 && log2_theta) *log2_theta = hi;
}

/// The same plan for the scan kernel, whose registers are spoken for: no register array of
/// queries (each channel row's heads are loaded together after an L2 prefetch of everything),
/// PER_LANE log2 importances in registers. Same operations in the same order, so the same bits;
/// every lane of the warp must call it.
template <int PER_LANE>
__device__ __forceinline__ void plan_stream_warp_lean(const DepthPlanArgs& args, std::int32_t s,
                                                      int lane, std::uint8_t* out) {
  const int d = args.channels, heads = args.heads;
  const float* __restrict__ q = args.queries + static_cast<std::int64_t>(s) * heads * d;
  const float* __restrict__ var =
      args.variances + static_cast<std::int64_t>(s % args.variance_period) * d;
  for (int j = lane; j < d; j += 32) {  // prefetches hold no registers
    asm volatile("prefetch.global.L2 [%0];" ::"l"(var + j));
    for (int h = 0; h < heads; ++h) asm volatile("prefetch.global.L2 [%0];" ::"l"(q + h * d + j));
  }
  float log2_g[PER_LANE];
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) {
    const int j = lane + 32 * r;
    float qv[kMaxGroupHeads];
#pragma unroll
    for (int h = 0; h < kMaxGroupHeads; ++h)
      qv[h] = h < heads && j < d ? __ldg(q + h * d + j) : 0.0f;
    const float v = j < d ? __ldg(var + j) : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int h = 0; h < kMaxGroupHeads; ++h)
      if (h < heads) sum = accumulate_q_squared(sum, qv[h]);
    log2_g[r] = j < d ? reproducible_log2(sum * v) : -1e30f;
  }
  const float hi = bisect_depths<PER_LANE>(log2_g, args.budget_of(s), d, lane, out);
}

/// plan_stream_warp_lean for any head_dim <= kMaxChannels.
__device__ __forceinline__ void plan_stream_warp_lean_any(const DepthPlanArgs& args, std::int32_t s,
                                                          int lane, std::uint8_t* out) {
  static_assert(kMaxChannels == 256, "the PER_LANE instances below cover 32 x 8 channels");
  if (args.channels <= 32)
    plan_stream_warp_lean<1>(args, s, lane, out);
  else if (args.channels <= 64)
    plan_stream_warp_lean<2>(args, s, lane, out);
  else if (args.channels <= 128)
    plan_stream_warp_lean<4>(args, s, lane, out);
  else
    plan_stream_warp_lean<8>(args, s, lane, out);
}

}  // namespace hisparse::kernels::fathom
