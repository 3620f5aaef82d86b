#include "trace/trace_session.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/config.hpp"
#include "core/error.hpp"

#if HISPARSE_WITH_CUDA
#include "trace/cupti_collector.hpp"
#endif

extern char** environ;

namespace hisparse::trace {

namespace {
std::atomic<bool> g_session_open{false};
std::atomic<bool> g_collecting{false};
}  // namespace

std::optional<std::string> other_profiler() {
  if (const char* p = std::getenv("CUDA_INJECTION64_PATH"); p != nullptr && *p != '\0')
    return fmt::format(
        "CUDA_INJECTION64_PATH={} (a profiler such as Nsight Systems or Nsight Compute is "
        "attached)",
        p);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view var(*e);
    if (var.rfind("NSYS_", 0) == 0)
      return fmt::format("{} is set (Nsight Systems is profiling this process)",
                         var.substr(0, var.find('=')));
  }
  if (const char* p = std::getenv("NVTX_INJECTION64_PATH");
      p != nullptr && *p != '\0' && std::string_view(p).find("cupti") == std::string_view::npos)
    return fmt::format("NVTX_INJECTION64_PATH={} (NVTX is injected into another tool)", p);
  return std::nullopt;
}

std::string prepare_nvtx_injection() {
#if HISPARSE_WITH_CUDA
  if (const char* p = std::getenv("NVTX_INJECTION64_PATH"); p != nullptr && *p != '\0')
    return fmt::format("NVTX_INJECTION64_PATH is already set ({}); left as it is", p);
  if (auto other = other_profiler())
    return fmt::format("not injecting NVTX into CUPTI: {}", *other);
  const std::string path = detail::cupti_library_path();
  if (path.empty())
    return "the CUPTI library was not found in this process; NVTX ranges will be missing";
  if (setenv("NVTX_INJECTION64_PATH", path.c_str(), 0) != 0)
    return fmt::format("setenv(NVTX_INJECTION64_PATH) failed: {}", std::strerror(errno));
  return {};
#else
  return "this build has no CUDA backend: no NVTX and no CUPTI";
#endif
}

struct TraceSession::Impl {
  TraceOptions options;
  std::string message;
  bool open = false;  ///< holds the process-wide session slot
#if HISPARSE_WITH_CUDA
  std::unique_ptr<detail::CuptiCollector> collector;
#endif
};

TraceSession::TraceSession(TraceOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  bool expected = false;
  if (!g_session_open.compare_exchange_strong(expected, true))
    throw Error("trace session", "another TraceSession is already active in this process",
                "stop() the running session before starting the next (CUPTI's activity API is "
                "process-wide)");
  impl_->open = true;
  if (auto other = other_profiler()) {
    impl_->message =
        fmt::format("trace disabled: {}; its own timeline shows the same work", *other);
    return;
  }
#if HISPARSE_WITH_CUDA
  std::string why, warning;
  impl_->collector = detail::CuptiCollector::start(impl_->options, why, warning);
  g_collecting = impl_->collector != nullptr;
  impl_->message = impl_->collector ? warning : fmt::format("trace disabled: {}", why);
#else
  impl_->message = "trace disabled: this build has no CUDA backend (no CUPTI)";
#endif
}

TraceSession::~TraceSession() {
  if (!impl_) return;
  try {
    (void)stop();
  } catch (...) {  // a destructor must not throw; stop() reports through its records
  }
}

bool TraceSession::collecting() noexcept {
  return g_collecting;
}

bool TraceSession::active() const noexcept {
#if HISPARSE_WITH_CUDA
  return impl_->collector != nullptr;
#else
  return false;
#endif
}

const std::string& TraceSession::message() const noexcept {
  return impl_->message;
}

TraceRecords TraceSession::stop() {
  TraceRecords out;
#if HISPARSE_WITH_CUDA
  if (impl_->collector) {
    g_collecting = false;
    out = impl_->collector->stop();
    impl_->collector.reset();
  }
#endif
  if (impl_->open) {
    out.label = impl_->options.label + out.label;  // the collector appends stop-time problems
    impl_->open = false;
    g_session_open = false;
  }
  return out;
}

}  // namespace hisparse::trace
