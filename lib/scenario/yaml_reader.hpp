// YamlReader: typed values out of a YAML document, each error naming where the value was written
// ("file:line:column: key", or the --set argument that replaced it) and what would fix it. Shared
// by the scenario loader and the gate file loader so that both speak the same way.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace hisparse {

class YamlReader {
 public:
  /// `file` names the document in messages; `applied` maps a key path to the --set argument
  /// that replaced it (such keys are named by their argument instead of a position).
  explicit YamlReader(std::string file, std::map<std::string, std::string> applied = {})
      : file_(std::move(file)), applied_(std::move(applied)) {}

  /// "file:line:column: key", or "--set k=v: key" when the key (or its section) was overridden.
  [[nodiscard]] std::string where(const std::string& key, const YAML::Node& node) const;
  [[nodiscard]] std::string where_mark(const std::string& key, const YAML::Mark& m) const;
  [[nodiscard]] const std::string& file() const { return file_; }

  /// The scalar text of `n`; throws Error when it is missing or not a scalar.
  [[nodiscard]] std::string scalar(const YAML::Node& n, const std::string& key,
                                   const char* expected) const;
  [[nodiscard]] std::string text(const YAML::Node& n, const std::string& key) const;
  [[nodiscard]] std::int64_t integer(const YAML::Node& n, const std::string& key, std::int64_t lo,
                                     std::int64_t hi) const;
  [[nodiscard]] double real(const YAML::Node& n, const std::string& key, double lo,
                            double hi) const;
  [[nodiscard]] bool boolean(const YAML::Node& n, const std::string& key) const;
  /// One of `allowed`; an unknown value names the nearest allowed one.
  [[nodiscard]] std::string choice(const YAML::Node& n, const std::string& key,
                                   const std::vector<std::string>& allowed) const;
  /// Checks that every key of mapping `n` (named `section`, "" for the root) is one of `keys`,
  /// and remembers where each was written (so an empty value is named by its key).
  void known_keys(const YAML::Node& n, const std::string& section,
                  const std::vector<std::string>& keys) const;

 private:
  std::string file_;
  std::map<std::string, std::string> applied_;
  mutable std::map<std::string, YAML::Mark> key_marks_;  ///< where each key was written
};

/// "a, b, c".
[[nodiscard]] std::string join_names(const std::vector<std::string>& names,
                                     const char* separator = ", ");

}  // namespace hisparse
