// Reading a gate: gate.yaml, or the default gate of a folder or file of baselines.
#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/error.hpp"
#include "report/benchmark_file.hpp"
#include "report/gate.hpp"
#include "report/json_lookup.hpp"
#include "report/results_file.hpp"
#include "scenario/yaml_reader.hpp"

namespace hisparse {
namespace {

using json_lookup::at;

constexpr const char* kGateFileName = "gate.yaml";

GateMetric deterministic(std::string name, GateMetric::Better better = GateMetric::Better::none) {
  GateMetric m;
  m.name = std::move(name);
  m.better = better;
  return m;
}

GateMetric timing(std::string name, GateMetric::Better better) {
  GateMetric m;
  m.name = std::move(name);
  m.timing = true;
  m.better = better;
  return m;
}

GateMetric::Better better_of(const YamlReader& r, const YAML::Node& n, const std::string& key) {
  return r.choice(n, key, {"higher", "lower"}) == "higher" ? GateMetric::Better::higher
                                                           : GateMetric::Better::lower;
}

/// One metric's rule: `exact`, or a mapping {timing: higher|lower, min_effect_pct, alpha} or
/// {tolerance, better: higher|lower}.
GateMetric metric_rule(const YamlReader& r, const std::string& name, const YAML::Node& n,
                       const std::string& key) {
  GateMetric m = deterministic(name);
  if (n.IsScalar()) {
    if (r.choice(n, key, {"exact"}) == "exact") return m;
  }
  if (!n.IsMap())
    throw Error(r.where(key, n), "expected 'exact' or a mapping",
                "write 'exact', '{tolerance: 1e-9}' or '{timing: higher, min_effect_pct: 5}'");
  r.known_keys(n, key, {"timing", "min_effect_pct", "alpha", "tolerance", "better"});
  if (n["timing"]) {
    m.timing = true;
    m.better = better_of(r, n["timing"], key + ".timing");
    for (const char* deterministic_only : {"tolerance", "better"})
      if (n[deterministic_only])
        throw Error(r.where(key + "." + deterministic_only, n[deterministic_only]),
                    "a timing metric has no tolerance or better",
                    "give its direction as 'timing: higher|lower' and its noise allowance as "
                    "min_effect_pct");
    if (n["min_effect_pct"])
      m.min_effect_pct = r.real(n["min_effect_pct"], key + ".min_effect_pct", 0, 1000);
    if (n["alpha"]) m.alpha = r.real(n["alpha"], key + ".alpha", 1e-9, 0.5);
    return m;
  }
  for (const char* timing_only : {"min_effect_pct", "alpha"})
    if (n[timing_only])
      throw Error(r.where(key + "." + timing_only, n[timing_only]),
                  "only a timing metric has a minimum effect and a test level",
                  "add 'timing: higher|lower', or give a deterministic metric a tolerance");
  if (n["tolerance"]) m.tolerance = r.real(n["tolerance"], key + ".tolerance", 0, 1);
  if (n["better"]) m.better = better_of(r, n["better"], key + ".better");
  return m;
}

GateBaseline baseline_entry(const YamlReader& r, const YAML::Node& n, const std::string& key,
                            const std::filesystem::path& folder) {
  if (!n.IsMap())
    throw Error(r.where(key, n), "expected a mapping",
                "write '- scenario: NAME' (or '- microbench: NAME'), 'file:' and 'metrics:'");
  r.known_keys(n, key, {"scenario", "microbench", "file", "cases", "metrics"});
  GateBaseline b;
  b.where = r.where(key, n);
  if (n["scenario"] && n["microbench"])
    throw Error(r.where(key + ".microbench", n["microbench"]),
                "a baseline is either a scenario's results or a microbenchmark's",
                "split it into two entries");
  if (n["scenario"]) {
    b.name = r.text(n["scenario"], key + ".scenario");
  } else if (n["microbench"]) {
    b.kind = GateInputKind::microbench;
    b.name = r.text(n["microbench"], key + ".microbench");
  } else {
    throw Error(b.where, "names no scenario or microbench",
                "add 'scenario: NAME' (the scenario's name: key) or 'microbench: LABEL'");
  }
  if (!n["file"])
    throw Error(b.where, "has no file", "add 'file: NAME.json' (the baseline, beside gate.yaml)");
  b.file = folder / r.text(n["file"], key + ".file");
  if (n["cases"]) {
    if (b.kind != GateInputKind::microbench)
      throw Error(r.where(key + ".cases", n["cases"]), "only a microbench baseline has cases",
                  "remove 'cases:', or make the entry 'microbench:'");
    b.cases = r.text(n["cases"], key + ".cases");
    try {
      (void)std::regex(b.cases);
    } catch (const std::regex_error& e) {
      throw Error(r.where(key + ".cases", n["cases"]),
                  fmt::format("'{}' is not a regular expression ({})", b.cases, e.what()),
                  "write an ECMAScript regular expression such as '^swap_in/'");
    }
  }
  const YAML::Node metrics = n["metrics"];
  if (!metrics || !metrics.IsMap() || metrics.size() == 0)
    throw Error(metrics ? r.where(key + ".metrics", metrics) : b.where, "has no metrics to judge",
                "add 'metrics:' with e.g. 'misses: exact' or 'output_tokens_per_s: {timing: "
                "higher}'");
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const std::string name = r.text(it->first, key + ".metrics");
    b.metrics.push_back(metric_rule(r, name, it->second, key + ".metrics." + name));
  }
  return b;
}

/// The default gate of one baseline document already read.
void add_default_baseline(GateSpec& spec, const std::filesystem::path& file,
                          const nlohmann::json& doc) {
  if (is_results_document(doc)) {
    GateBaseline b;
    b.name = at(at(doc, "scenario"), "name").is_string()
                 ? at(at(doc, "scenario"), "name").get<std::string>()
                 : file.stem().string();
    for (const auto& other : spec.baselines)
      if (other.kind == GateInputKind::results && other.name == b.name)
        throw Error(file.string(),
                    fmt::format("is a second baseline of scenario '{}' (the first: {})", b.name,
                                other.file.string()),
                    "keep one baseline per scenario in the folder, or write a gate.yaml");
    b.file = file;
    b.metrics = default_gate_metrics(GateInputKind::results);
    b.where = file.string();
    spec.baselines.push_back(std::move(b));
    return;
  }
  if (!is_benchmark_document(doc))
    throw Error(file.string(),
                "is neither a hisparse-bench results file nor a Google Benchmark "
                "output",
                "keep only baselines in the folder, or write a gate.yaml");
  // Every microbenchmark file of the folder is a repetition of one baseline.
  for (auto& other : spec.baselines)
    if (other.kind == GateInputKind::microbench) {
      other.extra_files.push_back(file);
      return;
    }
  GateBaseline b;
  b.kind = GateInputKind::microbench;
  b.name = "microbench";
  b.file = file;
  b.metrics = default_gate_metrics(GateInputKind::microbench);
  b.where = file.string();
  spec.baselines.push_back(std::move(b));
}

}  // namespace

std::vector<GateMetric> default_gate_metrics(GateInputKind kind) {
  if (kind == GateInputKind::microbench) return {timing("us_per_call", GateMetric::Better::lower)};
  std::vector<GateMetric> metrics{timing("output_tokens_per_s", GateMetric::Better::higher)};
  for (const char* name :
       {"running_requests", "queued_requests", "admitted_requests", "hits", "misses",
        "bytes_h2d_per_step", "bytes_scanned_per_step", "bits_per_token", "active_channels",
        "selection_recall", "attention_rel_error", "policy_miss_rate", "optimal_miss_rate",
        "next_tokens_digest"}) {
    GateMetric m = deterministic(name);
    m.required = false;  // judged where the baseline has it (files of older builds lack some)
    metrics.push_back(std::move(m));
  }
  metrics.front().required = false;
  return metrics;
}

GateSpec parse_gate(const std::string& yaml_text, const std::filesystem::path& file) {
  const YamlReader r(file.string());
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw Error(r.where_mark("gate", e.mark), fmt::format("not valid YAML ({})", e.msg),
                "fix the YAML syntax (see README 'Gating a CI job')");
  }
  if (!root.IsMap())
    throw Error(r.where("baselines", root), "expected a mapping with 'baselines:'",
                "write 'baselines:' and a list of baselines (see README 'Gating a CI job')");
  r.known_keys(root, "", {"baselines"});
  const YAML::Node list = root["baselines"];
  if (!list || !list.IsSequence() || list.size() == 0)
    throw Error(r.where("baselines", list ? list : root), "expected a non-empty list",
                "list at least one '- scenario: NAME' or '- microbench: NAME' entry");
  GateSpec spec;
  spec.file = file;
  for (std::size_t i = 0; i < list.size(); ++i) {
    GateBaseline b =
        baseline_entry(r, list[i], fmt::format("baselines[{}]", i), file.parent_path());
    for (const auto& other : spec.baselines)
      if (other.kind == b.kind && other.name == b.name)
        throw Error(b.where, fmt::format("'{}' is gated twice", b.name),
                    "keep one entry per scenario or microbenchmark label");
    spec.baselines.push_back(std::move(b));
  }
  return spec;
}

GateSpec load_gate(const std::filesystem::path& baseline) {
  std::error_code ec;
  const std::string fix =
      "give a baseline folder (with gate.yaml, or holding results.json and Google Benchmark "
      "files) or one baseline file";
  if (std::filesystem::is_directory(baseline, ec)) {
    const auto gate_file = baseline / kGateFileName;
    if (std::filesystem::exists(gate_file, ec)) {
      std::ifstream in(gate_file, std::ios::binary);
      if (!in) throw Error(gate_file.string(), "cannot read the file", fix);
      std::stringstream text;
      text << in.rdbuf();
      return parse_gate(text.str(), gate_file);
    }
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(baseline, ec))
      if (entry.is_regular_file() && entry.path().extension() == ".json")
        files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw Error(baseline.string(), "holds no gate.yaml and no .json baseline", fix);
    GateSpec spec;
    for (const auto& f : files) add_default_baseline(spec, f, read_json_file(f, fix));
    return spec;
  }
  if (!std::filesystem::exists(baseline, ec)) throw Error(baseline.string(), "does not exist", fix);
  GateSpec spec;
  add_default_baseline(spec, baseline, read_json_file(baseline, fix));
  return spec;
}

}  // namespace hisparse
