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
/// Copy kernel: threads per block, 16-B loads in flight per thread, resident blocks per SM (the
/// launch-bounds occupancy hint).
inline constexpr int kCopyThreads = 128;
inline constexpr int kCopyUnroll = 4;
inline constexpr int kCopyBlocksPerSm = 8;

/// Calls of at least kLargeBatch rows are bound by host page translation, not latency; for them
/// (figures in reports/hotcache_tuning.md, batch 64 and 100 on the H200):
///  - each row's plan is grouped by host address when it has at least kSortMissesFrom misses
///    (batch 100 / 20%: 829 -> 717 us);
///  - the copy grid is kCopyGridPerSmLarge blocks per SM (more than fit at once), so the chunks
///    run in many waves, each over a band of requests (batch 100 / 20%: 717 -> 629 us; batch 64 /
///    20%: 446 -> 409 us with the hash resolve; with the direct resolve, 2026-12-01 sweep: 16 x 4
///    gave 600 / 378 us, 32 x 2 gives 581 / 377 us).
/// Smaller calls, and calls with the speculative gather (batch 8 included), are latency-bound:
/// no grouping, kCopyBlocksPerSm blocks per SM (batch 8 with the speculative gather on the
/// large grid: 0.1% 15.1 us, 20% 59.6 us; on this one 13.3 / 56.3 us).
/// At every batch a chunk is kCopyRowsPerChunk rows. At batch 1 that beat the chunk size giving
/// each block at most one chunk (its search costs every block about 3 us): 20% miss 23.4 ->
/// 20.5 us, 100% 45.6 -> 42.5 us (swap_in_tune, 2026-12-01).
inline constexpr int kLargeBatch = 8;
inline constexpr int kSortMissesFrom = 32;
inline constexpr int kCopyGridPerSmLarge = 32;
inline constexpr int kCopyRowsPerChunk = 2;
/// ResolvePath::direct: rows of at most this many tokens use a direct token-indexed table (4 B
/// per token of shared memory) instead of the selection hash; the launcher uses it only while the
/// kernel's shared memory stays within kMaxResolveSharedBytes (the sm_90 opt-in limit).
inline constexpr int kResolveDirectTokens = 32768;
inline constexpr int kMaxResolveSharedBytes = 227 * 1024;
/// MissPlan::fetched: at batch < kLargeBatch the resolve block fetches a row's misses itself when
/// they fit in this many bytes of its spare shared memory (49 rows of 656 B). One block moves
/// them in about one PCIe round trip, before the copy kernel's hand-off would end.
inline constexpr int kResolveFetchBytes = 32 * 1024;
/// MissPlan::ready (the early hand-off) is used by calls of fewer than this many rows. From
/// batch 8 the large copy grid's waiting blocks slow the resolve down (H200, 2026-12-01,
/// swap_in_early: batch 8 / 0.1% 16.5 -> 23.1 us, batch 64 / 0.1% 19.7 -> 37.9 us, batch 64 /
/// 20% 379 -> 393 us), while below it every case gains 0.5-2.5 us.
inline constexpr int kEarlyHandoffBelow = kLargeBatch;
/// With the speculative gather (a residency bitmap and MissPlan::entry_slot) the hand-off is
/// used below this many rows instead: its blocks that guessed nothing leave at once. One H200
/// session, early below 4096 against below 8: batch 8 16.1 -> 15.1 us (0.1%) and 61.4 -> 59.9 us
/// (20%); batch 16 16.8 -> 17.5 us and 105.8 -> 106.2 us; batch 64 19.7 -> 31.9 us and 377 ->
/// 456 us; batch 100 22.3 -> 42.9 us and 580 -> 908 us. Batch 8 is the last that gains. With
/// the small copy grid that speculative calls now keep (2026-12-02), below 65 against below 9:
/// batch 16 even (15.1 -> 15.2 us at 0.1%), batch 32 15.8 -> 19.0 us, batch 64 17.8 -> 26.3 us.
inline constexpr int kSpeculativeGatherBelow = kLargeBatch + 1;
/// Largest batch the copy kernel's shared-memory chunk prefix holds.
inline constexpr int kMaxBatch = 4096;

}  // namespace hisparse::kernels::swap_in_config
