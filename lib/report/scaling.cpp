#include "report/scaling.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "report/json_lookup.hpp"

namespace hisparse {
namespace {

using json_lookup::at;
using json_lookup::number;
using nlohmann::json;

// Config keys that tell series apart (concurrency is the series' axis).
const char* const kSeriesKeys[] = {"model",      "mode",        "context_length", "top_k",
                                   "hot_buffer", "budget_bits", "policy"};

std::string text_of(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

std::string series_label(const json& p) {
  const json& c = at(p, "config");
  std::string label = fmt::format("{} {}", text_of(at(c, "model")), text_of(at(c, "mode")));
  for (const char* key : {"context_length", "top_k", "hot_buffer", "budget_bits"})
    if (const std::string v = text_of(at(c, key)); !v.empty())
      label += fmt::format(" {}={}", key, v);
  if (const json& s = at(p, "source"); !s.is_null()) label += fmt::format(" (source {})", s.dump());
  return label;
}

std::string series_key(const json& p) {
  std::string key = at(p, "source").dump();
  for (const char* k : kSeriesKeys) key += fmt::format("|{}", at(at(p, "config"), k).dump());
  return key;
}

// The phase whose time per step grew the most from `before` to `after` (gpu_phase_ms when both
// have it, else phase_ms), and by how much.
std::pair<std::string, double> grown_phase(const json& before, const json& after) {
  const char* field = at(at(before, "metrics"), "gpu_phase_ms").is_object() &&
                              at(at(after, "metrics"), "gpu_phase_ms").is_object()
                          ? "gpu_phase_ms"
                          : "phase_ms";
  const json& a = at(at(before, "metrics"), field);
  const json& b = at(at(after, "metrics"), field);
  std::pair<std::string, double> best{"", 0.0};
  if (!b.is_object()) return best;
  for (const auto& [name, v] : b.items()) {
    if (name == "total") continue;
    const double grew = number(v, 0.0) - number(at(a, name.c_str()), 0.0);
    if (grew > best.second) best = {name, grew};
  }
  return best;
}

}  // namespace

std::vector<ScalingSeries> scaling_series(const json& results) {
  std::map<std::string, std::vector<json>> groups;
  std::vector<std::string> order;
  if (const json& points = at(results, "points"); points.is_array())
    for (const auto& p : points) {
      if (at(p, "status") != json("ok") || !at(p, "metrics").is_object()) continue;
      const std::string key = series_key(p);
      if (!groups.count(key)) order.push_back(key);
      groups[key].push_back(p);
    }
  std::vector<ScalingSeries> out;
  for (const auto& key : order) {
    auto& pts = groups[key];
    std::stable_sort(pts.begin(), pts.end(), [](const json& x, const json& y) {
      return number(at(at(x, "config"), "concurrency"), 0) <
             number(at(at(y, "config"), "concurrency"), 0);
    });
    if (pts.size() < 2) continue;
    ScalingSeries s;
    s.label = series_label(pts.front());
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const json& m = at(pts[i], "metrics");
      ScalingStep st;
      st.requested = static_cast<int>(number(at(at(pts[i], "config"), "concurrency"), 0));
      st.running = static_cast<int>(number(at(m, "running_requests"), st.requested));
      st.tokens_per_s = number(at(m, "output_tokens_per_s"), 0);
      st.step_ms = number(at(at(m, "step_ms"), "median"), 0);
      if (i > 0) {
        const ScalingStep& prev = s.steps.back();
        if (st.running > prev.running && prev.tokens_per_s > 0 && st.tokens_per_s > 0)
          st.per_doubling = std::pow(
              st.tokens_per_s / prev.tokens_per_s,
              1.0 / std::log2(static_cast<double>(st.running) / static_cast<double>(prev.running)));
        std::tie(st.grew_phase, st.grew_ms) = grown_phase(pts[i - 1], pts[i]);
        if (!s.knee) {
          if (st.running <= prev.running && st.requested > prev.requested) {
            s.knee = prev.running;
            s.verdict = fmt::format(
                "stops at {} running requests: admission (concurrency {} asked, {} admitted by "
                "the memory budget, the rest wait)",
                prev.running, st.requested, st.running);
          } else if (st.per_doubling && *st.per_doubling < kNearLinearPerDoubling) {
            s.knee = prev.running;
            s.verdict = fmt::format(
                "bends after {} running requests: {:.2f}x per doubling from {} to {} (below "
                "{:.1f}x); the step grew from {:.1f} to {:.1f} ms, most in {} (+{:.1f} ms)",
                prev.running, *st.per_doubling, prev.running, st.running, kNearLinearPerDoubling,
                prev.step_ms, st.step_ms, st.grew_phase.empty() ? "no phase" : st.grew_phase,
                st.grew_ms);
          }
        }
      }
      s.steps.push_back(std::move(st));
    }
    if (!s.knee)
      s.verdict =
          fmt::format("near-linear (at least {:.1f}x per doubling) up to {} running requests",
                      kNearLinearPerDoubling, s.steps.back().running);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hisparse
