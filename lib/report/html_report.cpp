#include "report/html_report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "report/json_lookup.hpp"
#include "report/scaling.hpp"
#include "report/svg.hpp"
#include "report/tables.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {

using json_lookup::at;
using json_lookup::number;
using nlohmann::json;

std::string text_of(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

/// Config keys that tell points apart, in sweep order; "source" stands for the input file.
const std::vector<std::string> kKeys{"source",         "model",  "mode",
                                     "context_length", "top_k",  "hot_buffer",
                                     "budget_bits",    "policy", "concurrency"};

/// Compact key names for legends and bar labels.
std::string short_key(const std::string& key) {
  if (key == "concurrency") return "c";
  if (key == "context_length") return "ctx";
  if (key == "hot_buffer") return "hot";
  if (key == "budget_bits") return "bits";
  return key;
}

class Points {
 public:
  explicit Points(const json& results) {
    if (const json& sources = at(results, "sources"); sources.is_array())
      for (const auto& s : sources) source_labels_.push_back(text_of(at(s, "label")));
    if (const json& points = at(results, "points"); points.is_array())
      for (const auto& p : points)
        if (at(p, "status") == json("ok") && at(p, "metrics").is_object()) ok_.push_back(p);
  }

  [[nodiscard]] const std::vector<json>& ok() const { return ok_; }

  [[nodiscard]] std::string value(const json& p, const std::string& key) const {
    if (key == "source") {
      const json& s = at(p, "source");
      if (!s.is_number_unsigned() && !s.is_number_integer()) return "";
      const auto i = s.get<std::size_t>();
      return i < source_labels_.size() ? source_labels_[i] : fmt::format("run {}", i + 1);
    }
    return text_of(at(at(p, "config"), key.c_str()));
  }

  /// Keys (of kKeys, minus `except`) whose values differ among `points`.
  [[nodiscard]] std::vector<std::string> varying(const std::vector<json>& points,
                                                 const std::set<std::string>& except) const {
    std::vector<std::string> keys;
    for (const auto& k : kKeys) {
      if (except.count(k)) continue;
      std::set<std::string> seen;
      for (const auto& p : points) seen.insert(value(p, k));
      if (seen.size() > 1) keys.push_back(k);
    }
    return keys;
  }

  [[nodiscard]] std::string label(const json& p, const std::vector<std::string>& keys) const {
    std::string out;
    for (const auto& k : keys) {
      if (!out.empty()) out += ' ';
      out += k == "mode" || k == "model" || k == "source"
                 ? value(p, k)
                 : fmt::format("{}={}", short_key(k), value(p, k));
    }
    return out.empty() ? "all points" : out;
  }

 private:
  std::vector<std::string> source_labels_;
  std::vector<json> ok_;
};

/// Groups (x, y) pairs into series named by `label`, in first-seen order.
class SeriesBuilder {
 public:
  void add(const std::string& name, double x, double y) {
    auto it = std::find_if(series_.begin(), series_.end(),
                           [&](const svg::Series& s) { return s.name == name; });
    if (it == series_.end()) {
      series_.push_back({name, {}, {}});
      it = series_.end() - 1;
    }
    it->points.emplace_back(x, y);
  }
  [[nodiscard]] std::vector<svg::Series> take() { return std::move(series_); }

 private:
  std::vector<svg::Series> series_;
};

bool wide_range(const std::vector<svg::Series>& series) {
  double lo = INFINITY, hi = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (x <= 0) return false;
      lo = std::min(lo, x), hi = std::max(hi, x);
    }
  return hi >= 4 * lo;
}

/// A chart of `series`, on a log2 x axis when x spans a wide range.
svg::XYChart line_chart(std::string title, std::string x_label, std::string y_label,
                        std::vector<svg::Series> series) {
  svg::XYChart chart;
  chart.title = std::move(title);
  chart.x_label = std::move(x_label);
  chart.y_label = std::move(y_label);
  chart.series = std::move(series);
  chart.log2_x = wide_range(chart.series);
  return chart;
}

struct Figure {
  std::string id;
  std::string svg;  ///< empty: not drawn
  std::string caption;
  std::string note;  ///< why it is not drawn
};

std::string unit_of(const json& results) {
  return text_of(at(at(results, "metadata"), "backend")) == "cuda" ? "GPU" : "CPU";
}

/// A point's regression-gate verdicts (a `gate` overlay, see report/gate.hpp) as one mark: a red
/// down-triangle when one fails the gate, else a green up-triangle for an improvement, else an
/// amber question mark for an ambiguous timing; nothing when every verdict is `same`.
std::optional<svg::Mark> gate_mark(const json& p, double x, double y) {
  const json& rows = at(p, "gate");
  if (!rows.is_array()) return std::nullopt;
  bool failing = false, improved = false, ambiguous = false;
  std::string tip;
  for (const auto& r : rows) {
    const std::string verdict = text_of(at(r, "verdict"));
    if (verdict == "same" || verdict == "not_measured") continue;
    failing = failing || at(r, "fails") == json(true);
    improved = improved || verdict == "faster" || verdict == "better";
    ambiguous = ambiguous || verdict == "ambiguous";
    const json& delta = at(r, "delta_pct");
    tip +=
        fmt::format("{}{} {}{}", tip.empty() ? "gate: " : "; ", text_of(at(r, "metric")), verdict,
                    delta.is_number() ? fmt::format(" {:+.1f}%", delta.get<double>()) : "");
  }
  if (tip.empty()) return std::nullopt;
  if (failing) return svg::Mark{x, y, "\u25BC", "#c62828", tip};
  if (improved) return svg::Mark{x, y, "\u25B2", "#2e7d32", tip};
  if (ambiguous) return svg::Mark{x, y, "?", "#ef6c00", tip};
  return svg::Mark{x, y, "\u2022", "#555", tip};
}

Figure throughput_figure(const Points& pts, const std::string& unit) {
  Figure f{"throughput", {}, {}, {}};
  const auto keys = pts.varying(pts.ok(), {"concurrency"});
  SeriesBuilder b;
  std::vector<svg::Mark> marks;
  for (const auto& p : pts.ok()) {
    const double x = number(at(at(p, "config"), "concurrency"));
    const double y = number(at(at(p, "metrics"), "output_tokens_per_s"));
    b.add(pts.label(p, keys), x, y);
    if (auto mark = gate_mark(p, x, y)) marks.push_back(std::move(*mark));
  }
  svg::XYChart chart = line_chart("Throughput vs concurrency", "concurrency (requests)",
                                  "output tokens/s", b.take());
  chart.marks = marks;
  if (pts.ok().empty()) {
    f.note = "Throughput vs concurrency: no successful points.";
    return f;
  }
  f.svg = svg::render(chart);
  f.caption = fmt::format(
      "Output tokens/s (running requests / median {} step time) against concurrency, one line "
      "per mode (and per other setting that varies){}",
      unit,
      marks.empty() ? ""
                    : "; the regression gate's verdicts on the new run's points: \u25BC fails "
                      "the gate (slower, worse, changed, failed), \u25B2 better, ? a timing "
                      "the repetitions cannot decide (hover a mark for its metrics)");
  return f;
}

Figure speedup_figure(const Points& pts, const std::string& baseline) {
  Figure f{"speedup", {}, {}, {}};
  auto key = [&](const json& p) {
    return fmt::format("{}|{}|{}|{}", pts.value(p, "source"), pts.value(p, "model"),
                       pts.value(p, "context_length"), pts.value(p, "concurrency"));
  };
  std::map<std::string, double> base;
  std::vector<json> others;
  for (const auto& p : pts.ok()) {
    const double tps = number(at(at(p, "metrics"), "output_tokens_per_s"));
    if (pts.value(p, "mode") == baseline) {
      if (tps > 0) base.emplace(key(p), tps);
    } else {
      others.push_back(p);
    }
  }
  std::erase_if(others, [&](const json& p) { return !base.count(key(p)); });
  if (baseline.empty() || others.empty()) {
    f.note =
        "Speedup over the baseline: needs points of the baseline mode (sparse-gpu, else dense) "
        "and of another mode with the same model, context length and concurrency.";
    return f;
  }
  auto keys = pts.varying(others, {"concurrency"});
  if (std::find(keys.begin(), keys.end(), "mode") == keys.end()) keys.insert(keys.begin(), "mode");
  SeriesBuilder b;
  for (const auto& p : others)
    b.add(pts.label(p, keys), number(at(at(p, "config"), "concurrency")),
          number(at(at(p, "metrics"), "output_tokens_per_s")) / base.at(key(p)));
  svg::XYChart chart =
      line_chart(fmt::format("Speedup over {}", baseline), "concurrency (requests)",
                 fmt::format("tokens/s relative to {}", baseline), b.take());
  chart.reference_y = 1.0;
  chart.reference_label = baseline;
  f.svg = svg::render(chart);
  f.caption = fmt::format(
      "Output tokens/s of each mode divided by that of the baseline mode {} at the same model, "
      "context length and concurrency (above 1: faster)",
      baseline);
  return f;
}

Figure phase_figure(const Points& pts, const std::string& unit) {
  Figure f{"phases", {}, {}, {}};
  bool traced = false;
  for (const auto& p : pts.ok())
    if (at(at(p, "metrics"), "gpu_phase_ms").is_object()) traced = true;
  const char* field = traced ? "gpu_phase_ms" : "phase_ms";
  std::vector<json> bars;
  std::vector<std::string> phases;
  for (const auto& p : pts.ok()) {
    const json& ph = at(at(p, "metrics"), field);
    if (!ph.is_object() || ph.empty()) continue;
    bars.push_back(p);
    for (const auto& [name, v] : ph.items())
      if (name != "total" && std::find(phases.begin(), phases.end(), name) == phases.end())
        phases.push_back(name);
  }
  if (bars.empty() || phases.empty()) {
    f.note = "Step-time breakdown: no per-phase times (phase_ms) in these results.";
    return f;
  }
  constexpr std::size_t kMaxBars = 48;
  const bool cut = bars.size() > kMaxBars;
  if (cut) bars.resize(kMaxBars);
  const auto keys = pts.varying(bars, {});
  svg::StackedBarChart chart;
  chart.title = traced ? "GPU time per step by phase (CUPTI trace)" : "Step time by phase";
  chart.y_label = traced ? "GPU ms per step" : fmt::format("{} ms (median per phase)", unit);
  chart.stacks = phases;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const auto phase = phase_from_name(phases[i]);
    chart.colours.push_back(phase ? svg::hex_colour(phase_colour(*phase)) : svg::palette(i));
  }
  for (const auto& p : bars) {
    chart.bars.push_back(pts.label(p, keys));
    std::vector<double> row;
    for (const auto& name : phases)
      row.push_back(number(at(at(at(p, "metrics"), field), name.c_str()), 0.0));
    chart.values.push_back(std::move(row));
  }
  f.svg = svg::render(chart);
  f.caption =
      traced ? "GPU time of each phase per step, mean over the traced steps (gpu_phase_ms from "
               "the CUPTI timeline), stacked; colours are the NVTX phase colours"
             : fmt::format(
                   "Median {} time of each phase per step, summed over layers "
                   "(phase_ms), stacked; colours are the NVTX phase colours",
                   unit);
  if (cut) f.caption += fmt::format("; first {} points only", kMaxBars);
  return f;
}

Figure hit_rate_figure(const Points& pts) {
  Figure f{"hit-rate", {}, {}, {}};
  std::vector<json> with;
  for (const auto& p : pts.ok())
    if (at(at(p, "metrics"), "hit_rate").is_number()) with.push_back(p);
  if (with.empty()) {
    f.note =
        "Hit rate vs hot buffer: no point used a hot buffer (modes hisparse, "
        "hisparse+fathom report hit_rate).";
    return f;
  }
  const auto keys = pts.varying(with, {"hot_buffer"});
  SeriesBuilder b;
  // A policy axis: the swap-in runs LRU whatever the point's policy, so the measured hit rate is
  // the same for every policy. What differs is the replay of the recorded selections under each
  // policy (policy_miss_rate), plotted instead, with Belady's optimum as a series of its own.
  const bool by_policy = std::find(keys.begin(), keys.end(), "policy") != keys.end() &&
                         std::all_of(with.begin(), with.end(), [](const json& p) {
                           return at(at(p, "metrics"), "policy_miss_rate").is_number() &&
                                  at(at(p, "metrics"), "optimal_miss_rate").is_number();
                         });
  if (by_policy) {
    const auto others = pts.varying(with, {"hot_buffer", "policy"});
    std::set<std::pair<std::string, double>> optimum_done;  // one optimum per series and size
    for (const auto& p : with) {
      const json& m = at(p, "metrics");
      const double hot = number(at(at(p, "config"), "hot_buffer"));
      b.add(pts.label(p, keys), hot, 100.0 * (1.0 - number(at(m, "policy_miss_rate"))));
      const std::string optimum =
          "Belady optimum" + (others.empty() ? std::string() : " " + pts.label(p, others));
      if (optimum_done.insert({optimum, hot}).second)
        b.add(optimum, hot, 100.0 * (1.0 - number(at(m, "optimal_miss_rate"))));
    }
    f.svg = svg::render(line_chart("Hit rate of each replacement policy vs hot-buffer size",
                                   "hot buffer (slots per request and layer)", "hit rate (%)",
                                   b.take()));
    f.caption =
        "Share of selected rows each policy would have found in the hot buffer, replaying every "
        "selection the swap-in resolved (warm-up steps included; policy_miss_rate), with Belady's "
        "offline optimum; the swap-in itself runs LRU";
    return f;
  }
  for (const auto& p : with)
    b.add(pts.label(p, keys), number(at(at(p, "config"), "hot_buffer")),
          100.0 * number(at(at(p, "metrics"), "hit_rate")));
  const svg::XYChart chart =
      line_chart("Hot-buffer hit rate vs hot-buffer size",
                 "hot buffer (slots per request and layer)", "hit rate (%)", b.take());
  f.svg = svg::render(chart);
  f.caption = "Share of selected rows found in the GPU hot buffer over the measured steps";
  return f;
}

Figure pareto_figure(const Points& pts) {
  Figure f{"pareto", {}, {}, {}};
  std::vector<json> with;
  bool bits_per_token = false;
  for (const auto& p : pts.ok()) {
    const json& m = at(p, "metrics");
    if (pts.value(p, "mode").find("fathom") == std::string::npos) continue;
    if (!at(m, "attention_rel_error").is_number()) continue;
    with.push_back(p);
    bits_per_token = bits_per_token || at(m, "bits_per_token").is_number();
  }
  if (with.empty()) {
    f.note = "Bits vs error: no Fathom point with attention_rel_error in these results.";
    return f;
  }
  auto x_of = [&](const json& p) {
    return bits_per_token ? number(at(at(p, "metrics"), "bits_per_token"))
                          : number(at(at(p, "config"), "budget_bits"));
  };
  const auto keys = pts.varying(with, {"budget_bits"});
  SeriesBuilder b;
  std::vector<std::pair<double, double>> all;
  for (const auto& p : with) {
    const double x = x_of(p), y = number(at(at(p, "metrics"), "attention_rel_error"));
    b.add(pts.label(p, keys), x, y);
    if (std::isfinite(x) && std::isfinite(y)) all.emplace_back(x, y);
  }
  std::sort(all.begin(), all.end());
  svg::Series frontier{"Pareto frontier", {}, "#444444"};
  for (const auto& [x, y] : all)
    if (frontier.points.empty() || y < frontier.points.back().second)
      frontier.points.emplace_back(x, y);
  svg::XYChart chart;
  chart.title = "Bits read vs attention error";
  chart.x_label = bits_per_token ? "bits per token (incl. scales)" : "budget_bits (plane bits)";
  chart.y_label = "attention output relative L2 error";
  chart.series = b.take();
  chart.lines = false;
  chart.series.push_back(frontier);
  f.svg = svg::render(chart);
  f.caption =
      "Fathom points: bits scanned per token and KV head against the relative L2 error "
      "of the attention output vs dense attention; the frontier joins the points no "
      "other point beats on both";
  return f;
}

std::string cell(const json& v, const char* format = "{:.4g}") {
  if (v.is_number_float()) return fmt::format(fmt::runtime(format), v.get<double>());
  return svg::escaped(text_of(v));
}

/// The verdicts of a gated point that are not `same`, the failing ones in the failure style.
std::string gate_cell(const json& p) {
  std::string out;
  for (const auto& r : at(p, "gate")) {
    const std::string verdict = text_of(at(r, "verdict"));
    if (verdict == "same" || verdict == "not_measured") continue;
    const std::string text = svg::escaped(text_of(at(r, "metric")) + " " + verdict);
    out += (out.empty() ? "" : ", ") +
           (at(r, "fails") == json(true) ? "<span class=\"failed\">" + text + "</span>" : text);
  }
  return out.empty() && at(p, "gate").is_array() ? "same" : out;
}

std::string points_table(const json& results, const Points& pts) {
  const json& points = at(results, "points");
  std::string out =
      "<table>\n<tr><th>#</th><th>model</th><th>mode</th><th>concurrency</th><th>context</th>"
      "<th>top_k</th><th>hot</th><th>status</th><th>tok/s</th><th>step ms median</th>"
      "<th>p10</th><th>p90</th><th>running / queued</th><th>hit rate</th>{}</tr>\n";
  const bool gated =
      points.is_array() && std::any_of(points.begin(), points.end(),
                                       [](const json& p) { return at(p, "gate").is_array(); });
  out = fmt::format(fmt::runtime(out), gated ? "<th>gate</th>" : "");
  if (!points.is_array()) return out + "</table>\n";
  for (const auto& p : points) {
    const json& c = at(p, "config");
    const json& m = at(p, "metrics");
    const json& s = at(m, "step_ms");
    const bool ok = at(p, "status") == json("ok");
    const json& hit = at(m, "hit_rate");
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}</tr>\n",
        cell(at(p, "index")),
        svg::escaped(pts.value(p, "source").empty()
                         ? text_of(at(c, "model"))
                         : pts.value(p, "source") + ": " + text_of(at(c, "model"))),
        cell(at(c, "mode")), cell(at(c, "concurrency")), cell(at(c, "context_length")),
        cell(at(c, "top_k")), cell(at(c, "hot_buffer")),
        ok ? std::string("ok")
           : "<span class=\"failed\">failed: " + svg::escaped(text_of(at(p, "error"))) + "</span>",
        ok ? cell(at(m, "output_tokens_per_s"), "{:.1f}") : "",
        ok ? cell(at(s, "median"), "{:.3f}") : "", ok ? cell(at(s, "p10"), "{:.3f}") : "",
        ok ? cell(at(s, "p90"), "{:.3f}") : "",
        ok ? fmt::format("{} / {}", text_of(at(m, "running_requests")),
                         text_of(at(m, "queued_requests")))
           : "",
        hit.is_number() ? fmt::format("{:.1f}%", 100 * hit.get<double>()) : "-",
        gated ? "<td>" + gate_cell(p) + "</td>" : "");
  }
  return out + "</table>\n";
}

std::vector<std::string> distinct(const json& results, const char* field_path) {
  std::vector<std::string> values;
  auto add = [&](std::string v) {
    if (v.empty()) v = "unknown";
    if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
  };
  const json& sources = at(results, "sources");
  const std::string field = field_path;
  if (sources.is_array() && !sources.empty()) {
    for (const auto& s : sources)
      add(field == "synthetic" ? data_description(at(s, "synthetic"))
                               : text_of(at(s, field.c_str())));
  } else {
    const json& meta = at(results, "metadata");
    add(field == "synthetic" ? data_description(at(meta, "synthetic"))
        : field == "device"  ? text_of(at(at(meta, "device"), "name"))
                             : text_of(at(meta, field.c_str())));
  }
  return values;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

constexpr std::string_view kStyle =
    R"(body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222;padding:0 1em}
h1{font-size:1.6em}figure{margin:2em 0}figcaption{font-size:.9em;color:#444;max-width:760px}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}.failed{color:#b00}.note{color:#666;font-style:italic}
code{background:#f5f5f5;padding:0 3px})";

}  // namespace

std::string_view report_style() noexcept {
  return kStyle;
}

std::string baseline_mode(const json& results) {
  const Points pts(results);
  bool dense = false;
  for (const auto& p : pts.ok()) {
    if (pts.value(p, "mode") == "sparse-gpu") return "sparse-gpu";
    dense = dense || pts.value(p, "mode") == "dense";
  }
  return dense ? "dense" : "";
}

std::string provenance_caption(const json& results) {
  const auto backends = distinct(results, "backend");
  const bool cpu = std::find(backends.begin(), backends.end(), "cpu") != backends.end();
  return fmt::format(
      "{} {}{}, {} {}, {}", backends.size() > 1 ? "backends" : "backend", joined(backends),
      cpu ? " (CPU reference backend: host wall-clock timings, not GPU figures)" : "",
      distinct(results, "device").size() > 1 ? "devices" : "device",
      joined(distinct(results, "device")), joined(distinct(results, "synthetic")));
}

// Where each series stops scaling (report/scaling.hpp): a sentence and a row per concurrency.
std::string scaling_section(const json& results) {
  const auto all = scaling_series(results);
  if (all.empty()) return "";
  std::string html =
      "<h2 id=\"scaling\">Scaling</h2>\n<p class=\"note\">Per series, throughput per doubling of "
      "the running requests; the knee is the first step below 1.8x (or the concurrency "
      "admission caps), named with the phase whose time per step grew the most there.</p>\n";
  for (const auto& s : all) {
    html += fmt::format("<h3>{}</h3>\n<p>{}</p>\n", svg::escaped(s.label), svg::escaped(s.verdict));
    html +=
        "<table>\n<tr><th>concurrency</th><th>running</th><th>tok/s</th><th>step ms</th>"
        "<th>x per doubling</th><th>grew most</th></tr>\n";
    for (const auto& st : s.steps)
      html += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{:.4g}</td><td>{:.4g}</td><td>{}</td><td>{}</td></tr>\n",
          st.requested, st.running, st.tokens_per_s, st.step_ms,
          st.per_doubling ? fmt::format("{:.2f}", *st.per_doubling) : "-",
          st.grew_phase.empty()
              ? "-"
              : fmt::format("{} (+{:.2f} ms)", svg::escaped(st.grew_phase), st.grew_ms));
    html += "</table>\n";
  }
  return html;
}

std::string html_report(const json& results) {
  const Points pts(results);
  const json& meta = at(results, "metadata");
  const json& scenario = at(results, "scenario");
  const std::string name = text_of(at(scenario, "name")).empty() ? "hisparse-bench results"
                                                                 : text_of(at(scenario, "name"));
  const std::string unit = unit_of(results);
  const std::string provenance = provenance_caption(results);

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>hisparse-bench: {0}</title>\n<style>\n{1}\n</style>\n</head>\n<body>\n"
      "<h1>{0}</h1>\n",
      svg::escaped(name), kStyle);
  if (const std::string d = text_of(at(scenario, "description")); !d.empty())
    html += fmt::format("<p>{}</p>\n", svg::escaped(d));
  html += "<ul>\n";
  html += fmt::format("<li>{}</li>\n", svg::escaped(provenance));
  if (const json& sources = at(results, "sources"); sources.is_array()) {
    for (const auto& s : sources)
      html += fmt::format(
          "<li>source {}: scenario {}, backend {}, device {}, git {}, started {}</li>\n",
          svg::escaped(text_of(at(s, "label"))), svg::escaped(text_of(at(s, "scenario"))),
          svg::escaped(text_of(at(s, "backend"))), svg::escaped(text_of(at(s, "device"))),
          svg::escaped(text_of(at(s, "git_revision"))), svg::escaped(text_of(at(s, "start_time"))));
  } else {
    html += fmt::format("<li>git revision {}; started {}; host {}</li>\n",
                        svg::escaped(text_of(at(meta, "git_revision"))),
                        svg::escaped(text_of(at(meta, "start_time"))),
                        svg::escaped(text_of(at(meta, "host"))));
    if (const std::string cmd = text_of(at(meta, "command_line")); !cmd.empty())
      html += fmt::format("<li>command: <code>{}</code></li>\n", svg::escaped(cmd));
  }
  const json& summary = at(results, "summary");
  html += fmt::format("<li>points: {} of {} recorded, {} failed{}</li>\n</ul>\n",
                      text_of(at(summary, "recorded")), text_of(at(summary, "planned")),
                      text_of(at(summary, "failed")),
                      at(summary, "complete") == json(false) ? " (sweep incomplete)" : "");

  const std::vector<Figure> figures{
      throughput_figure(pts, unit), speedup_figure(pts, baseline_mode(results)),
      phase_figure(pts, unit), hit_rate_figure(pts), pareto_figure(pts)};
  int number_of_figure = 0;
  for (const auto& f : figures) {
    if (f.svg.empty()) {
      html += fmt::format("<p class=\"note\" id=\"{}\">{} ({})</p>\n", f.id, svg::escaped(f.note),
                          svg::escaped(provenance));
      continue;
    }
    html += fmt::format(
        "<figure id=\"{}\">\n{}\n<figcaption>Figure {}: {}. {}.</figcaption>\n</figure>\n", f.id,
        f.svg, ++number_of_figure, svg::escaped(f.caption),
        svg::escaped(provenance.substr(0, 1) == "b" ? "B" + provenance.substr(1) : provenance));
  }
  html += scaling_section(results);
  html += "<h2>Points</h2>\n" + points_table(results, pts);
  html += fmt::format("<p class=\"note\">Generated by hisparse-bench {} (report.html).</p>\n",
                      HISPARSE_VERSION);
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace hisparse
