// ResultSet: the versioned results of one run (results.json), its CSV and Markdown views, and the
// run metadata. Every file is rewritten atomically after each point, so an interrupted sweep keeps
// the points that finished.
//
// results.json (schema_version 1):
//   schema_version, metadata {tool, version, git_revision, command_line, host, start_time, backend,
//   device {...}, ceilings {...}, memory_budget {bytes, source}, synthetic {weights, workload}},
//   scenario (as resolved), points [{index, axes {axis: value}, config {...}, status "ok"|"failed"|
//   "interrupted", error, metrics {...} (see PointMetrics)}], summary {planned, recorded, ok,
//   failed, interrupted, complete}.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/ceilings.hpp"
#include "bench/runner.hpp"
#include "core/device.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {

inline constexpr int kResultsSchemaVersion = 1;

struct PointRecord {
  SweepPoint point;
  bool ok = true;
  /// Stopped by SIGINT or SIGTERM before it finished (not ok, not failed): its measurements are
  /// discarded, and `run --resume` runs it again.
  bool interrupted = false;
  std::string error;     ///< when failed or interrupted
  PointMetrics metrics;  ///< when ok
};

[[nodiscard]] nlohmann::json to_json(const PointRecord& r);

/// What a run records about itself.
struct RunInfo {
  std::string command_line;
  DeviceProperties device;
  Ceilings ceilings;
  MemoryBudget budget;
  bool synthetic_weights = true;
  bool synthetic_workload = true;
  std::string start_time;  ///< ISO 8601 UTC; now when empty
};

[[nodiscard]] nlohmann::json run_metadata(const RunInfo& info);
/// `git rev-parse HEAD` of the source tree at run time, with "-dirty" appended when its tracked
/// files differ from HEAD; else the revision configured into the build, else "unknown".
[[nodiscard]] std::string git_revision();
[[nodiscard]] std::string host_name();
[[nodiscard]] std::string utc_now_iso8601();
[[nodiscard]] nlohmann::json to_json(const DeviceProperties& p);

class ResultSet {
 public:
  ResultSet(nlohmann::json metadata, nlohmann::json scenario, std::size_t planned_points);

  void add(const PointRecord& record);
  /// A point recorded by an earlier run of the same sweep (`run --resume`), as it was written.
  void add_recorded(nlohmann::json point);
  /// The metadata, e.g. to note a resumed run.
  [[nodiscard]] nlohmann::json& metadata() noexcept { return metadata_; }
  [[nodiscard]] nlohmann::json to_json() const;
  [[nodiscard]] std::size_t size() const noexcept { return points_.size(); }
  [[nodiscard]] bool any_failed() const noexcept { return count("failed") > 0; }
  /// Points recorded with this status ("ok", "failed", "interrupted").
  [[nodiscard]] std::size_t count(const std::string& status) const;
  /// Writes results.json / results.csv / summary.md for the listed formats ("json", "csv", "md")
  /// into `dir` (created if missing), each atomically. Returns the paths written.
  std::vector<std::filesystem::path> write(const std::filesystem::path& dir,
                                           const std::vector<std::string>& formats) const;

 private:
  nlohmann::json metadata_;
  nlohmann::json scenario_;
  std::size_t planned_;
  nlohmann::json points_ = nlohmann::json::array();
};

}  // namespace hisparse
