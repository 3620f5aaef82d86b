#include "report/policy_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <map>

#include "report/html_report.hpp"
#include "report/svg.hpp"

namespace hisparse {
namespace {

using nlohmann::json;

constexpr std::string_view kNote =
    "CPU replay of recorded selections (backend cpu); rows, bytes and transfer time per decode "
    "step sum every stream of the step, the time is the bytes at the given PCIe ceiling, an "
    "estimate rather than a measurement";

constexpr std::array<std::string_view, 8> kColumns{
    "hot",       "policy",  "miss rate",    "over belady",
    "rows/step", "MB/step", "PCIe us/step", "worst stream (miss rate)"};

// One table row per cell, formatted once for every view.
std::vector<std::array<std::string, 8>> table_rows(const json& doc) {
  std::vector<std::array<std::string, 8>> rows;
  for (const auto& c : doc.at("cells")) {
    const double rate = c.at("miss_rate").get<double>();
    const json& optimum = c.at("optimal_miss_rate");
    const std::string over = c.at("policy") == "belady" ? "optimum"
                             : optimum.is_number()
                                 ? fmt::format("{:+.2f} pt", 100 * (rate - optimum.get<double>()))
                                 : "-";
    rows.push_back({std::to_string(c.at("hot").get<int>()), c.at("policy").get<std::string>(),
                    fmt::format("{:.2f}%", 100 * rate), over,
                    fmt::format("{:.1f}", c.at("rows_per_step").get<double>()),
                    fmt::format("{:.3f}", c.at("bytes_per_step").get<double>() / 1e6),
                    fmt::format("{:.2f}", c.at("pcie_us_per_step").get<double>()),
                    fmt::format("{} ({:.2f}%)", c.at("worst_stream").get<std::string>(),
                                100 * c.at("worst_miss_rate").get<double>())});
  }
  return rows;
}

// The per-stream view: a header ("stream", then "<policy> @ <hot>" per cell) and one row per
// stream of its miss rate in each cell, to see which layers or requests thrash.
std::vector<std::vector<std::string>> per_stream_rows(const json& doc) {
  std::vector<std::vector<std::string>> rows{{"stream"}};
  for (const auto& name : doc.at("streams")) rows.push_back({name.get<std::string>()});
  for (const auto& c : doc.at("cells")) {
    rows[0].push_back(
        fmt::format("{} @ {}", c.at("policy").get<std::string>(), c.at("hot").get<int>()));
    const auto& per_stream = c.at("per_stream");
    for (std::size_t s = 0; s < per_stream.size(); ++s) {
      const auto hits = per_stream[s].at("hits").get<double>();
      const auto misses = per_stream[s].at("misses").get<double>();
      rows[s + 1].push_back(
          hits + misses > 0 ? fmt::format("{:.2f}%", 100 * misses / (hits + misses)) : "-");
    }
  }
  return rows;
}

// "N stream(s), S decode step(s) counted after W warm-up, selections of up to K positions".
std::string summary_line(const json& doc) {
  return fmt::format(
      "{} stream(s), {} decode step(s) counted after {} warm-up, selections of up to {} "
      "positions",
      doc.at("streams").size(), doc.at("counted_steps").get<std::int64_t>(),
      doc.at("warmup_steps").get<std::int64_t>(), doc.at("widest_selection").get<std::int64_t>());
}

std::string note_line(const json& doc) {
  return fmt::format("{}; rows of {} B, PCIe {} GB/s", kNote, doc.at("row_bytes").get<int>(),
                     doc.at("pcie_gbps").get<double>());
}

// One series per policy (in the study's order) of `value(cell)` against the hot size.
template <class Value>
std::vector<svg::Series> series_by_policy(const json& doc, Value value) {
  std::vector<svg::Series> out;
  std::map<std::string, std::size_t> index;
  for (const auto& c : doc.at("cells")) {
    const auto name = c.at("policy").get<std::string>();
    const auto [it, added] = index.emplace(name, out.size());
    if (added) out.push_back({name, {}, {}});
    out[it->second].points.emplace_back(c.at("hot").get<double>(), value(c));
  }
  return out;
}

}  // namespace

json policy_study_json(const PolicyStudy& study, const std::vector<NamedTrace>& streams,
                       const PolicyStudySetup& setup) {
  json names = json::array();
  std::int64_t widest = 0;
  for (const auto& named : streams) {
    names.push_back(named.name);
    for (const auto& step : named.trace.steps)
      widest = std::max(widest, static_cast<std::int64_t>(step.selected.size()));
  }
  json cells = json::array();
  for (const auto& cell : study.cells) {
    const double rows = study.counted_steps > 0 ? static_cast<double>(cell.total.misses) /
                                                      static_cast<double>(study.counted_steps)
                                                : 0.0;
    const double bytes = rows * setup.row_bytes;
    const PolicyStudyCell* optimum = study.find(cell.hot, ReplacementPolicy::belady);
    json per_stream = json::array();
    for (const auto& s : cell.per_stream)
      per_stream.push_back({{"hits", s.hits}, {"misses", s.misses}});
    const std::size_t worst = cell.worst_stream();
    cells.push_back(
        {{"hot", cell.hot},
         {"policy", std::string(name_of(cell.policy))},
         {"hits", cell.total.hits},
         {"misses", cell.total.misses},
         {"miss_rate", cell.total.miss_rate()},
         {"optimal_miss_rate", optimum ? json(optimum->total.miss_rate()) : json(nullptr)},
         {"rows_per_step", rows},
         {"bytes_per_step", bytes},
         {"pcie_us_per_step", bytes / (setup.pcie_gbps * 1e3)},  // GB/s = 1e3 B/us
         {"worst_stream", streams.at(worst).name},
         {"worst_miss_rate", cell.per_stream.at(worst).miss_rate()},
         {"per_stream", per_stream}});
  }
  return {{"backend", "cpu"},
          {"note", std::string(kNote)},
          {"command_line", setup.command_line},
          {"inputs", setup.inputs},
          {"streams", names},
          {"first_seq_len", setup.first_seq_len > 0 ? json(setup.first_seq_len) : json()},
          {"warmup_steps", setup.warmup_steps},
          {"counted_steps", study.counted_steps},
          {"stream_steps", study.stream_steps},
          {"widest_selection", widest},
          {"row_bytes", setup.row_bytes},
          {"pcie_gbps", setup.pcie_gbps},
          {"seed", setup.seed},
          {"cells", cells}};
}

std::string policy_study_text(const json& doc) {
  constexpr auto kRow = "{:>7}  {:<8} {:>10} {:>12} {:>12} {:>10} {:>13}  {}\n";
  std::string out =
      fmt::format("Replacement policies over recorded selections: {}\n", summary_line(doc));
  out += fmt::format(kRow, kColumns[0], kColumns[1], kColumns[2], kColumns[3], kColumns[4],
                     kColumns[5], kColumns[6], kColumns[7]);
  for (const auto& r : table_rows(doc))
    out += fmt::format(kRow, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
  return out + note_line(doc) + "\n";
}

std::string policy_study_markdown(const json& doc) {
  std::string out =
      fmt::format("# Replacement policies over recorded selections\n\n{}.\n\n", summary_line(doc));
  out += fmt::format("Inputs: {}.\n\n", fmt::join(doc.at("inputs"), ", "));
  out += fmt::format("| {} |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
                     fmt::join(kColumns, " | "));
  for (const auto& r : table_rows(doc)) out += fmt::format("| {} |\n", fmt::join(r, " | "));
  out += fmt::format("\n{}.\n\n## Miss rate per stream\n\n", note_line(doc));
  const auto streams = per_stream_rows(doc);
  out += fmt::format("| {} |\n| --- |", fmt::join(streams[0], " | "));
  for (std::size_t c = 1; c < streams[0].size(); ++c) out += " ---: |";
  out += "\n";
  for (std::size_t r = 1; r < streams.size(); ++r)
    out += fmt::format("| {} |\n", fmt::join(streams[r], " | "));
  return out;
}

std::string policy_study_html(const json& doc) {
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>hisparse-bench: replacement policies</title>\n<style>\n{}\n</style>\n</head>\n"
      "<body>\n<h1>Replacement policies over recorded selections</h1>\n<ul>\n<li>{}</li>\n",
      report_style(), svg::escaped(summary_line(doc)));
  html += fmt::format("<li>inputs: {}</li>\n",
                      svg::escaped(fmt::format("{}", fmt::join(doc.at("inputs"), ", "))));
  if (const auto cmd = doc.value("command_line", std::string()); !cmd.empty())
    html += fmt::format("<li>command: <code>{}</code></li>\n", svg::escaped(cmd));
  html += fmt::format("<li>{}</li>\n</ul>\n", svg::escaped(note_line(doc)));

  svg::XYChart miss;
  miss.title = "Miss rate vs hot-buffer size";
  miss.x_label = "hot-buffer slots";
  miss.y_label = "miss rate (%)";
  miss.log2_x = true;
  miss.series =
      series_by_policy(doc, [](const json& c) { return 100 * c.at("miss_rate").get<double>(); });
  svg::XYChart time;
  time.title = "Transfer time per decode step vs hot-buffer size";
  time.x_label = "hot-buffer slots";
  time.y_label = fmt::format("us at {} GB/s", doc.at("pcie_gbps").get<double>());
  time.log2_x = true;
  time.series =
      series_by_policy(doc, [](const json& c) { return c.at("pcie_us_per_step").get<double>(); });
  const std::string caption = svg::escaped(
      "CPU replay of recorded selections; times are the missed bytes at the PCIe ceiling, not "
      "measurements");
  int figure = 0;
  for (const auto* chart : {&miss, &time})
    html += fmt::format("<figure>\n{}\n<figcaption>Figure {}: {}. {}.</figcaption>\n</figure>\n",
                        svg::render(*chart), ++figure, svg::escaped(chart->title), caption);

  html += "<h2>Table</h2>\n<table>\n<tr>";
  for (const auto column : kColumns) html += fmt::format("<th>{}</th>", svg::escaped(column));
  html += "</tr>\n";
  for (const auto& r : table_rows(doc)) {
    html += "<tr>";
    for (const auto& cell : r) html += fmt::format("<td>{}</td>", svg::escaped(cell));
    html += "</tr>\n";
  }
  html += "</table>\n<h2>Miss rate per stream</h2>\n<table>\n";
  const auto streams = per_stream_rows(doc);
  for (std::size_t r = 0; r < streams.size(); ++r) {
    html += "<tr>";
    for (const auto& cell : streams[r])
      html += r == 0 ? fmt::format("<th>{}</th>", svg::escaped(cell))
                     : fmt::format("<td>{}</td>", svg::escaped(cell));
    html += "</tr>\n";
  }
  html += fmt::format(
      "</table>\n<p class=\"note\">Generated by hisparse-bench {} (policies.html).</p>\n"
      "</body>\n</html>\n",
      HISPARSE_VERSION);
  return html;
}

}  // namespace hisparse
