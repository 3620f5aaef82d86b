// Tolerant lookups into results.json documents: older or partial files may lack any key, and
// every reader (tables, HTML report, compare, loading) treats a missing key as null.
#pragma once

#include <nlohmann/json.hpp>

namespace hisparse::json_lookup {

/// j[key] when j is an object that has key, else a null value.
[[nodiscard]] inline const nlohmann::json& at(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null_value;
  return j.is_object() && j.contains(key) ? j.at(key) : null_value;
}

}  // namespace hisparse::json_lookup
