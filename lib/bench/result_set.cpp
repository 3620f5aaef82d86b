#include "bench/result_set.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>

#include <fmt/format.h>

#include "core/error.hpp"
#include "model/mode.hpp"
#include "report/results_file.hpp"

#ifndef HISPARSE_GIT_REVISION
#define HISPARSE_GIT_REVISION "unknown"
#endif

namespace hisparse {

nlohmann::json to_json(const PointRecord& r) {
  const auto& c = r.point.config;
  nlohmann::json axes = nlohmann::json::object();
  for (const auto& [axis, value] : r.point.axes) axes[axis] = value;
  nlohmann::json j{{"index", r.point.index},
                   {"axes", axes},
                   {"config",
                    {{"model", r.point.model},
                     {"mode", std::string(name_of(c.mode))},
                     {"concurrency", c.concurrency},
                     {"context_length", c.context_length},
                     {"top_k", c.top_k},
                     {"hot_buffer", c.hot_buffer},
                     {"budget_bits", c.budget_bits},
                     {"fathom_klt", c.fathom_klt},
                     {"fathom_rule", fathom::plan_rule_name(c.fathom_rule)},
                     {"fathom_centre_keys", c.fathom_centre_keys},
                     {"fathom_head_budgets", c.fathom_head_budgets.empty()
                                                 ? nlohmann::json(nullptr)
                                                 : nlohmann::json(c.fathom_head_budgets)},
                     {"policy", c.policy}}},
                   {"status", r.ok            ? "ok"
                              : r.interrupted ? "interrupted"
                                              : "failed"},
                   {"error", r.ok ? nlohmann::json(nullptr) : nlohmann::json(r.error)}};
  j["metrics"] = r.ok ? nlohmann::json(r.metrics) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json to_json(const DeviceProperties& p) {
  return {{"name", p.name},
          {"backend", std::string(name_of(p.backend))},
          {"index", p.index},
          {"compute_capability", fmt::format("{}.{}", p.compute_major, p.compute_minor)},
          {"multiprocessors", p.multiprocessors},
          {"total_memory", p.total_memory},
          {"free_memory", p.free_memory},
          {"l2_bytes", p.l2_bytes},
          {"max_shared_per_block_optin", p.max_shared_per_block_optin},
          {"driver_version", p.driver_version},
          {"runtime_version", p.runtime_version}};
}

std::string git_revision() {
  const std::string dir(HISPARSE_SOURCE_DIR);
  const std::string cmd = fmt::format("git -C '{}' rev-parse HEAD 2>/dev/null", dir);
  if (std::FILE* pipe = popen(cmd.c_str(), "r")) {
    std::array<char, 128> buf{};
    std::string out;
    while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
    const int status = pclose(pipe);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (status != 0 || out.size() != 40) return HISPARSE_GIT_REVISION;
    // A tree whose tracked files differ from HEAD (work in progress, or a copy of a working tree
    // on another machine) is not that revision: say so rather than name a commit it is not.
    const std::string diff = fmt::format("git -C '{}' diff --quiet HEAD -- 2>/dev/null", dir);
    const int changed = std::system(diff.c_str());
    if (changed != -1 && WIFEXITED(changed) && WEXITSTATUS(changed) == 1) out += "-dirty";
    return out;
  }
  return HISPARSE_GIT_REVISION;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return buf.data();
}

std::string utc_now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf.data();
}

nlohmann::json run_metadata(const RunInfo& info) {
  return {
      {"tool", "hisparse-bench"},
      {"version", HISPARSE_VERSION},
      {"git_revision", git_revision()},
      {"command_line", info.command_line},
      {"host", host_name()},
      {"start_time", info.start_time.empty() ? utc_now_iso8601() : info.start_time},
      {"backend", std::string(name_of(info.device.backend))},
      {"device", to_json(info.device)},
      {"ceilings", info.ceilings},
      {"memory_budget",
       {{"bytes", info.budget.bytes},
        {"host_bytes", info.budget.host_bytes},
        {"source", info.budget.source}}},
      {"synthetic", {{"weights", info.synthetic_weights}, {"workload", info.synthetic_workload}}}};
}

ResultSet::ResultSet(nlohmann::json metadata, nlohmann::json scenario, std::size_t planned_points)
    : metadata_(std::move(metadata)), scenario_(std::move(scenario)), planned_(planned_points) {}

void ResultSet::add(const PointRecord& record) {
  points_.push_back(hisparse::to_json(record));
}

void ResultSet::add_recorded(nlohmann::json point) {
  points_.push_back(std::move(point));
}

std::size_t ResultSet::count(const std::string& status) const {
  return static_cast<std::size_t>(std::count_if(points_.begin(), points_.end(), [&](const auto& p) {
    return p.contains("status") && p["status"] == status;
  }));
}

nlohmann::json ResultSet::to_json() const {
  const std::size_t recorded = points_.size(), ok = count("ok"), failed = count("failed");
  return {{"schema_version", kResultsSchemaVersion},
          {"metadata", metadata_},
          {"scenario", scenario_},
          {"points", points_},
          {"summary",
           {{"planned", planned_},
            {"recorded", recorded},
            {"ok", ok},
            {"failed", failed},
            {"interrupted", count("interrupted")},
            {"complete", ok + failed == planned_}}}};
}

std::vector<std::filesystem::path> ResultSet::write(const std::filesystem::path& dir,
                                                    const std::vector<std::string>& formats) const {
  // The HTML report is written once, at the end of a run, not by the result set.
  std::vector<std::string> views;
  std::copy_if(formats.begin(), formats.end(), std::back_inserter(views),
               [](const std::string& f) { return f != "html"; });
  return write_results_files(to_json(), dir, views);
}

}  // namespace hisparse
