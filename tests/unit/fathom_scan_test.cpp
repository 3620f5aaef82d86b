// The scan's quantized-weight scores (fathom_math.hpp) and the tensor-core kernel's register
// layout, checked on the CPU: hand-worked values, closeness to REFERENCE.md's float partial read,
// a warp of the kernel emulated lane by lane with the PTX fragment layout of mma.sync m16n8k32
// (which must reproduce the twin bit for bit) and the conservative candidate bound. The twin's
// selection, seeds, rescans and workspace plans are in fathom_scan_plan_test.cpp.
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

TEST(FathomScanMath, MaskedCodesOffsetsAndShifts) {
  EXPECT_EQ(kf::masked_code(0xB, 0), 0u);
  EXPECT_EQ(kf::masked_code(0xB, 1), 0x8u);
  EXPECT_EQ(kf::masked_code(0xB, 2), 0x8u);
  EXPECT_EQ(kf::masked_code(0xB, 3), 0xAu);
  EXPECT_EQ(kf::masked_code(0xB, 4), 0xBu);
  EXPECT_EQ(kf::code_offset(1), -8);
  EXPECT_EQ(kf::code_offset(2), -12);
  EXPECT_EQ(kf::code_offset(3), -14);
  EXPECT_EQ(kf::code_offset(4), -15);
  // (2 m + o) / 16 is the cell-midpoint multiplier of REFERENCE.md for every code and depth.
  for (int t = 1; t <= 4; ++t)
    for (std::uint32_t c = 0; c < 16; ++c)
      EXPECT_EQ((2.0f * static_cast<float>(kf::masked_code(c, t)) +
                 static_cast<float>(kf::code_offset(t))) /
                    16.0f,
                kf::partial_multiplier(c >> (4 - t), t))
          << t << " " << c;
  EXPECT_EQ(kf::weight_shift(1.0f), 6);     // 1.0 * 2^6 = 64
  EXPECT_EQ(kf::weight_shift(127.9f), 0);   // [64, 128) already
  EXPECT_EQ(kf::weight_shift(128.0f), -1);  // -> 64
  EXPECT_EQ(kf::weight_shift(0.0f), kf::kNoWeights);
  EXPECT_EQ(kf::weight_shift(1e-35f), kf::kNoWeights);
  EXPECT_EQ(kf::weight_shift(INFINITY), kf::kNoWeights);
  EXPECT_EQ(kf::quantize_weight(1.0f, 6), 64);
  EXPECT_EQ(kf::quantize_weight(-0.5f, 6), -32);
  EXPECT_EQ(kf::quantize_weight(1.99f, 6), 127);     // 127.36 -> 127
  EXPECT_EQ(kf::quantize_weight(1.999f, 6), 127);    // 127.9 rounds to 128, clamped
  EXPECT_EQ(kf::quantize_weight(0.0234375f, 6), 2);  // 1.5 rounds half to even
  EXPECT_EQ(kf::quantize_weight(5.0f, kf::kNoWeights), 0);
  EXPECT_EQ(kf::quantized_score(1000, 6), 1000.0f / 16384.0f);
  EXPECT_EQ(kf::quantized_score(77, kf::kNoWeights), 0.0f);
}

TEST(FathomScanMath, RepresentableWeightsGiveTheExactPartialRead) {
  // a = 1 and q = 1: the weight is exactly 64 and the score is the float partial read.
  const int d = 2;
  const std::int64_t n = 64;
  PlaneStore store(Backend::cpu, PlaneLayoutKind::hbm, 1, d, n);
  std::vector<std::uint16_t> keys(static_cast<std::size_t>(n) * d);
  for (std::int64_t i = 0; i < n; ++i) {
    keys[i * d] = float_to_bf16(i == 0 ? 1.0f : -1.0f + static_cast<float>(i % 16) / 8.0f);
    keys[i * d + 1] = float_to_bf16(0.0f);
  }
  store.append(0, 1, keys.data(), d, 0, n);
  ASSERT_EQ(f16_to_float(store.host_scales()[store.layout().scale_index(0, 0)]), 1.0f);
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> q = {1.0f, 0.0f};
    std::vector<std::uint8_t> depths = {static_cast<std::uint8_t>(t), 0};
    kf::PlaneScanArgs args;
    args.words = store.words();
    args.scales = store.scales();
    args.layout = store.layout();
    args.queries = q.data();
    args.depths = depths.data();
    args.streams = 1;
    args.heads = 1;
    std::vector<float> exact(n), quantized(n);
    kf::plane_scores_ref(args, 0, n, exact.data());
    kf::plane_scores_quantized_ref(args, 0, n, quantized.data());
    EXPECT_EQ(exact, quantized) << "depth " << t;
  }
}

TEST(FathomScanMath, QuantizedScoresStayWithinTheRoundingBound) {
  Fixture f(128, 4, 64 * 37 + 17, 48, 21);  // three scale groups, the last one partial
  std::vector<float> exact(static_cast<std::size_t>(f.n) * f.heads), quant(exact.size());
  kf::plane_scores_ref(f.args, 0, f.n, exact.data());
  kf::plane_scores_quantized_ref(f.args, 0, f.n, quant.data());
  const auto& L = f.store.layout();
  const std::int64_t nb = (f.n + 63) / 64;
  double worst = 0;
  for (std::int64_t i = 0; i < f.n; ++i) {
    const std::int64_t block = i / 64, g0 = block / 16 * 16;
    for (int h = 0; h < f.heads; ++h) {
      // Per active channel, |2 c + o| / 16 <= 15/16 times: half a weight step (2^-shift, the
      // weight rounding) plus |q| S / 32 (the scale multiplier's rounding, S the group's largest
      // scale); plus float rounding of the exact score.
      std::vector<float> group_max(f.d, 0.0f);
      float max_abs = 0;
      for (int j = 0; j < f.d; ++j) {
        if (f.depths[j] == 0) continue;
        for (std::int64_t b = g0; b < std::min<std::int64_t>(nb, g0 + 16); ++b)
          group_max[j] =
              std::max(group_max[j], f16_to_float(f.store.host_scales()[L.scale_index(b, j)]));
        max_abs = std::max(max_abs, std::fabs(f.q[h * f.d + j] * group_max[j]));
      }
      const double step = std::ldexp(1.0, -kf::weight_shift(max_abs));
      double bound = 1e-5 * (std::fabs(exact[h * f.n + i]) + 1);
      for (int j = 0; j < f.d; ++j)
        if (f.depths[j] > 0)
          bound += 15.0 / 16.0 * (step / 2 + std::fabs(f.q[h * f.d + j]) * group_max[j] / 32);
      const double err = std::fabs(static_cast<double>(exact[h * f.n + i]) - quant[h * f.n + i]);
      ASSERT_LE(err, bound) << "token " << i << " head " << h;
      worst = std::max(worst, err / bound);
    }
  }
  EXPECT_GT(worst, 0.05);  // the quantization is visible: the test can fail
}

TEST(FathomScanMath, ScaleMultipliersRoundToSixteenthsOfTheGroupMaximum) {
  EXPECT_EQ(kf::scale_multiplier(1.0f, 1.0f), 16);
  EXPECT_EQ(kf::scale_multiplier(0.5f, 1.0f), 8);
  EXPECT_EQ(kf::scale_multiplier(0.03125f, 1.0f), 0);  // 0.5 rounds half to even
  EXPECT_EQ(kf::scale_multiplier(0.09375f, 1.0f), 2);  // 1.5 -> 2
  EXPECT_EQ(kf::scale_multiplier(3.0f, 7.0f), 7);      // 6.857 -> 7
  EXPECT_EQ(kf::scale_multiplier(0.0f, 1.0f), 0);
  EXPECT_EQ(kf::scale_multiplier(1.0f, 0.0f), 0);
  EXPECT_EQ(kf::scale_multiplier(NAN, 1.0f), 0);
  EXPECT_EQ(kf::scale_multiplier(1.0f, INFINITY), 0);
  // One division per group: m = rint(a x fl(16 / S)), worked by hand. fl(16 / 7) = 2.2857144,
  // and 3 x that rounds to 6.857143 -> 7; fl(16 / 3) = 5.3333335, and 0.28125 x that rounds to
  // 1.5 exactly -> 2 (half to even).
  EXPECT_EQ(kf::scale_step(7.0f), 16.0f / 7.0f);
  EXPECT_EQ(kf::scale_multiplier_by(3.0f, kf::scale_step(7.0f)), 7);
  EXPECT_EQ(kf::scale_multiplier_by(0.28125f, kf::scale_step(3.0f)), 2);
  EXPECT_EQ(kf::scale_multiplier_by(5.0f, kf::scale_step(5.0f)), 16);  // the group's largest
  EXPECT_EQ(kf::scale_step(0.0f), 0.0f);
  EXPECT_EQ(kf::scale_multiplier_by(INFINITY, kf::scale_step(INFINITY)), 0);
  // Outside 0..16 the multiplier clamps, and a negative scale never gives a negative one.
  EXPECT_EQ(kf::scale_multiplier_by(2.0f, 16.0f), 16);   // 32
  EXPECT_EQ(kf::scale_multiplier_by(1.03f, 16.0f), 16);  // 16.48
  EXPECT_EQ(kf::scale_multiplier_by(INFINITY, 1.0f), 16);
  EXPECT_EQ(kf::scale_multiplier_by(-1.0f, 16.0f), 0);
  EXPECT_EQ(kf::scale_multiplier_by(-0.01f, 16.0f), 0);  // -0.16 would round to -0
  EXPECT_EQ(kf::scale_multiplier_by(-INFINITY, 1.0f), 0);
  EXPECT_EQ(kf::scale_multiplier_by(NAN, 0.0f), 0);
  EXPECT_EQ(kf::group_scale_max(0.0f, NAN), 0.0f);  // a NaN scale never becomes the maximum
}

TEST(FathomScanMath, EligibleWindowLeavesOutSinksAndRecentTokens) {
  // Worked by hand, 4 sinks and 32 recent: n -> [first, end). A stream shorter than the sinks and
  // the window together has an empty window at min(n, 4); the kernel's 32-bit form agrees.
  const std::int64_t cases[][3] = {{100, 4, 68},
                                   {37, 4, 5},
                                   {36, 4, 4},
                                   {20, 4, 4},
                                   {3, 3, 3},
                                   {0, 0, 0},
                                   {1 << 20, 4, (1 << 20) - 32}};
  for (const auto& c : cases) {
    const auto wide = kf::eligible_window(c[0], 4, 32);
    const auto narrow = kf::eligible_window(static_cast<int>(c[0]), 4, 32);
    EXPECT_EQ(wide.first, c[1]) << c[0];
    EXPECT_EQ(wide.end, c[2]) << c[0];
    EXPECT_EQ(narrow.first, c[1]) << c[0];
    EXPECT_EQ(narrow.end, c[2]) << c[0];
  }
}

TEST(FathomScanMath, CandidateBoundIsConservative) {
  Rng rng(5);
  int tight = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int shift = static_cast<int>(rng.uniform() * 40.0f) - 20;
    const int sum = static_cast<int>((rng.uniform() - 0.5f) * 16000000.0f);
    const float score = kf::quantized_score(sum, shift);
    // floors just below, at and above the score
    for (float floor : {score, std::nextafter(score, -INFINITY), std::nextafter(score, INFINITY),
                        kf::quantized_score(sum + 1, shift)}) {
      const int bound = kf::min_candidate_sum(floor, shift);
      if (kf::quantized_score(sum, shift) >= floor) {
        ASSERT_GE(sum, bound) << shift << " " << sum << " " << floor;
        tight += sum - bound <= 2;
      }
    }
  }
  EXPECT_GT(tight, 10000);  // the bound is also useful, not just -infinity
  EXPECT_EQ(kf::min_candidate_sum(1e30f, 6), 0x3fffffff);  // nothing can pass
  EXPECT_EQ(kf::min_candidate_sum(-1.0f, kf::kNoWeights), -0x3fffffff);
  EXPECT_EQ(kf::min_candidate_sum(1.0f, kf::kNoWeights), 0x3fffffff);
}

TEST(FathomScanFragments, SlotsAreOrderedDeepestFirst) {
  const std::vector<std::uint8_t> depths = {1, 0, 4, 2, 4, 0, 3, 1};
  std::vector<int> channel(8), info(8), unit(32);
  int units = 0, scaled = 0;
  const int slots =
      km::order_slots(depths.data(), 8, channel.data(), info.data(), unit.data(), &units, &scaled);
  ASSERT_EQ(slots, 6);
  EXPECT_EQ(scaled, 6);
  EXPECT_EQ(units, 15);
  EXPECT_EQ(std::vector<int>(channel.begin(), channel.begin() + 6),
            (std::vector<int>{2, 4, 6, 3, 0, 7}));
  EXPECT_EQ(km::slot_depth(info[2]), 3);
  EXPECT_EQ(km::slot_unit(info[2]), 8);
  // Unit codes: (slot % 4) << 10 | channel << 2 | plane (channel 6 is slot 2, channel 7 slot 5).
  EXPECT_EQ(unit[8], (2 << 10) | (6 << 2) | 0);
  EXPECT_EQ(unit[10], (2 << 10) | (6 << 2) | 2);
  EXPECT_EQ(unit[14], (1 << 10) | (7 << 2) | 0);
  EXPECT_EQ(km::unit_channel(unit[10]), 6);
  EXPECT_EQ(km::unit_plane(unit[10]), 2);
  EXPECT_EQ(km::unit_run(unit[10]), 6 * kf::kPlanes + 2);  // the run ordinal of word_index
  EXPECT_EQ(km::unit_swizzle(unit[14]), 1);
}

// Sign reads come after every slot that reads scales (depth 1 included), so depths never rise
// along the slots and the scaled slots are a prefix; bytes that are no depth are no slot.
TEST(FathomScanFragments, SignReadsAreTheLastSlots) {
  const std::uint8_t s = kf::kSignRead;
  const std::vector<std::uint8_t> depths = {s, 1, 0, 3, s, 9, 1, 0x82};
  std::vector<int> channel(8), info(8), unit(32);
  int units = 0, scaled = 0;
  const int slots =
      km::order_slots(depths.data(), 8, channel.data(), info.data(), unit.data(), &units, &scaled);
  ASSERT_EQ(slots, 5);
  EXPECT_EQ(scaled, 3);
  EXPECT_EQ(units, 7);
  EXPECT_EQ(std::vector<int>(channel.begin(), channel.begin() + 5),
            (std::vector<int>{3, 1, 6, 0, 4}));
  for (int sl = 0; sl < 5; ++sl) EXPECT_EQ(km::slot_depth(info[sl]), sl == 0 ? 3 : 1) << sl;
  EXPECT_EQ(km::slot_unit(info[3]), 5);
  EXPECT_EQ(unit[5], (3 << 10) | (0 << 2) | 0);  // channel 0 is slot 3
  EXPECT_EQ(unit[6], (0 << 10) | (4 << 2) | 0);  // channel 4 is slot 4
  EXPECT_EQ(kf::read_planes(s), 1);
  EXPECT_FALSE(kf::reads_scale(s));
  EXPECT_TRUE(kf::reads_scale(1));
  EXPECT_EQ(kf::read_planes(9), 0);
}

// The tile's bank swizzle: the four lanes t that read slots 4i + t at one block hit four distinct
// bank pairs (8-byte words, rows a multiple of 128 bytes apart), the 16-byte pieces cp.async
// writes stay whole, and every row is a permutation of its blocks.
TEST(FathomScanFragments, TileSwizzleSpreadsTheFourSlotsOverDistinctBankPairs) {
  for (const int tile : {16, 32, 64}) {
    for (int w = 0; w < tile; ++w) {
      std::set<int> pairs;
      for (int t = 0; t < 4; ++t) {
        const int column = km::tile_column(w, t);
        ASSERT_GE(column, 0);
        ASSERT_LT(column, tile);
        pairs.insert((t * tile + column) % 16);  // row t, bank pair = word index mod 16
      }
      EXPECT_EQ(pairs.size(), 4u) << tile << " " << w;
    }
    for (int t = 0; t < 4; ++t) {
      std::set<int> columns;
      for (int c = 0; c < tile / 2; ++c) {
        EXPECT_EQ(km::tile_column(2 * c, t) + 1, km::tile_column(2 * c + 1, t));
        columns.insert(km::tile_column(2 * c, t));
        columns.insert(km::tile_column(2 * c + 1, t));
      }
      EXPECT_EQ(columns.size(), static_cast<std::size_t>(tile));
    }
  }
  EXPECT_EQ(km::tile_column(5, 0), 5);  // worked by hand: 5 ^ 2 t
  EXPECT_EQ(km::tile_column(5, 1), 7);
  EXPECT_EQ(km::tile_column(5, 3), 3);
}

// The A registers of lane (x, t), half h of k-step ks, hold the codes of slot 8 ks + 4 h + t read
// to that slot's depth (the bits past it 0) for tokens x + 8 i (a0 / a2) and 32 + x + 8 i (a1 / a3)
// of the block, times the block's multiplier of the slot: worked from the plane words here, for
// every lane and k-step, depths that differ within each group of 4 slots (so shallower slots
// read the zero row), padding slots past the last, multipliers up to 16, and a warp's two blocks
// built together as well as each alone.
TEST(FathomScanFragments, RegistersHoldEachSlotsCodesToItsDepth) {
  const std::vector<std::uint8_t> depths = {4, 1, 3, 0, 2, 1, 1, 4, 2, 3, 1, 1, 0, 2, 1, 1, 1, 3};
  const int d = static_cast<int>(depths.size());
  constexpr int kTile = 32, kStep = 8, kSlotsPad = 32;
  std::vector<int> channel(kSlotsPad, 0), info(kSlotsPad, 0), unit(4 * kSlotsPad, 0);
  int units = 0, scaled = 0;
  const int slots =
      km::order_slots(depths.data(), d, channel.data(), info.data(), unit.data(), &units, &scaled);
  ASSERT_EQ(slots, 16);
  Rng rng(77);
  // plane[u][w]: the 64 bits of unit u at block w, placed at the unit's swizzled column; row
  // `units` stays zero.
  std::vector<std::vector<std::uint64_t>> plane(units, std::vector<std::uint64_t>(kTile));
  std::vector<std::uint64_t> tile(static_cast<std::size_t>(units + 1) * kTile, 0);
  for (int u = 0; u < units; ++u)
    for (int w = 0; w < kTile; ++w) {
      plane[u][w] = rng.next_bits();
      tile[static_cast<std::size_t>(u) * kTile + km::tile_column(w, km::unit_swizzle(unit[u]))] =
          plane[u][w];
    }
  std::vector<int> rows(4 * kSlotsPad);
  for (int sl = 0; sl < kSlotsPad; ++sl)
    km::plane_row_offsets(info[sl], kTile, units, rows.data() + 4 * sl);
  std::vector<std::uint8_t> mult(static_cast<std::size_t>(kTile) * kSlotsPad);
  for (auto& m : mult) m = static_cast<std::uint8_t>(rng.next_bits() % 17);
  const auto* stage = reinterpret_cast<const unsigned char*>(tile.data());
  const auto expected = [&](int w, int ks, int lane, int r) {
    const int x = lane / 4, t = lane % 4, slot = ks * 8 + 4 * (r / 2) + t;
    if (slot >= slots) return 0u;
    const int depth = km::slot_depth(info[slot]), first_unit = km::slot_unit(info[slot]);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int token = 32 * (r % 2) + x + 8 * i;
      std::uint32_t code = 0;
      for (int p = 0; p < depth; ++p)
        code |= static_cast<std::uint32_t>((plane[first_unit + p][w] >> token) & 1u) << (3 - p);
      v |= code * mult[static_cast<std::size_t>(w) * kSlotsPad + slot] << (8 * i);
    }
    return v;
  };
  // Slots 0-7 read two planes or more; from k-step 1 on every slot reads one plane at most, so
  // the SHALLOW build (no plane counts read) must give the same registers there.
  const int deep = static_cast<int>(std::count_if(info.begin(), info.begin() + slots,
                                                  [](int i) { return km::slot_depth(i) >= 2; }));
  ASSERT_EQ(deep, 8);
  int nonzero = 0, shallow_nonzero = 0;
  for (int w0 : {0, 3, 16, 23})
    for (int ks = 0; ks < kSlotsPad / 8; ++ks)
      for (int lane = 0; lane < 32; ++lane) {
        const int column = 8 * km::tile_column(w0, lane % 4);
        std::uint32_t both[2][4], alone[4], shallow[2][4];
        km::a_fragments<2, kStep>(stage, column, rows.data(), info.data(),
                                  mult.data() + w0 * kSlotsPad, kStep * kSlotsPad, ks, lane, both);
        const bool is_shallow = ks * km::kSlotsPerStep >= deep;
        if (is_shallow)
          km::a_fragments<2, kStep, true>(stage, column, rows.data(), info.data(),
                                          mult.data() + w0 * kSlotsPad, kStep * kSlotsPad, ks, lane,
                                          shallow);
        for (int k = 0; k < 2; ++k) {
          const int w = w0 + k * kStep;
          km::a_fragment(stage, 8 * km::tile_column(w, lane % 4), rows.data(), info.data(),
                         mult.data() + w * kSlotsPad, ks, lane, alone);
          for (int r = 0; r < 4; ++r) {
            const std::uint32_t want = expected(w, ks, lane, r);
            ASSERT_EQ(both[k][r], want) << w0 << " " << k << " " << ks << " " << lane << " " << r;
            ASSERT_EQ(alone[r], want) << w << " " << ks << " " << lane << " " << r;
            if (is_shallow) {
              ASSERT_EQ(shallow[k][r], want) << w0 << " " << k << " " << ks << " " << lane;
              shallow_nonzero += want != 0;
            }
            nonzero += want != 0;
          }
        }
      }
  EXPECT_GT(nonzero, 500);  // the registers carry codes: the comparison can fail
  EXPECT_GT(shallow_nonzero, 100);
  // Worked by hand (rows of 8 x 32 = 256 bytes): depth 4 takes slots 0-1 (units 0-7), depth 3
  // slots 2-4 (units 8-16), depth 2 slots 5-7 (units 17-22), depth 1 slots 8-15 (units 23-30); the
  // zero row is row 31. Slot 2 (channel 2) reads units 8, 9, 10 and then zeros, slot 8 (channel
  // 1) unit 23, and padding slot 16 zeros only.
  ASSERT_EQ(units, 31);
  EXPECT_EQ(std::vector<int>(rows.begin() + 8, rows.begin() + 12),
            (std::vector<int>{8 * 256, 9 * 256, 10 * 256, 31 * 256}));
  EXPECT_EQ(std::vector<int>(rows.begin() + 32, rows.begin() + 36),
            (std::vector<int>{23 * 256, 31 * 256, 31 * 256, 31 * 256}));
  EXPECT_EQ(std::vector<int>(rows.begin() + 64, rows.begin() + 68),
            (std::vector<int>(4, 31 * 256)));
}

TEST(FathomScanFragments, CodeBytesAndWeightPlacement) {
  // Token x + 8 i of a 32-token half; planes (p = 0 most significant).
  std::uint32_t planes[4];
  std::vector<std::uint32_t> codes(32);
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<std::uint32_t>((i * 7 + 3) % 16);
  for (int p = 0; p < 4; ++p) {
    planes[p] = 0;
    for (int i = 0; i < 32; ++i) planes[p] |= ((codes[i] >> (3 - p)) & 1u) << i;
  }
  for (int depth = 0; depth <= 4; ++depth)
    for (int x = 0; x < 8; ++x) {
      std::uint32_t r = 0;
      for (int p = 0; p < depth; ++p) r = km::add_code_plane(r, planes[p], x, p);
      for (int i = 0; i < 4; ++i)
        EXPECT_EQ((r >> (8 * i)) & 0xffu, kf::masked_code(codes[x + 8 * i], depth))
            << depth << " " << x << " " << i;
    }
  EXPECT_EQ(km::rotate_right(0x80000001u, 1), 0xC0000000u);
  EXPECT_EQ(km::rotate_right(0x80000001u, 0), 0x80000001u);
  EXPECT_EQ(km::byte_permute(0x44332211u, 0u, km::weight_selector(2, 1)), 0x00003300u);
  EXPECT_EQ(km::byte_permute(0x44332211u, 0u, km::weight_selector(0, 3)), 0x11000000u);
  EXPECT_EQ(km::byte_permute(0x44332211u, 0x88776655u, 0x7340u), 0x88445511u);
}

// mma.sync.m16n8k32.row.col.s32.u8.s8.s32 as the PTX ISA lays it out: lane (g, t) holds A rows g
// (a0, a2) and g + 8 (a1, a3) at columns 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3); B column g at
// rows 4t.. (b0) and 16+4t.. (b1); C row g (c0, c1) and g + 8 (c2, c3) at columns 2t, 2t + 1.
void emulate_mma(const std::uint32_t a[32][4], const std::uint32_t b[32][2], int c[32][4]) {
  int A[16][32], B[32][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const auto byte = [&](std::uint32_t r) { return static_cast<int>((r >> (8 * i)) & 0xffu); };
      A[g][4 * t + i] = byte(a[lane][0]);
      A[g + 8][4 * t + i] = byte(a[lane][1]);
      A[g][16 + 4 * t + i] = byte(a[lane][2]);
      A[g + 8][16 + 4 * t + i] = byte(a[lane][3]);
      B[4 * t + i][g] = static_cast<std::int8_t>(byte(b[lane][0]));
      B[16 + 4 * t + i][g] = static_cast<std::int8_t>(byte(b[lane][1]));
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
      int sum = 0;
      for (int k = 0; k < 32; ++k) sum += A[row][k] * B[k][col];
      c[lane][r] += sum;
    }
  }
}

// One warp of the scan kernel, lane by lane: the tile, the weights and the offsets built as the
// kernel builds them in shared memory, then the MMAs and the epilogue. Must equal the twin.
void check_warp_emulation(int d, int heads, std::int64_t n, int budget, std::uint64_t seed,
                          PlaneLayoutKind kind, bool sign_reads = false) {
  Fixture f(d, heads, n, budget, seed, kind);
  if (sign_reads) f.use_sign_reads();
  std::vector<float> want(static_cast<std::size_t>(n) * heads);
  kf::plane_scores_quantized_ref(f.args, 0, n, want.data());

  const kf::ScanSharedPlan plan = kf::plan_scan_shared(f.args, budget, 16);
  const int sp = plan.slots_pad, hp = plan.heads_pad, tb = plan.tile_blocks;
  std::vector<int> slot_channel(sp, 0), slot_info(sp, 0), unit_code(plan.units_cap, 0);
  int units = 0, scaled = 0;
  const int slots = km::order_slots(f.depths.data(), d, slot_channel.data(), slot_info.data(),
                                    unit_code.data(), &units, &scaled);
  ASSERT_LE(units, plan.units_cap);
  std::vector<int> plane_rows(4 * static_cast<std::size_t>(sp));
  for (int sl = 0; sl < sp; ++sl)
    km::plane_row_offsets(sl < slots ? slot_info[sl] : 0, tb, plan.units_cap,
                          plane_rows.data() + 4 * sl);
  const auto& L = f.store.layout();
  const std::uint64_t* words = f.store.host_words();
  const std::uint16_t* scales = f.store.host_scales();
  const std::int64_t nb = (n + 63) / 64;
  int checked = 0;
  for (std::int64_t b0 = 0; b0 < nb; b0 += tb) {
    // The kernel's stage: a row per unit, then the zero row.
    std::vector<std::uint64_t> tile(static_cast<std::size_t>(plan.units_cap + 1) * tb, 0);
    for (int u = 0; u < units; ++u)
      for (int w = 0; w < tb && b0 + w < nb; ++w)
        tile[static_cast<std::size_t>(u) * tb +
             km::tile_column(w, km::unit_swizzle(unit_code[u]))] =
            words[L.word_index(b0 + w, km::unit_channel(unit_code[u]),
                               km::unit_plane(unit_code[u]))];
    for (int w = 0; w < tb && b0 + w < nb; ++w) {
      const std::int64_t block = b0 + w;
      // The block's scale group: largest scale per slot, then the weights, the block's
      // multipliers and its constant term, as the kernel's prep and epilogue build them.
      const std::int64_t g0 = block / kf::kScaleGroupBlocks * kf::kScaleGroupBlocks;
      const std::int64_t g1 = std::min<std::int64_t>(nb, g0 + kf::kScaleGroupBlocks);
      const auto scale = [&](std::int64_t b, int sl) {  // sign reads (slots from `scaled`): 1
        return sl < scaled ? f16_to_float(scales[L.scale_index(b, slot_channel[sl])]) : 1.0f;
      };
      std::vector<float> group_max(sp, 0.0f);
      for (int sl = 0; sl < slots; ++sl)
        for (std::int64_t b = g0; b < g1; ++b)
          group_max[sl] = kf::group_scale_max(group_max[sl], scale(b, sl));
      // The multipliers of the group's 16 blocks: 0 past the end, garbage in the padding slots
      // (their codes and |o| are 0, their weights 0 or never read).
      std::vector<std::uint8_t> group_mult(static_cast<std::size_t>(kf::kScaleGroupBlocks) * sp,
                                           0xc8);
      for (int r = 0; r < kf::kScaleGroupBlocks; ++r)
        for (int sl = 0; sl < slots; ++sl)
          group_mult[static_cast<std::size_t>(r) * sp + sl] =
              g0 + r < nb ? static_cast<std::uint8_t>(
                                kf::scale_multiplier(scale(g0 + r, sl), group_max[sl]))
                          : 0;
      const int row = static_cast<int>(block - g0);
      const std::uint8_t* mult = group_mult.data() + static_cast<std::size_t>(row) * sp;
      // Weights past the slots a warp reads are never written by the kernel: garbage here.
      const int slots_read = (slots + 15) / 16 * 16;
      std::vector<std::uint8_t> wts(static_cast<std::size_t>(hp) * sp, 0);
      for (int h = 0; h < hp; ++h)
        for (int sl = slots_read; sl < sp; ++sl) wts[km::weight_index(h, sl, sp)] = 0x5a;
      std::vector<int> offset(hp, 0), shift(hp, kf::kNoWeights);
      for (int h = 0; h < hp; ++h) {
        float max_abs = 0;
        for (int sl = 0; sl < slots; ++sl) {
          const float qv = h < heads ? f.q[h * d + slot_channel[sl]] : 0.0f;
          max_abs = std::max(max_abs, std::fabs(qv * group_max[sl]));
        }
        shift[h] = kf::weight_shift(max_abs);
        for (int sl = 0; sl < slots; ++sl) {
          const float qv = h < heads ? f.q[h * d + slot_channel[sl]] : 0.0f;
          const int wq = kf::quantize_weight(qv * group_max[sl], shift[h]);
          wts[km::weight_index(h, sl, sp)] =
              static_cast<std::uint8_t>(static_cast<std::int8_t>(wq));
          offset[h] += wq * mult[sl] * kf::code_offset(km::slot_depth(slot_info[sl]));
        }
      }
      // The constant terms of the group's 16 blocks from the offset MMA.
      std::vector<std::uint8_t> magnitude(sp, 0);
      for (int sl = 0; sl < sp; ++sl) magnitude[sl] = km::offset_magnitude(slot_info[sl]);
      int terms[32][4] = {};
      for (int k0 = 0; k0 < slots_read; k0 += 32) {
        std::uint32_t a[32][4], b[32][2];
        for (int lane = 0; lane < 32; ++lane)
          km::offset_fragments(group_mult.data(), magnitude.data(), wts.data(), sp, hp, k0,
                               slots_read, lane, a[lane], b[lane]);
        emulate_mma(a, b, terms);
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 4; ++r)
          if (lane / 4 + 8 * (r >> 1) == row) {
            const int h = 2 * (lane % 4) + (r & 1);
            ASSERT_EQ(-terms[lane][r], h < hp ? offset[h] : 0)
                << "block " << block << " head " << h;
          }
      int acc[32][km::kMaxPairs][4] = {};
      const int pairs = hp / 2;
      for (int ks2 = 0; ks2 < (slots + 15) / 16; ++ks2)
        for (int odd = 0; odd < 2; ++odd) {
          std::uint32_t a[32][4];
          for (int lane = 0; lane < 32; ++lane)
            km::a_fragment(reinterpret_cast<const unsigned char*>(tile.data()),
                           8 * km::tile_column(w, lane % 4), plane_rows.data(), slot_info.data(),
                           mult, 2 * ks2 + odd, lane, a[lane]);
          for (int pair = 0; pair < pairs; ++pair) {
            std::uint32_t b[32][2];
            int c[32][4];
            for (int lane = 0; lane < 32; ++lane) {
              km::b_fragment(km::weight_word(wts.data(), sp, pair, ks2, lane), odd, lane, b[lane]);
              for (int r = 0; r < 4; ++r) c[lane][r] = acc[lane][pair][r];
            }
            emulate_mma(a, b, c);
            for (int lane = 0; lane < 32; ++lane)
              for (int r = 0; r < 4; ++r) acc[lane][pair][r] = c[lane][r];
          }
        }
      for (int lane = 0; lane < 32; ++lane)
        for (int pair = 0; pair < pairs; ++pair) {
          const int h = km::lane_head(lane, pair);
          if (h >= heads) continue;
          for (int r = 0; r < 4; ++r) {
            const std::int64_t token = block * 64 + km::lane_token(lane, r);
            if (token >= n) continue;
            const float got = kf::quantized_score(2 * acc[lane][pair][r] + offset[h], shift[h]);
            ASSERT_EQ(got, want[h * n + token])
                << "token " << token << " head " << h << " lane " << lane;
            ++checked;
          }
        }
    }
  }
  EXPECT_EQ(checked, n * heads);
}

TEST(FathomScanFragments, EmulatedWarpReproducesTheTwinBitForBit) {
  check_warp_emulation(128, 4, 64 * 20 + 9, 48, 31, PlaneLayoutKind::hbm);
  check_warp_emulation(128, 4, 64 * 17, 128, 32, PlaneLayoutKind::host);
  check_warp_emulation(128, 3, 64 * 5 + 1, 512, 33, PlaneLayoutKind::hbm);  // every plane, 3 heads
  check_warp_emulation(40, 8, 64 * 3 + 63, 40, 34, PlaneLayoutKind::hbm);   // odd head_dim
  check_warp_emulation(128, 1, 100, 7, 35, PlaneLayoutKind::host);
  check_warp_emulation(128, 4, 64 * 20 + 9, 48, 36, PlaneLayoutKind::hbm, true);
  check_warp_emulation(64, 3, 64 * 17, 40, 37, PlaneLayoutKind::host, true);
}

}  // namespace
}  // namespace hisparse::fathom
