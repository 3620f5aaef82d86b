// Small synthetic K/V/Q for Fathom's tests and quality study, with the properties that matter for
// read depth: per-channel key variances spread over decades, a few outlier channels, query
// weights spread independently of the key variances, sinks, a recency bump, planted relevant
// tokens, and queries that drift step to step. Counter-based RNG: identical on every machine.
#pragma once

#include <cstdint>
#include <vector>

namespace hisparse::fathom {

struct SyntheticKeySpec {
  std::int64_t tokens = 8192;
  int channels = 128;  ///< head_dim
  int heads = 4;       ///< query heads sharing the KV head
  int steps = 4;       ///< query steps (drifting)
  std::uint64_t seed = 1;
  double key_spread_decades = 3.0;    ///< key variances span this many decades
  double query_spread_decades = 1.0;  ///< query weights (squared) span this many decades
  int outlier_channels = 4;
  double outlier_scale = 6.0;  ///< std multiplier of outlier channels
  int sink_tokens = 4;
  double sink_strength = 8.0;  ///< in units of the background score std
  int relevant_tokens = 96;    ///< planted tokens aligned with the query
  double relevant_min = 2.0, relevant_max = 5.0;
  int recent_window = 256;
  double recent_strength = 3.0;
  double logit_std = 2.5;  ///< background std of q.k / sqrt(d)
  double query_drift = 0.05;
  int calibration_skip = 16;  ///< tokens skipped by the calibration variance
  int calibration_tokens = 4096;
};

struct SyntheticKeys {
  SyntheticKeySpec spec;
  std::vector<std::uint16_t> keys;    ///< bf16 [tokens][channels]
  std::vector<std::uint16_t> values;  ///< bf16 [tokens][channels]
  std::vector<float> queries;         ///< [steps][heads][channels]
  std::vector<float> variance;        ///< calibration Var(k_j) [channels]

  [[nodiscard]] const float* query(int step) const {
    return queries.data() + static_cast<std::size_t>(step) * spec.heads * spec.channels;
  }
};

[[nodiscard]] SyntheticKeys make_synthetic_keys(const SyntheticKeySpec& spec);

/// Var(k_j) over tokens [skip, skip + count) of bf16 keys [tokens][channels] (fewer if short).
[[nodiscard]] std::vector<float> calibration_variance(const std::uint16_t* keys,
                                                      std::int64_t tokens, int channels, int skip,
                                                      int count);

}  // namespace hisparse::fathom
