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

namespace {

/// How many of the C(n1 + n2, n1) orderings of two tie-free samples give each U of the first,
/// u = 0 .. n1 * n2: c(i, j, u) = c(i - 1, j, u - j) + c(i, j - 1, u), the largest value of
/// the ordering coming from the first sample (adding j to its U) or from the second.
std::vector<double> u_counts(std::size_t n1, std::size_t n2) {
  // table[j][u] for the current i.
  std::vector<std::vector<double>> table(n2 + 1, std::vector<double>(n1 * n2 + 1, 0.0));
  for (auto& row : table) row[0] = 1;  // i = 0: one ordering, U = 0
  for (std::size_t i = 1; i <= n1; ++i) {
    std::vector<std::vector<double>> next(n2 + 1, std::vector<double>(n1 * n2 + 1, 0.0));
    next[0][0] = 1;  // j = 0: U = 0
    for (std::size_t j = 1; j <= n2; ++j)
      for (std::size_t u = 0; u <= i * j; ++u)
        next[j][u] = (u >= j ? table[j][u - j] : 0.0) + next[j - 1][u];
    table = std::move(next);
  }
  return table[n2];
}

}  // namespace

RankTest mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b) {
  RankTest t;
  const std::size_t n1 = a.size(), n2 = b.size(), n = n1 + n2;
  if (n1 == 0 || n2 == 0) return t;
  // Average ranks (1-based) over the pooled sample.
  std::vector<std::pair<double, bool>> pooled;
  for (double x : a) pooled.emplace_back(x, true);
  for (double y : b) pooled.emplace_back(y, false);
  std::sort(pooled.begin(), pooled.end(),
            [](const auto& l, const auto& r) { return l.first < r.first; });
  double rank_sum_a = 0, tie_term = 0;
  bool ties = false;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && pooled[j].first == pooled[i].first) ++j;
    const double rank = 0.5 * static_cast<double>(i + 1 + j);  // mean of ranks i+1 .. j
    for (std::size_t k = i; k < j; ++k)
      if (pooled[k].second) rank_sum_a += rank;
    const auto run = static_cast<double>(j - i);
    if (j - i > 1) ties = true;
    tie_term += run * run * run - run;
    i = j;
  }
  const double d1 = static_cast<double>(n1), d2 = static_cast<double>(n2);
  t.u = rank_sum_a - d1 * (d1 + 1) / 2;
  const double mean = d1 * d2 / 2;
  if (!ties && n <= 40) {
    const std::vector<double> counts = u_counts(n1, n2);
    double total = 0, below = 0, above = 0;  // orderings with U <= u and with U >= u
    for (std::size_t u = 0; u < counts.size(); ++u) {
      total += counts[u];
      if (static_cast<double>(u) <= t.u) below += counts[u];
      if (static_cast<double>(u) >= t.u) above += counts[u];
    }
    t.p_value = std::min(1.0, 2 * std::min(below, above) / total);
    t.exact = true;
    return t;
  }
  const auto dn = static_cast<double>(n);
  const double variance = d1 * d2 / 12 * ((dn + 1) - tie_term / (dn * (dn - 1)));
  if (!(variance > 0)) return t;  // every value equal: no evidence of a difference
  const double z = std::max(0.0, std::abs(t.u - mean) - 0.5) / std::sqrt(variance);
  t.p_value = std::min(1.0, std::erfc(z / std::sqrt(2.0)));
  return t;
}

double smallest_p_value(std::size_t n1, std::size_t n2) {
  if (n1 == 0 || n2 == 0) return 1.0;
  double orderings = 1;  // C(n1 + n2, n1), built up exactly for small sizes
  for (std::size_t i = 1; i <= std::min(n1, n2); ++i)
    orderings = orderings * static_cast<double>(std::max(n1, n2) + i) / static_cast<double>(i);
  return std::min(1.0, 2.0 / orderings);
}

}  // namespace hisparse
