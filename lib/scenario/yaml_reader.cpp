#include "scenario/yaml_reader.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {
namespace {

std::string leaf(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string range_fix(std::int64_t lo, std::int64_t hi) {
  if (hi >= INT32_MAX) return fmt::format("use {} or more", lo);
  return fmt::format("use a value from {} to {}", lo, hi);
}

}  // namespace

std::string join_names(const std::vector<std::string>& names, const char* separator) {
  std::string out;
  for (const auto& s : names) out += (out.empty() ? "" : separator) + s;
  return out;
}

std::string YamlReader::where(const std::string& key, const YAML::Node& node) const {
  YAML::Mark mark = YAML::Mark::null_mark();
  try {
    mark = node.Mark();
    // An empty value has the position of whatever follows it: name the key instead.
    if (node.IsNull() && key_marks_.count(key)) mark = key_marks_.at(key);
  } catch (const YAML::Exception&) {
    // A key that is not in the document has no position.
  }
  return where_mark(key, mark);
}

std::string YamlReader::where_mark(const std::string& key, const YAML::Mark& m) const {
  for (const auto& [path, arg] : applied_)
    if (key == path || key.rfind(path + ".", 0) == 0) return "--set " + arg + ": " + key;
  if (m.line >= 0) return fmt::format("{}:{}:{}: {}", file_, m.line + 1, m.column + 1, key);
  return file_ + ": " + key;
}

std::string YamlReader::scalar(const YAML::Node& n, const std::string& key,
                               const char* expected) const {
  if (!n || n.IsNull())
    throw Error(where(key, n), "missing value",
                fmt::format("write {} after '{}:'", expected, leaf(key)));
  if (!n.IsScalar())
    throw Error(where(key, n),
                fmt::format("expected {}, got a {}", expected, n.IsSequence() ? "list" : "mapping"),
                "write a single value");
  // Values end up in results.json, which holds UTF-8 text only: refuse other bytes here, with
  // the JSON writer's own check, rather than when the first point is written.
  try {
    (void)nlohmann::json(n.Scalar()).dump();
  } catch (const nlohmann::json::type_error&) {
    throw Error(where(key, n), "the value is not UTF-8 text", "save the file as UTF-8");
  }
  return n.Scalar();
}

std::string YamlReader::text(const YAML::Node& n, const std::string& key) const {
  return scalar(n, key, "a string");
}

std::int64_t YamlReader::integer(const YAML::Node& n, const std::string& key, std::int64_t lo,
                                 std::int64_t hi) const {
  const std::string s = scalar(n, key, "an integer");
  std::int64_t v = 0;
  const char* first = s.data();
  if (!s.empty() && s[0] == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc{} && ptr == s.data() + s.size() && (v < lo || v > hi)))
    throw Error(where(key, n), fmt::format("{} is out of range", s), range_fix(lo, hi));
  if (ec != std::errc{} || ptr != s.data() + s.size())
    throw Error(where(key, n), fmt::format("expected an integer, got '{}'", s),
                "write a whole number such as " + std::to_string(std::max<std::int64_t>(lo, 1)));
  return v;
}

double YamlReader::real(const YAML::Node& n, const std::string& key, double lo, double hi) const {
  const std::string s = scalar(n, key, "a number");
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || v != v)
    throw Error(where(key, n), fmt::format("expected a number, got '{}'", s),
                "write a number such as 0.5");
  if (v < lo || v > hi)
    throw Error(where(key, n), fmt::format("{} is out of range", s),
                fmt::format("use a value from {} to {}", lo, hi));
  return v;
}

bool YamlReader::boolean(const YAML::Node& n, const std::string& key) const {
  const std::string s = scalar(n, key, "true or false");
  bool v = false;
  if (!YAML::convert<bool>::decode(n, v))
    throw Error(where(key, n), fmt::format("expected true or false, got '{}'", s),
                "write true or false");
  return v;
}

std::string YamlReader::choice(const YAML::Node& n, const std::string& key,
                               const std::vector<std::string>& allowed) const {
  const std::string s = text(n, key);
  if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) return s;
  const std::string near = nearest_name(s, allowed);
  throw Error(where(key, n), fmt::format("unknown value '{}'", s),
              near.empty() ? "use one of " + join_names(allowed) : "did you mean '" + near + "'?");
}

void YamlReader::known_keys(const YAML::Node& n, const std::string& section,
                            const std::vector<std::string>& keys) const {
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = it->first.IsScalar() ? it->first.Scalar() : std::string("?");
    const std::string path = section.empty() ? k : section + "." + k;
    key_marks_[path] = it->first.Mark();
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    const std::string near = nearest_name(k, keys);
    throw Error(where_mark(path, it->first.Mark()), "unknown key",
                near.empty() ? "use one of " + join_names(keys) : "did you mean '" + near + "'?");
  }
}

}  // namespace hisparse
