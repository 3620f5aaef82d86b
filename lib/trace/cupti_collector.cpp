#include "trace/cupti_collector.hpp"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/device.hpp"

namespace hisparse::trace::detail {

namespace {

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr)
    return fmt::format("CUPTI error {}", static_cast<int>(r));
  return s;
}

std::string other_profiler_text() {
  return "another profiler (Nsight Systems, Nsight Compute or a CUPTI-based tool) owns CUPTI in "
         "this process; "
         "hisparse's trace steps aside; the profiler's own timeline shows the same work";
}

/// The same instant on CUPTI's clock and the host's steady clock: the host time is the midpoint
/// of two readings around cuptiGetTimestamp.
ClockSample sample_clocks() {
  const auto h0 = std::chrono::steady_clock::now();
  std::uint64_t c = 0;
  cuptiGetTimestamp(&c);
  const auto h1 = std::chrono::steady_clock::now();
  const auto ns = [](auto t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  return {c, static_cast<std::int64_t>(ns(h0) + (ns(h1) - ns(h0)) / 2)};
}

CopyKind copy_kind(std::uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return CopyKind::htod;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return CopyKind::dtoh;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return CopyKind::htoa;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return CopyKind::atoh;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return CopyKind::atoa;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return CopyKind::atod;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return CopyKind::dtoa;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return CopyKind::dtod;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return CopyKind::htoh;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return CopyKind::ptop;
    default:
      return CopyKind::unknown;
  }
}

MemorySpace memory_space(std::uint32_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
      return MemorySpace::pageable;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return MemorySpace::pinned;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
      return MemorySpace::device;
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY:
      return MemorySpace::array;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
      return MemorySpace::managed;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
      return MemorySpace::device_static;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC:
      return MemorySpace::managed_static;
    default:
      return MemorySpace::unknown;
  }
}

/// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string strip_version(const char* name) {
  std::string s = name ? name : "";
  const auto v = s.rfind("_v");
  if (v != std::string::npos && v + 2 < s.size() &&
      s.find_first_not_of("0123456789", v + 2) == std::string::npos)
    s.resize(v);
  return s;
}

/// The fields CUPTI's kernel, memcpy and memset activities share, copied into our record.
template <class Record, class Activity>
void copy_stream_fields(Record& r, const Activity& a) {
  r.start = a.start;
  r.end = a.end;
  r.device = a.deviceId;
  r.context = a.contextId;
  r.stream = a.streamId;
  r.correlation = a.correlationId;
  r.graph_id = a.graphId;
}

}  // namespace

struct CuptiCollector::State {
  TraceOptions options;
  std::mutex mutex;  ///< records are appended from CUPTI's worker thread
  TraceRecords records;
  std::unordered_map<std::uint32_t, std::string> api_names;
  std::vector<CUpti_ActivityKind> enabled;

  void consume(std::uint8_t* buffer, std::size_t valid);
  /// Disables the enabled kinds, flushes CUPTI's buffers into `records` and detaches the session.
  void finish();
};

namespace {

// CUPTI's buffer callbacks carry no user pointer: they reach the active session through this.
std::mutex g_active_mutex;
CuptiCollector::State* g_active = nullptr;
std::size_t g_buffer_bytes = 8u << 20;

constexpr std::size_t record_alignment = 8;  // CUPTI requires 8-byte aligned activity buffers

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  const std::size_t bytes = g_buffer_bytes;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(record_alignment, bytes));
  *size = *buffer ? bytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                               std::size_t, std::size_t valid) {
  {
    std::lock_guard lock(g_active_mutex);
    if (g_active != nullptr && buffer != nullptr) {
      g_active->consume(buffer, valid);
      std::size_t dropped = 0;
      if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) {
        std::lock_guard records_lock(g_active->mutex);
        g_active->records.dropped_records += dropped;
      }
    }
  }
  std::free(buffer);
}

void CUPTIAPI ignore_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

bool g_callbacks_registered = false;

}  // namespace

void CuptiCollector::State::consume(std::uint8_t* buffer, std::size_t valid) {
  std::lock_guard lock(mutex);
  ++records.buffers;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        KernelRecord r;
        copy_stream_fields(r, *k);
        r.name = k->name ? k->name : "";
        r.grid = {k->gridX, k->gridY, k->gridZ};
        r.block = {k->blockX, k->blockY, k->blockZ};
        r.registers_per_thread = k->registersPerThread;
        r.static_shared_bytes = k->staticSharedMemory;
        r.dynamic_shared_bytes = k->dynamicSharedMemory;
        r.local_bytes_per_thread = k->localMemoryPerThread;
        records.kernels.push_back(std::move(r));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        MemcpyRecord r;
        copy_stream_fields(r, *m);
        r.bytes = m->bytes;
        r.kind = copy_kind(m->copyKind);
        r.src = memory_space(m->srcKind);
        r.dst = memory_space(m->dstKind);
        records.memcpys.push_back(r);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        MemsetRecord r;
        copy_stream_fields(r, *m);
        r.bytes = m->bytes;
        r.value = m->value;
        r.memory = memory_space(m->memoryKind);
        records.memsets.push_back(r);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        RuntimeApiRecord r;
        r.start = a->start;
        r.end = a->end;
        r.process = a->processId;
        r.thread = a->threadId;
        r.correlation = a->correlationId;
        r.callback_id = a->cbid;
        r.return_value = a->returnValue;
        auto [it, inserted] = api_names.try_emplace(a->cbid);
        if (inserted) {
          const char* name = nullptr;
          if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) == CUPTI_SUCCESS)
            it->second = strip_version(name);
        }
        r.name = it->second;
        records.runtime_calls.push_back(std::move(r));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(record);
        NvtxMarkerRecord r;
        r.kind = (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) ? MarkerKind::start
                 : (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) ? MarkerKind::end
                                                               : MarkerKind::instant;
        r.timestamp = m->timestamp;
        r.id = m->id;
        if (m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ||
            m->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS) {
          r.process = m->objectId.pt.processId;
          r.thread = m->objectId.pt.threadId;
        }
        r.name = m->name ? m->name : "";
        r.domain = m->domain ? m->domain : "";
        records.markers.push_back(std::move(r));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER_DATA: {
        const auto* d = reinterpret_cast<const CUpti_ActivityMarkerData2*>(record);
        NvtxMarkerDataRecord r;
        r.id = d->id;
        r.colour = d->color;
        r.category = d->category;
        switch (d->payloadKind) {
          case CUPTI_METRIC_VALUE_KIND_INT64:
            r.has_payload = true;
            r.payload = d->payload.metricValueInt64;
            break;
          case CUPTI_METRIC_VALUE_KIND_UINT64:
            r.has_payload = true;
            r.payload = static_cast<std::int64_t>(d->payload.metricValueUint64);
            break;
          case CUPTI_METRIC_VALUE_KIND_DOUBLE:
            r.has_payload = true;
            r.payload = static_cast<std::int64_t>(d->payload.metricValueDouble);
            break;
          default:
            break;
        }
        records.marker_data.push_back(r);
        break;
      }
      case CUPTI_ACTIVITY_KIND_DEVICE: {
        const auto* d = reinterpret_cast<const CUpti_ActivityDevice5*>(record);
        DeviceRecord r;
        r.id = d->id;
        r.name = d->name ? d->name : "";
        r.multiprocessors = d->numMultiprocessors;
        r.compute_major = d->computeCapabilityMajor;
        r.compute_minor = d->computeCapabilityMinor;
        r.global_memory_bytes = d->globalMemorySize;
        r.memory_bandwidth_kbps = d->globalMemoryBandwidth;
        r.l2_bytes = d->l2CacheSize;
        r.core_clock_khz = d->coreClockRate;
        records.devices.push_back(std::move(r));
        break;
      }
      case CUPTI_ACTIVITY_KIND_ENVIRONMENT: {
        const auto* e = reinterpret_cast<const CUpti_ActivityEnvironment*>(record);
        EnvironmentRecord r;
        r.device = e->deviceId;
        r.timestamp = e->timestamp;
        switch (e->environmentKind) {
          case CUPTI_ACTIVITY_ENVIRONMENT_SPEED:
            r.kind = EnvironmentKind::speed;
            r.sm_clock_mhz = e->data.speed.smClock;
            r.memory_clock_mhz = e->data.speed.memoryClock;
            break;
          case CUPTI_ACTIVITY_ENVIRONMENT_TEMPERATURE:
            r.kind = EnvironmentKind::temperature;
            r.temperature_c = e->data.temperature.gpuTemperature;
            break;
          case CUPTI_ACTIVITY_ENVIRONMENT_POWER:
            r.kind = EnvironmentKind::power;
            r.power_mw = e->data.power.power;
            r.power_limit_mw = e->data.power.powerLimit;
            break;
          case CUPTI_ACTIVITY_ENVIRONMENT_COOLING:
            r.kind = EnvironmentKind::cooling;
            r.fan_percent = e->data.cooling.fanSpeed;
            break;
          default:
            continue;
        }
        records.environment.push_back(r);
        break;
      }
      default:
        break;  // other kinds are not enabled
    }
  }
}

void CuptiCollector::State::finish() {
  for (auto k : enabled) cuptiActivityDisable(k);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard lock(g_active_mutex);
  g_active = nullptr;
}

std::string cupti_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuptiGetTimestamp), &info) == 0 || info.dli_fname == nullptr)
    return {};
  return info.dli_fname;
}

CuptiCollector::CuptiCollector(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::unique_ptr<CuptiCollector> CuptiCollector::start(const TraceOptions& options, std::string& why,
                                                      std::string& warning) {
  std::string no_gpu;
  if (!cuda_available(&no_gpu)) {
    why = fmt::format("no CUDA device ({}); no GPU trace is collected", no_gpu);
    return nullptr;
  }
  // A profiler that subscribed to CUPTI's callbacks makes a second subscriber fail: probe for it.
  CUpti_SubscriberHandle probe = nullptr;
  const CUptiResult sub = cuptiSubscribe(&probe, &ignore_callback, nullptr);
  if (sub == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    why = other_profiler_text();
    return nullptr;
  }
  if (sub == CUPTI_SUCCESS) cuptiUnsubscribe(probe);

  g_buffer_bytes = std::max<std::size_t>(options.buffer_bytes, 64u << 10);
  if (!g_callbacks_registered) {
    const CUptiResult r = cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed);
    if (r != CUPTI_SUCCESS) {
      why =
          r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
              ? other_profiler_text()
              : fmt::format("CUPTI activity callbacks could not be registered: {}", result_text(r));
      return nullptr;
    }
    g_callbacks_registered = true;
  }
  cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);  // thread ids as the OS shows them

  auto state = std::make_unique<State>();
  state->options = options;
  {
    std::lock_guard lock(g_active_mutex);
    g_active = state.get();
  }
  auto fail = [&](const std::string& text) -> std::unique_ptr<CuptiCollector> {
    state->finish();
    why = text;
    return nullptr;
  };
  auto enable = [&](CUpti_ActivityKind kind, const char* what, bool required) -> bool {
    const CUptiResult r = cuptiActivityEnable(kind);
    if (r == CUPTI_SUCCESS) {
      state->enabled.push_back(kind);
      return true;
    }
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      fail(other_profiler_text());
      return false;
    }
    if (required) {
      fail(fmt::format("CUPTI cannot trace {}: {}", what, result_text(r)));
      return false;
    }
    warning += fmt::format("{}CUPTI cannot record {} ({}); they are left out",
                           warning.empty() ? "" : "; ", what, result_text(r));
    return true;
  };
  if (!enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernels", true)) return nullptr;
  if (!enable(CUPTI_ACTIVITY_KIND_MEMCPY, "memory copies", true)) return nullptr;
  if (!enable(CUPTI_ACTIVITY_KIND_MEMSET, "memsets", true)) return nullptr;
  if (options.runtime_api && !enable(CUPTI_ACTIVITY_KIND_RUNTIME, "runtime API calls", true))
    return nullptr;
  if (options.nvtx) {
    if (!enable(CUPTI_ACTIVITY_KIND_MARKER, "NVTX markers", false)) return nullptr;
    if (!enable(CUPTI_ACTIVITY_KIND_MARKER_DATA, "NVTX marker data", false)) return nullptr;
    const char* injected = std::getenv("NVTX_INJECTION64_PATH");
    if (injected == nullptr || std::string_view(injected).find("cupti") == std::string_view::npos)
      warning += fmt::format(
          "{}NVTX ranges will be missing: NVTX_INJECTION64_PATH does not point at libcupti "
          "(call hisparse::trace::prepare_nvtx_injection() before the first NVTX range, or "
          "export NVTX_INJECTION64_PATH={})",
          warning.empty() ? "" : "; ", cupti_library_path());
  }
  // Device records are optional: stop() fills them in from the runtime when CUPTI has none.
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DEVICE) == CUPTI_SUCCESS)
    state->enabled.push_back(CUPTI_ACTIVITY_KIND_DEVICE);
  if (options.environment && !enable(CUPTI_ACTIVITY_KIND_ENVIRONMENT, "environment samples", false))
    return nullptr;

  state->records.clock.push_back(sample_clocks());
  return std::unique_ptr<CuptiCollector>(new CuptiCollector(std::move(state)));
}

TraceRecords CuptiCollector::stop() {
  if (stopped_) return {};
  stopped_ = true;
  // Everything launched so far must finish before its records can be flushed.
  const cudaError_t sync = cudaDeviceSynchronize();
  state_->records.clock.push_back(sample_clocks());
  state_->finish();
  TraceRecords out;
  {
    std::lock_guard lock(state_->mutex);
    out = std::move(state_->records);
  }
  // CUPTI emits device records only for contexts created while it traces: fill in the others.
  std::set<std::uint32_t> seen;
  for (const auto& k : out.kernels) seen.insert(k.device);
  for (const auto& m : out.memcpys) seen.insert(m.device);
  for (const auto& m : out.memsets) seen.insert(m.device);
  for (const auto& d : out.devices) seen.erase(d.id);
  for (const auto id : seen) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, static_cast<int>(id)) != cudaSuccess) continue;
    DeviceRecord d;
    d.id = id;
    d.name = p.name;
    d.multiprocessors = static_cast<std::uint32_t>(p.multiProcessorCount);
    d.compute_major = static_cast<std::uint32_t>(p.major);
    d.compute_minor = static_cast<std::uint32_t>(p.minor);
    d.global_memory_bytes = p.totalGlobalMem;
    d.l2_bytes = static_cast<std::uint32_t>(p.l2CacheSize);
    out.devices.push_back(std::move(d));
  }
  if (sync != cudaSuccess)
    out.label += fmt::format(" (device error at trace stop: {})", cudaGetErrorString(sync));
  return out;
}

CuptiCollector::~CuptiCollector() {
  if (!stopped_) (void)stop();
}

}  // namespace hisparse::trace::detail
