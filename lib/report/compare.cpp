#include "report/compare.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/error.hpp"
#include "report/json_lookup.hpp"

namespace hisparse {
namespace {

using json_lookup::at;
using nlohmann::json;

std::string text_of(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

const char* kConfigKeys[] = {"model", "mode",       "concurrency", "context_length",
                             "top_k", "hot_buffer", "budget_bits", "policy"};

/// The value of `axis` for a point: from its config (all sweepable keys are there), else axes.
std::string axis_value(const json& point, const std::string& axis) {
  const json& c = at(at(point, "config"), axis.c_str());
  return c.is_null() ? text_of(at(at(point, "axes"), axis.c_str())) : text_of(c);
}

std::vector<std::string> swept_axes(const json& a, const json& b) {
  std::vector<std::string> axes;
  for (const json* doc : {&a, &b})
    for (const auto& p : at(*doc, "points"))
      if (const json& ax = at(p, "axes"); ax.is_object())
        for (const auto& [name, v] : ax.items())
          if (std::find(axes.begin(), axes.end(), name) == axes.end()) axes.push_back(name);
  // Config order (the sweep's expansion order) reads best.
  std::vector<std::string> ordered;
  for (const char* k : kConfigKeys)
    if (std::find(axes.begin(), axes.end(), k) != axes.end()) ordered.emplace_back(k);
  for (const auto& k : axes)
    if (std::find(ordered.begin(), ordered.end(), k) == ordered.end()) ordered.push_back(k);
  return ordered;
}

std::string point_key(const json& p, const std::vector<std::string>& axes) {
  std::string key;
  for (const auto& a : axes) key += (key.empty() ? "" : " ") + a + "=" + axis_value(p, a);
  return key.empty() ? "(single point)" : key;
}

json run_info(const json& doc, const std::string& label) {
  const json& meta = at(doc, "metadata");
  return {{"label", label},
          {"backend", at(meta, "backend")},
          {"device", at(at(meta, "device"), "name")},
          {"git_revision", at(meta, "git_revision")},
          {"start_time", at(meta, "start_time")}};
}

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

/// The point's value of the metric; nullopt where a selection metric is null (not measured).
std::optional<double> metric_of(const json& point, CompareMetric m, const std::string& label) {
  const MetricInfo& i = info(m);
  const json* v = &at(point, "metrics");
  for (std::size_t from = 0; from <= i.field.size();) {
    const std::size_t dot = std::min(i.field.find('.', from), i.field.size());
    v = &at(*v, std::string(i.field.substr(from, dot - from)).c_str());
    from = dot + 1;
  }
  if (v->is_number()) return v->get<double>();
  if (!i.timing && v->is_null()) return std::nullopt;
  throw Error(label,
              fmt::format("point {} has no metrics.{} value", text_of(at(point, "index")), i.field),
              "compare results.json files written by 'hisparse-bench run'");
}

/// Relative p10..p90 spread of the point's step times, in percent (0 when unknown).
double spread_pct(const json& point) {
  const json& s = at(at(point, "metrics"), "step_ms");
  const json &p10 = at(s, "p10"), &p90 = at(s, "p90"), &median = at(s, "median");
  if (!p10.is_number() || !p90.is_number() || !median.is_number() || median.get<double>() <= 0)
    return 0.0;
  return 100.0 * (p90.get<double>() - p10.get<double>()) / median.get<double>();
}

std::string config_difference(const json& a, const json& b, const std::vector<std::string>& axes) {
  std::string diff;
  for (const char* k : kConfigKeys) {
    if (std::find(axes.begin(), axes.end(), k) != axes.end()) continue;
    const std::string va = text_of(at(at(a, "config"), k)), vb = text_of(at(at(b, "config"), k));
    if (va != vb) diff += fmt::format("{}{} {} -> {}", diff.empty() ? "" : ", ", k, va, vb);
  }
  return diff;
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

std::string_view name_of(Verdict v) noexcept {
  switch (v) {
    case Verdict::same:
      return "same";
    case Verdict::noise:
      return "noise";
    case Verdict::improvement:
      return "improvement";
    case Verdict::regression:
      return "regression";
    case Verdict::failed:
      return "failed";
    case Verdict::not_compared:
      return "not_compared";
  }
  return "same";
}

Comparison compare_results(const json& base, const json& next, const CompareOptions& options,
                           const std::string& base_label, const std::string& new_label) {
  if (!(options.threshold_pct >= 0) || !std::isfinite(options.threshold_pct))
    throw Error("--threshold", fmt::format("{} is not a percentage", options.threshold_pct),
                "give a threshold in percent, e.g. --threshold 5");
  Comparison c;
  c.options = options;
  c.base_run = run_info(base, base_label);
  c.new_run = run_info(next, new_label);
  for (const char* what : {"backend", "device"}) {
    const std::string b = text_of(c.base_run[what]), n = text_of(c.new_run[what]);
    if (b == n) continue;
    const std::string problem = fmt::format("{} {} differs from BASE's {} {}", what, n, what, b);
    if (!options.allow_different_devices)
      throw Error(new_label,
                  problem + ": results from different backends or devices are not comparable",
                  "compare runs from the same device and backend, or pass "
                  "--allow-different-devices to compare them anyway");
    c.warnings.push_back(problem + " (compared anyway: --allow-different-devices)");
  }

  c.axes = swept_axes(base, next);
  std::map<std::string, const json*> base_points;
  std::vector<std::string> base_order;
  for (const auto& p : at(base, "points")) {
    const std::string key = point_key(p, c.axes);
    if (base_points.emplace(key, &p).second) base_order.push_back(key);
  }
  int matched = 0, valued = 0;  // points in both runs; of those, compared on a value
  std::map<std::string, bool> seen_in_new;
  for (const auto& p : at(next, "points")) {
    PointComparison r;
    r.point = point_key(p, c.axes);
    if (seen_in_new[r.point]) continue;  // duplicate axis values: the first one counts
    seen_in_new[r.point] = true;
    const auto it = base_points.find(r.point);
    const bool new_ok = at(p, "status") == json("ok");
    if (it == base_points.end()) {
      r.verdict = Verdict::not_compared;
      r.note = "only in NEW";
      if (new_ok) r.next = metric_of(p, options.metric, new_label).value_or(0.0);
      c.points.push_back(std::move(r));
      continue;
    }
    ++matched;
    const json& b = *it->second;
    const bool base_ok = at(b, "status") == json("ok");
    std::optional<double> base_value, new_value;
    if (base_ok) base_value = metric_of(b, options.metric, base_label);
    if (new_ok) new_value = metric_of(p, options.metric, new_label);
    r.base = base_value.value_or(0.0);
    r.next = new_value.value_or(0.0);
    if (!base_ok) {
      r.verdict = Verdict::not_compared;
      r.note = "failed in BASE";
    } else if (!new_ok) {
      r.verdict = Verdict::failed;
      r.note = "failed in NEW: " + text_of(at(p, "error"));
      ++c.regressions;
    } else if (!base_value || !new_value) {
      r.verdict = Verdict::not_compared;
      r.note = fmt::format("no {} in {}", name_of(options.metric),
                           !base_value && !new_value ? "either run"
                           : !base_value             ? "BASE"
                                                     : "NEW");
    } else if (r.base <= 0) {
      r.verdict = Verdict::not_compared;
      r.note = "BASE value is 0";
    } else {
      ++valued;
      r.delta_pct = 100.0 * (r.next - r.base) / r.base;
      r.noise_pct = is_timing(options.metric) ? std::max(spread_pct(b), spread_pct(p)) : 0.0;
      const bool worse = higher_is_better(options.metric) ? r.delta_pct < 0 : r.delta_pct > 0;
      const double size = std::abs(r.delta_pct);
      if (size <= options.threshold_pct)
        r.verdict = Verdict::same;
      else if (size <= r.noise_pct)
        r.verdict = Verdict::noise;
      else
        r.verdict = worse ? Verdict::regression : Verdict::improvement;
      if (r.verdict == Verdict::regression) ++c.regressions;
      if (r.verdict == Verdict::improvement) ++c.improvements;
      if (const std::string d = config_difference(b, p, c.axes); !d.empty())
        r.note = "config differs: " + d;
    }
    c.points.push_back(std::move(r));
  }
  for (const auto& key : base_order)
    if (!seen_in_new.count(key)) {
      PointComparison r;
      r.point = key;
      r.verdict = Verdict::not_compared;
      r.note = "only in BASE";
      if (at(*base_points[key], "status") == json("ok"))
        r.base = metric_of(*base_points[key], options.metric, base_label).value_or(0.0);
      c.points.push_back(std::move(r));
    }
  if (matched == 0)
    throw Error(
        new_label,
        fmt::format("no sweep point matches one of BASE ({}) by its axis values{}", base_label,
                    c.axes.empty() ? "" : " (" + fmt::format("{}", fmt::join(c.axes, ", ")) + ")"),
        "compare two runs of the same scenario");
  // A gate on a metric that no common point measured would pass whatever happened.
  if (!is_timing(options.metric) && valued == 0 &&
      std::none_of(c.points.begin(), c.points.end(),
                   [](const PointComparison& r) { return r.verdict == Verdict::failed; }))
    throw Error(new_label,
                fmt::format("no point in both runs has a nonzero metrics.{} to compare",
                            info(options.metric).field),
                "choose a metric these runs measure (selection_recall and attention_rel_error "
                "for sparse modes, hit_rate for hisparse modes, bits_per_token for fathom "
                "modes)");
  return c;
}

std::string comparison_text(const Comparison& c) {
  std::string out =
      fmt::format("compare {} ({} is better), threshold {:g}%, {}\n", name_of(c.options.metric),
                  higher_is_better(c.options.metric) ? "higher" : "lower", c.options.threshold_pct,
                  is_timing(c.options.metric)
                      ? "noise = larger step-time p10..p90 spread of the two points"
                      : "no noise allowance (a selection metric: the same for the same seed)");
  for (const json* run : {&c.base_run, &c.new_run})
    out +=
        fmt::format("{} {}: {} on {}, git {}, started {}\n", run == &c.base_run ? "BASE" : "NEW ",
                    text_of((*run)["label"]), text_of((*run)["backend"]), text_of((*run)["device"]),
                    text_of((*run)["git_revision"]).substr(0, 12), text_of((*run)["start_time"]));
  for (const auto& w : c.warnings) out += "warning: " + w + "\n";
  std::size_t width = 5;
  for (const auto& p : c.points) width = std::max(width, p.point.size());
  out += fmt::format("{:<{}}  {:>12} {:>12} {:>9} {:>8}  {}\n", "point", width, "BASE", "NEW",
                     "delta", "noise", "verdict");
  int same = 0, noise = 0, not_compared = 0;
  for (const auto& p : c.points) {
    const bool numbers = p.verdict != Verdict::not_compared && p.verdict != Verdict::failed;
    out += fmt::format("{:<{}}  {:>12} {:>12} {:>9} {:>8}  {}{}\n", p.point, width,
                       p.base != 0 ? fmt::format("{:.4g}", p.base) : "-",
                       p.next != 0 ? fmt::format("{:.4g}", p.next) : "-",
                       numbers ? fmt::format("{:+.1f}%", p.delta_pct) : "-",
                       numbers ? fmt::format("{:.1f}%", p.noise_pct) : "-",
                       p.verdict == Verdict::regression ? std::string("REGRESSION")
                       : p.verdict == Verdict::failed   ? std::string("FAILED")
                                                        : std::string(name_of(p.verdict)),
                       p.note.empty() ? "" : " (" + p.note + ")");
    same += p.verdict == Verdict::same;
    noise += p.verdict == Verdict::noise;
    not_compared += p.verdict == Verdict::not_compared;
  }
  out += fmt::format(
      "{}: {} regression{}, {} improvement{}, {} same, {} within noise, {} not compared\n",
      c.regressed() ? "REGRESSION" : "no regression", c.regressions, c.regressions == 1 ? "" : "s",
      c.improvements, c.improvements == 1 ? "" : "s", same, noise, not_compared);
  return out;
}

nlohmann::json to_json(const Comparison& c) {
  json points = json::array();
  for (const auto& p : c.points)
    points.push_back({{"point", p.point},
                      {"base", p.base},
                      {"new", p.next},
                      {"delta_pct", p.delta_pct},
                      {"noise_pct", p.noise_pct},
                      {"verdict", std::string(name_of(p.verdict))},
                      {"note", p.note}});
  return {{"metric", std::string(name_of(c.options.metric))},
          {"threshold_pct", c.options.threshold_pct},
          {"axes", c.axes},
          {"base", c.base_run},
          {"new", c.new_run},
          {"warnings", c.warnings},
          {"points", points},
          {"regressions", c.regressions},
          {"improvements", c.improvements},
          {"status", c.regressed() ? "regression" : "ok"}};
}

}  // namespace hisparse
