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

}  // namespace hisparse
