// Tolerant lookups into results.json documents: older or partial files may lack any key, and
// every reader (tables, HTML report, compare, loading) treats a missing key as null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

namespace hisparse::json_lookup {

/// j[key] when j is an object that has key, else a null value.
[[nodiscard]] inline const nlohmann::json& at(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null_value;
  return j.is_object() && j.contains(key) ? j.at(key) : null_value;
}

/// j as a double when it is a number, else `fallback` (a partial or hand-edited file).
[[nodiscard]] inline double number(const nlohmann::json& j,
                                   double fallback = std::numeric_limits<double>::quiet_NaN()) {
  return j.is_number() ? j.get<double>() : fallback;
}

/// j as a position when it is a non-negative integer, else SIZE_MAX (no valid position).
[[nodiscard]] inline std::size_t index(const nlohmann::json& j) {
  return j.is_number_unsigned() ? j.get<std::size_t>() : SIZE_MAX;
}

}  // namespace hisparse::json_lookup
