#include "core/device.hpp"

#include <unistd.h>

#include <fstream>
#include <thread>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace hisparse {

std::string_view name_of(Backend b) noexcept {
  return b == Backend::cuda ? "cuda" : "cpu";
}

bool cuda_compiled() noexcept {
  return HISPARSE_WITH_CUDA != 0;
}

bool cuda_available(std::string* why) {
#if HISPARSE_WITH_CUDA
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(st) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device present";
    return false;
  }
  return true;
#else
  if (why) *why = "this build has no CUDA backend (configured without nvcc)";
  return false;
#endif
}

Backend resolve_backend(std::string_view requested, const std::string& where) {
  if (requested == "cpu") return Backend::cpu;
  if (requested == "auto") return cuda_available() ? Backend::cuda : Backend::cpu;
  if (requested == "cuda") {
    std::string why;
    if (!cuda_available(&why))
      throw Error(where, "backend 'cuda' requested but " + why,
                  "run on a machine with an NVIDIA GPU, or use backend 'cpu' or 'auto'");
    return Backend::cuda;
  }
  throw Error(where, "unknown backend '" + std::string(requested) + "'", "use auto, cuda or cpu");
}

namespace {
DeviceProperties cpu_properties() {
  DeviceProperties p;
  p.backend = Backend::cpu;
  p.name = "CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) p.name = line.substr(colon + 2);
      break;
    }
  }
  p.multiprocessors = static_cast<int>(std::thread::hardware_concurrency());
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long avail = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  p.total_memory = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
  p.free_memory = static_cast<std::size_t>(avail) * static_cast<std::size_t>(page);
  return p;
}
}  // namespace

DeviceProperties Device::properties() const {
  if (backend_ == Backend::cpu) return cpu_properties();
#if HISPARSE_WITH_CUDA
  activate();
  cudaDeviceProp prop{};
  HISPARSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, index_));
  DeviceProperties p;
  p.backend = Backend::cuda;
  p.index = index_;
  p.name = prop.name;
  p.compute_major = prop.major;
  p.compute_minor = prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  p.total_memory = prop.totalGlobalMem;
  p.l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  p.max_shared_per_block_optin = prop.sharedMemPerBlockOptin;
  std::size_t free = 0, total = 0;
  HISPARSE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  p.free_memory = free;
  HISPARSE_CUDA_CHECK(cudaDriverGetVersion(&p.driver_version));
  HISPARSE_CUDA_CHECK(cudaRuntimeGetVersion(&p.runtime_version));
  return p;
#else
  throw Error("backend", "this build has no CUDA backend",
              "rebuild with nvcc, or use --backend cpu");
#endif
}

void Device::activate() const {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaSetDevice(index_));
#endif
}

void Device::synchronize() const {
#if HISPARSE_WITH_CUDA
  if (backend_ == Backend::cuda) HISPARSE_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

#if HISPARSE_WITH_CUDA
namespace detail {
void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  throw CudaError(call, file, line, static_cast<int>(code), cudaGetErrorName(code),
                  cudaGetErrorString(code));
}
}  // namespace detail
#endif

}  // namespace hisparse
