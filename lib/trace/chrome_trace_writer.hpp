// Writes Timelines as a Chrome-trace / Perfetto JSON file (trace.json; open it at ui.perfetto.dev
// or chrome://tracing). Layout per session (one sweep point):
//   process "<label> - host":   one track per host thread: NVTX ranges ("X", nested; ranges that
//                               cannot nest as async "b"/"e"), NVTX marks ("i"), CUDA runtime
//                               calls;
//   process "<label> - GPU d":  one track per CUDA stream: kernels (grid, block, registers, shared
//                               memory, phase, step), copies and memsets (bytes, GB/s);
//                               environment samples as counters ("C");
//   flow arrows ("s" on the launching call, "f" bound to the GPU slice) per correlation id.
// Timestamps are microseconds (ns precision) from the first session's first instant; all sessions
// share the host's steady clock. "otherData" holds per-session statistics and the per-phase
// breakdown.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "trace/timeline.hpp"

namespace hisparse::trace {

struct ChromeTraceOptions {
  bool runtime_api = true;  ///< CUDA runtime calls on the host threads
  bool flows = true;        ///< launch -> GPU activity arrows
  bool breakdown = true;    ///< per-step phase breakdown in otherData
};

/// Collects sessions and writes them as one file. Each add() renders its events at once, so a
/// runner can add a sweep point, write, and add the next (completed points survive a crash).
class ChromeTraceWriter {
 public:
  explicit ChromeTraceWriter(ChromeTraceOptions options = {}) : options_(options) {}

  void add(const Timeline& timeline);
  [[nodiscard]] std::size_t sessions() const noexcept { return sessions_.size(); }
  [[nodiscard]] std::size_t events() const noexcept { return event_count_; }
  /// The whole JSON document.
  [[nodiscard]] std::string str() const;
  /// Writes str() to `path` (through a temporary file renamed into place). Throws Error.
  void write(const std::filesystem::path& path) const;

 private:
  struct Session {
    std::string events;  ///< comma-separated event objects
    std::string other;   ///< this session's otherData object
  };
  ChromeTraceOptions options_;
  std::vector<Session> sessions_;
  bool have_origin_ = false;
  std::int64_t origin_ns_ = 0;
  std::size_t event_count_ = 0;
  std::uint64_t next_flow_id_ = 1;
};

/// JSON string escaping (quotes not included).
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace hisparse::trace
