#include "kernels/common/dynamic_shared.hpp"

#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.hpp"

namespace hisparse::kernels {
namespace {
std::mutex allowed_mutex;
std::map<std::pair<int, const void*>, std::size_t> allowed_bytes;  // (device, kernel) -> bytes
}  // namespace

void allow_dynamic_shared(const void* kernel, std::size_t bytes) {
  int device = 0;
  HISPARSE_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(allowed_mutex);
  std::size_t& allowed = allowed_bytes[{device, kernel}];
  if (bytes <= allowed) return;
  HISPARSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  allowed = bytes;
}

}  // namespace hisparse::kernels
