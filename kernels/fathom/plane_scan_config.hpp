// Tuning constants of the fused plane scan + selection kernels (sm_90: 228 KB shared memory per
// SM).
#pragma once

#include <cstdint>

namespace hisparse::kernels::fathom {

inline constexpr int kScanThreads = 256;  ///< 8 warps; a warp scores one 64-token block at a time
inline constexpr int kScanWarps = kScanThreads / 32;
/// Tokens one round of the block scores (every warp one block); candidate buffers are checked
/// for compaction after every round.
inline constexpr int kScanRoundTokens = kScanWarps * 64;
/// Shared memory of one scan block: the candidate buffers grow to use the target (2 blocks per
/// SM, which is also what the registers allow; a larger slack means fewer compactions), and may
/// use up to the budget for large top_k.
inline constexpr std::int64_t kScanSharedTarget = 110 * 1024;
inline constexpr std::int64_t kScanSharedBudget = 200 * 1024;
/// Candidate slack per head: at least 2 rounds, at most 8.
inline constexpr int kScanSlackRoundsMin = 2;
inline constexpr int kScanSlackRoundsMax = 8;
/// Plane bytes of one pipeline stage at most (tile blocks are lowered for large budgets).
inline constexpr std::int64_t kScanTileBytesMax = 32 * 1024;
/// Blocks per tile (a multiple of 8): host-offloaded planes are read in runs of tile_blocks x 8
/// bytes per (channel, plane), so longer tiles give longer PCIe reads (512 B at 64 blocks; the
/// larger tile may leave one scan block per SM, which the PCIe-bound host scan does not need);
/// HBM tiles stay inside one 16-block superblock.
inline constexpr int kScanTileBlocksHbm = 16;
inline constexpr int kScanTileBlocksHost = 64;
inline constexpr int kScanTileBlocksMin = 8;
/// Scan blocks resident per SM (117 registers x 256 threads, about 100 KB shared memory): the
/// chunking fills whole waves of them.
inline constexpr int kScanBlocksPerSm = 2;
inline constexpr int kFinalizeThreads = 512;

}  // namespace hisparse::kernels::fathom
