#include "core/stream.hpp"

#include "core/cuda_check.hpp"

namespace hisparse {

Stream::Stream(Backend backend) : backend_(backend) {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda)
    HISPARSE_CUDA_CHECK(cudaStreamCreateWithFlags(&native_, cudaStreamNonBlocking));
#endif
}

Stream::~Stream() {
#if HISPARSE_WITH_CUDA
  if (native_) cudaStreamDestroy(native_);
#endif
}

void Stream::synchronize() const {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaStreamSynchronize(native_));
#endif
}

void Stream::wait(const Event& event) const {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaStreamWaitEvent(native_, event.native_));
#else
  (void)event;  // CPU work is synchronous: recorded work has finished
#endif
}

Event::Event(Backend backend) : backend_(backend) {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaEventCreate(&native_));
#endif
}

Event::Event(Event&& o) noexcept : backend_(o.backend_), host_time_(o.host_time_) {
#if HISPARSE_WITH_CUDA
  native_ = o.native_;
  o.native_ = nullptr;
#endif
}

Event::~Event() {
#if HISPARSE_WITH_CUDA
  if (native_) cudaEventDestroy(native_);
#endif
}

void Event::record(const Stream& stream) {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) {
    HISPARSE_CUDA_CHECK(cudaEventRecord(native_, stream.native()));
    return;
  }
#endif
  (void)stream;
  host_time_ = std::chrono::steady_clock::now();
}

void Event::synchronize() const {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaEventSynchronize(native_));
#endif
}

double Event::elapsed_ms(const Event& start, const Event& end) {
#if HISPARSE_WITH_CUDA
  if (start.backend_ == Backend::cuda) {
    float ms = 0.0f;
    HISPARSE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.native_, end.native_));
    return static_cast<double>(ms);
  }
#endif
  return std::chrono::duration<double, std::milli>(end.host_time_ - start.host_time_).count();
}

}  // namespace hisparse
