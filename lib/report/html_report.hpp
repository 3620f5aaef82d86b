// report.html: one self-contained page (inline CSS and SVG, no scripts, no external resources)
// for a results document: the run's provenance, a table of the points, and the figures
// (throughput vs concurrency per mode, speedup over the baseline mode, step-time breakdown by
// phase, hot-buffer hit rate vs hot-buffer size, Fathom bits-vs-error Pareto). A figure whose
// fields are absent from the results is replaced by a sentence saying what it needs.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hisparse {

[[nodiscard]] std::string html_report(const nlohmann::json& results);

/// The CSS every page of the toolkit uses (report.html, policies.html).
[[nodiscard]] std::string_view report_style() noexcept;

/// What every figure caption states: backend(s), device(s) and where weights and workload came
/// from, e.g. "backend cuda, device NVIDIA H200, synthetic weights/workload". For merged results
/// it lists the distinct values of all sources.
[[nodiscard]] std::string provenance_caption(const nlohmann::json& results);

/// The baseline mode speedups are measured against: "sparse-gpu" when an ok point has it, else
/// "dense", else "".
[[nodiscard]] std::string baseline_mode(const nlohmann::json& results);

}  // namespace hisparse
