// Tuning constants of the swap-in kernels (sm_90, H200). Changing them changes speed only, never
// results: the contract does not depend on the launch shape.
#pragma once

namespace hisparse::kernels::swap_in_config {

/// Threads of the resolve kernel (one block per batch row): more threads shorten the scans over
/// top_k entries and hot slots at small batch.
inline constexpr int kResolveThreads = 1024;
/// Copy kernel: threads per block, 16-B loads in flight per thread, resident blocks per SM.
inline constexpr int kCopyThreads = 128;
inline constexpr int kCopyUnroll = 4;
inline constexpr int kCopyBlocksPerSm = 8;
/// Largest batch the copy kernel's shared-memory chunk prefix holds.
inline constexpr int kMaxBatch = 4096;

}  // namespace hisparse::kernels::swap_in_config
