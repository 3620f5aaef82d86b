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

}  // namespace
}  // namespace hisparse
