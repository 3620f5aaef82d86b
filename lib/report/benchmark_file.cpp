#include "report/benchmark_file.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "core/error.hpp"
#include "report/json_lookup.hpp"

namespace hisparse {

using json_lookup::at;
using nlohmann::json;

namespace {

/// Microseconds per unit of Google Benchmark's time_unit.
double us_per_unit(const json& unit) {
  const std::string u = unit.is_string() ? unit.get<std::string>() : "ns";
  if (u == "ns") return 1e-3;
  if (u == "ms") return 1e3;
  if (u == "s") return 1e6;
  return 1.0;  // "us"
}

std::string context_text(const json& context, const char* key) {
  const json& v = at(context, key);
  return v.is_string() ? v.get<std::string>() : "";
}

// Fields of a run entry that are Google Benchmark's own, not counters.
constexpr std::array kOwnFields{"name",
                                "family_index",
                                "per_family_instance_index",
                                "run_name",
                                "run_type",
                                "repetitions",
                                "repetition_index",
                                "threads",
                                "iterations",
                                "real_time",
                                "cpu_time",
                                "time_unit",
                                "label",
                                "error_occurred",
                                "error_message",
                                "aggregate_name",
                                "aggregate_unit",
                                "big_o",
                                "rms"};

}  // namespace

bool is_benchmark_document(const json& doc) {
  return doc.is_object() && at(doc, "benchmarks").is_array();
}

std::string benchmark_case_name(const std::string& run_name) {
  std::string name = run_name;
  for (const char* suffix : {"/iterations:", "/repeats:", "/manual_time", "/real_time"})
    if (const auto p = name.find(suffix); p != std::string::npos) name.erase(p);
  return name;
}

BenchmarkRuns read_benchmark_runs(const json& doc, const std::string& label) {
  if (!is_benchmark_document(doc))
    throw Error(label, "not a Google Benchmark output (no \"benchmarks\" list)",
                "give a file written by hisparse-microbench --benchmark_out=FILE "
                "--benchmark_out_format=json");
  BenchmarkRuns runs;
  runs.label = label;
  const json& context = at(doc, "context");
  runs.device = context_text(context, "hisparse_device");
  runs.backend = context_text(context, "hisparse_backend");
  runs.revision = context_text(context, "hisparse_git_revision");
  if (runs.revision.empty()) runs.revision = "unknown";
  runs.date = context_text(context, "date");
  for (const auto& r : at(doc, "benchmarks")) {
    const json& type = at(r, "run_type");
    if ((type.is_string() && type != "iteration") || at(r, "error_occurred") == json(true))
      continue;
    const json& name = at(r, "run_name").is_string() ? at(r, "run_name") : at(r, "name");
    if (!name.is_string() || !at(r, "real_time").is_number())
      throw Error(label, "a benchmark entry has no name or real_time",
                  "give an unedited hisparse-microbench --benchmark_out file");
    const std::string c = benchmark_case_name(name.get<std::string>());
    auto [it, fresh] = runs.cases.try_emplace(c);
    if (fresh) runs.order.push_back(c);
    auto& counters = it->second;
    for (const auto& [key, value] : r.items())
      if (value.is_number() &&
          std::find(kOwnFields.begin(), kOwnFields.end(), key) == kOwnFields.end())
        counters[key].push_back(value.get<double>());
    if (!r.contains("us_per_call"))
      counters["us_per_call"].push_back(r["real_time"].get<double>() * us_per_unit(r["time_unit"]));
  }
  return runs;
}

void pool_benchmark_runs(BenchmarkRuns& into, const BenchmarkRuns& more) {
  if (!into.device.empty() && !more.device.empty() && into.device != more.device)
    throw Error(more.label,
                fmt::format("ran on {}, and {} on {}: repetitions of one side must come from "
                            "one device",
                            more.device, into.label, into.device),
                "give the files of one device on each side");
  if (into.device.empty()) into.device = more.device;
  if (into.backend.empty()) into.backend = more.backend;
  into.label += ", " + more.label;
  for (const auto& name : more.order) {
    auto [it, fresh] = into.cases.try_emplace(name);
    if (fresh) into.order.push_back(name);
    for (const auto& [counter, values] : more.cases.at(name)) {
      auto& v = it->second[counter];
      v.insert(v.end(), values.begin(), values.end());
    }
  }
}

}  // namespace hisparse
