// Finding scenario and model files by name or path, and the nearest name for a "did you mean".
#include <algorithm>
#include <climits>
#include <cstdint>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "scenario/scenario.hpp"
#include "scenario/yaml_reader.hpp"

namespace hisparse {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::filesystem::path> scenario_search_dirs() {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  for (const std::filesystem::path& d :
       {std::filesystem::current_path(ec) / "scenarios",
        std::filesystem::path(HISPARSE_SOURCE_DIR) / "scenarios"}) {
    if (!std::filesystem::is_directory(d, ec)) continue;
    const auto canon = std::filesystem::weakly_canonical(d, ec);
    if (std::find(dirs.begin(), dirs.end(), canon) == dirs.end()) dirs.push_back(canon);
  }
  return dirs;
}

std::vector<std::string> list_scenarios() {
  std::set<std::string> names;
  for (const auto& dir : scenario_search_dirs())
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.is_regular_file() && entry.path().extension() == ".yaml")
        names.insert(entry.path().stem().string());
  return {names.begin(), names.end()};
}

std::filesystem::path find_scenario(const std::string& name_or_path, const std::string& where) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return name_or_path;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               name_or_path.ends_with(".yaml") || name_or_path.ends_with(".yml");
  if (!looks_like_path)
    for (const auto& dir : scenario_search_dirs())
      if (std::filesystem::is_regular_file(dir / (name_or_path + ".yaml"), ec))
        return dir / (name_or_path + ".yaml");
  const std::string near = looks_like_path ? "" : nearest_name(name_or_path, list_scenarios());
  throw Error(where, fmt::format("no scenario file '{}'", name_or_path),
              near.empty() ? "give a path to a scenario YAML or a name from 'hisparse-bench list "
                             "scenarios'"
                           : "did you mean '" + near + "'?");
}

ModelSpec load_model_named(const std::string& m, const std::string& where,
                           const std::filesystem::path& base_dir) {
  const bool is_path =
      m.find('/') != std::string::npos || m.ends_with(".yaml") || m.ends_with(".yml");
  if (is_path) {
    std::filesystem::path p = m;
    std::error_code ec;
    if (p.is_relative() && !base_dir.empty() && std::filesystem::exists(base_dir / p, ec))
      p = base_dir / p;
    if (!std::filesystem::exists(p, ec))
      throw Error(where, fmt::format("model file '{}' does not exist", m),
                  "give a path relative to the scenario file, or a preset name (hisparse-bench "
                  "list models)");
    return load_model(p.string());
  }
  const auto presets = list_model_presets();
  if (std::find(presets.begin(), presets.end(), m) == presets.end()) {
    const std::string near = nearest_name(m, presets);
    throw Error(where, fmt::format("unknown model '{}'", m),
                near.empty() ? "use one of " + join_names(presets) + " or a path to a model YAML"
                             : "did you mean '" + near + "'?");
  }
  return load_model(m);
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

}  // namespace hisparse
