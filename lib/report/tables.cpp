#include "report/tables.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "report/json_lookup.hpp"

namespace hisparse {
namespace {

using json_lookup::at;
using json_lookup::number;
using nlohmann::json;

/// Numbers with up to 6 significant digits, integers as integers, null as empty.
std::string cell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

const char* kConfigKeys[] = {"model", "mode",       "concurrency", "context_length",
                             "top_k", "hot_buffer", "budget_bits", "policy"};
const char* kMetricKeys[] = {"output_tokens_per_s",
                             "tpot_ms",
                             "running_requests",
                             "queued_requests",
                             "hits",
                             "misses",
                             "hit_rate",
                             "bytes_h2d_per_step",
                             "bytes_scanned_per_step",
                             "bits_per_token",
                             "bytes_per_token",
                             "active_channels",
                             "gpu_bytes_per_request",
                             "selection_recall",
                             "attention_rel_error",
                             "policy_miss_rate",
                             "optimal_miss_rate"};
const char* kStepKeys[] = {"median", "p10", "p90", "p99", "mean", "rel_stdev"};

std::vector<std::string> phase_names(const json& points, const char* field = "phase_ms") {
  std::set<std::string> names;
  if (!points.is_array()) return {};
  for (const auto& p : points)
    if (const json& ph = at(at(p, "metrics"), field); ph.is_object())
      for (const auto& [name, v] : ph.items()) names.insert(name);
  return {names.begin(), names.end()};
}

/// "<source label>: " for a point of merged results, else "".
std::string source_prefix(const json& results, const json& point) {
  const json& sources = at(results, "sources");
  const json& src = at(point, "source");
  if (!sources.is_array() || !src.is_number()) return "";
  const std::size_t i = json_lookup::index(src);
  return (i < sources.size() ? cell(at(sources[i], "label")) : cell(src)) + ": ";
}

/// Per point of `mode` that chose rows: what the choice read and how good it was (budget_bits and
/// the plan columns for Fathom modes). Empty when no point of the mode measured either.
std::string selection_table(const json& results, const std::string& mode) {
  const json& points = at(results, "points");
  const auto number_or_dash = [](const json& v, const char* format) {
    return v.is_number() ? fmt::format(fmt::runtime(format), v.get<double>()) : std::string("-");
  };
  std::string rows;
  for (const auto& p : points) {
    const json& c = at(p, "config");
    const json& m = at(p, "metrics");
    if (cell(at(c, "mode")) != mode || cell(at(p, "status")) != "ok") continue;
    const json& bits = at(m, "bits_per_token");
    if (!at(m, "selection_recall").is_number() && !bits.is_number()) continue;
    rows += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        source_prefix(results, p) + cell(at(c, "model")),
                        cell(at(c, "concurrency")), cell(at(c, "context_length")),
                        cell(at(c, "top_k")), bits.is_number() ? cell(at(c, "budget_bits")) : "-",
                        number_or_dash(bits, "{:.1f}"),
                        number_or_dash(at(m, "active_channels"), "{:.1f}"),
                        bytes_text(number(at(m, "bytes_scanned_per_step"))),
                        number_or_dash(at(m, "selection_recall"), "{:.4f}"),
                        number_or_dash(at(m, "attention_rel_error"), "{:.3g}"));
  }
  if (rows.empty()) return rows;
  return "Selection (recall against each query head's exact top-k, error against dense "
         "attention; bits per token of the Fathom plans, scales included):\n\n"
         "| model | concurrency | context | top_k | budget_bits | bits/token | active channels "
         "| scanned / step | recall | attention error |\n"
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n" +
         rows + "\n";
}

/// Per point of `mode` with a hot buffer: the miss rate of the replacement policy its recorded
/// selections were replayed under, beside Belady's offline optimum. Empty when no point has one.
std::string policy_table(const json& results, const std::string& mode) {
  std::string rows;
  for (const auto& p : at(results, "points")) {
    const json& c = at(p, "config");
    const json& m = at(p, "metrics");
    if (cell(at(c, "mode")) != mode || cell(at(p, "status")) != "ok") continue;
    const json& rate = at(m, "policy_miss_rate");
    if (!rate.is_number()) continue;
    const json& optimum = at(m, "optimal_miss_rate");
    rows +=
        fmt::format("| {} | {} | {} | {} | {} | {} | {:.2f}% | {} | {} |\n",
                    source_prefix(results, p) + cell(at(c, "model")), cell(at(c, "concurrency")),
                    cell(at(c, "context_length")), cell(at(c, "top_k")), cell(at(c, "hot_buffer")),
                    cell(at(m, "policy")), 100 * rate.get<double>(),
                    optimum.is_number() ? fmt::format("{:.2f}%", 100 * optimum.get<double>()) : "-",
                    cell(at(m, "policy_steps")));
  }
  if (rows.empty()) return rows;
  return "Replacement policies (every selection the swap-in resolved, replayed under the point's "
         "policy, with Belady's offline optimum beside it; the swap-in itself runs LRU):\n\n"
         "| model | concurrency | context | top_k | hot | policy | miss rate | Belady optimum | "
         "steps |\n"
         "|---|---:|---:|---:|---:|---|---:|---:|---:|\n" +
         rows + "\n";
}

}  // namespace

std::string data_description(const json& synthetic) {
  const bool syn_w =
      at(synthetic, "weights").is_boolean() ? at(synthetic, "weights").get<bool>() : true;
  const bool syn_k =
      at(synthetic, "workload").is_boolean() ? at(synthetic, "workload").get<bool>() : true;
  return syn_w && syn_k ? "synthetic weights/workload"
         : syn_w        ? "synthetic weights, replayed workload"
         : syn_k        ? "loaded weights, synthetic workload"
                        : "loaded weights, replayed workload";
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string results_csv(const json& results) {
  const json& points = at(results, "points");
  const auto phases = phase_names(points);
  const auto gpu_phases = phase_names(points, "gpu_phase_ms");
  const bool merged = at(results, "sources").is_array();
  std::vector<std::string> header{"index"};
  if (merged) header.emplace_back("source");
  for (const char* k : kConfigKeys) header.emplace_back(k);
  header.emplace_back("status");
  header.emplace_back("output_tokens_per_s");
  for (const char* k : kStepKeys) header.push_back(fmt::format("step_ms_{}", k));
  for (const char* k : kMetricKeys)
    if (std::string(k) != "output_tokens_per_s") header.emplace_back(k);
  for (const auto& p : phases) header.push_back(fmt::format("phase_ms_{}", p));
  for (const auto& p : gpu_phases) header.push_back(fmt::format("gpu_phase_ms_{}", p));
  header.emplace_back("error");

  std::string out;
  for (std::size_t i = 0; i < header.size(); ++i) {
    if (i) out += ',';
    out += header[i];
  }
  out += "\n";
  if (!points.is_array()) return out;
  for (const auto& p : points) {
    const json& c = at(p, "config");
    const json& m = at(p, "metrics");
    std::vector<std::string> row{cell(at(p, "index"))};
    if (merged) {
      const json& src = at(p, "source");
      const json& sources = at(results, "sources");
      row.push_back(json_lookup::index(src) < sources.size()
                        ? cell(at(sources[json_lookup::index(src)], "label"))
                        : cell(src));
    }
    for (const char* k : kConfigKeys) row.push_back(cell(at(c, k)));
    row.push_back(cell(at(p, "status")));
    row.push_back(cell(at(m, "output_tokens_per_s")));
    for (const char* k : kStepKeys) row.push_back(cell(at(at(m, "step_ms"), k)));
    for (const char* k : kMetricKeys)
      if (std::string(k) != "output_tokens_per_s") row.push_back(cell(at(m, k)));
    for (const auto& ph : phases) row.push_back(cell(at(at(m, "phase_ms"), ph.c_str())));
    for (const auto& ph : gpu_phases) row.push_back(cell(at(at(m, "gpu_phase_ms"), ph.c_str())));
    row.push_back(cell(at(p, "error")));
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i) out += ',';
      out += csv_field(row[i]);
    }
    out += "\n";
  }
  return out;
}

std::string results_markdown(const json& results) {
  const json& meta = at(results, "metadata");
  const json& scenario = at(results, "scenario");
  const json& points = at(results, "points");
  const std::string backend = cell(at(meta, "backend"));
  const bool cpu = backend != "cuda";
  std::string out = fmt::format("# {}\n\n", cell(at(scenario, "name")).empty()
                                                ? std::string("hisparse-bench results")
                                                : cell(at(scenario, "name")));
  if (const std::string d = cell(at(scenario, "description")); !d.empty()) out += d + "\n\n";
  const std::string data = data_description(at(meta, "synthetic"));
  out +=
      fmt::format("- backend: **{}**{}\n", backend,
                  cpu ? " (CPU reference backend: host wall-clock timings, not GPU figures)" : "");
  out += fmt::format("- device: {}\n", cell(at(at(meta, "device"), "name")));
  out += fmt::format("- data: {}\n", data);
  if (const json& sources = at(results, "sources"); sources.is_array()) {
    for (const auto& src : sources)
      out += fmt::format("- source {}: scenario {}, backend {}, device {}, git {}, started {}\n",
                         cell(at(src, "label")), cell(at(src, "scenario")),
                         cell(at(src, "backend")), cell(at(src, "device")),
                         cell(at(src, "git_revision")), cell(at(src, "start_time")));
  } else {
    out += fmt::format("- git revision: {}; started {}; host {}\n", cell(at(meta, "git_revision")),
                       cell(at(meta, "start_time")), cell(at(meta, "host")));
  }
  if (const json& budget = at(meta, "memory_budget"); budget.is_object())
    out += fmt::format("- admission memory budget: {}\n", cell(at(budget, "source")));
  const json& summary = at(results, "summary");
  out += fmt::format("- points: {} of {} recorded, {} failed{}\n\n", cell(at(summary, "recorded")),
                     cell(at(summary, "planned")), cell(at(summary, "failed")),
                     at(summary, "complete") == json(false) ? " (sweep incomplete)" : "");

  const std::string unit = cpu ? "CPU" : "GPU";
  std::vector<std::string> modes;
  if (points.is_array())
    for (const auto& p : points) {
      const std::string mode = cell(at(at(p, "config"), "mode"));
      if (std::find(modes.begin(), modes.end(), mode) == modes.end()) modes.push_back(mode);
    }
  for (const auto& mode : modes) {
    out += fmt::format("## mode: {}\n\n", mode);
    out += fmt::format(
        "| model | concurrency | context | top_k | hot | status | tok/s | {} step ms (median) | "
        "p90 | p99 | running / queued | hit rate | H2D / step | phases (median ms) |\n",
        unit);
    out += "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const auto& p : points) {
      const json& c = at(p, "config");
      if (cell(at(c, "mode")) != mode) continue;
      const json& m = at(p, "metrics");
      const json& step = at(m, "step_ms");
      std::string phases;
      if (const json& ph = at(m, "phase_ms"); ph.is_object())
        for (const auto& [name, v] : ph.items())
          phases += fmt::format("{}{} {:.3g}", phases.empty() ? "" : ", ", name, number(v));
      if (const json& gph = at(m, "gpu_phase_ms"); gph.is_object()) {
        phases += phases.empty() ? "GPU trace:" : "; GPU trace:";
        for (const auto& [name, v] : gph.items())
          phases += fmt::format(" {} {:.3g}", name, number(v));
      }
      const bool ok = cell(at(p, "status")) == "ok";
      std::string status = ok ? std::string("ok") : fmt::format("failed: {}", cell(at(p, "error")));
      for (auto& ch : status)
        if (ch == '|' || ch == '\n') ch = ' ';
      const json& hit = at(m, "hit_rate");
      out += fmt::format(
          "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
          source_prefix(results, p) + cell(at(c, "model")), cell(at(c, "concurrency")),
          cell(at(c, "context_length")), cell(at(c, "top_k")), cell(at(c, "hot_buffer")), status,
          ok ? fmt::format("{:.1f}", number(at(m, "output_tokens_per_s"))) : "",
          ok ? fmt::format("{:.3f}", number(at(step, "median"))) : "",
          ok ? fmt::format("{:.3f}", number(at(step, "p90"))) : "",
          ok ? fmt::format("{:.3f}", number(at(step, "p99"))) : "",
          ok ? fmt::format("{} / {}", cell(at(m, "running_requests")),
                           cell(at(m, "queued_requests")))
             : "",
          hit.is_number() ? fmt::format("{:.1f}%", 100 * hit.get<double>()) : "-",
          ok ? bytes_text(number(at(m, "bytes_h2d_per_step"))) : "", phases);
    }
    out += "\n";
    out += selection_table(results, mode);
    out += policy_table(results, mode);
  }
  if (modes.empty()) out += "No points recorded yet.\n";
  return out;
}

}  // namespace hisparse
