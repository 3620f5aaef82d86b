// Launch shapes of the host gather kernels (sm_90).
#pragma once

#include <cstddef>

namespace hisparse::kernels::host_gather_config {

/// sm_loads: threads per block, 16-byte loads in flight per thread, default blocks per SM.
inline constexpr int kSmThreads = 128;
inline constexpr int kSmUnroll = 4;
inline constexpr int kSmBlocksPerSm = 16;

/// bulk_async: rows in flight per lane, default blocks (one warp each) per SM, and the shared
/// memory one block may use for its row slots (fewer lanes work when rows are large).
inline constexpr int kBulkStages = 2;
inline constexpr int kBulkBlocksPerSm = 4;
inline constexpr std::size_t kBulkSharedMax = 56 * 1024;

constexpr std::size_t bulk_barrier_bytes(int lanes) {
  return (static_cast<std::size_t>(lanes) * kBulkStages * 8 + 15) / 16 * 16;
}
constexpr std::size_t bulk_shared_bytes(int lanes, std::size_t row_bytes) {
  return bulk_barrier_bytes(lanes) + static_cast<std::size_t>(lanes) * kBulkStages * row_bytes;
}
/// Lanes of a bulk block for rows of `row_bytes` (0: not even one lane's slots fit).
constexpr int bulk_lanes(std::size_t row_bytes) {
  int lanes = 32;
  while (lanes > 0 && bulk_shared_bytes(lanes, row_bytes) > kBulkSharedMax) --lanes;
  return lanes;
}

}  // namespace hisparse::kernels::host_gather_config
