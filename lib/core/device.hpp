// Where work runs: the CUDA device or the CPU reference backend.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace hisparse {

enum class Backend { cpu, cuda };

[[nodiscard]] std::string_view name_of(Backend b) noexcept;

/// True when this build contains the CUDA backend (independent of whether a GPU is present).
[[nodiscard]] bool cuda_compiled() noexcept;
/// True when a usable CUDA device is present; otherwise `why` (if given) says what is missing.
[[nodiscard]] bool cuda_available(std::string* why = nullptr);

/// Resolves "auto" | "cuda" | "cpu". "auto" gives cuda when available. Throws Error naming
/// `where` when cuda is requested but unavailable, or when the name is unknown.
[[nodiscard]] Backend resolve_backend(std::string_view requested, const std::string& where);

struct DeviceProperties {
  std::string name;  ///< "NVIDIA H200" or the CPU model name
  Backend backend = Backend::cpu;
  int index = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;       ///< SMs (cuda) or hardware threads (cpu)
  std::size_t total_memory = 0;  ///< device memory (cuda) or physical RAM (cpu), bytes
  std::size_t free_memory = 0;
  std::size_t l2_bytes = 0;
  std::size_t max_shared_per_block_optin = 0;
  int driver_version = 0;  ///< e.g. 13000
  int runtime_version = 0;
};

class Device {
 public:
  [[nodiscard]] static Device cpu() { return Device(Backend::cpu, 0); }
  [[nodiscard]] static Device cuda(int index = 0) { return Device(Backend::cuda, index); }
  [[nodiscard]] static Device for_backend(Backend b) { return Device(b, 0); }

  [[nodiscard]] Backend backend() const noexcept { return backend_; }
  [[nodiscard]] int index() const noexcept { return index_; }
  [[nodiscard]] bool is_cuda() const noexcept { return backend_ == Backend::cuda; }
  /// Queries the properties (and makes this device current for CUDA).
  [[nodiscard]] DeviceProperties properties() const;
  /// Makes this the current CUDA device (no-op for the CPU).
  void activate() const;
  /// Waits for all work on the device (no-op for the CPU).
  void synchronize() const;

 private:
  Device(Backend b, int index) : backend_(b), index_(index) {}
  Backend backend_;
  int index_;
};

}  // namespace hisparse
