#include "scenario/scenario.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/error.hpp"
#include "fathom/selector.hpp"
#include "kernels/fathom/fathom_math.hpp"
#include "model/capacity_model.hpp"
#include "model/mode.hpp"
#include "scenario/overrides.hpp"
#include "scenario/yaml_reader.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace {

constexpr int kMaxHotBuffer = 32768;
const std::vector<std::string> kFormats{"json", "csv", "md", "html"};
const std::vector<std::string> kBackends{"auto", "cuda", "cpu"};
const std::vector<std::string> kGenerators{"synthetic", "replay"};

bool is_fathom(Mode m) {
  return m == Mode::fathom || m == Mode::hisparse_fathom;
}
bool is_hisparse(Mode m) {
  return m == Mode::hisparse || m == Mode::hisparse_fathom;
}

/// The per-head budgets `quality --calibrated-budgets N --json` wrote for one rule and basis:
/// the split that reached the target (calibrated_head_budgets[key]) and, where the file has
/// them, the splits at each mean budget (calibrated_head_budgets_by_budget[key]).
struct CalibratedBudgets {
  std::vector<int> table;
  std::map<int, std::vector<int>> by_budget;
};

/// Reads them; every error names `where` and the file.
CalibratedBudgets read_calibrated_budgets(const std::filesystem::path& path, const std::string& key,
                                          const std::string& where) {
  const std::string fix =
      "write it with 'hisparse-bench quality --calibrated-budgets N --json > FILE' (add the "
      "scenario's --rule, and --klt for a KLT basis), or list the budgets inline";
  std::ifstream in(path);
  if (!in) throw Error(where, fmt::format("cannot read '{}'", path.string()), fix);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where, fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()), fix);
  }
  const auto table = j.find("calibrated_head_budgets");
  if (!j.is_object() || table == j.end() || !table->is_object())
    throw Error(where, fmt::format("'{}' has no calibrated_head_budgets", path.string()), fix);
  const auto row = table->find(key);
  if (row == table->end()) {
    std::vector<std::string> keys;
    for (auto it = table->begin(); it != table->end(); ++it) keys.push_back(it.key());
    throw Error(where,
                fmt::format("'{}' has no calibrated budgets for '{}' (it has: {})", path.string(),
                            key, keys.empty() ? "none" : join_names(keys)),
                "set fathom.rule and fathom.klt to the study's, or run the study with them");
  }
  if (row->is_null())
    throw Error(where,
                fmt::format("'{}': the calibrated split for '{}' never reached the 32-channel "
                            "scan's error, so the study gave no budgets",
                            path.string(), key),
                "run the study with larger budgets (quality --budgets) or more calibration steps");
  // A non-empty list of integers, or an error naming its place in the file.
  const auto budgets = [&](const nlohmann::json& list, const std::string& what) {
    std::vector<int> out;
    if (list.is_array())
      for (const auto& v : list)
        if (v.is_number_integer()) out.push_back(v.get<int>());
    if (out.empty() || out.size() != list.size())
      throw Error(where,
                  fmt::format("'{}': {} is not a non-empty list of integers", path.string(), what),
                  fix);
    return out;
  };
  CalibratedBudgets out;
  out.table = budgets(*row, "calibrated_head_budgets." + key);
  const auto splits = j.find("calibrated_head_budgets_by_budget");
  if (splits == j.end() || !splits->is_object()) return out;  // a file from before the splits
  const auto by = splits->find(key);
  if (by == splits->end() || by->is_null()) return out;
  if (!by->is_object())
    throw Error(where,
                fmt::format("'{}': calibrated_head_budgets_by_budget.{} is not an object",
                            path.string(), key),
                fix);
  for (auto it = by->begin(); it != by->end(); ++it) {
    const std::string what = fmt::format("calibrated_head_budgets_by_budget.{}.{}", key, it.key());
    int mean = 0;
    const auto [end, ec] =
        std::from_chars(it.key().data(), it.key().data() + it.key().size(), mean);
    if (ec != std::errc() || end != it.key().data() + it.key().size() || mean < 0)
      throw Error(where, fmt::format("'{}': {} is not keyed by a budget", path.string(), what),
                  fix);
    out.by_budget[mean] = budgets(*it, what);
  }
  return out;
}

struct AxisRule {
  const char* name;
  bool numeric;
  std::int64_t lo;
  std::int64_t hi;
};

const std::vector<AxisRule>& axis_rules() {
  static const std::vector<AxisRule> rules{
      {"model", false, 0, 0},
      {"mode", false, 0, 0},
      {"context_length", true, 1, std::int64_t{1} << 40},
      {"top_k", true, 0, INT32_MAX},
      {"hot_buffer", true, 0, kMaxHotBuffer},
      {"budget_bits", true, 0, INT32_MAX},
      {"policy", false, 0, 0},
      {"concurrency", true, 1, INT32_MAX},
  };
  return rules;
}

const AxisRule& rule_of(const std::string& axis) {
  for (const auto& r : axis_rules())
    if (axis == r.name) return r;
  throw std::logic_error("unknown axis " + axis);
}

AxisValue default_value(const std::string& file, const std::string& axis) {
  AxisValue v;
  v.where = file + ": " + axis;
  if (axis == "mode")
    v.text = "dense";
  else if (axis == "policy")
    v.text = "lru";
  else if (axis == "concurrency")
    v.number = 1;
  else if (axis == "context_length")
    v.number = 4096;
  else if (axis == "budget_bits")
    v.number = 48;
  if (rule_of(axis).numeric) v.text = std::to_string(v.number);
  return v;
}

class ScenarioParser {
 public:
  ScenarioParser(const YamlReader& reader, std::filesystem::path base_dir)
      : r_(reader), base_dir_(std::move(base_dir)) {}

  Scenario parse(const YAML::Node& root) {
    Scenario s;
    if (!root || root.IsNull())
      throw Error(r_.file() + ":1:1: name", "the scenario is empty",
                  "write at least 'name:' and 'model:' (see scenarios/quick.yaml)");
    if (!root.IsMap())
      throw Error(r_.where("scenario", root), "expected a mapping of keys",
                  "write 'key: value' lines (see scenarios/quick.yaml)");
    std::vector<std::string> top;
    for (const auto& k : scenario_key_paths())
      if (k.find('.') == std::string::npos) top.push_back(k);
    r_.known_keys(root, "", top);

    if (!root["name"])
      throw Error(r_.file() + ":1:1: name", "missing required key", "add 'name: <identifier>'");
    s.name = r_.text(root["name"], "name");
    if (s.name.empty() || !std::all_of(s.name.begin(), s.name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        }))
      throw Error(r_.where("name", root["name"]), fmt::format("'{}' is not an identifier", s.name),
                  "use letters, digits, '.', '_' and '-' only");
    if (root["description"]) s.description = r_.text(root["description"], "description");
    if (root["backend"]) s.backend = r_.choice(root["backend"], "backend", kBackends);
    if (root["decode_steps"])
      s.decode_steps =
          static_cast<int>(r_.integer(root["decode_steps"], "decode_steps", 1, 1000000));
    if (root["warmup_steps"])
      s.warmup_steps =
          static_cast<int>(r_.integer(root["warmup_steps"], "warmup_steps", 0, 1000000));
    if (root["repetitions"])
      s.repetitions = static_cast<int>(r_.integer(root["repetitions"], "repetitions", 1, 1000));
    if (root["point_time_limit_s"])
      s.point_time_limit_s = r_.real(root["point_time_limit_s"], "point_time_limit_s", 0, 1e7);
    if (root["quality_metrics"])
      s.quality_metrics = r_.boolean(root["quality_metrics"], "quality_metrics");
    if (root["workload"]) s.workload = workload(root["workload"]);
    s.outputs.dir = std::filesystem::path("results") / s.name;
    if (root["outputs"]) outputs(root["outputs"], s.outputs);
    if (root["trace"]) trace(root["trace"], s.trace);
    if (root["fathom"]) fathom(root["fathom"], s.fathom);
    if (root["deployment"]) deployment(root["deployment"], s.deployment);

    // Sweepable keys: the scalar first, then the sweep list replaces it.
    for (const auto& rule : axis_rules()) {
      const std::string axis = rule.name;
      if (root[axis])
        s.values[axis] = {axis_value(root[axis], axis, axis)};
      else if (axis != "model")
        s.values[axis] = {default_value(r_.file(), axis)};
    }
    if (root["sweep"]) sweep(root["sweep"], s);
    if (!s.values.count("model"))
      throw Error(r_.file() + ":1:1: model", "missing required key",
                  "add 'model: <preset or path>' (hisparse-bench list models) or sweep.model");
    for (const auto& rule : axis_rules())
      if (std::find(s.swept.begin(), s.swept.end(), rule.name) != s.swept.end())
        ordered_swept_.push_back(rule.name);
    s.swept = ordered_swept_;
    if (root["skip"]) skip(root["skip"], s);

    const std::vector<AxisValue> model_values = s.values.at("model");
    for (const auto& m : model_values) s.models.emplace(m.text, load(m));
    if (s.workload.generator == "replay" && s.workload.replay_path.empty())
      throw Error(r_.where("workload.generator", root["workload"]["generator"]),
                  "generator 'replay' needs workload.replay_path",
                  "set workload.replay_path to captured q/k tensors, or use generator 'synthetic'");
    return s;
  }

 private:
  AxisValue axis_value(const YAML::Node& n, const std::string& axis, const std::string& key) {
    const AxisRule& rule = rule_of(axis);
    AxisValue v;
    v.where = r_.where(key, n);
    if (rule.numeric) {
      v.number = r_.integer(n, key, rule.lo, rule.hi);
      v.text = std::to_string(v.number);
    } else if (axis == "mode") {
      v.text = r_.choice(n, key, mode_names());
    } else if (axis == "policy") {
      v.text = r_.choice(n, key, policy_names());
    } else {
      v.text = r_.text(n, key);
    }
    return v;
  }

  void sweep(const YAML::Node& n, Scenario& s) {
    if (!n.IsMap())
      throw Error(r_.where("sweep", n), "expected a mapping of axes to lists",
                  "write e.g. 'sweep: {concurrency: [1, 4]}'");
    r_.known_keys(n, "sweep", sweep_axis_names());
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string axis = it->first.Scalar();
      const std::string key = "sweep." + axis;
      const YAML::Node list = it->second;
      if (!list.IsSequence())
        throw Error(r_.where(key, list), "expected a list of values",
                    fmt::format("write e.g. '{}: [a, b]'", axis));
      if (list.size() == 0)
        throw Error(r_.where(key, list), "empty sweep (no values)",
                    "list at least one value, or remove the axis");
      std::vector<AxisValue> values;
      for (const auto& item : list) {
        AxisValue v = axis_value(item, axis, key);
        for (const auto& seen : values)
          if (seen.text == v.text)
            throw Error(v.where, fmt::format("value '{}' is listed twice", v.text),
                        "list each value once");
        values.push_back(std::move(v));
      }
      s.values[axis] = std::move(values);
      s.swept.push_back(axis);
    }
  }

  // skip: a list of mappings, each from swept axes to one of their listed values.
  void skip(const YAML::Node& n, Scenario& s) {
    if (!n.IsSequence())
      throw Error(r_.where("skip", n), "expected a list of combinations to leave out",
                  "write e.g. 'skip: [{model: tiny-dsa, mode: fathom}]'");
    for (std::size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      const std::string key = fmt::format("skip[{}]", i);
      if (!item.IsMap() || item.size() == 0)
        throw Error(r_.where(key, item), "expected a mapping of swept axes to one value each",
                    "write e.g. '{model: tiny-dsa, mode: fathom}'");
      SkipRule rule;
      for (auto it = item.begin(); it != item.end(); ++it) {
        const std::string axis = it->first.Scalar();
        const std::string item_key = key + "." + axis;
        if (std::find(s.swept.begin(), s.swept.end(), axis) == s.swept.end())
          throw Error(r_.where(item_key, it->second), fmt::format("'{}' is not swept", axis),
                      s.swept.empty()
                          ? std::string("skip needs a sweep; remove it or add one")
                          : fmt::format("name swept axes only ({})", join_names(s.swept)));
        const AxisValue v = axis_value(it->second, axis, item_key);
        std::vector<std::string> listed;
        for (const auto& value : s.values.at(axis)) listed.push_back(value.text);
        if (std::find(listed.begin(), listed.end(), v.text) == listed.end())
          throw Error(v.where, fmt::format("{} '{}' is not in sweep.{}", axis, v.text, axis),
                      fmt::format("use one of: {}", join_names(listed)));
        rule.values.emplace_back(axis, v.text);
      }
      s.skip.push_back(std::move(rule));
    }
    if (s.point_count() == 0)
      throw Error(r_.where("skip", n), "every combination of the sweep is skipped",
                  "remove a skip entry or sweep more values");
  }

  WorkloadSpec workload(const YAML::Node& n) {
    if (!n.IsMap())
      throw Error(r_.where("workload", n), "expected a mapping",
                  "write e.g. 'workload: {seed: 7}'");
    std::vector<std::string> keys;
    for (const auto& k : scenario_key_paths())
      if (k.rfind("workload.", 0) == 0) keys.push_back(k.substr(9));
    r_.known_keys(n, "workload", keys);
    WorkloadSpec w;
    if (n["generator"]) w.generator = r_.choice(n["generator"], "workload.generator", kGenerators);
    if (n["seed"])
      w.seed = static_cast<std::uint64_t>(r_.integer(n["seed"], "workload.seed", 0, INT64_MAX));
    if (n["channel_spread_decades"])
      w.channel_spread_decades =
          r_.real(n["channel_spread_decades"], "workload.channel_spread_decades", 0.0, 12.0);
    if (n["outlier_channels"])
      w.outlier_channels =
          static_cast<int>(r_.integer(n["outlier_channels"], "workload.outlier_channels", 0, 4096));
    if (n["outlier_scale"])
      w.outlier_scale = r_.real(n["outlier_scale"], "workload.outlier_scale", 1e-6, 1e6);
    if (n["sink_tokens"])
      w.sink_tokens =
          static_cast<int>(r_.integer(n["sink_tokens"], "workload.sink_tokens", 0, 1 << 20));
    if (n["recency_bias"])
      w.recency_bias = r_.real(n["recency_bias"], "workload.recency_bias", 0, 1);
    if (n["query_drift"]) w.query_drift = r_.real(n["query_drift"], "workload.query_drift", 0, 1);
    if (n["replay_path"]) {
      w.replay_path = r_.text(n["replay_path"], "workload.replay_path");
      std::filesystem::path p = w.replay_path;
      if (p.is_relative() && !base_dir_.empty() && std::filesystem::exists(base_dir_ / p))
        w.replay_path = (base_dir_ / p).string();
    }
    return w;
  }

  void outputs(const YAML::Node& n, OutputSpec& o) {
    if (!n.IsMap())
      throw Error(r_.where("outputs", n), "expected a mapping",
                  "write e.g. 'outputs: {dir: results/x, formats: [json]}'");
    r_.known_keys(n, "outputs", {"dir", "formats"});
    if (n["dir"]) o.dir = r_.text(n["dir"], "outputs.dir");
    if (n["formats"]) {
      const YAML::Node f = n["formats"];
      if (!f.IsSequence())
        throw Error(r_.where("outputs.formats", f), "expected a list",
                    "write e.g. [json, csv, md]");
      if (f.size() == 0)
        throw Error(r_.where("outputs.formats", f), "no output format",
                    "list at least one of json, csv, md, html");
      o.formats.clear();
      for (const auto& item : f) o.formats.push_back(r_.choice(item, "outputs.formats", kFormats));
    }
  }

  void trace(const YAML::Node& n, TraceSpec& t) {
    if (!n.IsMap())
      throw Error(r_.where("trace", n), "expected a mapping",
                  "write e.g. 'trace: {enabled: true}'");
    r_.known_keys(n, "trace", {"enabled", "steps"});
    if (n["enabled"]) t.enabled = r_.boolean(n["enabled"], "trace.enabled");
    if (n["steps"]) t.steps = static_cast<int>(r_.integer(n["steps"], "trace.steps", 1, 1000000));
  }

  void deployment(const YAML::Node& n, DeploymentSpec& d) {
    if (!n.IsMap())
      throw Error(r_.where("deployment", n), "expected a mapping",
                  "write e.g. 'deployment: {share_layer_weights: true, gpu_memory_gib: 141}'");
    r_.known_keys(
        n, "deployment",
        {"share_layer_weights", "gpu_memory_gib", "gemm_dtype", "overlap_selection", "cuda_graph"});
    if (n["overlap_selection"])
      d.overlap_selection = r_.boolean(n["overlap_selection"], "deployment.overlap_selection");
    if (n["cuda_graph"]) d.cuda_graph = r_.boolean(n["cuda_graph"], "deployment.cuda_graph");
    if (n["gemm_dtype"])
      d.gemm_dtype = r_.choice(n["gemm_dtype"], "deployment.gemm_dtype", {"fp32", "bf16"});
    if (n["share_layer_weights"])
      d.share_layer_weights =
          r_.boolean(n["share_layer_weights"], "deployment.share_layer_weights");
    if (n["gpu_memory_gib"])
      d.gpu_memory_gib = r_.real(n["gpu_memory_gib"], "deployment.gpu_memory_gib", 0, 1e6);
  }

  void fathom(const YAML::Node& n, FathomSpec& f) {
    if (!n.IsMap())
      throw Error(r_.where("fathom", n), "expected a mapping", "write e.g. 'fathom: {klt: true}'");
    r_.known_keys(n, "fathom", {"klt", "rule", "centre_keys", "head_budgets"});
    if (n["klt"]) f.klt = r_.boolean(n["klt"], "fathom.klt");
    if (n["centre_keys"]) f.centre_keys = r_.boolean(n["centre_keys"], "fathom.centre_keys");
    if (n["rule"])
      f.rule = r_.choice(n["rule"], "fathom.rule", {"paper", "measured"}) == "measured"
                   ? fathom::PlanRule::measured
                   : fathom::PlanRule::paper;
    if (n["head_budgets"]) head_budgets(n["head_budgets"], f);  // after rule and klt: its key
  }

  // fathom.head_budgets: a list of budgets, or the quality JSON holding them.
  void head_budgets(const YAML::Node& n, FathomSpec& f) {
    const std::string key = "fathom.head_budgets";
    f.head_budgets_where = r_.where(key, n);
    constexpr std::int64_t kMaxBudget = kernels::fathom::kPlanes * kernels::fathom::kMaxChannels;
    if (n.IsSequence()) {
      if (n.size() == 0)
        throw Error(f.head_budgets_where, "the list of per-head budgets is empty",
                    "list one budget per (layer, KV head), or leave the key out");
      for (const auto& item : n)
        f.head_budgets.push_back(static_cast<int>(r_.integer(item, key, 0, kMaxBudget)));
      f.head_budgets_source = "inline";
      return;
    }
    std::filesystem::path path = r_.scalar(n, key, "a list of budgets or a quality JSON file");
    if (path.is_relative() && !base_dir_.empty()) path = base_dir_ / path;
    const std::string json_key =
        std::string(fathom::plan_rule_name(f.rule)) + (f.klt ? "_klt" : "");
    auto read = read_calibrated_budgets(path, json_key, f.head_budgets_where);
    f.head_budgets = std::move(read.table);
    f.head_budgets_by_budget = std::move(read.by_budget);
    const auto check = [&](const std::vector<int>& table) {
      for (const int b : table)
        if (b < 0 || b > kMaxBudget)
          throw Error(f.head_budgets_where,
                      fmt::format("{}: budget {} is outside 0..{}", path.string(), b, kMaxBudget),
                      "write the file again with hisparse-bench quality --calibrated-budgets N");
      if (table.size() != f.head_budgets.size())
        throw Error(f.head_budgets_where,
                    fmt::format("{}: the splits by budget have {} heads, the split at the "
                                "target {}",
                                path.string(), table.size(), f.head_budgets.size()),
                    "write the file again with hisparse-bench quality --calibrated-budgets N");
    };
    check(f.head_budgets);
    for (const auto& [mean, table] : f.head_budgets_by_budget) check(table);
    f.head_budgets_source = fmt::format("{} ({})", path.string(), json_key);
  }

  ModelSpec load(const AxisValue& v) { return load_model_named(v.text, v.where, base_dir_); }

  const YamlReader& r_;
  std::filesystem::path base_dir_;
  std::vector<std::string> ordered_swept_;
};

int default_top_k(const ModelSpec& m) {
  return m.has_indexer() && m.indexer.top_k > 0 ? m.indexer.top_k : 2048;
}

// Calls f(value) for each combination of the cartesian product that `skip` keeps, in sweep order;
// value(axis) is the combination's AxisValue of that axis.
template <class F>
void for_each_kept_combination(const Scenario& s, F&& f) {
  const auto& axes = sweep_axis_names();
  std::size_t total = 1;
  for (const auto& axis : axes) total *= s.values.at(axis).size();
  std::vector<std::size_t> pick(axes.size(), 0);
  const auto value = [&](const std::string& axis) -> const AxisValue& {
    const auto i =
        static_cast<std::size_t>(std::find(axes.begin(), axes.end(), axis) - axes.begin());
    return s.values.at(axis)[pick[i]];
  };
  for (std::size_t n = 0; n < total; ++n) {
    // Mixed-radix counter over the axes, the last axis (concurrency) fastest.
    std::size_t rest = n;
    for (std::size_t a = axes.size(); a-- > 0;) {
      const std::size_t count = s.values.at(axes[a]).size();
      pick[a] = rest % count;
      rest /= count;
    }
    const bool skipped = std::any_of(s.skip.begin(), s.skip.end(), [&](const SkipRule& rule) {
      return std::all_of(rule.values.begin(), rule.values.end(),
                         [&](const auto& av) { return value(av.first).text == av.second; });
    });
    if (!skipped) f(value);
  }
}

/// Builds every point; with `check`, applies the rules that involve several keys or the model.
std::vector<SweepPoint> build_points(const Scenario& s, bool check) {
  std::vector<SweepPoint> points;
  points.reserve(s.point_count());
  for_each_kept_combination(s, [&](const auto& value) {
    SweepPoint p;
    p.index = points.size();
    for (const auto& axis : s.swept) p.axes.emplace_back(axis, value(axis).text);
    p.model = value("model").text;
    const ModelSpec& model = s.models.at(p.model);
    EngineConfig& c = p.config;
    c.mode = parse_mode(value("mode").text, value("mode").where);
    c.concurrency = static_cast<int>(value("concurrency").number);
    c.context_length = value("context_length").number;
    c.top_k = static_cast<int>(value("top_k").number);
    c.hot_buffer = static_cast<int>(value("hot_buffer").number);
    c.budget_bits = static_cast<int>(value("budget_bits").number);
    c.policy = value("policy").text;
    c.fathom_klt = s.fathom.klt;
    c.fathom_rule = s.fathom.rule;
    c.fathom_centre_keys = s.fathom.centre_keys;
    // The split calibrated at this point's budget where the study wrote one, else shares of the
    // split that reached the target.
    const auto at_budget = s.fathom.head_budgets_by_budget.find(c.budget_bits);
    c.fathom_head_budgets = at_budget != s.fathom.head_budgets_by_budget.end()
                                ? at_budget->second
                                : s.fathom.head_budgets;
    c.workload = s.workload;
    c.share_layer_weights = s.deployment.share_layer_weights;
    c.bf16_gemm = s.deployment.gemm_dtype == "bf16";
    c.overlap_selection = s.deployment.overlap_selection;
    c.cuda_graph = s.deployment.cuda_graph;
    c.quality_metrics = s.quality_metrics;
    const bool top_k_given = c.top_k != 0;
    if (!top_k_given) c.top_k = default_top_k(model);
    const bool hot_given = c.hot_buffer != 0;
    if (!hot_given) c.hot_buffer = 2 * c.top_k;
    if (check) {
      const std::string mode(name_of(c.mode));
      const auto swept = [&](const char* axis) {
        return std::find(s.swept.begin(), s.swept.end(), axis) != s.swept.end();
      };
      if (is_fathom(c.mode) && model.is_mla())
        throw Error(
            value("mode").where,
            fmt::format("mode '{}' needs a GQA model, but '{}' uses MLA", mode, p.model),
            swept("model") && swept("mode")
                ? fmt::format("leave the pair out with 'skip: [{{model: {}, mode: {}}}]'", p.model,
                              mode)
                : std::string("use dense, sparse-gpu or hisparse with this model, or a GQA model"));
      std::string why;
      if (!mode_supported(model, c.mode, &why))
        throw Error(value("mode").where, why,
                    fmt::format("use a mode that '{}' supports (hisparse-bench plan --model {})",
                                p.model, p.model));
      if (c.mode != Mode::dense && c.top_k > c.context_length)
        throw Error(
            top_k_given ? value("top_k").where : value("context_length").where,
            fmt::format("top_k {} is larger than context_length {}", c.top_k, c.context_length),
            fmt::format("use top_k <= {} or a longer context", c.context_length));
      if (is_hisparse(c.mode) && c.hot_buffer < c.top_k)
        throw Error(value("hot_buffer").where,
                    fmt::format("hot_buffer {} is smaller than top_k {}", c.hot_buffer, c.top_k),
                    fmt::format("use hot_buffer >= {} (0 means 2 * top_k)", c.top_k));
      if (is_hisparse(c.mode) && c.hot_buffer > kMaxHotBuffer)
        throw Error(
            hot_given ? value("hot_buffer").where : value("top_k").where,
            fmt::format("hot_buffer {} exceeds the {}-slot limit", c.hot_buffer, kMaxHotBuffer),
            fmt::format("use at most {} slots (top_k <= {} with the default hot_buffer)",
                        kMaxHotBuffer, kMaxHotBuffer / 2));
      if (is_fathom(c.mode)) {
        // The selector always keeps its sinks and recent window; top_k must leave room beyond.
        const fathom::SelectorConfig selector;
        const int fixed = selector.sinks + selector.recent;
        if (c.top_k <= fixed)
          throw Error(top_k_given ? value("top_k").where : value("mode").where,
                      fmt::format("top_k {} leaves no room beyond the {} sinks and {} recent "
                                  "tokens that mode '{}' always selects",
                                  c.top_k, selector.sinks, selector.recent, mode),
                      fmt::format("use top_k > {}", fixed));
        // hisparse+fathom swaps each selection into the hot buffer: it must hold the largest.
        fathom::SelectorConfig sized = selector;
        sized.top_k = c.top_k;
        const int rows = sized.max_rows(model.gqa.q_heads / model.gqa.kv_heads);
        if (c.mode == Mode::hisparse_fathom && c.hot_buffer < rows)
          throw Error(hot_given ? value("hot_buffer").where : value("top_k").where,
                      fmt::format("hot_buffer {} cannot hold one Fathom selection of up to {} rows "
                                  "({} sinks + {} recent + {} query heads x (top_k {} - {}))",
                                  c.hot_buffer, rows, selector.sinks, selector.recent,
                                  model.gqa.q_heads / model.gqa.kv_heads, c.top_k, fixed),
                      fmt::format("use hot_buffer >= {}", rows));
        const int max_bits = 4 * model.gqa.head_dim;
        if (c.budget_bits > max_bits)
          throw Error(value("budget_bits").where,
                      fmt::format("budget_bits {} is above 4 * head_dim = {} of '{}'",
                                  c.budget_bits, max_bits, p.model),
                      fmt::format("use a budget from 0 to {}", max_bits));
        if (!c.fathom_head_budgets.empty()) {
          const auto kv = static_cast<std::size_t>(model.gqa.kv_heads);
          if (c.fathom_head_budgets.size() % kv != 0)
            throw Error(s.fathom.head_budgets_where,
                        fmt::format("{} per-head budgets, but '{}' has {} KV heads per layer",
                                    c.fathom_head_budgets.size(), p.model, kv),
                        fmt::format("give a multiple of {} budgets (one per KV head, layer by "
                                    "layer; rows are reused for deeper layers)",
                                    kv));
          if (c.fathom_head_budgets.size() / kv > static_cast<std::size_t>(model.layers))
            throw Error(s.fathom.head_budgets_where,
                        fmt::format("{} rows of per-head budgets, but '{}' has {} layers",
                                    c.fathom_head_budgets.size() / kv, p.model, model.layers),
                        "give at most one row of KV-head budgets per layer");
        }
      }
    }
    points.push_back(std::move(p));
  });
  return points;
}

Scenario parse_document(const std::string& text, const std::string& label,
                        const std::vector<std::string>& overrides,
                        const std::filesystem::path& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw Error(fmt::format("{}:{}:{}", label, e.mark.line + 1, e.mark.column + 1),
                "YAML syntax error: " + e.msg, "fix the YAML syntax at that position");
  }
  std::map<std::string, std::string> applied;
  for (const auto& o : overrides) apply_override(root, o, applied);
  YamlReader reader(label, applied);
  ScenarioParser parser(reader, base_dir);
  Scenario s = parser.parse(root);
  s.source = label;
  (void)build_points(s, true);
  return s;
}

}  // namespace

const std::vector<std::string>& sweep_axis_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& r : axis_rules()) v.emplace_back(r.name);
    return v;
  }();
  return names;
}

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> v{"lru", "fifo", "random", "belady"};
  return v;
}

const std::vector<std::string>& mode_names() {
  static const std::vector<std::string> v{"dense", "sparse-gpu", "hisparse", "fathom",
                                          "hisparse+fathom"};
  return v;
}

std::size_t Scenario::point_count() const {
  std::size_t n = 0;
  for_each_kept_combination(*this, [&](const auto&) { ++n; });
  return n;
}

std::size_t Scenario::skipped_count() const {
  std::size_t product = 1;
  for (const auto& [axis, v] : values) product *= v.size();
  return product - point_count();
}

std::vector<SweepPoint> Scenario::expand() const {
  return build_points(*this, false);
}

nlohmann::json Scenario::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  j["description"] = description;
  j["source"] = source.string();
  j["backend"] = backend;
  j["decode_steps"] = decode_steps;
  j["warmup_steps"] = warmup_steps;
  j["repetitions"] = repetitions;
  j["point_time_limit_s"] = point_time_limit_s;
  for (const auto& axis : sweep_axis_names()) {
    const auto& v = values.at(axis);
    const bool swept_axis = std::find(swept.begin(), swept.end(), axis) != swept.end();
    auto as_json = [&](const AxisValue& a) {
      return rule_of(axis).numeric ? nlohmann::json(a.number) : nlohmann::json(a.text);
    };
    if (swept_axis) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& a : v) list.push_back(as_json(a));
      j["sweep"][axis] = list;
    } else {
      j[axis] = as_json(v.front());
    }
  }
  if (!j.contains("sweep")) j["sweep"] = nlohmann::json::object();
  if (!skip.empty()) {
    j["skip"] = nlohmann::json::array();
    for (const auto& rule : skip) {
      nlohmann::json entry = nlohmann::json::object();
      for (const auto& [axis, text] : rule.values)
        entry[axis] =
            rule_of(axis).numeric ? nlohmann::json(std::stoll(text)) : nlohmann::json(text);
      j["skip"].push_back(entry);
    }
  }
  j["workload"] = {{"generator", workload.generator},
                   {"seed", workload.seed},
                   {"channel_spread_decades", workload.channel_spread_decades},
                   {"outlier_channels", workload.outlier_channels},
                   {"outlier_scale", workload.outlier_scale},
                   {"sink_tokens", workload.sink_tokens},
                   {"recency_bias", workload.recency_bias},
                   {"query_drift", workload.query_drift},
                   {"replay_path", workload.replay_path}};
  j["outputs"] = {{"dir", outputs.dir.string()}, {"formats", outputs.formats}};
  j["trace"] = {{"enabled", trace.enabled}, {"steps", trace.steps}};
  // Only when not the default: results recorded before the keys existed compare equal (the gate).
  if (!quality_metrics) j["quality_metrics"] = false;
  if (deployment.share_layer_weights || deployment.gpu_memory_gib > 0 ||
      deployment.gemm_dtype != "fp32" || !deployment.overlap_selection || !deployment.cuda_graph) {
    j["deployment"] = {{"share_layer_weights", deployment.share_layer_weights},
                       {"gpu_memory_gib", deployment.gpu_memory_gib},
                       {"gemm_dtype", deployment.gemm_dtype}};
    if (!deployment.overlap_selection) j["deployment"]["overlap_selection"] = false;
    if (!deployment.cuda_graph) j["deployment"]["cuda_graph"] = false;
  }
  j["fathom"] = {
      {"klt", fathom.klt},
      {"rule", fathom::plan_rule_name(fathom.rule)},
      {"centre_keys", fathom.centre_keys},
      {"head_budgets",
       fathom.head_budgets.empty() ? nlohmann::json(nullptr) : nlohmann::json(fathom.head_budgets)},
      {"head_budgets_source", fathom.head_budgets_source}};
  if (!fathom.head_budgets_by_budget.empty()) {
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [mean, table] : fathom.head_budgets_by_budget)
      by[std::to_string(mean)] = table;
    j["fathom"]["head_budgets_by_budget"] = std::move(by);
  }
  return j;
}

Scenario parse_scenario(const std::string& yaml_text, const std::string& label,
                        const std::vector<std::string>& overrides,
                        const std::filesystem::path& base_dir) {
  HISPARSE_FUNC_RANGE();
  return parse_document(yaml_text, label, overrides, base_dir);
}

bool scenario_requests_trace(const std::filesystem::path& file,
                             const std::vector<std::string>& overrides) {
  try {
    std::ifstream in(file);
    if (!in) return false;
    std::stringstream text;
    text << in.rdbuf();
    YAML::Node root = YAML::Load(text.str());
    std::map<std::string, std::string> applied;
    for (const auto& o : overrides) apply_override(root, o, applied);
    const YAML::Node enabled = root.IsMap() && root["trace"] && root["trace"].IsMap()
                                   ? root["trace"]["enabled"]
                                   : YAML::Node();
    return enabled && enabled.IsScalar() && enabled.as<bool>();
  } catch (const std::exception&) {
    return false;  // load_scenario names the problem
  }
}

Scenario load_scenario(const std::filesystem::path& file,
                       const std::vector<std::string>& overrides) {
  HISPARSE_FUNC_RANGE();
  std::ifstream in(file);
  if (!in || std::filesystem::is_directory(file))
    throw Error(file.string(), "cannot read the scenario file",
                "check the path (hisparse-bench list scenarios)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_document(text.str(), file.string(), overrides, file.parent_path());
}

}  // namespace hisparse
