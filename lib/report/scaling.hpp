// Where throughput stops growing with concurrency, and why: per series of points that differ only
// in concurrency (same model, mode, context, ... and source), the per-doubling throughput factor
// between consecutive points, the knee (the first step below kNearLinearPerDoubling, or the
// concurrency admission caps), and the phase whose time per step grew the most across it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse {

/// The near-linear bound: throughput at 2C at least 1.8x that at C.
inline constexpr double kNearLinearPerDoubling = 1.8;

struct ScalingStep {
  int requested = 0;
  int running = 0;
  double tokens_per_s = 0;
  double step_ms = 0;
  /// From the previous point: (tok/s ratio)^(1 / log2(running ratio)); empty for the first
  /// point or when running did not grow.
  std::optional<double> per_doubling;
  std::string grew_phase;  ///< the phase whose ms per step grew the most from the previous point
  double grew_ms = 0;
};

struct ScalingSeries {
  std::string label;  ///< the series' fixed keys, e.g. "glm-5.1-fp8-rank hisparse ctx=32768"
  std::vector<ScalingStep> steps;  ///< by requested concurrency
  std::optional<int> knee;         ///< running requests at the knee; empty: no knee seen
  std::string verdict;             ///< one sentence: where it stops and why
};

/// The series of a results.json document with at least two concurrencies among its ok points.
/// Phase times come from metrics.gpu_phase_ms when traced, else metrics.phase_ms.
[[nodiscard]] std::vector<ScalingSeries> scaling_series(const nlohmann::json& results);

}  // namespace hisparse
