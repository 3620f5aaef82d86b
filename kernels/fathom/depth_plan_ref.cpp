#include "kernels/fathom/depth_plan.hpp"

#include <cmath>
#include <vector>

#include "kernels/fathom/depth_search.hpp"

namespace hisparse::kernels::fathom {

void importance_ref(const DepthPlanArgs& args, std::int32_t s, float* importance) {
  const float* q = args.queries + static_cast<std::int64_t>(s) * args.heads * args.channels;
  const float* var =
      args.variances + static_cast<std::int64_t>(s % args.variance_period) * args.channels;
  for (int j = 0; j < args.channels; ++j) {
    float sum = 0.0f;
    for (int h = 0; h < args.heads; ++h) sum = accumulate_q_squared(sum, q[h * args.channels + j]);
    importance[j] = sum * var[j];
  }
}

void depth_plan_bisection_ref(const DepthPlanArgs& args) {
  std::vector<float> g(args.channels), log2_g(args.channels);
  for (std::int32_t s = 0; s < args.streams; ++s) {
    importance_ref(args, s, g.data());
    for (int j = 0; j < args.channels; ++j) log2_g[j] = reproducible_log2(g[j]);
    // The kernel's multi-level search (the sequential bisection's theta bit for bit).
    const float hi =
        search_log2_theta<kDepthSearchLevels>(log2_g.data(), args.channels, args.budget_of(s));
    std::uint8_t* out = args.depths + static_cast<std::int64_t>(s) * args.channels;
    for (int j = 0; j < args.channels; ++j)
      out[j] = static_cast<std::uint8_t>(depth_at(log2_g[j], hi));
    if (args.log2_theta) args.log2_theta[s] = hi;
  }
}

void depth_plan_greedy_ref(const DepthPlanArgs& args) {
  std::vector<float> g(args.channels);
  for (std::int32_t s = 0; s < args.streams; ++s) {
    importance_ref(args, s, g.data());
    std::uint8_t* out = args.depths + static_cast<std::int64_t>(s) * args.channels;
    for (int j = 0; j < args.channels; ++j) out[j] = 0;
    for (int round = 0; round < args.budget_of(s); ++round) {
      int best = -1;
      float best_gain = 0.0f;
      for (int j = 0; j < args.channels; ++j) {
        if (out[j] >= kPlanes) continue;
        const float gain = std::ldexp(g[j], -2 * out[j]);  // exact: g_j * 4^-t_j
        if (gain > best_gain) {
          best_gain = gain;
          best = j;
        }
      }
      if (best < 0) break;
      ++out[best];
    }
  }
}

}  // namespace hisparse::kernels::fathom
