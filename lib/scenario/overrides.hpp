// `--set key=value` overrides applied to a scenario document before validation.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace hisparse {

/// Every key a scenario may contain, as dotted paths ("top_k", "workload.seed", "sweep.mode").
[[nodiscard]] const std::vector<std::string>& scenario_key_paths();

/// Applies one "key=value" override to `root` (a mapping, or null for an empty document). The value
/// is parsed as YAML, so `sweep.concurrency=[1,2,4]` sets a list. Records the dotted key and the
/// argument in `applied` (so that later errors on that key name the --set argument).
/// Throws Error("--set <arg>", ...) for a malformed argument, an unknown key or a value that is not
/// YAML.
void apply_override(YAML::Node& root, const std::string& argument,
                    std::map<std::string, std::string>& applied);

}  // namespace hisparse
