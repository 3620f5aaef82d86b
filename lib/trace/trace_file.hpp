// TraceFile: the trace.json of one run. A runner traces a few steps of every sweep point:
//
//   trace::TraceFile trace_file(out_dir / "trace.json");  // when --trace
//   for (each point) {
//     ... warm-up ...
//     auto session = trace_file.begin(point_label);  // inactive + message if impossible
//     for (int s = 0; s < trace_steps; ++s) {
//       HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, s);
//       engine.step();
//     }
//     const auto steps = trace_file.end(*session);  // appends the point, rewrites the file
//     record.phase_ms = trace::mean_phase_ms(steps);  // GPU ms per phase per step
//   }

#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "trace/chrome_trace_writer.hpp"
#include "trace/timeline.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::trace {

class TraceFile {
 public:
  explicit TraceFile(std::filesystem::path path, ChromeTraceOptions options = {})
      : path_(std::move(path)), writer_(options) {}

  /// Starts a session for one sweep point (see TraceSession: inactive with message() when CUPTI
  /// cannot be used; throws Error while another session is active).
  [[nodiscard]] std::unique_ptr<TraceSession> begin(std::string label, TraceOptions options = {});
  /// Stops `session`, adds its timeline to the file and rewrites the file (so finished points
  /// survive a later crash). Returns the per-step phase breakdown; empty for an inactive session,
  /// which adds nothing to the file.
  std::vector<StepPhaseTimes> end(TraceSession& session);

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Sessions written so far.
  [[nodiscard]] std::size_t sessions() const noexcept { return writer_.sessions(); }

 private:
  std::filesystem::path path_;
  ChromeTraceWriter writer_;
};

/// Mean over steps of each phase's GPU ms (phases absent from a step count as 0 there), plus
/// "total" (mean gpu_ms). Empty for no steps.
[[nodiscard]] std::map<std::string, double> mean_phase_ms(const std::vector<StepPhaseTimes>& steps);

}  // namespace hisparse::trace
