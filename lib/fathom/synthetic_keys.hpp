// Small synthetic K/V/Q for Fathom's tests and quality study, with the properties that matter for
// read depth: per-channel key variances spread over decades, a few outlier channels, query
// weights that differ between the heads of a GQA group, sinks, a recency bump, a heavy tail of
// planted relevant tokens, and queries that drift step to step. Counter-based RNG: identical on
// every machine.
//
// Two profiles:
//  - KeyProfile::rope_qk_norm (default): post-RoPE keys and queries of a QK-norm model
//    (Qwen3-like, rotate-half pairs (i, i + d/2), base 1e6). Variance comes in channel pairs and
//    grows towards the low-frequency pairs (which also carry a slowly rotating key bias, the
//    "massive values" of real models); each head of the group weights the pairs differently
//    (log-normal per head); the query is rotated by its position, so in high-frequency pairs the
//    query's energy moves between the two channels of the pair from one decode step to the next,
//    while a calibrated channel set can only see its average.
//  - KeyProfile::independent: the wave-1 workload (independent channels, key variances uniform
//    in log over key_spread_decades, query weights shared by the group, no rotation).
//  - KeyProfile::correlated: a model without QK-norm. The independent workload is drawn as
//    sources and mixed by a random orthogonal matrix M (keys k = M s, queries q = M q_s, so
//    q.k = q_s.s): every channel then carries a blend of all sources, the channel variances are
//    flat, and only the KLT basis (KltBasis) recovers the spread.
// Calibration queries are held out: other content and other positions than the test queries.
#pragma once

#include <cstdint>
#include <vector>

namespace hisparse::fathom {

enum class KeyProfile { rope_qk_norm, independent, correlated };

struct SyntheticKeySpec {
  KeyProfile profile = KeyProfile::rope_qk_norm;
  std::int64_t tokens = 8192;
  int channels = 128;  ///< head_dim
  int heads = 4;       ///< query heads sharing the KV head
  int steps = 4;       ///< query steps (drifting)
  std::uint64_t seed = 1;
  double key_spread_decades = 3.0;    ///< key variances span this many decades
  double query_spread_decades = 1.0;  ///< query weights (squared) span this many decades
  int outlier_channels = 4;
  double outlier_scale = 6.0;  ///< std multiplier of outlier channels
  // Attention shape. The defaults aim at what dense attention of real decoders looks like at
  // 8K-32K context (not at any method's result): a near-flat bulk, a heavy tail of relevant
  // tokens, sinks and a recency bump, so that exact top-256 of 8192 tokens keeps about 98% of the
  // mass and leaves a relative L2 output error of about 2% (what top-k leaves in real models: a
  // few percent), with an entropy of about 3 nats and a quarter of the mass on the sinks
  // (attention_stats() in quality_study.hpp measures these; reports/fathom_quality.md
  // "Synthetic workload").
  int sink_tokens = 4;
  double sink_strength = 6.0;  ///< in units of the background score std; ~25% of the mass
  /// Planted tokens aligned with the query: the heavy tail of the logit distribution. Every
  /// query head gets relevant_tokens / heads of them (256 by default, 3% of the context): its
  /// own in the rope profile, ones shared by the whole group in independent/correlated.
  int relevant_tokens = 1024;
  /// Strengths uniform in [min, max] background std: log-uniform weights, a Zipf-like tail that
  /// starts inside the bulk (1 std); the strongest token of a head holds ~15% of its mass.
  double relevant_min = 1.0, relevant_max = 6.0;
  int recent_window = 256;
  double recent_strength = 3.0;  ///< at age 0, decaying over 64 tokens; ~5% on the last 32
  /// Background std of q.k / sqrt(d), per query head. With QK-norm, |q| and |k| are fixed by the
  /// norm gains, and unrelated tokens have cos(q, k) ~ N(0, 1/d), so the bulk logit std is O(1).
  /// At 1.5 the bulk's own entropy is ln(n) - 1.1 nats: close to flat, so whatever of it top-k
  /// leaves out is lost by every method alike (the oracle's error).
  double logit_std = 1.5;
  double query_drift = 0.05;
  int calibration_skip = 16;  ///< tokens skipped by the calibration variance
  int calibration_tokens = 4096;
  int calibration_queries = 64;  ///< held-out query steps for offline calibration (fixed sets)
  // rope_qk_norm only:
  double rope_base = 1e6;    ///< RoPE base (Qwen3)
  double head_spread = 0.7;  ///< std of the per-head log amplitude of each pair
  int bias_pairs = 4;        ///< lowest-frequency pairs with a slowly rotating key bias
  double bias_scale = 3.0;   ///< bias magnitude in units of the pair's std
};

struct SyntheticKeys {
  SyntheticKeySpec spec;
  std::vector<std::uint16_t> keys;         ///< bf16 [tokens][channels]
  std::vector<std::uint16_t> values;       ///< bf16 [tokens][channels]
  std::vector<float> queries;              ///< [steps][heads][channels]
  std::vector<float> calibration_queries;  ///< held out: [calibration_queries][heads][channels]
  std::vector<float> variance;             ///< calibration Var(k_j) [channels]

  [[nodiscard]] const float* query(int step) const {
    return queries.data() + static_cast<std::size_t>(step) * spec.heads * spec.channels;
  }
};

[[nodiscard]] SyntheticKeys make_synthetic_keys(const SyntheticKeySpec& spec);

/// Mean and Var(k_j) over tokens [skip, skip + count) of bf16 keys [tokens][channels] (fewer if
/// short; all tokens when fewer than 2 remain after skip).
struct CalibrationMoments {
  std::vector<float> mean, variance;
};
[[nodiscard]] CalibrationMoments calibration_moments(const std::uint16_t* keys, std::int64_t tokens,
                                                     int channels, int skip, int count);
/// calibration_moments(...).variance.
[[nodiscard]] std::vector<float> calibration_variance(const std::uint16_t* keys,
                                                      std::int64_t tokens, int channels, int skip,
                                                      int count);

}  // namespace hisparse::fathom
