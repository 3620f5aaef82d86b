// Regression gate over two results.json documents (`hisparse-bench compare BASE NEW`). Points are
// matched by their values of the swept axes (the union of both runs' axes, read from each point's
// config). A change is significant only when it exceeds both the threshold and the measured
// noise, nvbench style: noise = the larger relative step-time spread (p90 - p10) / median of the
// two points for the timing metrics; the selection metrics (recall, attention error, hit rate,
// bytes moved, bits read) are deterministic for a seed and have no noise allowance. A worse
// significant change, or a point that ran in BASE and failed in NEW, is a regression.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

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
/// Step-time metrics: a value on every ok point, judged against the step-time noise. The others
/// may be null where a mode does not measure them (recall of a dense point): such points are not
/// compared, and a comparison in which no point has the metric is refused.
[[nodiscard]] bool is_timing(CompareMetric m) noexcept;

struct CompareOptions {
  CompareMetric metric = CompareMetric::tokens_per_s;
  double threshold_pct = 5.0;
  bool allow_different_devices = false;
};

enum class Verdict {
  same,         ///< |delta| within the threshold
  noise,        ///< beyond the threshold but within the noise
  improvement,  ///< significant and better
  regression,   ///< significant and worse
  failed,       ///< ok in BASE, failed in NEW (a regression)
  not_compared  ///< failed in BASE, in one run only, or no baseline value
};
[[nodiscard]] std::string_view name_of(Verdict v) noexcept;

struct PointComparison {
  std::string point;  ///< axis values, e.g. "mode=dense concurrency=4" ("(single point)" if none)
  double base = 0, next = 0;
  double delta_pct = 0;  ///< (NEW - BASE) / BASE in percent
  double noise_pct = 0;
  Verdict verdict = Verdict::same;
  std::string note;  ///< e.g. "only in NEW", "failed in NEW: ...", "config differs: ..."
};

struct Comparison {
  CompareOptions options;
  std::vector<std::string> axes;
  std::vector<PointComparison> points;
  nlohmann::json base_run, new_run;  ///< label, backend, device, git revision, start time
  std::vector<std::string> warnings;
  int regressions = 0;
  int improvements = 0;
  [[nodiscard]] bool regressed() const noexcept { return regressions > 0; }
};

/// Compares `next` against `base` (validated results documents, see load_results). The labels
/// name them in messages. Throws Error (bad input) when backends or devices differ (unless
/// allowed), when no point matches, or when an ok point lacks the metric.
[[nodiscard]] Comparison compare_results(const nlohmann::json& base, const nlohmann::json& next,
                                         const CompareOptions& options,
                                         const std::string& base_label,
                                         const std::string& new_label);

/// Human-readable table and a one-line verdict.
[[nodiscard]] std::string comparison_text(const Comparison& c);
[[nodiscard]] nlohmann::json to_json(const Comparison& c);

}  // namespace hisparse
