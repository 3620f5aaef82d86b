// Owning memory with RAII. Three kinds:
//  - host:   plain page-aligned host memory;
//  - pinned: page-locked host memory mapped into the GPU address space (zero-copy readable by
//            kernels through device_data()); on the CPU backend it is plain host memory;
//  - device: GPU memory (cudaMalloc); on the CPU backend it is plain host memory, so components
//            written against device_data() run unchanged on the CPU twin.
// Allocation failures name what was being allocated, its size and what is free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "core/device.hpp"

namespace hisparse {

enum class MemoryKind { host, pinned, device };
[[nodiscard]] const char* name_of(MemoryKind kind) noexcept;

/// Allocation failure on demand, for tests of every allocation site's message and clean-up on
/// the CPU: the `nth` next allocation of `kind` (counting from 1; 0 disarms) fails as if its
/// allocator had no memory. The environment variable HISPARSE_FAIL_ALLOC=KIND:N (KIND host,
/// pinned or device) arms the same for a whole process, read at its first allocation.
void inject_allocation_failure(MemoryKind kind, std::size_t nth) noexcept;
/// Allocations of `kind` made and not yet released (of more than 0 bytes), to check clean-up.
[[nodiscard]] std::size_t live_allocations(MemoryKind kind) noexcept;

class Allocation {
 public:
  Allocation() = default;
  /// `label` names the purpose in error messages, e.g. "host KV pool".
  static Allocation host(std::size_t bytes, std::string label);
  static Allocation pinned(std::size_t bytes, Backend backend, std::string label);
  static Allocation device(std::size_t bytes, Backend backend, std::string label);

  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  ~Allocation() { release(); }

  /// Pointer valid on the host (nullptr for GPU device memory).
  [[nodiscard]] void* host_data() const noexcept { return host_; }
  /// Pointer valid where the backend's kernels run (GPU address, or host address on the CPU).
  [[nodiscard]] void* device_data() const noexcept { return device_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] MemoryKind kind() const noexcept { return kind_; }
  [[nodiscard]] Backend backend() const noexcept { return backend_; }
  [[nodiscard]] bool empty() const noexcept { return bytes_ == 0; }

 private:
  /// Size, kind and backend set, no memory yet.
  static Allocation unallocated(std::size_t bytes, MemoryKind kind, Backend backend);
  void release() noexcept;
  void* host_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::host;
  Backend backend_ = Backend::cpu;
};

/// Typed view over an Allocation: `Buffer<float>::device(n, backend, "scores")`.
template <class T>
class Buffer {
 public:
  using value_type = T;
  Buffer() = default;
  static Buffer host(std::size_t n, std::string label) {
    return Buffer(Allocation::host(n * sizeof(T), std::move(label)), n);
  }
  static Buffer pinned(std::size_t n, Backend b, std::string label) {
    return Buffer(Allocation::pinned(n * sizeof(T), b, std::move(label)), n);
  }
  static Buffer device(std::size_t n, Backend b, std::string label) {
    return Buffer(Allocation::device(n * sizeof(T), b, std::move(label)), n);
  }
  /// Workspace kept across calls: reallocates (dropping the contents) only when `n` elements do
  /// not fit, so a steady decode step allocates nothing. Returns device_data().
  T* reserve_device(std::size_t n, Backend b, const char* label) {
    if (size_ < n) *this = device(n, b, label);
    return device_data();
  }
  [[nodiscard]] T* device_data() const noexcept { return static_cast<T*>(alloc_.device_data()); }
  [[nodiscard]] T* host_data() const noexcept { return static_cast<T*>(alloc_.host_data()); }
  /// Host view; only for host and pinned memory (or device memory on the CPU backend).
  [[nodiscard]] std::span<T> host_span() const noexcept { return {host_data(), size_}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] const Allocation& allocation() const noexcept { return alloc_; }

 private:
  Buffer(Allocation a, std::size_t n) : alloc_(std::move(a)), size_(n) {}
  Allocation alloc_;
  std::size_t size_ = 0;
};

/// Byte copy between any two kinds; synchronous: the bytes have landed when it returns, also for
/// work queued next on a non-blocking stream. Works on both backends.
void copy_bytes(void* dst, const void* src, std::size_t bytes, Backend backend);
/// Sets `bytes` bytes at `dst` to zero (synchronous, like copy_bytes). Works on both backends.
void zero_bytes(void* dst, std::size_t bytes, Backend backend);
/// Human-readable size: "1.50 GiB".
[[nodiscard]] std::string format_bytes(std::size_t bytes);

}  // namespace hisparse
