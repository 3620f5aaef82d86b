// Tuning constants of the swap-in kernels (sm_90, H200). Changing them changes speed only, never
// results: the contract does not depend on the launch shape. Figures behind each choice are in
// reports/hotcache_tuning.md.
#pragma once

namespace hisparse::kernels::swap_in_config {

/// Threads of the resolve kernel (one block per batch row): more threads shorten the scans over
/// top_k entries and hot slots at small batch.
inline constexpr int kResolveThreads = 1024;
/// Entries of the selection / hot slots each resolve thread holds in registers per tile: the
/// loads of a whole tile (kResolveThreads * kResolveItems entries) are in flight together.
inline constexpr int kResolveItems = 4;
/// Copy kernel: threads per block, 16-B loads in flight per thread, resident blocks per SM.
inline constexpr int kCopyThreads = 128;
inline constexpr int kCopyUnroll = 4;
inline constexpr int kCopyBlocksPerSm = 8;
/// By default a row's plan is grouped by host address when the call has at least kSortMinBatch
/// rows and the row at least kSortMissesFrom misses: at batch 64-100 that took 5-18% off the copy
/// (host page translation walks one stretch at a time); at batch 1 it only adds the bucket scan.
inline constexpr int kSortMissesFrom = 32;
inline constexpr int kSortMinBatch = 8;
/// Largest batch the copy kernel's shared-memory chunk prefix holds.
inline constexpr int kMaxBatch = 4096;

}  // namespace hisparse::kernels::swap_in_config
