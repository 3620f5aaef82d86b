// Plain activity records: what the CUPTI collector (cupti_collector.hpp, CUDA builds only) turns
// CUPTI's activity buffers into, and what the backend-free part (timeline.hpp,
// chrome_trace_writer.hpp) consumes. No CUPTI type appears here, so CPU tests feed recorded
// fixtures (record_text.hpp) through exactly the code the GPU path uses.
//
// Timestamps are raw CUPTI nanoseconds (cuptiGetTimestamp's clock); ClockSample pairs map them to
// the host's steady clock (Timeline does the alignment).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace hisparse::trace {

/// A kernel execution (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL).
struct KernelRecord {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t device = 0;
  std::uint32_t context = 0;
  std::uint32_t stream = 0;
  std::uint32_t correlation = 0;  ///< matches the RuntimeApiRecord of its launch
  std::string name;               ///< as CUPTI reports it (mangled)
  std::array<std::int32_t, 3> grid{1, 1, 1};
  std::array<std::int32_t, 3> block{1, 1, 1};
  std::int32_t registers_per_thread = 0;
  std::int32_t static_shared_bytes = 0;
  std::int32_t dynamic_shared_bytes = 0;
  std::uint32_t local_bytes_per_thread = 0;
  std::uint32_t graph_id = 0;  ///< 0 unless launched from a CUDA graph
};

enum class CopyKind : std::uint8_t {
  unknown,
  htod,
  dtoh,
  htoa,
  atoh,
  atoa,
  atod,
  dtoa,
  dtod,
  htoh,
  ptop
};
enum class MemorySpace : std::uint8_t {
  unknown,
  pageable,
  pinned,
  device,
  array,
  managed,
  device_static,
  managed_static
};

/// A memory copy (CUPTI_ACTIVITY_KIND_MEMCPY).
struct MemcpyRecord {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t device = 0;
  std::uint32_t context = 0;
  std::uint32_t stream = 0;
  std::uint32_t correlation = 0;
  std::uint64_t bytes = 0;
  CopyKind kind = CopyKind::unknown;
  MemorySpace src = MemorySpace::unknown;
  MemorySpace dst = MemorySpace::unknown;
  std::uint32_t graph_id = 0;
};

/// A memset (CUPTI_ACTIVITY_KIND_MEMSET).
struct MemsetRecord {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t device = 0;
  std::uint32_t context = 0;
  std::uint32_t stream = 0;
  std::uint32_t correlation = 0;
  std::uint64_t bytes = 0;
  std::uint32_t value = 0;
  MemorySpace memory = MemorySpace::unknown;
  std::uint32_t graph_id = 0;
};

/// A CUDA runtime API call on a host thread (CUPTI_ACTIVITY_KIND_RUNTIME).
struct RuntimeApiRecord {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t process = 0;
  std::uint32_t thread = 0;
  std::uint32_t correlation = 0;
  std::uint32_t callback_id = 0;
  std::string name;  ///< "cudaLaunchKernel" (version suffix removed)
  std::uint32_t return_value = 0;
};

enum class MarkerKind : std::uint8_t { start, end, instant };

/// One NVTX marker as CUPTI reports it (CUPTI_ACTIVITY_KIND_MARKER). A range is two markers
/// with the same id; the end marker carries no name. Timeline pairs them into NvtxRangeRecord.
struct NvtxMarkerRecord {
  MarkerKind kind = MarkerKind::instant;
  std::uint64_t timestamp = 0;
  std::uint32_t id = 0;
  std::uint32_t process = 0;
  std::uint32_t thread = 0;
  std::string name;    ///< empty for end markers
  std::string domain;  ///< empty for the default domain
};

/// Colour, category and payload of a marker (CUPTI_ACTIVITY_KIND_MARKER_DATA), by marker id.
struct NvtxMarkerDataRecord {
  std::uint32_t id = 0;
  std::uint32_t colour = 0;  ///< ARGB, 0 when none
  std::uint32_t category = 0;
  bool has_payload = false;
  std::int64_t payload = 0;  ///< integer payloads exactly; double payloads truncated
};

/// A GPU of the trace (CUPTI_ACTIVITY_KIND_DEVICE, or the runtime's properties as a fallback).
struct DeviceRecord {
  std::uint32_t id = 0;
  std::string name;
  std::uint32_t multiprocessors = 0;
  std::uint32_t compute_major = 0;
  std::uint32_t compute_minor = 0;
  std::uint64_t global_memory_bytes = 0;
  std::uint64_t memory_bandwidth_kbps = 0;  ///< as CUPTI reports it (KB/s)
  std::uint32_t l2_bytes = 0;
  std::uint32_t core_clock_khz = 0;
};

enum class EnvironmentKind : std::uint8_t { speed, temperature, power, cooling };

/// A sample of the device's environment (CUPTI_ACTIVITY_KIND_ENVIRONMENT), where supported.
struct EnvironmentRecord {
  std::uint32_t device = 0;
  std::uint64_t timestamp = 0;
  EnvironmentKind kind = EnvironmentKind::speed;
  std::uint32_t sm_clock_mhz = 0;
  std::uint32_t memory_clock_mhz = 0;
  std::uint32_t temperature_c = 0;
  std::uint32_t power_mw = 0;
  std::uint32_t power_limit_mw = 0;
  std::uint32_t fan_percent = 0;
};

/// The same instant on both clocks: CUPTI's timestamp and the host's steady clock (ns).
struct ClockSample {
  std::uint64_t cupti_ns = 0;
  std::int64_t host_ns = 0;
};

/// Everything one trace session collected.
struct TraceRecords {
  std::string label;  ///< what was traced, e.g. "hisparse c=64 ctx=32768" (one sweep point)
  std::vector<KernelRecord> kernels;
  std::vector<MemcpyRecord> memcpys;
  std::vector<MemsetRecord> memsets;
  std::vector<RuntimeApiRecord> runtime_calls;
  std::vector<NvtxMarkerRecord> markers;
  std::vector<NvtxMarkerDataRecord> marker_data;
  std::vector<DeviceRecord> devices;
  std::vector<EnvironmentRecord> environment;
  std::vector<ClockSample> clock;     ///< at least one at session start, one at stop
  std::uint64_t dropped_records = 0;  ///< CUPTI records lost to full buffers
  std::uint64_t buffers = 0;          ///< activity buffers CUPTI completed
};

[[nodiscard]] const char* name_of(CopyKind k) noexcept;     ///< "HtoD", "DtoH", ...
[[nodiscard]] const char* name_of(MemorySpace m) noexcept;  ///< "pinned", "device", ...
[[nodiscard]] const char* name_of(MarkerKind k) noexcept;   ///< "start", "end", "instant"
[[nodiscard]] const char* name_of(EnvironmentKind k) noexcept;

}  // namespace hisparse::trace
