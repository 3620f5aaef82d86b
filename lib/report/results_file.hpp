// results.json as a file: reading one back (for `compare` and `report`), writing the views of a
// results document (results.json, results.csv, summary.md, report.html), merging several runs.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hisparse {

/// Reads a results.json. Throws Error naming `path` for a file that cannot be read, text that is
/// not JSON, a document that is not a results file, or a schema_version this build does not read.
[[nodiscard]] nlohmann::json load_results(const std::filesystem::path& path);
/// The checks of load_results on a document already read from `where`.
[[nodiscard]] nlohmann::json checked_results(nlohmann::json doc, const std::string& where);
/// Whether `doc` looks like a results document (schema_version and points), of any version.
[[nodiscard]] bool is_results_document(const nlohmann::json& doc);

/// The keys in which two resolved scenarios (results.json `scenario`) differ, each as
/// "key (old -> new)" with nested keys dotted ("workload.seed (1 -> 2)"); top-level keys in
/// `ignored` are left out.
[[nodiscard]] std::vector<std::string> scenario_differences(
    const nlohmann::json& a, const nlohmann::json& b, const std::vector<std::string>& ignored);

/// Any JSON file. Throws Error naming `path` (with `fix`) when it cannot be read or parsed.
[[nodiscard]] nlohmann::json read_json_file(const std::filesystem::path& path,
                                            const std::string& fix);

/// Writes the views of `results` listed in `formats` into `dir` (created when missing), each
/// atomically: "json" results.json, "csv" results.csv, "md" summary.md, "html" report.html.
/// Unknown names are ignored. Returns the paths written. Throws Error naming the folder or file.
std::vector<std::filesystem::path> write_results_files(const nlohmann::json& results,
                                                       const std::filesystem::path& dir,
                                                       const std::vector<std::string>& formats);

/// Several results documents as one: the first one's metadata and scenario, "sources" (one entry
/// per input: label, backend, device, git revision, scenario name, start time), the points of all
/// inputs in order (each with "source": its input's position, "index" renumbered) and the summary
/// recomputed. One input is returned as it is.
[[nodiscard]] nlohmann::json merge_results(const std::vector<nlohmann::json>& documents,
                                           const std::vector<std::string>& labels);

}  // namespace hisparse
