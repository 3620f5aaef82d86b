#include "kernels/common/device_cache.hpp"

#include <array>
#include <atomic>

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"

namespace hisparse::kernels {

int multiprocessors() {
  int device = 0;
  HISPARSE_CUDA_CHECK(cudaGetDevice(&device));
  // 0 = not read yet; two threads reading it at once store the same value.
  static std::array<std::atomic<int>, 64> cached{};
  std::atomic<int>* slot = device >= 0 && device < static_cast<int>(cached.size())
                               ? &cached[static_cast<std::size_t>(device)]
                               : nullptr;
  if (slot)
    if (const int sms = slot->load(std::memory_order_relaxed); sms > 0) return sms;
  int sms = 0;
  HISPARSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (slot) slot->store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace hisparse::kernels
