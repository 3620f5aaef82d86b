// DepthPlanner: the worked example, budget errors, comparison-method plans and their costs.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "fathom/depth_planner.hpp"
#include "kernels/fathom/depth_plan.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

struct Plan {
  std::vector<std::uint8_t> greedy, bisection;
  float log2_theta = 0;
};

Plan plan_both(const std::vector<float>& q, const std::vector<float>& var, int heads, int budget) {
  const int d = static_cast<int>(var.size());
  Plan p;
  p.greedy.assign(d, 9);
  p.bisection.assign(d, 9);
  kf::DepthPlanArgs a;
  a.queries = q.data();
  a.variances = var.data();
  a.streams = 1;
  a.heads = heads;
  a.channels = d;
  a.budget = budget;
  a.depths = p.greedy.data();
  kf::depth_plan_greedy_ref(a);
  a.depths = p.bisection.data();
  a.log2_theta = &p.log2_theta;
  kf::depth_plan_bisection_ref(a);
  return p;
}

TEST(FathomPlanner, WorkedExampleFourChannelsBudgetEight) {
  // g = (1000, 90, 5, 1): marginals g 4^-t, the 8 largest are 1000, 250,
  // 90, 62.5, 22.5, 15.6, 5.6, 5.
  const std::vector<float> q = {std::sqrt(1000.0f), std::sqrt(90.0f), std::sqrt(5.0f), 1.0f};
  const std::vector<float> var = {1, 1, 1, 1};
  const auto p = plan_both(q, var, 1, 8);
  EXPECT_EQ(p.greedy, (std::vector<std::uint8_t>{4, 3, 1, 0}));
  EXPECT_EQ(p.bisection, (std::vector<std::uint8_t>{4, 3, 1, 0}));
  // theta lies between the 9th marginal and the 8th: 2 theta in (1.41, 5].
  EXPECT_GE(std::exp2(p.log2_theta) * 2, 1.40625);
  EXPECT_LE(std::exp2(p.log2_theta) * 2, 5.0);
}

TEST(FathomPlanner, ImportanceSumsTheGroupsQueryHeads) {
  // Two heads: channel 0 is large in head 0, channel 1 in head 1, variance favours channel 1.
  const std::vector<float> q = {3, 0, 0, 0, /*head 1*/ 0, 1, 0, 0};
  const std::vector<float> var = {1, 16, 1, 1};  // g = (9, 16, 0, 0)
  const auto p = plan_both(q, var, 2, 1);
  EXPECT_EQ(p.greedy, (std::vector<std::uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(p.bisection, p.greedy);
  const auto p5 = plan_both(q, var, 2, 5);  // marginals 16, 9, 4, 2.25, 1, ... -> (2, 3)
  EXPECT_EQ(p5.greedy, (std::vector<std::uint8_t>{2, 3, 0, 0}));
  EXPECT_EQ(p5.bisection, p5.greedy);
}

TEST(FathomPlanner, BudgetsAtTheEnds) {
  const std::vector<float> q = {1, 2, 3, 4};
  const std::vector<float> var = {1, 1, 1, 1};
  EXPECT_EQ(plan_both(q, var, 1, 0).greedy, (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(plan_both(q, var, 1, 0).bisection, (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(plan_both(q, var, 1, 16).greedy, (std::vector<std::uint8_t>{4, 4, 4, 4}));
  EXPECT_EQ(plan_both(q, var, 1, 16).bisection, (std::vector<std::uint8_t>{4, 4, 4, 4}));
}

TEST(FathomPlanner, BadBudgetIsNamed) {
  DepthPlanner planner(Backend::cpu);
  std::vector<float> q(8, 1.0f), var(8, 1.0f);
  std::vector<std::uint8_t> d(8);
  kf::DepthPlanArgs a;
  a.queries = q.data();
  a.variances = var.data();
  a.streams = 1;
  a.heads = 1;
  a.channels = 8;
  a.budget = 33;
  a.depths = d.data();
  try {
    planner.plan(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "fathom planner: budget_bits: budget 33 plane bits is outside 0..32 for head_dim 8; use a "
        "budget such as 40, 48, 64, 80 or 128");
  }
}

TEST(FathomPlanner, ComparisonMethodsAndCosts) {
  const int d = 128, heads = 4;
  std::vector<float> q(static_cast<std::size_t>(heads) * d), var(d, 1.0f);
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < d; ++j) q[h * d + j] = static_cast<float>((j * 37 + h) % 101) - 50.0f;
  const auto full = method_depths({ScanMethod::full_scan, 0, 0}, q.data(), heads, d, var, {});
  EXPECT_DOUBLE_EQ(plan_bits(full), 544.0);
  std::vector<int> fixed(32);
  std::iota(fixed.begin(), fixed.end(), 10);
  const auto fx =
      method_depths({ScanMethod::fixed_channels, 0, 32}, q.data(), heads, d, var, fixed);
  EXPECT_DOUBLE_EQ(plan_bits(fx), 136.0);
  EXPECT_EQ(fx[10], 4);
  EXPECT_EQ(fx[9], 0);
  const auto sq = method_depths({ScanMethod::sparq, 0, 16}, q.data(), heads, d, var, {});
  EXPECT_EQ(active_channels(sq), 16);
  EXPECT_DOUBLE_EQ(plan_bits(sq), 68.0);
  const auto f48 = method_depths({ScanMethod::fathom, 48, 0}, q.data(), heads, d, var, {});
  EXPECT_EQ(std::accumulate(f48.begin(), f48.end(), 0), 48);
  EXPECT_DOUBLE_EQ(plan_bits(f48), 48 + 0.25 * active_channels(f48));
  EXPECT_EQ(MethodSpec({ScanMethod::fathom, 48, 0}).name(), "fathom-48");
  EXPECT_EQ(MethodSpec({ScanMethod::sparq, 0, 32}).name(), "sparq-32");
}

TEST(FathomPlanner, FixedChannelCalibrationPicksLargestVarianceTimesQuerySquare) {
  const std::vector<float> var = {1, 100, 1, 1, 50};
  const std::vector<float> qs = {10, 0, 1, 1, 1, /*row 2*/ 10, 0, 1, 1, 1};  // 200, 0, 2, 2, 100
  EXPECT_EQ(calibrate_fixed_channels(var, qs, 5, 2), (std::vector<int>{0, 4}));
}

}  // namespace
}  // namespace hisparse::fathom
