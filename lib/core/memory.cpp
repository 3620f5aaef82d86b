#include "core/memory.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {
constexpr std::size_t kPage = 4096;

/// Per kind: allocations to let through before the injected failure (armed while > 0), and the
/// live count.
struct KindCounters {
  std::atomic<std::size_t> fail_in{0};
  std::atomic<std::size_t> live{0};
};
std::array<KindCounters, 3> counters;

KindCounters& counters_of(MemoryKind kind) {
  return counters[static_cast<std::size_t>(kind)];
}

/// HISPARSE_FAIL_ALLOC=KIND:N, read once.
void arm_from_environment() {
  static const bool armed = [] {
    const char* value = std::getenv("HISPARSE_FAIL_ALLOC");
    if (!value || !*value) return false;
    const std::string v = value;
    const auto colon = v.find(':');
    const std::string kind = v.substr(0, colon);
    const std::size_t nth =
        colon == std::string::npos ? 1 : std::strtoull(v.c_str() + colon + 1, nullptr, 10);
    for (MemoryKind k : {MemoryKind::host, MemoryKind::pinned, MemoryKind::device})
      if (kind == name_of(k)) counters_of(k).fail_in = nth;
    return true;
  }();
  (void)armed;
}

/// Whether this allocation of `kind` is the one to fail.
bool injected_failure(MemoryKind kind) {
  arm_from_environment();
  auto& fail_in = counters_of(kind).fail_in;
  std::size_t n = fail_in.load();
  while (n > 0 && !fail_in.compare_exchange_weak(n, n - 1)) {
  }
  return n == 1;
}

[[noreturn]] void out_of_host_memory(const std::string& label, MemoryKind kind, std::size_t bytes,
                                     const char* what, const char* fix) {
  const std::size_t free = Device::cpu().properties().free_memory;
  throw OutOfMemoryError(label,
                         fmt::format("cannot {} {} of host memory ({} free)", what,
                                     format_bytes(bytes), format_bytes(free)),
                         fix, kind, bytes, free);
}

void* aligned_host(std::size_t bytes, const std::string& label, MemoryKind kind) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = injected_failure(kind) ? nullptr : std::aligned_alloc(kPage, rounded);
  if (!p)
    out_of_host_memory(label, kind, bytes, "allocate",
                       "reduce concurrency, context length or pool size");
  ++counters_of(kind).live;
  return p;
}
}  // namespace

const char* name_of(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::host:
      return "host";
    case MemoryKind::pinned:
      return "pinned";
    case MemoryKind::device:
      return "device";
  }
  return "host";
}

void inject_allocation_failure(MemoryKind kind, std::size_t nth) noexcept {
  arm_from_environment();  // a test's own arming wins over the environment's
  counters_of(kind).fail_in = nth;
}

std::size_t live_allocations(MemoryKind kind) noexcept {
  return counters_of(kind).live.load();
}

std::string format_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.2f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

Allocation Allocation::host(std::size_t bytes, std::string label) {
  Allocation a = unallocated(bytes, MemoryKind::host, Backend::cpu);
  a.host_ = a.device_ = aligned_host(bytes, label, MemoryKind::host);
  return a;
}

Allocation Allocation::unallocated(std::size_t bytes, MemoryKind kind, Backend backend) {
  Allocation a;
  a.bytes_ = bytes;
  a.kind_ = kind;
  a.backend_ = backend;
  return a;
}

Allocation Allocation::pinned(std::size_t bytes, Backend backend, std::string label) {
  if (backend == Backend::cpu) {  // the CPU twin's "pinned" memory is plain host memory
    Allocation a = unallocated(bytes, MemoryKind::pinned, Backend::cpu);
    a.host_ = a.device_ = aligned_host(bytes, label, MemoryKind::pinned);
    return a;
  }
#if HISPARSE_WITH_CUDA
  Allocation a = unallocated(bytes, MemoryKind::pinned, Backend::cuda);
  if (bytes == 0) return a;
  const char* fix =
      "reduce concurrency, context length or the host pool size, or raise the memlock limit";
  if (injected_failure(MemoryKind::pinned))
    out_of_host_memory(label, MemoryKind::pinned, bytes, "pin", fix);
  const cudaError_t st =
      cudaHostAlloc(&a.host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (st != cudaSuccess) {
    cudaGetLastError();
    out_of_host_memory(label, MemoryKind::pinned, bytes, "pin", fix);
  }
  ++counters_of(MemoryKind::pinned).live;
  HISPARSE_CUDA_CHECK(cudaHostGetDevicePointer(&a.device_, a.host_, 0));
  return a;
#else
  throw Error(label, "pinned memory needs the CUDA backend", "use --backend cpu");
#endif
}

Allocation Allocation::device(std::size_t bytes, Backend backend, std::string label) {
  if (backend == Backend::cpu) {  // the CPU twin's "device" memory is plain host memory
    Allocation a = unallocated(bytes, MemoryKind::device, Backend::cpu);
    a.host_ = a.device_ = aligned_host(bytes, label, MemoryKind::device);
    return a;
  }
#if HISPARSE_WITH_CUDA
  Allocation a = unallocated(bytes, MemoryKind::device, Backend::cuda);
  if (bytes == 0) return a;
  const bool injected = injected_failure(MemoryKind::device);
  const cudaError_t st = injected ? cudaErrorMemoryAllocation : cudaMalloc(&a.device_, bytes);
  if (st != cudaSuccess) {
    if (!injected) cudaGetLastError();
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw OutOfMemoryError(
        label,
        fmt::format("cannot allocate {} of GPU memory ({} free of {})", format_bytes(bytes),
                    format_bytes(free), format_bytes(total)),
        "reduce concurrency, context length or hot-buffer size (see `hisparse-bench plan`)",
        MemoryKind::device, bytes, free);
  }
  ++counters_of(MemoryKind::device).live;
  return a;
#else
  throw Error(label, "device memory needs the CUDA backend", "use --backend cpu");
#endif
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
    backend_ = o.backend_;
  }
  return *this;
}

void Allocation::release() noexcept {
  if (host_ || device_) --counters_of(kind_).live;
  if (backend_ == Backend::cpu || kind_ == MemoryKind::host) {
    std::free(host_);
  } else {
#if HISPARSE_WITH_CUDA
    if (kind_ == MemoryKind::pinned && host_) cudaFreeHost(host_);
    if (kind_ == MemoryKind::device && device_) cudaFree(device_);
#endif
  }
  host_ = device_ = nullptr;
  bytes_ = 0;
}

void copy_bytes(void* dst, const void* src, std::size_t bytes, Backend backend) {
  if (bytes == 0) return;
  if (backend == Backend::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if HISPARSE_WITH_CUDA
  HISPARSE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // cudaMemcpy from pageable host memory may return before the DMA has landed, and the project's
  // streams are non-blocking (they do not wait for the legacy default stream): without this wait
  // a kernel launched right after could read stale bytes (seen on the H200 as rare GPU-vs-twin
  // mismatches in tests that upload inputs with copy_bytes).
  HISPARSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
#endif
}

void zero_bytes(void* dst, std::size_t bytes, Backend backend) {
  if (bytes == 0) return;
  if (backend == Backend::cpu) {
    std::memset(dst, 0, bytes);
    return;
  }
#if HISPARSE_WITH_CUDA
  HISPARSE_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  HISPARSE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // see copy_bytes
#endif
}

}  // namespace hisparse
