// Bisection on theta equals the integer greedy form on thousands of random inputs, except where
// the budget boundary falls on a (near) tie of marginals; then the bisection still fits the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "core/rng.hpp"
#include "kernels/fathom/depth_plan.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

TEST(FathomPlannerFuzz, BisectionEqualsGreedyExceptTies) {
  Rng rng(2024);
  int equal = 0, near_ties = 0;
  const int cases = 3000;
  for (int c = 0; c < cases; ++c) {
    const int d = 1 + static_cast<int>(rng.below(128));
    const int heads = 1 + static_cast<int>(rng.below(8));
    const int budget = static_cast<int>(rng.below(static_cast<std::uint64_t>(4 * d + 1)));
    std::vector<float> q(static_cast<std::size_t>(heads) * d), var(d);
    for (auto& x : q) x = rng.normal();
    for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
    std::vector<std::uint8_t> greedy(d), bis(d);
    kf::DepthPlanArgs a;
    a.queries = q.data();
    a.variances = var.data();
    a.streams = 1;
    a.heads = heads;
    a.channels = d;
    a.budget = budget;
    a.depths = greedy.data();
    kf::depth_plan_greedy_ref(a);
    a.depths = bis.data();
    kf::depth_plan_bisection_ref(a);
    const int bis_sum = std::accumulate(bis.begin(), bis.end(), 0);
    ASSERT_LE(bis_sum, budget) << "case " << c;
    ASSERT_EQ(std::accumulate(greedy.begin(), greedy.end(), 0), std::min(budget, 4 * d))
        << "case " << c;
    if (greedy == bis) {
      ++equal;
      continue;
    }
    // Allowed only at a near tie: the marginals around the budget boundary within 1e-5.
    std::vector<float> g(d);
    kf::importance_ref(a, 0, g.data());
    std::vector<double> marginals;
    for (int j = 0; j < d; ++j)
      for (int t = 0; t < 4; ++t)
        marginals.push_back(std::ldexp(static_cast<double>(g[j]), -2 * t));
    std::sort(marginals.begin(), marginals.end(), std::greater<>());
    const double at = marginals[static_cast<std::size_t>(std::max(0, bis_sum))];
    const double last = marginals[static_cast<std::size_t>(budget - 1)];
    ASSERT_LE(at / last, 1.0 + 1e-5)
        << "case " << c << ": bisection gave " << bis_sum << " of " << budget;
    ++near_ties;
  }
  EXPECT_GE(equal, cases * 99 / 100);
  RecordProperty("near_ties", near_ties);
}

}  // namespace
}  // namespace hisparse::fathom
