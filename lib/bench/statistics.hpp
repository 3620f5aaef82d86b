// Summary statistics of repeated timings (nvbench / Google Benchmark style).
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse {

/// Percentiles use linear interpolation between the two closest ranks (rank = p/100 * (n-1),
/// numpy's default), so the median of an even count is the mean of the middle two.
struct Summary {
  std::size_t count = 0;
  double min = 0, max = 0;
  double mean = 0;
  double median = 0;
  double p10 = 0, p90 = 0, p99 = 0;
  double stdev = 0;      ///< sample standard deviation (n - 1); 0 for fewer than 2 samples
  double rel_stdev = 0;  ///< stdev / mean; 0 when the mean is 0
};

/// The p-th percentile (0..100) of `samples` (any order). 0 for no samples.
[[nodiscard]] double percentile(std::vector<double> samples, double p);
[[nodiscard]] Summary summarize(const std::vector<double>& samples);

void to_json(nlohmann::json& j, const Summary& s);

/// Two-sided Mann-Whitney U test (Wilcoxon rank-sum) of sample `a` against sample `b`: do they
/// come from the same distribution? The test Google Benchmark's compare tool applies to
/// repetitions; it assumes nothing about the shape of timing noise.
struct RankTest {
  double u = 0;        ///< U of `a`: pairs (x in a, y in b) with x > y, ties counted as 1/2
  double p_value = 1;  ///< two-sided
  /// The exact permutation distribution was used (no ties, n1 + n2 <= 40); else the normal
  /// approximation with tie and continuity corrections.
  bool exact = false;
};
[[nodiscard]] RankTest mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b);

/// The smallest two-sided p-value that samples of sizes n1 and n2 can give (when every value
/// of one is below every value of the other): 2 / C(n1 + n2, n1). A test at level alpha can only
/// decide when this is below alpha (4 repetitions a side at alpha 0.05).
[[nodiscard]] double smallest_p_value(std::size_t n1, std::size_t n2);

}  // namespace hisparse
