// CSV and Markdown views of a results.json document (schema_version 1). They read only the JSON,
// so `hisparse-bench report` can re-render them from files.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace hisparse {

/// One header row and one row per point. Columns: index, the config keys, status, the metrics
/// (step_ms_* flattened), one phase_ms_<phase> column per phase seen in any point, error.
[[nodiscard]] std::string results_csv(const nlohmann::json& results);

/// summary.md: a header naming the scenario, backend, device and that weights/workload are
/// synthetic, then one table per mode.
[[nodiscard]] std::string results_markdown(const nlohmann::json& results);

/// Where weights and workload came from, from metadata.synthetic {weights, workload}:
/// "synthetic weights/workload", "loaded weights, synthetic workload", ... (synthetic when absent).
[[nodiscard]] std::string data_description(const nlohmann::json& synthetic);

/// A CSV field, quoted when it contains a comma, quote or line break.
[[nodiscard]] std::string csv_field(const std::string& text);

}  // namespace hisparse
