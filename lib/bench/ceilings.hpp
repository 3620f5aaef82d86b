// Measured hardware ceilings that kernel results are reported against (PCIe host->device,
// HBM device copy). Measured at run start on the device in use, never assumed.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device.hpp"

namespace hisparse {

struct Ceilings {
  std::string device;  ///< device name the figures come from
  Backend backend = Backend::cpu;
  double h2d_gbps = 0.0;  ///< pinned host -> device cudaMemcpy, GB/s (1e9 B/s)
  double d2h_gbps = 0.0;
  double hbm_copy_gbps = 0.0;  ///< device -> device copy, bytes read + written, GB/s
  /// Zero-copy reads: SM loads of mapped pinned memory into HBM (kernels/common/host_gather,
  /// 4 KiB contiguous rows), GB/s read. The path the swap-in and the plane staging take; on a
  /// virtualised node it can sit well below h2d_gbps.
  double sm_read_gbps = 0.0;
  double host_copy_gbps = 0.0;  ///< CPU memcpy, bytes read + written (CPU backend only)
  std::size_t bytes = 0;        ///< transfer size used
};

/// Measures the ceilings (median of `repeats` timed copies after one warm-up). On the CPU backend
/// only host_copy_gbps is measured. `bytes` is the copy size (the SM-read probe rounds it down to
/// whole 4 KiB rows).
[[nodiscard]] Ceilings measure_ceilings(const Device& device,
                                        std::size_t bytes = std::size_t{1} << 30, int repeats = 5);

void to_json(nlohmann::json& j, const Ceilings& c);

}  // namespace hisparse
