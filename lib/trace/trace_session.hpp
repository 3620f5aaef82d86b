// TraceSession: collect a timeline of the GPU work of a few steps with CUPTI, RAII style.
//
//   hisparse::trace::prepare_nvtx_injection();  // top of main() when --trace, before any NVTX
//   ...
//   trace::ChromeTraceWriter writer;
//   for (each sweep point) {
//     ... warm-up ...
//     trace::TraceSession session({.label = point_label});
//     if (!session.active()) print(session.message());  // e.g. Nsight owns CUPTI: no trace
//     for (int s = 0; s < trace_steps; ++s) {
//       HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, s);
//       engine.step();
//     }
//     trace::Timeline timeline(session.stop());
//     auto breakdown = trace::phase_breakdown(timeline);  // GPU ms per phase per step
//     writer.add(timeline);
//     writer.write(out_dir / "trace.json");
//   }

//
// CUPTI's activity API is process-wide: one session at a time (a second one throws Error). When
// another profiler (Nsight Systems, Nsight Compute) owns CUPTI, when the build has no CUDA
// backend, or when no GPU is present, the session is inactive: active() is false, message() says
// why, and stop() returns empty records. Nothing fails.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "trace/records.hpp"

namespace hisparse::trace {

struct TraceOptions {
  std::string label;                    ///< names the session in trace.json (the sweep point)
  std::size_t buffer_bytes = 8u << 20;  ///< size of each CUPTI activity buffer
  bool runtime_api = true;              ///< CUDA runtime calls (needed for launch flows and phases)
  bool nvtx = true;                     ///< NVTX ranges (needs prepare_nvtx_injection())
  bool environment = false;             ///< clock/temperature/power samples, where supported
};

/// A profiler that owns CUPTI in this process, detected from its environment variables
/// (CUDA_INJECTION64_PATH, NSYS_*, NVTX_INJECTION64_PATH pointing elsewhere than CUPTI); nullopt
/// when none is seen. The text says which variable showed it.
[[nodiscard]] std::optional<std::string> other_profiler();

/// Points NVTX_INJECTION64_PATH at the CUPTI library this build links, so that NVTX ranges reach
/// CUPTI as marker records (CUPTI's documented route). It takes effect only if it runs before the
/// process's first NVTX call: call it at the top of main() when tracing is requested. Leaves an
/// existing setting alone. Returns "" on success, otherwise why it did nothing.
std::string prepare_nvtx_injection();

class TraceSession {
 public:
  /// Starts collecting (or, when that is impossible, becomes inactive with a message).
  /// Throws Error if another TraceSession is active.
  explicit TraceSession(TraceOptions options = {});
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  [[nodiscard]] bool active() const noexcept;
  /// Whether a session of this process is collecting a timeline now (a decode engine then runs
  /// its steps eagerly, so that the NVTX ranges enclose each phase's kernels).
  [[nodiscard]] static bool collecting() noexcept;
  /// Why the session is inactive, or a warning about an active one (e.g. NVTX ranges will be
  /// missing because injection was not prepared); empty when all is well.
  [[nodiscard]] const std::string& message() const noexcept;
  /// Waits for the device, flushes CUPTI's buffers, stops collecting and returns the records
  /// (label set, clock samples at start and stop). Later calls return empty records.
  [[nodiscard]] TraceRecords stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hisparse::trace
