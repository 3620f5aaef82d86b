// Tuning constants of the fused plane scan + selection kernels (sm_90: 228 KB shared memory per
// SM).
#pragma once

#include <cstdint>

namespace hisparse::kernels::fathom {

inline constexpr int kScanThreads = 256;  ///< one token per thread per round
inline constexpr int kScanRoundTokens = kScanThreads;
/// Shared memory one scan block may use at most (candidate buffers + one tile of planes); the
/// buffers are sized to need much less (about 50 KB at top_k 512) so that 4 blocks share an SM.
inline constexpr std::int64_t kScanSharedBudget = 200 * 1024;
/// Plane bytes of one tile at most (tile blocks are lowered for large budgets).
inline constexpr std::int64_t kScanTileBytesMax = 64 * 1024;
/// Blocks per tile: host-offloaded planes are read in runs of tile_blocks x 8 bytes per
/// (channel, plane), so longer tiles give longer PCIe reads.
inline constexpr int kScanTileBlocksHbm = 16;
inline constexpr int kScanTileBlocksHost = 64;
/// Scan blocks per SM the chunking aims for.
inline constexpr int kScanBlocksPerSm = 4;
inline constexpr int kFinalizeThreads = 512;

}  // namespace hisparse::kernels::fathom
