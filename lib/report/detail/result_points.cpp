#include "report/detail/result_points.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "report/json_lookup.hpp"

namespace hisparse::detail {
namespace {

using json_lookup::at;
using nlohmann::json;

const char* kConfigKeys[] = {"model", "mode",       "concurrency", "context_length",
                             "top_k", "hot_buffer", "budget_bits", "policy"};

/// The value of `axis` for a point: from its config (all sweepable keys are there), else axes.
std::string axis_value(const json& point, const std::string& axis) {
  const json& c = at(at(point, "config"), axis.c_str());
  return c.is_null() ? text_of(at(at(point, "axes"), axis.c_str())) : text_of(c);
}

}  // namespace

std::string text_of(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::vector<std::string> swept_axes(const std::vector<const json*>& docs) {
  std::vector<std::string> axes;
  for (const json* doc : docs)
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

std::string config_difference(const json& a, const json& b, const std::vector<std::string>& axes) {
  std::string diff;
  for (const char* k : kConfigKeys) {
    if (std::find(axes.begin(), axes.end(), k) != axes.end()) continue;
    const std::string va = text_of(at(at(a, "config"), k)), vb = text_of(at(at(b, "config"), k));
    if (va != vb) diff += fmt::format("{}{} {} -> {}", diff.empty() ? "" : ", ", k, va, vb);
  }
  return diff;
}

const json* metric_at(const json& point, const std::string& path) {
  const json* v = &at(point, "metrics");
  for (std::size_t from = 0;;) {
    const std::size_t dot = path.find('.', from);
    const std::string key = path.substr(from, dot == std::string::npos ? dot : dot - from);
    if (!v->is_object() || !v->contains(key)) return nullptr;
    v = &(*v)[key];
    if (dot == std::string::npos) return v;
    from = dot + 1;
  }
}

}  // namespace hisparse::detail
