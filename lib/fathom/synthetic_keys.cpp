#include "fathom/synthetic_keys.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace hisparse::fathom {

CalibrationMoments calibration_moments(const std::uint16_t* keys, std::int64_t tokens, int channels,
                                       int skip, int count) {
  CalibrationMoments m;
  m.mean.assign(static_cast<std::size_t>(channels), 0.0f);
  m.variance.assign(static_cast<std::size_t>(channels), 0.0f);
  std::int64_t first = std::min<std::int64_t>(skip, tokens);
  std::int64_t last = std::min<std::int64_t>(tokens, first + count);
  if (last - first < 2) first = 0, last = tokens;  // too short to skip: use what there is
  const double n = static_cast<double>(last - first);
  if (n < 1) return m;
  for (int j = 0; j < channels; ++j) {
    double sum = 0, sum2 = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const double v = bf16_to_float(keys[i * channels + j]);
      sum += v;
      sum2 += v * v;
    }
    const double mean = sum / n;
    m.mean[j] = static_cast<float>(mean);
    m.variance[j] = static_cast<float>(std::max(0.0, sum2 / n - mean * mean));
  }
  return m;
}

std::vector<float> calibration_variance(const std::uint16_t* keys, std::int64_t tokens,
                                        int channels, int skip, int count) {
  return calibration_moments(keys, tokens, channels, skip, count).variance;
}

namespace {

constexpr double kTwoPi = 6.283185307179586;

/// Per-profile channel statistics and the query generator.
struct QueryModel {
  int d = 0, heads = 0;
  bool rope = false;
  std::vector<double> sigma;      ///< key std per channel
  std::vector<double> rho;        ///< independent: query weight per channel
  std::vector<double> shared;     ///< independent: the group's shared query component
  std::vector<double> amplitude;  ///< rope: [heads][d/2] query amplitude per head and pair
  std::vector<double> phase;      ///< rope: [heads][d/2] query angle per head and pair
  std::vector<double> theta;      ///< rope: rotation per token of each pair

  /// Query of every head for content `own` ([heads][d] normals) at position `position`.
  void fill(const std::vector<double>& own, double position, std::vector<double>& q) const {
    if (!rope) {
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < d; ++j) q[h * d + j] = 0.8 * shared[j] + 0.6 * rho[j] * own[h * d + j];
      return;
    }
    const int half = d / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double amp = amplitude[h * half + i], ph = phase[h * half + i];
        const double x = amp * (std::cos(ph) + 0.5 * own[h * d + i]);
        const double y = amp * (std::sin(ph) + 0.5 * own[h * d + i + half]);
        const double angle = std::fmod(position * theta[i], kTwoPi);
        const double c = std::cos(angle), s = std::sin(angle);
        q[h * d + i] = x * c - y * s;
        q[h * d + i + half] = x * s + y * c;
      }
  }
  /// Scale each head's query so that its background logit q.k / sqrt(d) has std `logit_std`.
  /// Per head, not per group: QK-norm fixes every head's query norm, so no head of a group is
  /// much flatter or sharper than the others (a shared scale let the log-normal pair weights make
  /// some heads near-uniform, and their large errors dominated every mean).
  void normalise(std::vector<double>& q, double logit_std) const {
    for (int h = 0; h < heads; ++h) {
      double var_score = 0;
      for (int j = 0; j < d; ++j) var_score += q[h * d + j] * q[h * d + j] * sigma[j] * sigma[j];
      const double scale =
          logit_std * std::sqrt(static_cast<double>(d)) / std::sqrt(std::max(var_score, 1e-300));
      for (int j = 0; j < d; ++j) q[h * d + j] *= scale;
    }
  }
};

/// Random orthogonal d x d matrix (row-major): Gram-Schmidt, applied twice, over the columns of
/// a Gaussian matrix.
std::vector<double> random_orthogonal(int d, std::uint64_t seed) {
  Rng rng(seed);
  const auto n = static_cast<std::size_t>(d);
  std::vector<double> m(n * n);
  for (auto& x : m) x = rng.normal();
  for (std::size_t c = 0; c < n; ++c) {
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t p = 0; p < c; ++p) {
        double dot = 0;
        for (std::size_t r = 0; r < n; ++r) dot += m[r * n + p] * m[r * n + c];
        for (std::size_t r = 0; r < n; ++r) m[r * n + c] -= dot * m[r * n + p];
      }
    double norm = 0;
    for (std::size_t r = 0; r < n; ++r) norm += m[r * n + c] * m[r * n + c];
    norm = std::sqrt(norm);
    for (std::size_t r = 0; r < n; ++r) m[r * n + c] /= norm;
  }
  return m;
}

/// y = M x for a row-major d x d matrix.
void mix_into(const std::vector<double>& m, const double* x, double* y, int d) {
  for (int r = 0; r < d; ++r) {
    double acc = 0;
    for (int c = 0; c < d; ++c) acc += m[static_cast<std::size_t>(r) * d + c] * x[c];
    y[r] = acc;
  }
}

QueryModel make_query_model(const SyntheticKeySpec& spec, Rng& rng) {
  QueryModel m;
  m.d = spec.channels;
  m.heads = spec.heads;
  m.rope = spec.profile == KeyProfile::rope_qk_norm;
  const int d = m.d;
  m.sigma.assign(d, 1.0);
  if (!m.rope) {
    m.rho.assign(d, 1.0);
    m.shared.assign(d, 0.0);
    for (int j = 0; j < d; ++j)
      m.sigma[j] = std::pow(10.0, -0.5 * spec.key_spread_decades * rng.uniform());
    for (int o = 0; o < std::min(spec.outlier_channels, d); ++o)
      m.sigma[rng.below(d)] *= spec.outlier_scale;
    for (int j = 0; j < d; ++j)
      m.rho[j] = std::pow(10.0, -0.5 * spec.query_spread_decades * rng.uniform());
    for (int j = 0; j < d; ++j) m.shared[j] = m.rho[j] * rng.normal();
    return m;
  }
  // Pair i rotates by base^(-2i/d) per token: i = 0 fastest, i = d/2 - 1 slowest. Key variance
  // grows over key_spread_decades towards the slow pairs (jitter of half a decade); a few random
  // pairs are outliers. Query amplitudes: a pair scale over query_spread_decades, times a
  // log-normal factor per head (heads of a group weight different pairs).
  const int half = d / 2;
  m.theta.resize(half);
  std::vector<double> rho(half);
  for (int i = 0; i < half; ++i) {
    m.theta[i] = std::pow(spec.rope_base, -2.0 * i / d);
    const double slowness = half > 1 ? static_cast<double>(i) / (half - 1) : 1.0;
    const double log10_var =
        -spec.key_spread_decades * (1.0 - slowness) + 0.5 * (rng.uniform() - 0.5);
    m.sigma[i] = m.sigma[i + half] = std::pow(10.0, 0.5 * log10_var);
    rho[i] = std::pow(10.0, -0.5 * spec.query_spread_decades * rng.uniform());
  }
  for (int o = 0; o < std::min(spec.outlier_channels / 2, half); ++o) {
    const auto i = static_cast<int>(rng.below(half));
    m.sigma[i] *= spec.outlier_scale;
    m.sigma[i + half] *= spec.outlier_scale;
  }
  m.amplitude.resize(static_cast<std::size_t>(m.heads) * half);
  m.phase.resize(m.amplitude.size());
  for (int h = 0; h < m.heads; ++h)
    for (int i = 0; i < half; ++i) {
      m.amplitude[h * half + i] = rho[i] * std::exp(spec.head_spread * rng.normal());
      m.phase[h * half + i] = kTwoPi * rng.uniform();
    }
  return m;
}

}  // namespace

SyntheticKeys make_synthetic_keys(const SyntheticKeySpec& spec) {
  if (spec.tokens < 1 || spec.channels < 1 || spec.heads < 1 || spec.steps < 1)
    throw Error("synthetic keys", "tokens, channels, heads and steps must be positive", "");
  if (spec.profile == KeyProfile::rope_qk_norm && spec.channels % 2 != 0)
    throw Error("synthetic keys", fmt::format("head_dim {} is odd", spec.channels),
                "RoPE pairs channels: use an even head_dim or KeyProfile::independent");
  const int d = spec.channels, heads = spec.heads;
  const auto n = spec.tokens;
  Rng rng(spec.seed);
  SyntheticKeys out;
  out.spec = spec;
  const QueryModel model = make_query_model(spec, rng);
  const std::vector<double>& sigma = model.sigma;

  // Test queries: decode positions n, n + 1, ...; the content drifts step to step.
  std::vector<double> own(static_cast<std::size_t>(heads) * d);
  for (auto& v : own) v = rng.normal();
  out.queries.resize(static_cast<std::size_t>(spec.steps) * heads * d);
  std::vector<double> q(static_cast<std::size_t>(heads) * d);
  for (int s = 0; s < spec.steps; ++s) {
    if (s > 0)
      for (auto& v : own) v += spec.query_drift * rng.normal();
    model.fill(own, static_cast<double>(n + s), q);
    model.normalise(q, spec.logit_std);
    for (int i = 0; i < heads * d; ++i)
      out.queries[static_cast<std::size_t>(s) * heads * d + i] = static_cast<float>(q[i]);
  }
  // Held-out calibration queries: fresh content at random earlier positions (own RNG stream, so
  // the test data do not depend on how many are drawn).
  Rng calibration_rng(splitmix64(spec.seed ^ 0x63616c69ull));
  out.calibration_queries.resize(static_cast<std::size_t>(std::max(0, spec.calibration_queries)) *
                                 heads * d);
  for (int c = 0; c < spec.calibration_queries; ++c) {
    std::vector<double> fresh(own.size());
    for (auto& v : fresh) v = calibration_rng.normal();
    model.fill(fresh, std::floor(calibration_rng.uniform() * static_cast<double>(n)), q);
    model.normalise(q, spec.logit_std);
    for (int i = 0; i < heads * d; ++i)
      out.calibration_queries[static_cast<std::size_t>(c) * heads * d + i] =
          static_cast<float>(q[i]);
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

  // Planted directions, each raising a score by one background std per unit strength. The
  // independent profile plants everything along the group's mean query (the wave-1 workload). The
  // rope profile plants each relevant token for one head of the group (heads attend to different
  // tokens; their queries point in different directions) and sinks and recent tokens for all.
  const bool rope = spec.profile == KeyProfile::rope_qk_norm;
  std::vector<double> head_vec(static_cast<std::size_t>(heads) * d), all_vec(d);
  for (int h = 0; h < heads; ++h) {
    double sh = 0;
    for (int j = 0; j < d; ++j) sh += q0[h * d + j] * q0[h * d + j] * sigma[j] * sigma[j];
    const double per = 1.0 / std::sqrt(std::max(sh, 1e-300));
    for (int j = 0; j < d; ++j) head_vec[h * d + j] = sigma[j] * sigma[j] * q0[h * d + j] * per;
  }
  for (int j = 0; j < d; ++j) {
    all_vec[j] = unit * dir[j];
    if (rope) {
      all_vec[j] = 0;
      for (int h = 0; h < heads; ++h) all_vec[j] += head_vec[h * d + j];
    }
  }
  std::vector<double> boost(static_cast<std::size_t>(n), 0.0), planted(boost.size(), 0.0);
  std::vector<int> planted_head(boost.size(), 0);
  for (std::int64_t i = 0; i < std::min<std::int64_t>(spec.sink_tokens, n); ++i)
    boost[i] = spec.sink_strength;
  // Relevant tokens sit at distinct positions outside the sinks: stacked strengths would make
  // single tokens far stronger than relevant_max says. Every head gets relevant_tokens / heads of
  // them: its own (rope) or ones the whole group shares (independent, correlated).
  const std::int64_t sinks = std::min<std::int64_t>(spec.sink_tokens, n);
  const std::int64_t relevant = std::min<std::int64_t>(
      rope ? spec.relevant_tokens : (spec.relevant_tokens + heads - 1) / heads, n - sinks);
  std::vector<char> taken(static_cast<std::size_t>(n), 0);
  for (std::int64_t r = 0; r < relevant; ++r) {
    std::int64_t pos = 0;
    do {
      pos = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(n)));
    } while (pos < sinks || taken[pos]);
    taken[pos] = 1;
    const double strength =
        spec.relevant_min + (spec.relevant_max - spec.relevant_min) * rng.uniform();
    if (rope) {
      planted[pos] = strength;
      planted_head[pos] = static_cast<int>(r % heads);
    } else {
      boost[pos] += strength;
    }
  }
  for (std::int64_t age = 0; age < std::min<std::int64_t>(spec.recent_window, n); ++age)
    boost[n - 1 - age] += spec.recent_strength * std::exp(-static_cast<double>(age) / 64.0);

  // correlated: keys and queries are mixed from the sources by one orthogonal matrix.
  const bool mixed = spec.profile == KeyProfile::correlated;
  const std::vector<double> mixing =
      mixed ? random_orthogonal(d, splitmix64(spec.seed ^ 0x6d697865ull)) : std::vector<double>{};
  std::vector<double> source(static_cast<std::size_t>(d)), key(source.size());
  out.keys.resize(static_cast<std::size_t>(n) * d);
  out.values.resize(static_cast<std::size_t>(n) * d);
  const std::uint64_t key_seed = splitmix64(spec.seed ^ 0x6b657973ull);
  const std::uint64_t value_seed = splitmix64(spec.seed ^ 0x76616c73ull);
  // rope_qk_norm: the slowest pairs carry a key bias that rotates with the position (it widens
  // their quantization range without adding variance).
  std::vector<double> bias_phase;
  const int half = d / 2;
  const int bias_pairs =
      spec.profile == KeyProfile::rope_qk_norm ? std::min(spec.bias_pairs, half) : 0;
  for (int b = 0; b < bias_pairs; ++b) bias_phase.push_back(kTwoPi * rng.uniform());
  std::vector<double> bias(static_cast<std::size_t>(d), 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int b = 0; b < bias_pairs; ++b) {
      const int pair = half - 1 - b;
      const double angle =
          std::fmod(static_cast<double>(i) * model.theta[pair], kTwoPi) + bias_phase[b];
      bias[pair] = spec.bias_scale * sigma[pair] * std::cos(angle);
      bias[pair + half] = spec.bias_scale * sigma[pair + half] * std::sin(angle);
    }
    for (int j = 0; j < d; ++j) {
      const auto idx = static_cast<std::uint64_t>(i * d + j);
      source[j] = bias[j] + sigma[j] * random_normal(key_seed, idx) + boost[i] * all_vec[j] +
                  planted[i] * head_vec[planted_head[i] * d + j];
      out.values[idx] = float_to_bf16(random_normal(value_seed, idx));
    }
    if (mixed) mix_into(mixing, source.data(), key.data(), d);
    const std::vector<double>& k = mixed ? key : source;
    for (int j = 0; j < d; ++j)
      out.keys[static_cast<std::size_t>(i * d + j)] = float_to_bf16(static_cast<float>(k[j]));
  }
  if (mixed) {
    const auto mix_rows = [&](std::vector<float>& rows) {
      for (std::size_t r = 0; r + static_cast<std::size_t>(d) <= rows.size(); r += d) {
        for (int j = 0; j < d; ++j) source[j] = rows[r + j];
        mix_into(mixing, source.data(), key.data(), d);
        for (int j = 0; j < d; ++j) rows[r + j] = static_cast<float>(key[j]);
      }
    };
    mix_rows(out.queries);
    mix_rows(out.calibration_queries);
  }
  out.variance =
      calibration_variance(out.keys.data(), n, d, spec.calibration_skip, spec.calibration_tokens);
  return out;
}

}  // namespace hisparse::fathom
