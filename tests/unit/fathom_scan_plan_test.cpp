// The plane scan's twin and plan, checked on the CPU: the selection from quantized scores (its
// quality before and after 8-bit weights), seeds and the rescan's shares of the grid, the score
// range, the fused planner, and the workspace and shared-memory plans of every kernel variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/metrics.hpp"
#include "core/rng.hpp"
#include "fathom/plane_scan.hpp"
#include "fathom/plane_store.hpp"
#include "fathom/quality_study.hpp"
#include "fathom/selector.hpp"
#include "fathom/synthetic_keys.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "kernels/fathom/plane_scan_config.hpp"
#include "kernels/fathom/plane_scan_fragments.hpp"
#include "kernels/fathom/plane_stage.hpp"
#include "support/error_message.hpp"
#include "support/fathom_scan_fixture.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;
namespace km = kernels::fathom::mma;
using Fixture = test::ScanFixture;

TEST(FathomScanTwin, SelectionUsesTheQuantizedScores) {
  Fixture f(128, 4, 5000, 48, 41);
  f.args.keep = 200;
  f.args.max_tokens = f.n;
  const std::int64_t length = f.n;
  f.args.lengths = &length;
  std::vector<std::int32_t> sel(static_cast<std::size_t>(f.args.max_selected())), count(1);
  std::vector<float> scores(static_cast<std::size_t>(f.n) * f.heads);
  f.args.selected = sel.data();
  f.args.selected_count = count.data();
  f.args.scores = scores.data();
  kf::plane_scan_select_ref(f.args);
  std::vector<float> want(scores.size());
  kf::plane_scores_quantized_ref(f.args, 0, f.n, want.data());
  EXPECT_EQ(scores, want);
  std::vector<std::int32_t> expect(sel.size());
  const auto c = kf::select_from_scores_ref(want.data(), f.heads, f.n, 200, 4, 32, expect.data());
  ASSERT_EQ(count[0], c);
  EXPECT_EQ(std::vector<std::int32_t>(sel.begin(), sel.begin() + c),
            std::vector<std::int32_t>(expect.begin(), expect.begin() + c));
}

// A seed filters scores below it and keeps every score at or above it (ties included).
TEST(FathomScanMath, SeedThresholdKeepsScoresAtOrAboveTheSeed) {
  for (const float seed : {-3.5f, -0.0f, 0.0f, 1.25f, 7e30f}) {
    const std::uint64_t t = kf::seed_threshold(seed);
    EXPECT_GT(kf::selection_key(seed, 0u), t) << seed;
    EXPECT_GT(kf::selection_key(seed, 0xfffffffeu), t) << seed;  // the last position
    EXPECT_GT(kf::selection_key(std::nextafter(seed, 1e38f), 5u), t) << seed;
    EXPECT_LE(kf::selection_key(std::nextafter(seed, -1e38f), 0u), t) << seed;
  }
  EXPECT_EQ(kf::seed_threshold(std::nanf("")), 0u);
  EXPECT_EQ(kf::seed_threshold(-INFINITY), 0u);
  // keep-th 2, top 10, margin 0.25: 2 - 0.25 x 8 = 0; margin 0 gives the keep-th itself.
  EXPECT_EQ(kf::seed_score(2.0f, 10.0f, 0.25f), 0.0f);
  EXPECT_EQ(kf::seed_score(2.0f, 10.0f, 0.0f), 2.0f);
  EXPECT_TRUE(std::isnan(kf::seed_score(std::nanf(""), 10.0f, 0.25f)));
}

// A seed is proven when every head's candidates over the chunks reach min(keep, eligible):
// by hand, keep 3 and sinks 4 + recent 32, so a stream of 40 tokens has 4 eligible, one of 38
// has 2 and one of 30 none.
TEST(FathomScanTwin, SeedIsProvenByEveryHeadsCandidates) {
  const std::int64_t lengths[3] = {40, 38, 30};
  kf::PlaneScanArgs a;
  a.lengths = lengths;
  a.streams = 3;
  a.heads = 2;
  a.keep = 3;
  //                        stream 0  stream 1  stream 2
  const std::int32_t hits[6] = {3, 5, 2, 2, 0, 0};
  EXPECT_TRUE(kf::seed_proven(a, hits, 0));
  EXPECT_TRUE(kf::seed_proven(a, hits, 1));  // 2 eligible: 2 candidates prove it
  EXPECT_TRUE(kf::seed_proven(a, hits, 2));  // nothing eligible: nothing to prove
  const std::int32_t short_by_one[6] = {3, 2, 1, 2, 0, 0};
  EXPECT_FALSE(kf::seed_proven(a, short_by_one, 0));  // head 1: 2 of 3
  EXPECT_FALSE(kf::seed_proven(a, short_by_one, 1));  // head 0: 1 of 2
}

// The rescan pass spreads the unproven streams over the grid: every grid block scans exactly
// one sub-chunk of one of them, each stream's sub-chunks are 0..subs-1 with no gap or repeat,
// the shares differ by at most one block, and rescan_block inverts rescan_share.
TEST(FathomScanTwin, RescanSharesCoverTheGridOnce) {
  for (int blocks = 1; blocks <= 70; ++blocks)
    for (int unproven = 1; unproven <= blocks; ++unproven) {
      std::vector<std::vector<int>> seen(static_cast<std::size_t>(unproven));
      for (int b = 0; b < blocks; ++b) {
        const kf::RescanShare share = kf::rescan_share(b, blocks, unproven);
        ASSERT_GE(share.rank, 0);
        ASSERT_LT(share.rank, unproven);
        ASSERT_LT(share.sub, share.subs);
        ASSERT_EQ(kf::rescan_block(share.rank, share.sub, unproven), b);
        auto& subs = seen[static_cast<std::size_t>(share.rank)];
        if (subs.empty()) subs.assign(static_cast<std::size_t>(share.subs), 0);
        ASSERT_EQ(static_cast<int>(subs.size()), share.subs) << "one count per stream";
        ++subs[static_cast<std::size_t>(share.sub)];
      }
      for (const auto& subs : seen) {
        for (const int times : subs) ASSERT_EQ(times, 1) << blocks << " blocks, " << unproven;
        ASSERT_LE(static_cast<int>(subs.size()), (blocks + unproven - 1) / unproven);
        ASSERT_GE(static_cast<int>(subs.size()), blocks / unproven);
      }
    }
  // By hand: 10 blocks for 3 streams: ranks 0, 1, 2, 0, 1, 2, ...; stream 0 takes 4 sub-chunks.
  const kf::RescanShare b9 = kf::rescan_share(9, 10, 3);
  EXPECT_EQ(b9.rank, 0);
  EXPECT_EQ(b9.sub, 3);
  EXPECT_EQ(b9.subs, 4);
  EXPECT_EQ(kf::rescan_share(5, 10, 3).subs, 3);
  // Sub-chunks of 16K tokens: a 1M-token stream takes 64 blocks of a 264-block grid, two such
  // streams 128, five the whole grid; 0 tokens means the whole grid.
  EXPECT_EQ(kf::rescan_blocks(264, 1, 1048576, 16384), 64);
  EXPECT_EQ(kf::rescan_blocks(264, 2, 1048576, 16384), 128);
  EXPECT_EQ(kf::rescan_blocks(264, 5, 1048576, 16384), 264);
  EXPECT_EQ(kf::rescan_blocks(264, 1, 1048577, 16384), 65);
  EXPECT_EQ(kf::rescan_blocks(264, 3, 1000, 16384), 3);  // short streams: one block each
  EXPECT_EQ(kf::rescan_blocks(264, 1, 1048576, 0), 264);
}

// score_range_ref by hand: 2 heads over 40 tokens (sinks 4 and recent 32 leave tokens 4..7).
TEST(FathomScanTwin, ScoreRangeIsTheKeepThAndTopEligibleScore) {
  std::vector<float> scores(80, 100.0f);  // sinks and recent score 100: never eligible
  const float head0[4] = {3.0f, -1.0f, 3.0f, 2.0f}, head1[4] = {-5.0f, -6.0f, -4.0f, -7.0f};
  for (int i = 0; i < 4; ++i) {
    scores[4 + i] = head0[i];
    scores[40 + 4 + i] = head1[i];
  }
  float range[4];
  kf::score_range_ref(scores.data(), 2, 40, 3, 4, 32, range);
  EXPECT_EQ(range[0], 2.0f);  // 3, 3, 2: the third
  EXPECT_EQ(range[1], 3.0f);
  EXPECT_EQ(range[2], -6.0f);  // -4, -5, -6
  EXPECT_EQ(range[3], -4.0f);
  kf::score_range_ref(scores.data(), 2, 40, 5, 4, 32, range);  // keep 5 > 4 eligible
  EXPECT_TRUE(std::isnan(range[0]));
  EXPECT_EQ(range[1], 3.0f);
  kf::score_range_ref(scores.data(), 1, 30, 1, 4, 32, range);  // no eligible token
  EXPECT_TRUE(std::isnan(range[0]));
  EXPECT_TRUE(std::isnan(range[1]));
}

TEST(FathomScanTwin, FusedPlanSelectsLikeThePlannerThenTheScan) {
  Fixture f(128, 4, 3000, 40, 43);
  const std::int64_t length = f.n;
  f.args.lengths = &length;
  f.args.keep = 100;
  f.args.max_tokens = f.n;
  const auto room = static_cast<std::size_t>(f.args.max_selected());
  std::vector<std::int32_t> want(room), got(room), want_count(1), got_count(1);
  f.args.selected = want.data();
  f.args.selected_count = want_count.data();
  kf::plane_scan_select_ref(f.args);

  kf::PlaneScanArgs fused = f.args;
  fused.depths = nullptr;  // must not be read
  fused.plan_variances = f.var.data();
  fused.plan_budget = 40;
  std::vector<std::uint8_t> planned(f.depths.size(), 9);
  fused.planned_depths = planned.data();
  fused.selected = got.data();
  fused.selected_count = got_count.data();
  kf::plane_scan_select_ref(fused);
  EXPECT_EQ(planned, f.depths);
  int sum = 0;
  for (auto t : planned) sum += t;
  EXPECT_LE(sum, 40);
  EXPECT_GT(sum, 30);  // the budget is nearly used: 128 channels with spread importance
  ASSERT_EQ(got_count[0], want_count[0]);
  EXPECT_EQ(got, want);
}

// The microbenchmark's scan shape: Qwen3-8B's groups of 4 query heads x 128 channels, top_k 512
// (keep 476), `streams` KV streams of `tokens`.
kf::PlaneScanArgs microbench_shape(std::int32_t streams = 0, std::int64_t tokens = 0) {
  kf::PlaneScanArgs a;
  a.layout.channels = 128;
  a.heads = 4;
  a.keep = 476;
  a.streams = streams;
  a.max_tokens = tokens;
  return a;
}

TEST(FathomScanTwin, SharedMemoryPlanNamesTopKWhenTooLarge) {
  kf::PlaneScanArgs a;
  a.layout.channels = 128;
  a.heads = 8;
  a.keep = 4000;
  EXPECT_EQ(test::error_message([&] { (void)kf::plan_scan_workspace(a, 48, 132); }),
            "fathom scan: top_k: 8 query heads x keep 4000 need 334 KB of shared memory for "
            "the fused selection at plane budget 48, more than 200 KB; lower top_k or the "
            "plane budget");
  a.heads = 4;
  a.keep = 476;
  const auto ws = kf::plan_scan_workspace(a, 48, 132);
  EXPECT_EQ(ws.tile_blocks, 32);  // two scale groups per HBM tile while they fit the target
  const auto plan = kf::plan_scan_shared(a, 48, ws.tile_blocks);
  EXPECT_EQ(plan.slots_pad, 48);
  EXPECT_GE(plan.cap, 476 + 1024 + 512);  // more than a round of slack: few compactions
  EXPECT_LE(plan.total, 110 * 1024);      // still 2 scan blocks per SM
  // At budget 128 a 32-block tile would leave one block per SM: the tile falls back to 16.
  const auto wide = kf::plan_scan_workspace(a, 128, 132);
  EXPECT_EQ(wide.tile_blocks, 16);
  EXPECT_LE(kf::plan_scan_shared(a, 128, wide.tile_blocks).total, 110 * 1024);
  // top_k 2048 does not fit the target but fits the budget with the smallest slack.
  a.keep = 2012;
  const auto big = kf::plan_scan_shared(a, 128, 16);
  EXPECT_EQ(big.cap, 2012 + 2 * 512);
  // Tiles hold whole scale groups of 16 blocks.
  EXPECT_EQ(test::error_message([&] { (void)kf::plan_scan_shared(a, 48, 8); }),
            "fathom scan: workspace: tile of 8 blocks; use a multiple of 16 blocks "
            "(plan_scan_workspace)");
  EXPECT_GT(big.total, 110 * 1024);
}

// Only staged host planes prepare a tile's weights in the tile loop; the other paths read them
// from the staged scoring records, and their candidate buffers get the room.
TEST(FathomScanTwin, SharedMemoryPlanReservesTheTilePrepOnlyForStagedPlanes) {
  kf::PlaneScanArgs a;
  a.layout.channels = 128;
  a.heads = 4;
  a.keep = 476;
  const auto records = kf::plan_scan_shared(a, 48, 32);
  const auto staged = kf::plan_scan_shared(a, 48, 32, 0, true);
  EXPECT_EQ(records.weights, 0);
  EXPECT_EQ(records.multipliers, 0);
  EXPECT_EQ(records.group_max, 0);
  EXPECT_EQ(records.shifts, 0);
  // Two scale groups x 4 heads x 48 slots of weights, 32 blocks x 48 multipliers, 2 x 48 float
  // group maxima and 2 x 4 int shifts: 2336 bytes, 73 more candidates per head (8 bytes each).
  EXPECT_EQ(staged.multipliers - staged.weights, 2 * 4 * 48);
  EXPECT_EQ(staged.group_max - staged.multipliers, 32 * 48);
  EXPECT_EQ(staged.shifts - staged.group_max, 2 * 48 * 4);
  EXPECT_EQ(records.cap - staged.cap, 2336 / (8 * 4));
  EXPECT_LE(records.total, 110 * 1024);
  EXPECT_LE(staged.total, 110 * 1024);
  // A workspace's own plan follows its staging buffers.
  kf::PlaneScanWorkspace ws;
  ws.budget = 48;
  ws.tile_blocks = 32;
  EXPECT_EQ(kf::plan_scan_shared(a, ws).cap, records.cap);
  std::uint64_t word = 0;
  ws.staging.words = &word;
  EXPECT_EQ(kf::plan_scan_shared(a, ws).cap, staged.cap);
}

// Scoring records (planes not staged): one per scale group of 16 blocks, sized by the plan's
// slots and heads, staged in place of a tile's scales, and written from a scratch record in the
// candidate buffers, which must hold one warp's. Staged host planes keep their prep: no records.
TEST(FathomScanTwin, ScoringRecordsAreSizedPerScaleGroup) {
  const kf::ScanRecordLayout r{48, 4};  // budget 48 at head_dim 128, a GQA group of 4
  EXPECT_EQ(r.weights(), 16 * 48);
  EXPECT_EQ(r.terms(), 16 * 48 + 4 * 48);
  EXPECT_EQ(r.shifts(), 16 * 48 + 4 * 48 + 16 * 4 * 4);
  EXPECT_EQ(r.bytes(), 1232);  // 1216 + 4 shifts, to 16 bytes
  kf::PlaneScanArgs a = microbench_shape(8, 1048576);
  const auto ws = kf::plan_scan_workspace(a, 48, 132);
  const auto plan = kf::plan_scan_shared(a, 48, ws.tile_blocks);
  EXPECT_EQ(ws.record_bytes, plan.record.bytes());
  EXPECT_EQ(ws.records_per_stream, 1048576 / 1024);
  EXPECT_EQ(ws.record_bytes_total(a), 8LL * 1024 * ws.record_bytes);
  EXPECT_GE(plan.scales_stage, ws.tile_blocks / 16 * plan.record.bytes());
  // One query head, head_dim 256 with a slot per channel, 4-warp blocks: the smallest candidate
  // buffers still hold a scratch record (and slots_pad floats).
  kf::PlaneScanArgs wide;
  wide.layout.channels = 256;
  wide.heads = 1;
  wide.keep = 1;
  wide.streams = 1;
  wide.max_tokens = 4096;
  const auto small = kf::plan_scan_shared(wide, 256, 16, 1);
  EXPECT_EQ(small.slots_pad, 256);
  EXPECT_GE(8LL * small.cap, small.record.bytes() + 4 * 256);
  a.layout.kind = kf::PlaneLayoutKind::host;
  const auto staged = kf::plan_scan_workspace(a, 48, 132, 0, {true});
  EXPECT_EQ(staged.record_bytes, 0);
  EXPECT_EQ(staged.records_per_stream, 0);
  EXPECT_GT(kf::plan_scan_workspace(a, 48, 132, 0, {false}).record_bytes, 0);  // read in place
}

// A workspace for HBM planes plans the seeded rescan's sub-chunks (kRescanSubChunkTokens); one for
// staged host planes, which are never seeded, plans none.
TEST(FathomScanTwin, SeededRescanIsPlannedInSubChunks) {
  const kf::PlaneScanArgs a = microbench_shape(64, 131072);
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132).rescan_sub_tokens, kf::kRescanSubChunkTokens);
  kf::HostStaging staged;
  staged.enabled = true;
  kf::PlaneScanArgs host = a;
  host.layout.kind = kf::PlaneLayoutKind::host;
  EXPECT_EQ(kf::plan_scan_workspace(host, 48, 132, 0, staged).rescan_sub_tokens, 0)
      << "staged host planes are never seeded";
}

TEST(FathomScanTwin, ChunksFillWholeWavesOfScanBlocks) {
  kf::PlaneScanArgs a = microbench_shape();
  const auto chunks = [&](std::int32_t streams, std::int64_t tokens) {
    a.streams = streams;
    a.max_tokens = tokens;
    return kf::plan_scan_workspace(a, 48, 132).chunks;
  };
  EXPECT_EQ(chunks(64, 131072), 4);    // 256 blocks: one wave of 264
  EXPECT_EQ(chunks(256, 1048576), 1);  // 256 blocks
  EXPECT_EQ(chunks(8, 1048576), 33);   // 264 blocks
  EXPECT_EQ(chunks(8, 2048), 1);       // at least 4 x keep tokens per chunk
}

// Per-KV-head budgets: streams with larger budgets take more, shorter chunks, so that a wave's
// blocks end together (128K batch 8: 64 streams, heads alternating at budgets 80 and 16).
TEST(FathomScanTwin, UnequalHeadBudgetsGiveWorkSizedChunks) {
  kf::PlaneScanArgs a = microbench_shape(64, 131072);
  const std::vector<std::int32_t> spread = {80, 16, 80, 16, 80, 16, 80, 16};
  const auto ws = kf::plan_scan_workspace(a, 80, 132, 0, {}, spread);
  ASSERT_EQ(ws.chunk_period, 8);
  // Weights 80 + 128 and 16 + 128 (kChunkWorkBits): 5 and round(5 x 144 / 208) = 3 chunks, 256
  // blocks as before. Every stream with budget 80 had 4 chunks of 16 tiles; now 13 tiles at
  // most, against 22 tiles of budget 16. Modelled with one tile per chunk start: 14 x 208 = 2912
  // and 23 x 144 = 3312 work units, against 17 x 208 = 3536 for the uniform plan.
  EXPECT_EQ(ws.chunks, 5);
  for (int p = 0; p < 8; ++p) EXPECT_EQ(ws.period_chunks[p], p % 2 == 0 ? 5 : 3) << "head " << p;
  EXPECT_EQ(ws.chunks_of(0), 5);
  EXPECT_EQ(ws.chunks_of(9), 3);
  EXPECT_EQ(kf::plan_scan_workspace(a, 80, 132).chunks, 4);  // without the budgets
  // Equal budgets, a period above kMaxChunkPeriod, or staged host planes: the same chunks for
  // every stream.
  const auto equal = kf::plan_scan_workspace(a, 48, 132, 0, {}, std::vector<std::int32_t>(8, 48));
  EXPECT_EQ(equal.chunk_period, 0);
  EXPECT_EQ(equal.chunks, 4);
  EXPECT_EQ(equal.chunks_of(3), 4);
  std::vector<std::int32_t> long_period(kf::kMaxChunkPeriod + 2, 16);
  long_period[0] = 80;
  EXPECT_EQ(kf::plan_scan_workspace(a, 80, 132, 0, {}, long_period).chunk_period, 0);
  a.layout.kind = kf::PlaneLayoutKind::host;
  EXPECT_EQ(kf::plan_scan_workspace(a, 80, 132, 0, {true}, spread).chunk_period, 0);
  EXPECT_EQ(kf::plan_scan_workspace(a, 80, 132, 1, {true}, spread).chunk_period, 8);  // in place
  // One wave already holds a chunk per 4 x keep tokens of every stream: nothing to gain.
  a.layout.kind = kf::PlaneLayoutKind::hbm;
  a.streams = 2;
  a.max_tokens = 8192;
  EXPECT_EQ(kf::plan_scan_workspace(a, 80, 132, 0, {}, spread).chunk_period, 0);
  EXPECT_EQ(test::error_message([&] { (void)kf::plan_scan_workspace(a, 64, 132, 0, {}, spread); }),
            "fathom scan: head budgets: a KV head's budget of 80 for a launch sized for 64; size "
            "the launch for the largest head budget");
}

// Staged host planes (PlaneStaging): the scan reads HBM, so it takes the HBM tile; the copy
// kernel's blocks come out of the scan's residency; the staging holds the budget's units for
// whole tiles and one round per `chunks` tiles. HBM planes and unasked-for staging size none.
TEST(FathomScanTwin, HostStagingIsSizedForRoundsOfChunksTiles) {
  kf::PlaneScanArgs a = microbench_shape(8, 1048576);
  a.layout.kind = kf::PlaneLayoutKind::host;
  const auto ws = kf::plan_scan_workspace(a, 48, 132, 0, {true});
  EXPECT_EQ(ws.tile_blocks, 16);
  EXPECT_EQ(ws.chunks, 25);  // 8 streams x 25 = 200 = 264 slots - 64 copy blocks
  EXPECT_EQ(ws.staging.copy_blocks, 64);
  EXPECT_EQ(ws.staging.parts, 8);  // 8 copy blocks per stream
  EXPECT_EQ(ws.staging.units_cap, 48);
  EXPECT_EQ(ws.staging.slots_cap, 48);
  EXPECT_EQ(ws.staging.blocks_cap, 16384);
  EXPECT_EQ(ws.staging.rounds, 41);  // 1024 tiles / 25 chunks
  EXPECT_EQ(ws.staging.word_count(8), 8LL * 48 * 16384);
  EXPECT_EQ(ws.staging.flag_count(8), 8 * 41);
  EXPECT_FALSE(ws.staging.enabled());  // the owner sets the buffers
  const auto direct = kf::plan_scan_workspace(a, 48, 132, 0, {false});
  EXPECT_EQ(direct.tile_blocks, 64);
  EXPECT_EQ(direct.chunks, 33);
  EXPECT_EQ(direct.staging.copy_blocks, 0);
  a.layout.kind = kf::PlaneLayoutKind::hbm;
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true}).staging.copy_blocks, 0);
  // 64 copy blocks, then one per 16 streams.
  EXPECT_EQ(kf::stage_copy_blocks(3), 64);
  EXPECT_EQ(kf::stage_copy_blocks(40), 64);
  EXPECT_EQ(kf::stage_copy_blocks(256), 64);
  EXPECT_EQ(kf::stage_copy_blocks(2048), 128);
  // 3 streams: 21 copy blocks each (63 of the 64); 40 streams: one each.
  a.layout.kind = kf::PlaneLayoutKind::host;
  a.streams = 3;
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true}).staging.copy_blocks, 63);
  a.streams = 40;
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true}).staging.copy_blocks, 40);
  a.streams = 3;
  // Only the staged variant stages; the others read host planes in place.
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 2, {true}).staging.copy_blocks, 0);
  // Small scan blocks (one head, keep 64, budget 8) hold fewer stream tables than 16: 2048
  // streams then need more copy blocks than 128, each within the scan block's shared memory.
  a.streams = 2048;
  a.heads = 1;
  a.keep = 64;
  const auto small = kf::plan_scan_workspace(a, 8, 132, 0, {true});
  const auto small_shared = kf::plan_scan_shared(a, 8, small.tile_blocks, 0, true).total;
  const std::int64_t per_block = small_shared / kf::stage_table_bytes(128);
  ASSERT_LT(per_block, 16);
  EXPECT_EQ(small.staging.copy_blocks, (2048 + per_block - 1) / per_block);
  EXPECT_GT(small.staging.copy_blocks, 128);
  EXPECT_LE(kf::stage_copy_shared_bytes(a, small.staging), small_shared);
  a.streams = 8;
  a.heads = 4;
  a.keep = 476;
  // More copy blocks than streams: whole shares per stream (20 -> 2 parts x 8 streams).
  const auto shared = kf::plan_scan_workspace(a, 48, 132, 0, {true, 20, 4});
  EXPECT_EQ(shared.staging.copy_blocks, 16);
  EXPECT_EQ(shared.staging.parts, 2);
  EXPECT_EQ(shared.staging.rounds_per_copy, 4);
  // 8 streams: 25 chunks x 16-block tiles make 3,200-byte runs per round, one round per step.
  EXPECT_EQ(ws.staging.rounds_per_copy, 1);
  // 256 streams (batch 32): 2 chunks x 16-block tiles make 256-byte runs, and 256 x 48 runs per
  // round exceed kStageManyRuns, so a copy step moves 8 KB of each run: 32 rounds. 64 streams
  // (3,072 runs per round of 3 chunks: 384 bytes) move at least 1.5 KB per step: 4 rounds.
  a.streams = 256;
  const auto many = kf::plan_scan_workspace(a, 48, 132, 0, {true});
  EXPECT_EQ(many.chunks, 2);
  EXPECT_EQ(many.staging.copy_blocks, 64);
  EXPECT_EQ(many.staging.rounds, 512);
  EXPECT_EQ(many.staging.rounds_per_copy, 32);
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true, 0, 2}).staging.rounds_per_copy, 2);
  a.streams = 64;
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true}).chunks, 3);
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0, {true}).staging.rounds_per_copy, 4);
  a.streams = 8;
  // The rule itself: at most the rounds there are; 8 KB per run and step past 8,192 runs per
  // round (256 x 48), else 1.5 KB (256 x 32 runs of 256 bytes: 6 rounds); longer runs take one.
  EXPECT_EQ(kf::stage_rounds_per_copy(256, 48, 32, 512), 32);
  EXPECT_EQ(kf::stage_rounds_per_copy(256, 48, 32, 20), 20);
  EXPECT_EQ(kf::stage_rounds_per_copy(256, 48, 1024, 512), 1);
  EXPECT_EQ(kf::stage_rounds_per_copy(256, 32, 32, 512), 6);
  EXPECT_EQ(kf::stage_rounds_per_copy(8, 48, 400, 41), 1);
  EXPECT_EQ(kf::stage_rounds_per_copy(8, 48, 100, 41), 2);
  EXPECT_EQ(test::error_message([&] {
              (void)kf::plan_scan_workspace(a, 48, 132, 0, {true, -1, 0});
            }),
            "fathom scan: staging: -1 copy blocks, 0 rounds per copy; use 0 (the default) or "
            "a positive count");
  // A budget above every plane (head_dim 40 x 4) stages every unit; slots stop at head_dim.
  a.layout.kind = kf::PlaneLayoutKind::host;
  a.layout.channels = 40;
  const auto full = kf::plan_scan_workspace(a, 512, 132, 0, {true});
  EXPECT_EQ(full.staging.units_cap, 160);
  EXPECT_EQ(full.staging.slots_cap, 40);
}

// Every kernel variant at the microbenchmark's shape (Qwen3-8B group of 4 heads, top_k 512,
// budget 48): its tile, threads and candidate slack, and (HBM) that its shared memory lets the
// blocks it was compiled for share one SM (228 KB, 1 KB per block reserved).
TEST(FathomScanTwin, EveryVariantReachesItsResidencyAtTopK512) {
  ASSERT_EQ(kf::kScanVariantCount, 3);
  kf::PlaneScanArgs a = microbench_shape(64, 131072);
  const int hbm_tiles[] = {32, 16, 16}, host_tiles[] = {64, 16, 16}, threads[] = {256, 128, 128};
  const int blocks[] = {2, 4, 5};
  for (int v = 0; v < kf::kScanVariantCount; ++v) {
    for (auto kind : {kf::PlaneLayoutKind::hbm, kf::PlaneLayoutKind::host}) {
      a.layout.kind = kind;
      const auto ws = kf::plan_scan_workspace(a, 48, 132, v);
      EXPECT_EQ(ws.variant, v);
      EXPECT_EQ(ws.tile_blocks, kind == kf::PlaneLayoutKind::hbm ? hbm_tiles[v] : host_tiles[v])
          << "variant " << v;
      const auto plan = kf::plan_scan_shared(a, 48, ws.tile_blocks, v);
      EXPECT_EQ(plan.threads, threads[v]);
      const int round = kf::scan_round_tokens(threads[v]);
      EXPECT_GE(plan.cap, 476 + kf::kScanVariants[v].slack_rounds_min * round) << "variant " << v;
      EXPECT_EQ(kf::scan_blocks_per_sm(kf::kScanVariants[v], 4), blocks[v]);
      if (kind == kf::PlaneLayoutKind::hbm) {
        EXPECT_LE(blocks[v] * (plan.total + 1024), 228 * 1024) << "variant " << v;
      }
    }
  }
  // Groups of more than 4 heads keep the 128-register cap.
  EXPECT_EQ(kf::scan_blocks_per_sm(kf::kScanVariants[2], 8), 4);
  EXPECT_EQ(kf::scan_blocks_per_sm(kf::kScanVariants[0], 8), 2);
  // More resident blocks per SM: more chunks per stream for the same batch.
  a.layout.kind = kf::PlaneLayoutKind::hbm;
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 0).chunks, 4);
  EXPECT_EQ(kf::plan_scan_workspace(a, 48, 132, 2).chunks, 10);
}

TEST(FathomScanTwin, UnknownVariantIsRejectedWithTheValidRange) {
  const kf::PlaneScanArgs a = microbench_shape();
  EXPECT_EQ(test::error_message([&] { (void)kf::plan_scan_workspace(a, 48, 132, 3); }),
            "fathom scan: variant: scan variant 3 does not exist; use 0..2 (kScanVariants in "
            "plane_scan_config.hpp)");
  PlaneScan scan(Backend::cpu);
  EXPECT_THROW(scan.set_variant(-1), Error);
  EXPECT_EQ(scan.variant(), 0);
  scan.set_variant(2);
  EXPECT_EQ(scan.variant(), 2);
  EXPECT_EQ(test::error_message([&] { scan.set_multiprocessors(0); }),
            "fathom scan: multiprocessors: 0 SMs; plan for at least one SM");
  scan.set_multiprocessors(4);
  EXPECT_EQ(scan.multiprocessors(), 4);
}

// Selection quality of the scan's 8-bit weights against REFERENCE.md's float weights on the
// default synthetic workload (same depths, same keys): recall of the exact top-k selection and
// relative L2 error of the attention output.
TEST(FathomScanQuality, QuantizedWeightsKeepTheSelectionQuality) {
  SyntheticKeySpec spec;
  spec.tokens = 8192;
  spec.steps = 2;
  const int top_k = 256, keep = top_k - 36;
  std::printf(
      "| budget | weights | recall | attention rel. error |\n| ---: | --- | ---: | ---: |\n");
  for (int budget : {40, 48, 64, 128}) {
    double recall[2] = {0, 0}, error[2] = {0, 0};
    int samples = 0;
    for (int kvh = 0; kvh < 2; ++kvh) {
      SyntheticKeySpec s = spec;
      s.seed = spec.seed + static_cast<std::uint64_t>(kvh) * 1000003ull;
      const SyntheticKeys data = make_synthetic_keys(s);
      const int d = s.channels, heads = s.heads;
      const std::int64_t n = s.tokens;
      PlaneStore store(Backend::cpu, PlaneLayoutKind::hbm, 1, d, n);
      store.append(0, 1, data.keys.data(), d, 0, n);
      for (int step = 0; step < s.steps; ++step) {
        const float* q = data.query(step);
        std::vector<float> scores(static_cast<std::size_t>(n) * heads);
        std::vector<std::int32_t> oracle(36 + static_cast<std::size_t>(heads) * keep),
            sel(oracle.size());
        exact_scores(q, heads, data.keys.data(), n, d, scores.data());
        const auto on =
            kf::select_from_scores_ref(scores.data(), heads, n, keep, 4, 32, oracle.data());
        std::vector<float> dense(static_cast<std::size_t>(heads) * d), approx(dense.size());
        attention_over(q, heads, data.keys.data(), data.values.data(), n, d, {}, dense.data());
        std::vector<std::uint8_t> depths(d);
        kf::DepthPlanArgs p;
        p.queries = q;
        p.variances = data.variance.data();
        p.streams = 1;
        p.heads = heads;
        p.channels = d;
        p.budget = budget;
        p.depths = depths.data();
        kf::depth_plan_bisection_ref(p);
        kf::PlaneScanArgs args;
        args.words = store.words();
        args.scales = store.scales();
        args.layout = store.layout();
        args.queries = q;
        args.depths = depths.data();
        args.streams = 1;
        args.heads = heads;
        for (int variant = 0; variant < 2; ++variant) {
          if (variant == 0)
            kf::plane_scores_ref(args, 0, n, scores.data());
          else
            kf::plane_scores_quantized_ref(args, 0, n, scores.data());
          const auto c =
              kf::select_from_scores_ref(scores.data(), heads, n, keep, 4, 32, sel.data());
          std::vector<std::int32_t> inter;
          std::set_intersection(sel.begin(), sel.begin() + c, oracle.begin(), oracle.begin() + on,
                                std::back_inserter(inter));
          recall[variant] += static_cast<double>(inter.size()) / static_cast<double>(on);
          attention_over(q, heads, data.keys.data(), data.values.data(), n, d,
                         std::span<const std::int32_t>(sel.data(), static_cast<std::size_t>(c)),
                         approx.data());
          error[variant] += mean_relative_l2_error(approx.data(), dense.data(), heads, d);
        }
        ++samples;
      }
    }
    for (int v = 0; v < 2; ++v)
      std::printf("| %d | %s | %.4f | %.5f |\n", budget, v == 0 ? "float" : "8-bit",
                  recall[v] / samples, error[v] / samples);
    // Within noise: the 8-bit weights move recall by at most 0.02 and the error by at most 10%.
    EXPECT_GT(recall[1], recall[0] - 0.02 * samples) << budget;
    EXPECT_LT(error[1], error[0] * 1.10) << budget;
  }
}

}  // namespace
}  // namespace hisparse::fathom
