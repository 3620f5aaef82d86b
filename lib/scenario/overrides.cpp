#include "scenario/overrides.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {

const std::vector<std::string>& scenario_key_paths() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k{"name",
                               "description",
                               "model",
                               "backend",
                               "mode",
                               "concurrency",
                               "context_length",
                               "decode_steps",
                               "warmup_steps",
                               "repetitions",
                               "point_time_limit_s",
                               "quality_metrics",
                               "top_k",
                               "hot_buffer",
                               "budget_bits",
                               "policy",
                               "workload",
                               "sweep",
                               "skip",
                               "outputs",
                               "trace",
                               "fathom",
                               "deployment"};
    for (const char* w :
         {"generator", "seed", "channel_spread_decades", "outlier_channels", "outlier_scale",
          "sink_tokens", "recency_bias", "query_drift", "replay_path"})
      k.push_back(std::string("workload.") + w);
    for (const auto& axis : sweep_axis_names()) k.push_back("sweep." + axis);
    for (const char* o :
         {"outputs.dir", "outputs.formats", "trace.enabled", "trace.steps", "fathom.klt",
          "fathom.rule", "fathom.centre_keys", "fathom.head_budgets",
          "deployment.share_layer_weights", "deployment.gpu_memory_gib", "deployment.gemm_dtype",
          "deployment.overlap_selection", "deployment.cuda_graph"})
      k.emplace_back(o);
    return k;
  }();
  return keys;
}

void apply_override(YAML::Node& root, const std::string& argument,
                    std::map<std::string, std::string>& applied) {
  const std::string where = "--set " + argument;
  const auto eq = argument.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(where, "expected key=value", "write e.g. --set workload.seed=7");
  const std::string key = argument.substr(0, eq);
  const std::string text = argument.substr(eq + 1);
  const auto& known = scenario_key_paths();
  if (std::find(known.begin(), known.end(), key) == known.end()) {
    const std::string near = nearest_name(key, known);
    throw Error(where + ": " + key, "unknown key",
                near.empty() ? "run 'hisparse-bench validate --help' for the scenario keys"
                             : "did you mean '" + near + "'?");
  }
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(where + ": " + key, "the value is not valid YAML (" + e.msg + ")",
                "quote it, e.g. " + key + "='\"text\"'");
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw Error(where, "the scenario is not a mapping", "fix the scenario file");
  const auto dot = key.find('.');
  if (dot == std::string::npos) {
    root[key] = value;
  } else {
    const std::string section = key.substr(0, dot);
    const std::string child = key.substr(dot + 1);
    if (!root[section] || root[section].IsNull()) root[section] = YAML::Node(YAML::NodeType::Map);
    if (!root[section].IsMap())
      throw Error(where + ": " + key, "'" + section + "' in the scenario is not a mapping",
                  "make '" + section + "' a mapping of keys, or set it whole");
    root[section][child] = value;
  }
  applied[key] = argument;
}

}  // namespace hisparse
