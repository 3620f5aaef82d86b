// DepthPlanner kernel: per (sequence, KV head) importance g_j = Var(k_j) * sum_h q_hj^2 over the
// query heads of the group, then depths t_j = clip(round(log4(g_j / theta)), 0, 4) with theta the
// smallest value whose depths sum to at most the budget (bisection on log2 theta).
#pragma once

#include <cstdint>

#include "core/stream.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse::kernels::fathom {

struct DepthPlanArgs {
  const float* queries = nullptr;    ///< [streams][heads][channels]
  const float* variances = nullptr;  ///< [variance_period][channels]; stream s uses row s % period
  std::int32_t variance_period = 1;  ///< number of KV heads (streams are sequence-major)
  std::int32_t streams = 0;
  std::int32_t heads = 0;     ///< query heads per KV head (<= kMaxGroupHeads)
  std::int32_t channels = 0;  ///< head_dim (<= kMaxChannels)
  std::int32_t budget = 0;    ///< plane bits per token, 0..4 * channels
  /// [variance_period], optional: a budget per KV head (stream s plans budgets[s % period]
  /// planes, each 0..budget); null: every stream plans `budget`.
  const std::int32_t* budgets = nullptr;
  std::uint8_t* depths = nullptr;  ///< [streams][channels]
  float* log2_theta = nullptr;     ///< [streams], optional

  /// The planes stream s may spend.
  [[nodiscard]] HISPARSE_HD std::int32_t budget_of(std::int32_t s) const {
    return budgets != nullptr ? budgets[s % variance_period] : budget;
  }
};

#if HISPARSE_WITH_CUDA
/// One warp per stream; no host synchronisation.
void launch_depth_plan(const DepthPlanArgs& args, cudaStream_t stream);
#endif
/// CPU twin of the kernel (same bisection, bit-identical depths and theta).
void depth_plan_bisection_ref(const DepthPlanArgs& args);
/// The integer form: budget_of(s) times, one more plane to the channel with the largest g_j 4^-t_j
/// among those below 4 (ties to the lower channel; channels with g_j = 0 get nothing).
/// log2_theta is not written.
void depth_plan_greedy_ref(const DepthPlanArgs& args);

/// Importance of every channel of stream `s` (the value both planners rank).
void importance_ref(const DepthPlanArgs& args, std::int32_t s, float* importance);

}  // namespace hisparse::kernels::fathom
