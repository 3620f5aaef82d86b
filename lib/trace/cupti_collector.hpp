// The CUPTI side of tracing (CUDA builds only; compiled from CUDA_SOURCES). It enables CUPTI's
// activity API, hands CUPTI the buffers it asks for, converts every completed buffer into plain
// records (records.hpp) and frees it, and samples both clocks at start and stop. No CUPTI type
// leaves this component. Use it through TraceSession.
#pragma once

#include <memory>
#include <string>

#include "trace/records.hpp"
#include "trace/trace_session.hpp"

namespace hisparse::trace::detail {

class CuptiCollector {
 public:
  /// Enables activity collection. Returns nullptr and sets `why` when CUPTI cannot be used
  /// (another profiler owns it, no device, an unsupported activity kind); `warning` receives
  /// non-fatal problems (e.g. NVTX injection not prepared).
  static std::unique_ptr<CuptiCollector> start(const TraceOptions& options, std::string& why,
                                               std::string& warning);
  ~CuptiCollector();
  CuptiCollector(const CuptiCollector&) = delete;
  CuptiCollector& operator=(const CuptiCollector&) = delete;

  /// Synchronises the device, flushes, disables the activity kinds and returns what arrived.
  [[nodiscard]] TraceRecords stop();

  struct State;  ///< buffers and converted records; shared with CUPTI's callbacks

 private:
  explicit CuptiCollector(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  bool stopped_ = false;
};

/// Absolute path of the CUPTI shared library loaded in this process ("" if not found).
[[nodiscard]] std::string cupti_library_path();

}  // namespace hisparse::trace::detail
