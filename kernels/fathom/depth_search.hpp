// The DepthPlanner's search for log2(theta), several bisection levels per round.
//
// The contract is the sequential bisection (sequential_depth_search): kBisectionSteps steps of
// mid = 0.5f * (lo + hi), hi = mid when the depth sum at mid fits the budget, else lo = mid. Each
// step's depth sum on the GPU is a warp reduction, so the 30 steps are one long dependent chain.
// A round of L levels instead computes the 2^L - 1 midpoints that the next L sequential steps can
// visit (each from the endpoints that path would have, with the same float operations), asks for
// all their depth sums at once (independent reductions that pipeline) and then walks the path the
// sequential steps take. Every midpoint and every decision is the sequential one, so the final hi
// is bit-identical, for any depth-sum function, in 30 / L dependent rounds.
#pragma once

#include <cstdint>

#include "kernels/fathom/fathom_math.hpp"

#if defined(__CUDA_ARCH__)
#define HISPARSE_SEARCH_UNROLL _Pragma("unroll")
#else
#include <cfenv>
#define HISPARSE_SEARCH_UNROLL
#endif

namespace hisparse::kernels::fathom {

/// The sequential bisection on log2(theta); `total(x)` is the depth sum at log2(theta) = x.
template <class Total>
HISPARSE_HD float sequential_depth_search(int budget, Total&& total) {
  float lo = kBisectionLow, hi = kBisectionHigh;
  for (int step = 0; step < kBisectionSteps; ++step) {
    const float mid = 0.5f * (lo + hi);
    if (total(mid) <= budget)
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

/// sequential_depth_search's result in kBisectionSteps / LEVELS rounds. `totals(mid, total)` sets
/// total[n] to the depth sum at mid[n] for the round's nodes n = 1 .. 2^LEVELS - 1, in heap order:
/// node 1 is the next sequential step's midpoint, node 2n the one after it when the sum at node n
/// fits the budget (hi moved down), node 2n + 1 when it does not.
template <int LEVELS, class Totals>
HISPARSE_HD float multilevel_depth_search(int budget, Totals&& totals) {
  static_assert(LEVELS >= 1 && LEVELS <= 6 && kBisectionSteps % LEVELS == 0,
                "rounds must cover the 30 bisection steps exactly");
  constexpr int kNodes = 1 << LEVELS;
  float lo = kBisectionLow, hi = kBisectionHigh;
  for (int round = 0; round < kBisectionSteps / LEVELS; ++round) {
    // edge[k], k = 0 .. kNodes: the round's midpoints in increasing order between lo and hi. The
    // node at `level`, position i, sits at k = (2i + 1) * half with half = kNodes >> (level + 1);
    // its interval runs from edge[k - half] to edge[k + half].
    float edge[kNodes + 1];
    float mid[kNodes];
    int total[kNodes];
    edge[0] = lo;
    edge[kNodes] = hi;
    mid[0] = 0.0f;
    total[0] = 0;
    HISPARSE_SEARCH_UNROLL
    for (int level = 0; level < LEVELS; ++level) {
      const int half = kNodes >> (level + 1);
      HISPARSE_SEARCH_UNROLL
      for (int i = 0; i < (1 << level); ++i) {
        const int k = (2 * i + 1) * half;
        edge[k] = 0.5f * (edge[k - half] + edge[k + half]);  // the sequential step's midpoint
        mid[(1 << level) + i] = edge[k];
      }
    }
    totals(mid, total);
    // The path: at each level keep the subtree under the chosen child in the first slots of every
    // deeper level, so the current node is always 1 << level (no run-time array index, which a
    // GPU would put in local memory).
    HISPARSE_SEARCH_UNROLL
    for (int level = 0; level < LEVELS; ++level) {
      const int node = 1 << level;
      const bool fits = total[node] <= budget;
      const float m = mid[node];
      lo = fits ? lo : m;
      hi = fits ? m : hi;
      HISPARSE_SEARCH_UNROLL
      for (int deeper = level + 1; deeper < LEVELS; ++deeper) {
        const int half = 1 << (deeper - level - 1);
        HISPARSE_SEARCH_UNROLL
        for (int i = 0; i < half; ++i) {
          const int a = (1 << deeper) + i;
          total[a] = fits ? total[a] : total[a + half];
          mid[a] = fits ? mid[a] : mid[a + half];
        }
      }
    }
  }
  return hi;
}

/// log2(theta) of one stream from its channels' log2 importances (the CPU twin's search).
template <int LEVELS>
HISPARSE_HD float search_log2_theta(const float* log2_g, int channels, int budget) {
  return multilevel_depth_search<LEVELS>(
      budget, [&](const float(&mid)[1 << LEVELS], int(&total)[1 << LEVELS]) {
        for (int n = 1; n < (1 << LEVELS); ++n) total[n] = 0;
        for (int j = 0; j < channels; ++j)
          for (int n = 1; n < (1 << LEVELS); ++n) total[n] += depth_at(log2_g[j], mid[n]);
      });
}

/// Levels per round of the CPU twin and (for up to 2 channels per lane) of the kernel.
inline constexpr int kDepthSearchLevels = 3;

/// Levels per round for a warp whose lanes hold PER_LANE channels: a round issues 2^L - 1 depth
/// sums of about 3.5 PER_LANE instructions each, so wide lanes take 2 levels (the rounds stay
/// latency-bound) and narrow ones 3.
inline constexpr int warp_search_levels(int per_lane) {
  return per_lane >= 4 ? 2 : kDepthSearchLevels;
}

/// 1.5 * 2^23: floats in [2^23, 2^24) are the integers, so RD(kDepthCodeBias + y) for y in [0, 4]
/// is kDepthCodeBias + floor(y), whose bits are kDepthCodeBiasBits + floor(y).
inline constexpr float kDepthCodeBias = 12582912.0f;
inline constexpr std::uint32_t kDepthCodeBiasBits = 0x4b400000u;

/// The bits of kDepthCodeBias + depth_at(log2_g, x), from three FP32 operations instead of a
/// subtraction, four compares and three adds: with d = RN(log2_g - x) (depth_at's difference),
/// v = sat(RD(d / 8 + 1 / 8)) = clamp(RD((d + 1) / 2), 0, 4) / 4 (scaling by 4 is exact: d + 1 is
/// 0 or at least 2^-24 in size), and RD(4 v + kDepthCodeBias) adds floor(4 v). floor(RD(y)) =
/// floor(y) for every real y, and floor((d + 1) / 2) >= m exactly when d >= 2m - 1, which is
/// depth_at's count. Infinities saturate to 0 and 4; NaN gives 0 like depth_at.
HISPARSE_HD std::uint32_t depth_code(float log2_g, float x) {
  const float d = log2_g - x;
#if defined(__CUDA_ARCH__)
  const float v = __saturatef(__fmaf_rd(d, 0.125f, 0.125f));
  return __float_as_uint(__fmaf_rd(v, 4.0f, kDepthCodeBias));
#else
  // The same two round-down FMAs on the host, for the tests that prove the identity (slow: it
  // switches the rounding mode). The volatiles keep the FMAs between the mode switches.
  volatile float in = d;
  const int saved = std::fegetround();
  std::fesetround(FE_DOWNWARD);
  const float r = std::fma(static_cast<float>(in), 0.125f, 0.125f);
  const float v = r > 0.0f ? (r < 1.0f ? r : 1.0f) : 0.0f;  // sat: [0, 1], NaN -> 0
  volatile float code = std::fma(v, 4.0f, kDepthCodeBias);
  std::fesetround(saved);
  return detail::float_bits(code);
#endif
}

#if defined(__CUDACC__)
/// This lane's depth sum at x over its PER_LANE channels (padding channels hold log2_g = -1e30
/// and count 0). Unsigned sums of the codes wrap harmlessly; the bias comes off once.
template <int PER_LANE>
__device__ __forceinline__ int lane_depth_sum(const float (&log2_g)[PER_LANE], float x) {
  std::uint32_t sum = 0;
#pragma unroll
  for (int r = 0; r < PER_LANE; ++r) sum += depth_code(log2_g[r], x);
  return static_cast<int>(sum - static_cast<std::uint32_t>(PER_LANE) * kDepthCodeBiasBits);
}

/// log2(theta) of the stream whose channels the warp holds (lane l: channels l + 32 r), identical
/// to sequential_depth_search over depth_at. Every lane returns it.
template <int PER_LANE, int LEVELS = warp_search_levels(PER_LANE)>
__device__ __forceinline__ float warp_search_log2_theta(const float (&log2_g)[PER_LANE],
                                                        int budget) {
  return multilevel_depth_search<LEVELS>(
      budget, [&](const float(&mid)[1 << LEVELS], int(&total)[1 << LEVELS]) {
#pragma unroll
        for (int n = 1; n < (1 << LEVELS); ++n)
          total[n] = __reduce_add_sync(0xffffffffu, lane_depth_sum<PER_LANE>(log2_g, mid[n]));
      });
}
#endif

}  // namespace hisparse::kernels::fathom
