// Streams and events. On the CUDA backend they wrap cudaStream_t / cudaEvent_t; on the CPU
// backend work is synchronous, the stream is empty and events read the host's steady clock, so
// timing code is the same for both backends.
#pragma once

#include <chrono>

#include "core/device.hpp"

#if HISPARSE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hisparse {

#if HISPARSE_WITH_CUDA
using NativeStream = cudaStream_t;
#else
using NativeStream = void*;
#endif

class Event;

class Stream {
 public:
  /// A new non-blocking stream on the CUDA backend; an empty stream on the CPU.
  explicit Stream(Backend backend);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : backend_(o.backend_), native_(o.native_) { o.native_ = nullptr; }
  Stream& operator=(Stream&&) = delete;
  ~Stream();

  [[nodiscard]] Backend backend() const noexcept { return backend_; }
  [[nodiscard]] NativeStream native() const noexcept { return native_; }
  void synchronize() const;
  /// Later work on this stream waits until `event`'s recorded work has finished (no host wait).
  void wait(const Event& event) const;

 private:
  Backend backend_;
  NativeStream native_ = nullptr;
};

class Event {
 public:
  explicit Event(Backend backend);
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&&) = delete;
  ~Event();

  void record(const Stream& stream);
  void synchronize() const;
  /// Milliseconds from `start` to `end` (both recorded and complete).
  [[nodiscard]] static double elapsed_ms(const Event& start, const Event& end);

 private:
  friend class Stream;
  Backend backend_;
#if HISPARSE_WITH_CUDA
  cudaEvent_t native_ = nullptr;
#endif
  std::chrono::steady_clock::time_point host_time_{};
};

}  // namespace hisparse
