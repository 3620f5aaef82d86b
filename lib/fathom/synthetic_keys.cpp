#include "fathom/synthetic_keys.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace hisparse::fathom {

std::vector<float> calibration_variance(const std::uint16_t* keys, std::int64_t tokens,
                                        int channels, int skip, int count) {
  std::vector<float> var(static_cast<std::size_t>(channels), 0.0f);
  std::int64_t first = std::min<std::int64_t>(skip, tokens);
  std::int64_t last = std::min<std::int64_t>(tokens, first + count);
  if (last - first < 2) first = 0, last = tokens;  // too short to skip: use what there is
  const double n = static_cast<double>(last - first);
  if (n < 1) return var;
  for (int j = 0; j < channels; ++j) {
    double sum = 0, sum2 = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const double v = bf16_to_float(keys[i * channels + j]);
      sum += v;
      sum2 += v * v;
    }
    const double mean = sum / n;
    var[j] = static_cast<float>(std::max(0.0, sum2 / n - mean * mean));
  }
  return var;
}

SyntheticKeys make_synthetic_keys(const SyntheticKeySpec& spec) {
  if (spec.tokens < 1 || spec.channels < 1 || spec.heads < 1 || spec.steps < 1)
    throw Error("synthetic keys", "tokens, channels, heads and steps must be positive", "");
  const int d = spec.channels, heads = spec.heads;
  const auto n = spec.tokens;
  Rng rng(spec.seed);
  SyntheticKeys out;
  out.spec = spec;

  // Channel key stds spread over decades; a few outliers.
  std::vector<double> sigma(d), rho(d);
  for (int j = 0; j < d; ++j)
    sigma[j] = std::pow(10.0, -0.5 * spec.key_spread_decades * rng.uniform());
  for (int o = 0; o < std::min(spec.outlier_channels, d); ++o)
    sigma[rng.below(d)] *= spec.outlier_scale;
  for (int j = 0; j < d; ++j)
    rho[j] = std::pow(10.0, -0.5 * spec.query_spread_decades * rng.uniform());

  // Queries: a component shared by the group plus one per head, drifting step to step.
  std::vector<double> shared(d), own(static_cast<std::size_t>(heads) * d);
  for (int j = 0; j < d; ++j) shared[j] = rho[j] * rng.normal();
  for (auto& v : own) v = rng.normal();
  out.queries.resize(static_cast<std::size_t>(spec.steps) * heads * d);
  std::vector<double> q(static_cast<std::size_t>(heads) * d);
  for (int s = 0; s < spec.steps; ++s) {
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < d; ++j) {
        if (s > 0) own[h * d + j] += spec.query_drift * rng.normal();
        q[h * d + j] = 0.8 * shared[j] + 0.6 * rho[j] * own[h * d + j];
      }
    // Scale so that the background logit q.k / sqrt(d) has std logit_std for the mean head.
    double var_score = 0;
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < d; ++j) var_score += q[h * d + j] * q[h * d + j] * sigma[j] * sigma[j];
    const double scale =
        spec.logit_std * std::sqrt(static_cast<double>(d)) / std::sqrt(var_score / heads);
    for (int i = 0; i < heads * d; ++i)
      out.queries[static_cast<std::size_t>(s) * heads * d + i] = static_cast<float>(q[i] * scale);
  }

  // Direction that raises the group's scores: sigma^2 * mean query, normalised to one score std.
  std::vector<double> dir(d, 0.0);
  const float* q0 = out.query(0);
  for (int j = 0; j < d; ++j) {
    double m = 0;
    for (int h = 0; h < heads; ++h) m += q0[h * d + j];
    dir[j] = sigma[j] * sigma[j] * m / heads;
  }
  double qdir = 0, sdev = 0;
  for (int j = 0; j < d; ++j) {
    double m = 0;
    for (int h = 0; h < heads; ++h) m += q0[h * d + j];
    m /= heads;
    qdir += m * dir[j];
    sdev += m * m * sigma[j] * sigma[j];
  }
  const double unit =
      std::sqrt(sdev) / std::max(qdir, 1e-30);  // adding unit*dir raises the score by 1 std

  std::vector<double> boost(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < std::min<std::int64_t>(spec.sink_tokens, n); ++i)
    boost[i] = spec.sink_strength;
  for (int r = 0; r < spec.relevant_tokens; ++r) {
    const auto pos = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(n)));
    boost[pos] += spec.relevant_min + (spec.relevant_max - spec.relevant_min) * rng.uniform();
  }
  for (std::int64_t age = 0; age < std::min<std::int64_t>(spec.recent_window, n); ++age)
    boost[n - 1 - age] += spec.recent_strength * std::exp(-static_cast<double>(age) / 64.0);

  out.keys.resize(static_cast<std::size_t>(n) * d);
  out.values.resize(static_cast<std::size_t>(n) * d);
  const std::uint64_t key_seed = splitmix64(spec.seed ^ 0x6b657973ull);
  const std::uint64_t value_seed = splitmix64(spec.seed ^ 0x76616c73ull);
  for (std::int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      const auto idx = static_cast<std::uint64_t>(i * d + j);
      const double k = sigma[j] * random_normal(key_seed, idx) + boost[i] * unit * dir[j];
      out.keys[idx] = float_to_bf16(static_cast<float>(k));
      out.values[idx] = float_to_bf16(random_normal(value_seed, idx));
    }
  out.variance =
      calibration_variance(out.keys.data(), n, d, spec.calibration_skip, spec.calibration_tokens);
  return out;
}

}  // namespace hisparse::fathom
