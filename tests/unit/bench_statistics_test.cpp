// Statistics of step times: hand-computed percentiles (linear interpolation between ranks).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bench/statistics.hpp"

namespace hisparse {
namespace {

TEST(BenchStatistics, PercentilesInterpolateBetweenRanks) {
  // Sorted: 1 2 3 4 5 6 7 8 9 10 (given shuffled). rank = p/100 * 9.
  const std::vector<double> v{7, 3, 10, 1, 5, 9, 2, 8, 6, 4};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);   // rank 4.5: (5 + 6) / 2
  EXPECT_DOUBLE_EQ(percentile(v, 10), 1.9);   // rank 0.9: 1 + 0.9 * (2 - 1)
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);   // rank 8.1: 9 + 0.1
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.91);  // rank 8.91
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
}

TEST(BenchStatistics, SummaryOfOddCount) {
  const Summary s = summarize({4, 1, 2, 8, 5});  // sorted 1 2 4 5 8
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.median, 4);
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 8);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);  // rank 0.4
  EXPECT_DOUBLE_EQ(s.p90, 6.8);  // rank 3.6: 5 + 0.6 * 3
  // Sample variance: (9 + 4 + 0 + 1 + 16) / 4 = 7.5.
  EXPECT_DOUBLE_EQ(s.stdev, std::sqrt(7.5));
  EXPECT_DOUBLE_EQ(s.rel_stdev, std::sqrt(7.5) / 4);
}

TEST(BenchStatistics, SingleAndEmptySamples) {
  const Summary one = summarize({2.5});
  EXPECT_DOUBLE_EQ(one.median, 2.5);
  EXPECT_DOUBLE_EQ(one.p99, 2.5);
  EXPECT_DOUBLE_EQ(one.stdev, 0);
  EXPECT_DOUBLE_EQ(one.rel_stdev, 0);
  const Summary none = summarize({});
  EXPECT_EQ(none.count, 0u);
  EXPECT_DOUBLE_EQ(none.median, 0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(BenchStatistics, JsonCarriesEveryField) {
  const nlohmann::json j = summarize({1, 3});
  EXPECT_DOUBLE_EQ(j.at("median").get<double>(), 2);
  EXPECT_DOUBLE_EQ(j.at("p10").get<double>(), 1.2);
  EXPECT_DOUBLE_EQ(j.at("p90").get<double>(), 2.8);
  EXPECT_DOUBLE_EQ(j.at("p99").get<double>(), 2.98);
  EXPECT_DOUBLE_EQ(j.at("mean").get<double>(), 2);
  EXPECT_EQ(j.at("count").get<int>(), 2);
  EXPECT_TRUE(j.contains("rel_stdev"));
}

TEST(BenchStatistics, RankTestExactWithoutTies) {
  // Every value of a below every value of b: U = 0, and one of the C(8, 4) = 70 orderings is
  // as extreme on each side, so p = 2 / 70.
  const RankTest t = mann_whitney_u({1, 2, 3, 4}, {5, 6, 7, 8});
  EXPECT_TRUE(t.exact);
  EXPECT_DOUBLE_EQ(t.u, 0);
  EXPECT_DOUBLE_EQ(t.p_value, 2.0 / 70);
  EXPECT_DOUBLE_EQ(mann_whitney_u({5, 6, 7, 8}, {1, 2, 3, 4}).u, 16);
  EXPECT_DOUBLE_EQ(mann_whitney_u({5, 6, 7, 8}, {1, 2, 3, 4}).p_value, 2.0 / 70);
  // Three a side can never decide at 0.05: 2 / C(6, 3) = 0.1.
  EXPECT_DOUBLE_EQ(mann_whitney_u({1, 2, 3}, {4, 5, 6}).p_value, 0.1);
  EXPECT_DOUBLE_EQ(smallest_p_value(3, 3), 0.1);
  EXPECT_DOUBLE_EQ(smallest_p_value(4, 4), 2.0 / 70);
  EXPECT_DOUBLE_EQ(smallest_p_value(9, 9), 2.0 / 48620);
  EXPECT_DOUBLE_EQ(smallest_p_value(0, 5), 1.0);
  // a = {1, 3}, b = {2, 4}: pairs with x > y: (3, 2) only, U = 1. Orderings of U 0..4 for 2 + 2
  // values: 1, 1, 2, 1, 1; P(U <= 1) = 2 / 6, so p = 2 * 2 / 6.
  EXPECT_DOUBLE_EQ(mann_whitney_u({1, 3}, {2, 4}).u, 1);
  EXPECT_DOUBLE_EQ(mann_whitney_u({1, 3}, {2, 4}).p_value, 4.0 / 6);
  // The same samples give p = 1.
  EXPECT_DOUBLE_EQ(mann_whitney_u({1, 2}, {1.5, 1.6}).p_value, 1.0);  // U = 2 = n1 n2 / 2
}

TEST(BenchStatistics, RankTestNormalApproximationWithTies) {
  // a = {1, 2, 2}, b = {2, 3, 3}. Ranks: 1 -> 1; the three 2s -> 3; the two 3s -> 5.5.
  // R_a = 1 + 3 + 3 = 7, U = 7 - 6 = 1, mean 4.5. Tie term: (27 - 3) + (8 - 2) = 30, so
  // variance = 3 * 3 / 12 * (7 - 30 / 30) = 4.5; z = (3.5 - 0.5) / sqrt(4.5) = sqrt(2),
  // p = erfc(z / sqrt(2)) = erfc(1).
  const RankTest t = mann_whitney_u({1, 2, 2}, {2, 3, 3});
  EXPECT_FALSE(t.exact);
  EXPECT_DOUBLE_EQ(t.u, 1);
  EXPECT_NEAR(t.p_value, std::erfc(1.0), 1e-12);
  // Every value equal: no evidence of a difference.
  EXPECT_DOUBLE_EQ(mann_whitney_u({2, 2}, {2, 2}).p_value, 1.0);
  EXPECT_DOUBLE_EQ(mann_whitney_u({}, {1}).p_value, 1.0);
}

}  // namespace
}  // namespace hisparse
