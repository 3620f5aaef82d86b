// Tuning constants of the fused plane scan + selection kernels (sm_90: 228 KB shared memory and
// 64K registers per SM).
#pragma once

#include <cstdint>

namespace hisparse::kernels::fathom {

/// One residency choice of the scan kernel. Latency (not bandwidth or instruction count) bounds
/// the HBM scan at 2 blocks x 8 warps per SM, so the variants trade tile length, candidate slack
/// and registers for more resident warps. Every variant computes the same scores and selection.
struct ScanVariant {
  int threads;           ///< threads per scan block: a warp scores one 64-token block per round
  int blocks_per_sm;     ///< __launch_bounds__ minimum blocks (register cap) and chunking residency
  int tile_blocks_hbm;   ///< blocks per tile for HBM planes (whole 16-block superblocks)
  int tile_blocks_host;  ///< blocks per tile for host planes (longer PCIe runs)
  std::int64_t shared_target;  ///< bytes one block may use before candidate slack is cut
  int slack_rounds_min;        ///< candidate slack per head, in rounds of the block
};

/// Index 0 is the default. Shared-memory targets leave 1 KB per block of the SM's 228 KB for the
/// runtime; registers per thread are capped at 64K / (threads x blocks_per_sm). The default
/// instance (variant 0, a GQA group of 4) compiles without register spills (ptxas -v at 367df0c,
/// 2026-12-04), and so do the rescan instances; the other HBM and direct-host instances spill
/// 0-16 bytes (variant 2 16, the groups of up to 8 heads 8-12). 24 warps per SM (256 x 3, 80
/// registers) spilled 24-80 bytes and 32 warps (256 x 4, 64 registers) 76-160 bytes, so they are
/// not offered. The staged-host instances of variant 0 (which carry the copy role) spill 88
/// bytes (group of 4), 96 (up to 4 heads) and 208 (up to 8 heads); the staged scan is PCIe-bound
/// (1393 against 1421 us at 1M batch 1 with more spills, PERF_LOG 2026-12-01).
inline constexpr ScanVariant kScanVariants[] = {
    {256, 2, 32, 64, 110 * 1024, 1},  // 0: 16 warps/SM in 8-warp blocks, <= 128 registers
    {128, 4, 16, 16, 54 * 1024, 1},   // 1: 16 warps/SM in 4-warp blocks (cheaper barriers)
    {128, 5, 16, 16, 43 * 1024, 1},   // 2: 20 warps/SM in 4-warp blocks, <= 96 registers
};
inline constexpr int kScanVariantCount =
    static_cast<int>(sizeof(kScanVariants) / sizeof(kScanVariants[0]));

/// Blocks per SM the kernel is compiled for (its __launch_bounds__ minimum): groups of more than
/// 4 query heads need twice the per-head registers and candidate buffers, so their instances
/// keep the 128-register cap (512 threads per SM).
constexpr int scan_blocks_per_sm(const ScanVariant& v, int heads) {
  const int wide_cap = 512 / v.threads;
  return heads <= 4 || v.blocks_per_sm < wide_cap ? v.blocks_per_sm : wide_cap;
}

/// Shared memory of one SM (sm_90) and what the runtime reserves per resident block.
inline constexpr std::int64_t kSharedPerSm = 228 * 1024;
inline constexpr std::int64_t kSharedReservedPerBlock = 1024;

/// Shared memory a block may grow to when its target leaves less than the minimum slack (large
/// top_k; the residency of the variant is then not reached).
inline constexpr std::int64_t kScanSharedBudget = 200 * 1024;
/// Candidate slack per head: at most 4 rounds of 8-warp blocks, 4096 tokens (more only delays the
/// threshold's rise).
inline constexpr int kScanSlackRoundsMax = 4;
/// Plane bytes of one pipeline stage at most (tile blocks are lowered for large budgets).
inline constexpr std::int64_t kScanTileBytesMax = 32 * 1024;
/// Tiles are whole scale groups of 16 blocks (kScaleGroupBlocks: one set of weights per group,
/// fathom_math.hpp); host planes are read in runs of tile_blocks x 8 bytes per (channel, plane);
/// HBM tiles are one 16-block superblock.
inline constexpr int kScanTileBlocksMin = 16;
inline constexpr int kFinalizeThreads = 512;
/// Shared memory the merge kernel may use (the sm_90 opt-in limit per block).
inline constexpr std::int64_t kFinalizeSharedMax = 227 * 1024;

/// Host-plane staging (PlaneStaging): the copy blocks are scan blocks that took the copy role,
/// kStageUnroll 16-byte loads in flight per thread. kStageBlocks copy blocks (with fewer streams,
/// the same whole number per stream), more only where kStageStreamsPerBlock would be exceeded
/// (every copy block plans and orders its streams in shared memory first). H200, budget 48
/// (reports/PERF_LOG.md): on 2026-12-01, 1M x 8 streams 1415 us at 16 blocks, 1397 at 64, 1412
/// at 128; 128K x 64 streams 1635 us at 16 (four streams per block), 1341 at 64 (one each), 1722
/// at 128. On 2026-12-03, 1M x 8 streams took 1251-1254 us at 64 blocks against 1273-1278 at
/// 16, the old minimum (it is gone: 64 for every stream count). 8 loads in flight instead of 4
/// changed nothing, and a cp.async ring of 16 ran at 40% of PCIe (PERF_LOG 2026-12-03).
/// kStageThreads: threads of the copy-only diagnostic kernel (those of the default scan variant).
inline constexpr int kStageThreads = 256;
inline constexpr int kStageUnroll = 4;
inline constexpr int kStageBlocks = 64;
inline constexpr int kStageStreamsPerBlock = 16;
/// The scan variant compiled for staged host planes (other variants read host planes in place).
inline constexpr int kStagedVariant = 0;
constexpr int stage_copy_blocks(int streams) {
  const int by_tables = (streams + kStageStreamsPerBlock - 1) / kStageStreamsPerBlock;
  return kStageBlocks > by_tables ? kStageBlocks : by_tables;
}

/// A staging round copies one run of (round blocks x 8) bytes per stream and active (channel,
/// plane), each in host pages of its own, so a copy step moves `rounds_per_copy` rounds: at least
/// kStageStepRunBytes of every run. Short runs cost the SM loads their rate: the copy's own span
/// (PlaneStaging::copy_clock) at 128K x 64 streams, budget 48 (384-byte runs per round, 64 copy
/// blocks; PERF_LOG 2026-12-03) ran at 88.6% of PCIe with 1 round per step, 90.6% with 2 and
/// 91.7% with 4 (1268 / 1249 / 1254 us for the step); 16 rounds per step delayed the first
/// round (1324 us). 1M x 8 streams (3,200-byte runs) kept one round. 1.5 KB (4 rounds there, 3
/// before at 1 KB; A/B of 2026-12-04, 3 x 20 iterations, PERF_LOG): the transfer at 128K x 64
/// streams 90.3-90.8% -> 91.5-92.6%, the step 1262 -> 1246 us; 1M x 64 streams 9612 -> 9449 us;
/// 1M x 8 and 128K x 8 streams unchanged.
/// Past kStageManyRuns runs per round the pages' address translations no longer last from one
/// round to the next (on the H200 VM, the hypervisor's IOMMU), so such a copy moves at least
/// kStageManyRunsStepBytes of each run per step. H200, 256 streams (batch 32), 2 chunks x
/// 16-block tiles, so 256-byte runs (PERF_LOG 2026-12-03), 1 -> 16 -> 32 rounds per copy: B128 1M
/// 353 -> 105 -> 103 ms (25% -> 85% of PCIe), B48 1M 45.3 -> 44.0 -> 43.7 ms, B48 128K 6.05 ->
/// 5.37 -> 5.12 ms, B128 128K 13.6 -> 12.5 -> 12.4 ms (before the stream-by-stream copy of
/// plane_stage.cuh).
inline constexpr std::int64_t kStageStepRunBytes = 1536;
inline constexpr std::int64_t kStageManyRuns = 8192;
inline constexpr std::int64_t kStageManyRunsStepBytes = 8192;
/// Rounds per copy step (PlaneStaging::rounds_per_copy) for `streams` streams of at most `units`
/// active (channel, plane) units, rounds of `round_blocks` 64-token blocks, `rounds` rounds.
constexpr int stage_rounds_per_copy(std::int64_t streams, std::int64_t units,
                                    std::int64_t round_blocks, int rounds) {
  const std::int64_t step_bytes =
      streams * units > kStageManyRuns ? kStageManyRunsStepBytes : kStageStepRunBytes;
  const std::int64_t run_bytes = round_blocks * 8;  // 64 tokens of one plane: 8 bytes per block
  const std::int64_t per_copy = (step_bytes + run_bytes - 1) / run_bytes;
  return static_cast<int>(per_copy < rounds ? per_copy : rounds);
}

/// Seeded selection: a rescanned stream takes at most one sub-chunk per this many tokens of the
/// longest stream (rescan_blocks in plane_scan.hpp). Every sub-chunk's list adds up to `keep`
/// candidates per head to the head merge, so spreading one stream over the whole grid makes the
/// merge the long part. H200, B48, 1M tokens, drift 0.2, margin 0.25 (PERF_LOG 2026-12-04):
/// batch 8 (1 of 64 streams rescanned over a 264-block grid) 1434 us with the whole grid, 1364 at
/// 16K tokens (64 sub-chunks), 1514 at 64K; batch 32 (7 of 256) 4850 / 4848 / 4926 us.
inline constexpr std::int64_t kRescanSubChunkTokens = 16384;

/// Work-sized chunks (PlaneScanWorkspace::chunk_period): a scan block's time is modelled as its
/// tiles x (budget + kChunkWorkBits). The constant is the per-tile work that does not grow with
/// the budget (prep, candidate selection). H200, 128K batch 8 (PERF_LOG 2026-12-02): a B80 chunk
/// of 16 tiles took 463 us, a B16 chunk of 22 tiles 440 us, so a B16 tile costs 0.70 of a B80
/// tile: (16 + K) / (80 + K) = 0.70 at K = 133.
inline constexpr int kChunkWorkBits = 128;
/// What a chunk's start costs in the model, in tiles: its selection starts from an empty
/// threshold, and its candidates join the per-stream merge.
inline constexpr int kChunkStartTiles = 1;

/// 64-token blocks one warp scores together in a round: independent MMA chains that share one
/// scale group's weights. 8-warp blocks take 2 (a round is one 16-block group: 436 against 446 us
/// at 128K batch 8, 8.3 against 8.9 ms at 1M batch 32, PERF_LOG 2026-12-01); 4-warp blocks take
/// 1, which keeps their candidate slack, and so their residency, where it was.
constexpr int scan_blocks_per_warp(int threads) {
  return threads >= 256 ? 2 : 1;
}
/// Tokens one round of a block of `threads` scores; candidate buffers are checked for
/// compaction after every round.
constexpr int scan_round_tokens(int threads) {
  return threads / 32 * 64 * scan_blocks_per_warp(threads);
}

}  // namespace hisparse::kernels::fathom
