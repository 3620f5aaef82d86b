#include "core/memory.hpp"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {
constexpr std::size_t kPage = 4096;

void* aligned_host(std::size_t bytes, const std::string& label) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (!p) {
    const auto props = Device::cpu().properties();
    throw Error(label,
                fmt::format("cannot allocate {} of host memory ({} free)", format_bytes(bytes),
                            format_bytes(props.free_memory)),
                "reduce concurrency, context length or pool size");
  }
  return p;
}
}  // namespace

std::string format_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.2f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

Allocation Allocation::host(std::size_t bytes, std::string label) {
  Allocation a = unallocated(bytes, MemoryKind::host, Backend::cpu);
  a.host_ = a.device_ = aligned_host(bytes, label);
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
    Allocation a = host(bytes, std::move(label));
    a.kind_ = MemoryKind::pinned;
    return a;
  }
#if HISPARSE_WITH_CUDA
  Allocation a = unallocated(bytes, MemoryKind::pinned, Backend::cuda);
  if (bytes == 0) return a;
  const cudaError_t st =
      cudaHostAlloc(&a.host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (st != cudaSuccess) {
    cudaGetLastError();
    const auto props = Device::cpu().properties();
    throw Error(
        label,
        fmt::format("cannot pin {} of host memory ({} free, {})", format_bytes(bytes),
                    format_bytes(props.free_memory), cudaGetErrorString(st)),
        "reduce concurrency, context length or the host pool size, or raise the memlock limit");
  }
  HISPARSE_CUDA_CHECK(cudaHostGetDevicePointer(&a.device_, a.host_, 0));
  return a;
#else
  throw Error(label, "pinned memory needs the CUDA backend", "use --backend cpu");
#endif
}

Allocation Allocation::device(std::size_t bytes, Backend backend, std::string label) {
  if (backend == Backend::cpu) {  // the CPU twin's "device" memory is plain host memory
    Allocation a = host(bytes, std::move(label));
    a.kind_ = MemoryKind::device;
    return a;
  }
#if HISPARSE_WITH_CUDA
  Allocation a = unallocated(bytes, MemoryKind::device, Backend::cuda);
  if (bytes == 0) return a;
  const cudaError_t st = cudaMalloc(&a.device_, bytes);
  if (st != cudaSuccess) {
    cudaGetLastError();
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw Error(
        label,
        fmt::format("cannot allocate {} of GPU memory ({} free of {})", format_bytes(bytes),
                    format_bytes(free), format_bytes(total)),
        "reduce concurrency, context length or hot-buffer size (see `hisparse-bench plan`)");
  }
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
