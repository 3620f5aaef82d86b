// Points of results documents as the gate matches them: by their values of the swept axes (the
// union over the documents compared), read from each point's config.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse::detail {

/// A JSON value as plain text: strings without quotes, null as "".
[[nodiscard]] std::string text_of(const nlohmann::json& v);
/// Every axis any point of `docs` is swept over, in the sweep's expansion order.
[[nodiscard]] std::vector<std::string> swept_axes(const std::vector<const nlohmann::json*>& docs);
/// "mode=hisparse concurrency=4" ("(single point)" without axes).
[[nodiscard]] std::string point_key(const nlohmann::json& point,
                                    const std::vector<std::string>& axes);
/// The config keys outside `axes` whose values differ, e.g. "context_length 128 -> 256".
[[nodiscard]] std::string config_difference(const nlohmann::json& a, const nlohmann::json& b,
                                            const std::vector<std::string>& axes);
/// The value at a dotted path under the point's metrics ("step_ms.median"); nullptr when a key
/// is absent (a null value is returned as null).
[[nodiscard]] const nlohmann::json* metric_at(const nlohmann::json& point, const std::string& path);

}  // namespace hisparse::detail
