#include "report/compare.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace hisparse {
namespace {

struct MetricInfo {
  CompareMetric id;
  std::string_view name;   ///< --metric value
  std::string_view field;  ///< under metrics; a '.' steps into an object
  bool higher_better;
  bool timing;
};
constexpr MetricInfo kMetrics[] = {
    {CompareMetric::tokens_per_s, "tokens_per_s", "output_tokens_per_s", true, true},
    {CompareMetric::step_ms_median, "step_ms.median", "step_ms.median", false, true},
    {CompareMetric::selection_recall, "selection_recall", "selection_recall", true, false},
    {CompareMetric::attention_rel_error, "attention_rel_error", "attention_rel_error", false,
     false},
    {CompareMetric::hit_rate, "hit_rate", "hit_rate", true, false},
    {CompareMetric::bytes_h2d_per_step, "bytes_h2d_per_step", "bytes_h2d_per_step", false, false},
    {CompareMetric::bits_per_token, "bits_per_token", "bits_per_token", false, false}};

const MetricInfo& info(CompareMetric m) {
  for (const auto& i : kMetrics)
    if (i.id == m) return i;
  return kMetrics[0];
}

}  // namespace

CompareMetric parse_compare_metric(std::string_view name, const std::string& where) {
  for (const auto& i : kMetrics)
    if (i.name == name) return i.id;
  throw Error(where, fmt::format("unknown metric '{}'", name),
              fmt::format("use one of {}", fmt::join(compare_metric_names(), ", ")));
}

std::string_view name_of(CompareMetric m) noexcept {
  return info(m).name;
}

std::vector<std::string> compare_metric_names() {
  std::vector<std::string> names;
  for (const auto& i : kMetrics) names.emplace_back(i.name);
  return names;
}

bool higher_is_better(CompareMetric m) noexcept {
  return info(m).higher_better;
}

bool is_timing(CompareMetric m) noexcept {
  return info(m).timing;
}

GateMetric gate_metric_of(const CompareOptions& options) {
  const MetricInfo& i = info(options.metric);
  GateMetric m;
  m.name = std::string(i.field);
  m.timing = i.timing;
  m.better = i.higher_better ? GateMetric::Better::higher : GateMetric::Better::lower;
  if (i.timing)
    m.min_effect_pct = options.threshold_pct;
  else
    m.tolerance = options.threshold_pct / 100.0;
  return m;
}

GateOutcome compare_results(const nlohmann::json& base, const nlohmann::json& next,
                            const CompareOptions& options, const std::string& base_label,
                            const std::string& new_label) {
  if (!(options.threshold_pct >= 0) || !std::isfinite(options.threshold_pct))
    throw Error("--threshold", fmt::format("{} is not a percentage", options.threshold_pct),
                "give a threshold in percent, e.g. --threshold 5");
  GateBaseline baseline;
  baseline.name = std::string(name_of(options.metric));
  baseline.where = base_label;
  baseline.metrics = {gate_metric_of(options)};
  GateOptions gate_options;
  gate_options.allow_different_devices = options.allow_different_devices;
  gate_options.allow_different_scenarios = true;
  GateOutcome outcome =
      judge_documents(baseline, {base}, {base_label}, {next}, {new_label}, gate_options);
  // A gate on a metric that no common point measured would pass whatever happened.
  const bool judged = std::any_of(outcome.rows.begin(), outcome.rows.end(), [](const auto& r) {
    return std::isfinite(r.base) && std::isfinite(r.next);
  });
  const bool failed = std::any_of(outcome.rows.begin(), outcome.rows.end(),
                                  [](const auto& r) { return r.verdict == GateVerdict::failed; });
  if (!is_timing(options.metric) && !judged && !failed)
    throw Error(new_label,
                fmt::format("no point in both runs has a metrics.{} to compare",
                            info(options.metric).field),
                "choose a metric these runs measure (selection_recall and attention_rel_error "
                "for sparse modes, hit_rate for hisparse modes, bits_per_token for fathom "
                "modes)");
  return outcome;
}

std::string comparison_text(const GateOutcome& outcome, const CompareOptions& options) {
  return fmt::format("compare {} ({} is better), threshold {:g}%, {}\n", name_of(options.metric),
                     higher_is_better(options.metric) ? "higher" : "lower", options.threshold_pct,
                     is_timing(options.metric)
                         ? "a timing: beyond the threshold, a rank test over repetitions (or the "
                           "larger step-time spread of a single run) decides"
                         : "no noise allowance (a selection metric: the same for the same seed)") +
         gate_text(outcome, true);
}

}  // namespace hisparse
