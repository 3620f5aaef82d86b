// `hisparse-bench compare BASE NEW`: the regression gate (gate.hpp) on one metric of two
// results.json files, without a gate file. Points are matched by their values of the swept axes;
// runs of different scenarios are compared (a config that differs outside the axes is noted).
// A timing metric's change counts when it exceeds the threshold and the rank test or the
// repetitions' spread (or, for a single run, the step-time p10..p90 spread) says it is real; the
// selection metrics are deterministic for a seed and are judged against the threshold alone.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/gate.hpp"

namespace hisparse {

enum class CompareMetric {
  tokens_per_s,
  step_ms_median,
  selection_recall,
  attention_rel_error,
  hit_rate,
  bytes_h2d_per_step,
  bits_per_token
};

/// "tokens_per_s", "step_ms.median", "selection_recall", "attention_rel_error", "hit_rate",
/// "bytes_h2d_per_step", "bits_per_token"; throws Error naming `where` otherwise.
[[nodiscard]] CompareMetric parse_compare_metric(std::string_view name, const std::string& where);
[[nodiscard]] std::string_view name_of(CompareMetric m) noexcept;
/// Every metric's name, in the order above.
[[nodiscard]] std::vector<std::string> compare_metric_names();
[[nodiscard]] bool higher_is_better(CompareMetric m) noexcept;
/// Step-time metrics: judged as timings. The others are deterministic and may be null where a
/// mode does not measure them (recall of a dense point).
[[nodiscard]] bool is_timing(CompareMetric m) noexcept;

struct CompareOptions {
  CompareMetric metric = CompareMetric::tokens_per_s;
  double threshold_pct = 5.0;
  bool allow_different_devices = false;
};

/// The gate's rule for the metric: a timing's minimum effect, or a selection metric's relative
/// tolerance, both `threshold_pct`, in the metric's direction.
[[nodiscard]] GateMetric gate_metric_of(const CompareOptions& options);

/// Compares `next` against `base` (validated results documents, see load_results). The labels
/// name them in messages. Throws Error (bad input) when backends or devices differ (unless
/// allowed), when no point matches, or when no point in both runs measures a selection metric.
[[nodiscard]] GateOutcome compare_results(const nlohmann::json& base, const nlohmann::json& next,
                                          const CompareOptions& options,
                                          const std::string& base_label,
                                          const std::string& new_label);

/// The one-line header (metric, direction, threshold, how noise is judged) and the gate's table
/// with every point.
[[nodiscard]] std::string comparison_text(const GateOutcome& outcome,
                                          const CompareOptions& options);

}  // namespace hisparse
