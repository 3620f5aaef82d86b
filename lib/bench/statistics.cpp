#include "bench/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hisparse {
namespace {
double sorted_percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}
}  // namespace

double percentile(std::vector<double> samples, double p) {
  std::sort(samples.begin(), samples.end());
  return sorted_percentile(samples, p);
}

Summary summarize(const std::vector<double>& samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  s.min = sorted.front();
  s.max = sorted.back();
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  s.median = sorted_percentile(sorted, 50);
  s.p10 = sorted_percentile(sorted, 10);
  s.p90 = sorted_percentile(sorted, 90);
  s.p99 = sorted_percentile(sorted, 99);
  if (s.count > 1) {
    double ss = 0;
    for (double v : sorted) ss += (v - s.mean) * (v - s.mean);
    s.stdev = std::sqrt(ss / static_cast<double>(s.count - 1));
  }
  s.rel_stdev = s.mean != 0 ? s.stdev / s.mean : 0.0;
  return s;
}

void to_json(nlohmann::json& j, const Summary& s) {
  j = nlohmann::json{{"count", s.count},   {"min", s.min},
                     {"max", s.max},       {"mean", s.mean},
                     {"median", s.median}, {"p10", s.p10},
                     {"p90", s.p90},       {"p99", s.p99},
                     {"stdev", s.stdev},   {"rel_stdev", s.rel_stdev}};
}

}  // namespace hisparse
