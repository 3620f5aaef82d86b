// The gate's views: the terminal table, Markdown and JSON.
#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "report/detail/result_points.hpp"
#include "report/gate.hpp"

namespace hisparse {

using detail::text_of;
using nlohmann::json;

namespace {

std::string test_text(const GateRow& r) {
  if (std::isfinite(r.p_value))
    return fmt::format("p={:.3g} ({}v{})", r.p_value, r.base_samples, r.new_samples);
  if (std::isfinite(r.noise_pct)) return fmt::format("spread {:.1f}%", r.noise_pct);
  return "";
}

std::string delta_text(const GateRow& r) {
  return std::isfinite(r.delta_pct) ? fmt::format("{:+.2f}%", r.delta_pct) : "";
}

std::string counts_text(const GateOutcome& o) {
  std::string s;
  for (GateVerdict v :
       {GateVerdict::slower, GateVerdict::worse, GateVerdict::changed, GateVerdict::failed,
        GateVerdict::missing, GateVerdict::ambiguous, GateVerdict::faster, GateVerdict::better,
        GateVerdict::added, GateVerdict::same, GateVerdict::not_measured})
    if (const std::size_t n = o.count(v); n > 0)
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", n, name_of(v));
  return s.empty() ? "nothing judged" : s;
}

std::string run_line(const char* side, const json& p) {
  return fmt::format("  {} {}: {} on {}, git {}{}\n", side, text_of(p["label"]),
                     text_of(p["backend"]).empty() ? "backend not recorded" : text_of(p["backend"]),
                     text_of(p["device"]).empty() ? "a device not recorded" : text_of(p["device"]),
                     text_of(p["git_revision"]).substr(0, 12),
                     text_of(p["start_time"]).empty() ? "" : ", " + text_of(p["start_time"]));
}

}  // namespace

std::string gate_text(const GateOutcome& o, bool all) {
  std::string out;
  for (const auto& run : o.runs) {
    out += fmt::format("{}:\n", run.baseline);
    out += run_line("BASE", run.base);
    out += run_line("NEW ", run.next);
  }
  for (const auto& w : o.warnings) out += "warning: " + w + "\n";
  std::vector<const GateRow*> shown;
  for (const auto& r : o.rows)
    if (all || (r.verdict != GateVerdict::same && r.verdict != GateVerdict::not_measured))
      shown.push_back(&r);
  if (!shown.empty()) {
    std::size_t item = 10, metric = 6;
    for (const auto* r : shown) {
      item = std::max(item, r->item.size() + (o.runs.size() > 1 ? r->baseline.size() + 2 : 0));
      metric = std::max(metric, r->metric.size());
    }
    out += fmt::format("{:<{}}  {:<{}} {:>12} {:>12} {:>9} {:>16}  {}\n", "point/case", item,
                       "metric", metric, "BASE", "NEW", "delta", "test", "verdict");
    for (const auto* r : shown) {
      const std::string name = o.runs.size() > 1 ? r->baseline + ": " + r->item : r->item;
      std::string verdict(name_of(r->verdict));
      if (fails(r->verdict))
        std::transform(verdict.begin(), verdict.end(), verdict.begin(), ::toupper);
      out += fmt::format("{:<{}}  {:<{}} {:>12} {:>12} {:>9} {:>16}  {}{}\n", name, item, r->metric,
                         metric, r->base_text.empty() ? "-" : r->base_text,
                         r->new_text.empty() ? "-" : r->new_text, delta_text(*r), test_text(*r),
                         verdict, r->note.empty() ? "" : " (" + r->note + ")");
    }
  }
  out += fmt::format("{}: {}\n", o.failed() ? "FAIL" : "PASS", counts_text(o));
  return out;
}

std::string gate_markdown(const GateOutcome& o) {
  std::string out = fmt::format("# Gate: {}\n\n", o.failed() ? "FAIL" : "PASS");
  for (const auto& run : o.runs) {
    out +=
        fmt::format("- **{}**: NEW {} ({} on {}, git {}) against BASE {} ({} on {}, git {})\n",
                    run.baseline, text_of(run.next["label"]), text_of(run.next["backend"]),
                    text_of(run.next["device"]), text_of(run.next["git_revision"]).substr(0, 12),
                    text_of(run.base["label"]), text_of(run.base["backend"]),
                    text_of(run.base["device"]), text_of(run.base["git_revision"]).substr(0, 12));
  }
  for (const auto& w : o.warnings) out += "- warning: " + w + "\n";
  out += "\n| baseline | point/case | metric | BASE | NEW | delta | test | verdict | note |\n";
  out += "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |\n";
  for (const auto& r : o.rows)
    if (r.verdict != GateVerdict::same && r.verdict != GateVerdict::not_measured)
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.baseline, r.item,
                         r.metric, r.base_text, r.new_text, delta_text(r), test_text(r),
                         fails(r.verdict) ? fmt::format("**{}**", name_of(r.verdict))
                                          : std::string(name_of(r.verdict)),
                         r.note);
  out += fmt::format("\n{}\n", counts_text(o));
  return out;
}

json to_json(const GateOutcome& o) {
  auto number = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json runs = json::array(), rows = json::array(), counts = json::object();
  for (const auto& r : o.runs) {
    json inputs = json::array(), files = json::array();
    for (const auto& p : r.inputs) inputs.push_back(p.string());
    for (const auto& p : r.baseline_files) files.push_back(p.string());
    runs.push_back({{"baseline", r.baseline},
                    {"base", r.base},
                    {"new", r.next},
                    {"baseline_files", files},
                    {"inputs", inputs}});
  }
  for (const auto& r : o.rows) {
    rows.push_back({{"baseline", r.baseline},
                    {"item", r.item},
                    {"metric", r.metric},
                    {"base", r.base_text},
                    {"new", r.new_text},
                    {"base_value", number(r.base)},
                    {"new_value", number(r.next)},
                    {"delta_pct", number(r.delta_pct)},
                    {"noise_pct", number(r.noise_pct)},
                    {"p_value", number(r.p_value)},
                    {"base_samples", r.base_samples},
                    {"new_samples", r.new_samples},
                    {"verdict", std::string(name_of(r.verdict))},
                    {"fails", fails(r.verdict)},
                    {"note", r.note}});
    counts[std::string(name_of(r.verdict))] = o.count(r.verdict);
  }
  return {{"status", o.failed() ? "fail" : "pass"},
          {"runs", runs},
          {"warnings", o.warnings},
          {"counts", counts},
          {"rows", rows}};
}

}  // namespace hisparse
