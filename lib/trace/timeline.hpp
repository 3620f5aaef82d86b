// Timeline: the backend-free model of one trace session. It takes plain TraceRecords (from the
// CUPTI collector or a fixture), aligns CUPTI timestamps to the host's steady clock, pairs NVTX
// start/end markers into ranges and nests them per host thread, links every GPU activity to the
// runtime call that launched it (correlation id), and attributes it to the innermost enclosing
// NVTX phase range of that launch and to the enclosing step range. phase_breakdown() turns that
// into GPU time per phase per step (the breakdown results.json reports).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/nvtx.hpp"
#include "trace/records.hpp"

namespace hisparse::trace {

/// Linear map from CUPTI's clock to the host's steady clock, fitted through the first and last
/// ClockSample (offset and drift). With one sample it is an offset, with none the identity.
class ClockAlignment {
 public:
  ClockAlignment() = default;
  explicit ClockAlignment(const std::vector<ClockSample>& samples);
  [[nodiscard]] std::int64_t to_host_ns(std::uint64_t cupti_ns) const noexcept;
  /// Relative rate difference of the two clocks in parts per million (0 without two samples).
  [[nodiscard]] double drift_ppm() const noexcept {
    return static_cast<double>(drift_num_) / static_cast<double>(drift_den_) * 1e6;
  }

 private:
  std::uint64_t cupti0_ = 0;
  std::int64_t host0_ = 0;
  // host - host0 = d + round(d * drift_num_ / drift_den_) with d = cupti - cupti0: exact integers.
  std::int64_t drift_num_ = 0;
  std::int64_t drift_den_ = 1;
};

/// A paired NVTX range on a host thread; times on the host clock (ns).
struct NvtxRange {
  std::uint32_t id = 0;
  std::uint32_t process = 0;
  std::uint32_t thread = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::string name;
  std::string domain;
  std::optional<Phase> phase;  ///< set for ranges of the "hisparse" domain
  std::uint32_t colour = 0;
  std::uint32_t category = 0;
  bool has_payload = false;
  std::int64_t payload = 0;
  int parent = -1;         ///< index of the enclosing range on the same thread
  int depth = 0;           ///< 0 for a top-level range
  bool nested = true;      ///< false: partly overlaps an open range (start/end style, not push/pop)
  bool terminated = true;  ///< false: still open when the session stopped (ends at end_ns())
};

/// An NVTX mark (a point in time).
struct NvtxInstant {
  std::int64_t ts_ns = 0;
  std::uint32_t process = 0;
  std::uint32_t thread = 0;
  std::string name;
  std::string domain;
};

enum class ActivityKind : std::uint8_t { kernel, memcpy, memset };
[[nodiscard]] const char* name_of(ActivityKind k) noexcept;

/// Work on a GPU stream, linked to its launch and its phase.
struct GpuActivity {
  ActivityKind kind = ActivityKind::kernel;
  std::size_t record = 0;  ///< index into records().kernels / memcpys / memsets by kind
  std::uint32_t device = 0;
  std::uint32_t stream = 0;
  std::uint32_t correlation = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  int launch = -1;  ///< index into records().runtime_calls of the launching call, -1 if unknown
  int range = -1;   ///< innermost NVTX range enclosing the launch, -1 if none
  Phase phase = Phase::other;
  std::int64_t step = -1;  ///< step index of the enclosing Phase::step range, -1 if none
};

struct HostThread {
  std::uint32_t process = 0;
  std::uint32_t thread = 0;
  friend bool operator==(const HostThread&, const HostThread&) = default;
  friend auto operator<=>(const HostThread&, const HostThread&) = default;
};

struct StreamTrack {
  std::uint32_t device = 0;
  std::uint32_t stream = 0;
  friend bool operator==(const StreamTrack&, const StreamTrack&) = default;
  friend auto operator<=>(const StreamTrack&, const StreamTrack&) = default;
};

/// What did not fit the model; each count is reported in trace.json so nothing is lost silently.
struct TimelineStats {
  std::size_t unmatched_end_markers = 0;  ///< end marker whose start was before the session
  std::size_t unterminated_ranges = 0;    ///< start marker without end before stop
  std::size_t invalid_activities = 0;     ///< zero or reversed timestamps: left out
  std::size_t unlaunched_activities = 0;  ///< no runtime call with the activity's correlation id
  std::uint64_t dropped_records = 0;      ///< CUPTI records lost to full buffers
};

class Timeline {
 public:
  explicit Timeline(TraceRecords records);

  [[nodiscard]] const TraceRecords& records() const noexcept { return records_; }
  [[nodiscard]] const std::string& label() const noexcept { return records_.label; }
  [[nodiscard]] const ClockAlignment& clock() const noexcept { return clock_; }
  [[nodiscard]] std::int64_t host_ns(std::uint64_t cupti_ns) const noexcept {
    return clock_.to_host_ns(cupti_ns);
  }
  /// Earliest and latest instant of the session on the host clock (records and clock samples).
  [[nodiscard]] std::int64_t begin_ns() const noexcept { return begin_ns_; }
  [[nodiscard]] std::int64_t end_ns() const noexcept { return end_ns_; }

  /// Ranges sorted by (thread, start); parents precede children.
  [[nodiscard]] const std::vector<NvtxRange>& ranges() const noexcept { return ranges_; }
  [[nodiscard]] const std::vector<NvtxInstant>& instants() const noexcept { return instants_; }
  /// GPU activities sorted by start time.
  [[nodiscard]] const std::vector<GpuActivity>& activities() const noexcept { return activities_; }
  [[nodiscard]] const std::vector<HostThread>& host_threads() const noexcept {
    return host_threads_;
  }
  [[nodiscard]] const std::vector<StreamTrack>& streams() const noexcept { return streams_; }
  [[nodiscard]] const TimelineStats& stats() const noexcept { return stats_; }

  /// Index into records().runtime_calls of the call with this correlation id, -1 if none.
  [[nodiscard]] int launch_of(std::uint32_t correlation) const;
  /// Demangled kernel name for activities of kind kernel ("" otherwise).
  [[nodiscard]] const std::string& display_name(const GpuActivity& a) const;
  /// Innermost range on (process, thread) that encloses `ts_ns`, -1 if none.
  [[nodiscard]] int enclosing_range(const HostThread& thread, std::int64_t ts_ns) const;
  /// Step index of a Phase::step range (its payload, or its position among step ranges in time
  /// order when it has none); -1 for any other range.
  [[nodiscard]] std::int64_t step_index(int range) const;

 private:
  void pair_markers();
  void nest_ranges();
  void build_activities();
  void collect_tracks();

  TraceRecords records_;
  ClockAlignment clock_;
  std::int64_t begin_ns_ = 0;
  std::int64_t end_ns_ = 0;
  std::vector<NvtxRange> ranges_;
  std::vector<NvtxInstant> instants_;
  std::vector<GpuActivity> activities_;
  std::vector<HostThread> host_threads_;
  std::vector<StreamTrack> streams_;
  std::vector<std::string> kernel_names_;  ///< demangled, parallel to records().kernels
  std::unordered_map<std::uint32_t, int> launch_by_correlation_;
  std::map<HostThread, std::vector<int>> ranges_by_thread_;  ///< indices sorted by start
  std::unordered_map<int, std::int64_t> step_of_range_;
  TimelineStats stats_;
};

/// GPU time of one step, by phase. Activities count by their launch (a kernel launched inside a
/// step's range belongs to that step even if it runs after the range closed).
struct StepPhaseTimes {
  std::int64_t step = 0;
  double wall_ms = 0.0;                    ///< duration of the step's NVTX range (host)
  double gpu_ms = 0.0;                     ///< sum of the durations of the step's GPU activities
  std::map<std::string, double> phase_ms;  ///< phase_name(phase) -> summed GPU activity ms
  std::size_t kernels = 0;
  std::size_t copies = 0;  ///< memcpys and memsets
};

/// One entry per step range seen (sorted by step); GPU activities outside any step are left out.
/// Step index: the step range's payload, or its position among step ranges when it has none.
[[nodiscard]] std::vector<StepPhaseTimes> phase_breakdown(const Timeline& timeline);

/// Demangles an Itanium C++ symbol; returns the input unchanged when it is not one.
[[nodiscard]] std::string demangle(const std::string& symbol);

}  // namespace hisparse::trace
