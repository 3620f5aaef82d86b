// DepthPlanner: the worked example, budget errors, comparison-method plans and their costs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "fathom/depth_planner.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/depth_search.hpp"
#include "kernels/fathom/fathom_math.hpp"
#include "support/error_message.hpp"
#include "support/read_tables.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

struct Plan {
  std::vector<std::uint8_t> greedy, bisection;
  float log2_theta = 0;
};

/// Planner arguments over `q` [streams][heads][channels] and `var` [period][channels] (no depths
/// yet): the fields every test fills the same way.
kf::DepthPlanArgs plan_args(const std::vector<float>& q, const std::vector<float>& var, int streams,
                            int heads, int channels, int budget, int period = 1) {
  kf::DepthPlanArgs a;
  a.queries = q.data();
  a.variances = var.data();
  a.variance_period = period;
  a.streams = streams;
  a.heads = heads;
  a.channels = channels;
  a.budget = budget;
  return a;
}

Plan plan_both(const std::vector<float>& q, const std::vector<float>& var, int heads, int budget) {
  const int d = static_cast<int>(var.size());
  Plan p;
  p.greedy.assign(d, 9);
  p.bisection.assign(d, 9);
  kf::DepthPlanArgs a = plan_args(q, var, 1, heads, d, budget);
  a.depths = p.greedy.data();
  kf::depth_plan_greedy_ref(a);
  a.depths = p.bisection.data();
  a.log2_theta = &p.log2_theta;
  kf::depth_plan_bisection_ref(a);
  return p;
}

TEST(FathomPlanner, WorkedExampleFourChannelsBudgetEight) {
  // g = (1000, 90, 5, 1): marginals g 4^-t, the 8 largest are 1000, 250,
  // 90, 62.5, 22.5, 15.6, 5.6, 5.
  const std::vector<float> q = {std::sqrt(1000.0f), std::sqrt(90.0f), std::sqrt(5.0f), 1.0f};
  const std::vector<float> var = {1, 1, 1, 1};
  const auto p = plan_both(q, var, 1, 8);
  EXPECT_EQ(p.greedy, (std::vector<std::uint8_t>{4, 3, 1, 0}));
  EXPECT_EQ(p.bisection, (std::vector<std::uint8_t>{4, 3, 1, 0}));
  // theta lies between the 9th marginal and the 8th: 2 theta in (1.41, 5].
  EXPECT_GE(std::exp2(p.log2_theta) * 2, 1.40625);
  EXPECT_LE(std::exp2(p.log2_theta) * 2, 5.0);
}

TEST(FathomPlanner, ImportanceSumsTheGroupsQueryHeads) {
  // Two heads: channel 0 is large in head 0, channel 1 in head 1, variance favours channel 1.
  const std::vector<float> q = {3, 0, 0, 0, /*head 1*/ 0, 1, 0, 0};
  const std::vector<float> var = {1, 16, 1, 1};  // g = (9, 16, 0, 0)
  const auto p = plan_both(q, var, 2, 1);
  EXPECT_EQ(p.greedy, (std::vector<std::uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(p.bisection, p.greedy);
  const auto p5 = plan_both(q, var, 2, 5);  // marginals 16, 9, 4, 2.25, 1, ... -> (2, 3)
  EXPECT_EQ(p5.greedy, (std::vector<std::uint8_t>{2, 3, 0, 0}));
  EXPECT_EQ(p5.bisection, p5.greedy);
}

TEST(FathomPlanner, BudgetsAtTheEnds) {
  const std::vector<float> q = {1, 2, 3, 4};
  const std::vector<float> var = {1, 1, 1, 1};
  EXPECT_EQ(plan_both(q, var, 1, 0).greedy, (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(plan_both(q, var, 1, 0).bisection, (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(plan_both(q, var, 1, 16).greedy, (std::vector<std::uint8_t>{4, 4, 4, 4}));
  EXPECT_EQ(plan_both(q, var, 1, 16).bisection, (std::vector<std::uint8_t>{4, 4, 4, 4}));
}

TEST(FathomPlanner, BadBudgetIsNamed) {
  DepthPlanner planner(Backend::cpu);
  std::vector<float> q(8, 1.0f), var(8, 1.0f);
  std::vector<std::uint8_t> d(8);
  kf::DepthPlanArgs a = plan_args(q, var, 1, 1, 8, 33);
  a.depths = d.data();
  EXPECT_EQ(
      test::error_message([&] { planner.plan(a); }),
      "fathom planner: budget_bits: budget 33 plane bits is outside 0..32 for head_dim 8; use a "
      "budget such as 40, 48, 64, 80 or 128");
}

TEST(FathomPlanner, PerHeadBudgetsPlanEveryStreamAsAloneWithItsBudget) {
  // 6 streams over 3 KV heads (stream s uses row s % 3) with budgets (40, 0, 100): planning them
  // together equals planning each stream alone with its KV head's budget, in both forms.
  const int d = 64, heads = 2, kv = 3, streams = 6;
  Rng rng(5);
  std::vector<float> q(static_cast<std::size_t>(streams) * heads * d),
      var(static_cast<std::size_t>(kv) * d);
  for (auto& x : q) x = rng.normal();
  for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
  const std::vector<std::int32_t> budgets = {40, 0, 100};
  kf::DepthPlanArgs a = plan_args(q, var, streams, heads, d, 100, kv);
  a.budgets = budgets.data();
  std::vector<std::uint8_t> greedy(static_cast<std::size_t>(streams) * d, 9), bisection = greedy;
  a.depths = greedy.data();
  kf::depth_plan_greedy_ref(a);
  a.depths = bisection.data();
  kf::depth_plan_bisection_ref(a);
  for (int s = 0; s < streams; ++s) {
    const auto at = static_cast<std::size_t>(s) * d;
    const std::vector<float> qs(q.begin() + static_cast<std::ptrdiff_t>(at * heads),
                                q.begin() + static_cast<std::ptrdiff_t>((at + d) * heads));
    const std::vector<float> vs(var.begin() + static_cast<std::ptrdiff_t>((s % kv) * d),
                                var.begin() + static_cast<std::ptrdiff_t>((s % kv + 1) * d));
    const auto alone = plan_both(qs, vs, heads, budgets[static_cast<std::size_t>(s % kv)]);
    const std::vector<std::uint8_t> g(greedy.begin() + static_cast<std::ptrdiff_t>(at),
                                      greedy.begin() + static_cast<std::ptrdiff_t>(at + d));
    const std::vector<std::uint8_t> b(bisection.begin() + static_cast<std::ptrdiff_t>(at),
                                      bisection.begin() + static_cast<std::ptrdiff_t>(at + d));
    EXPECT_EQ(g, alone.greedy) << "stream " << s;
    EXPECT_EQ(b, alone.bisection) << "stream " << s;
    EXPECT_EQ(std::accumulate(g.begin(), g.end(), 0), budgets[static_cast<std::size_t>(s % kv)]);
  }
}

TEST(FathomPlanner, HeadBudgetsKeepEachHeadsShareOfTheMean) {
  // Table of 2 layers x 2 KV heads, mean 48: layer 0 (52, 44), layer 1 (48, 48); deeper layers
  // reuse the rows.
  const std::vector<int> table = {52, 44, 48, 48};
  EXPECT_EQ(head_budgets(table, 2, 0, 48, 512, "t"), (std::vector<std::int32_t>{52, 44}));
  EXPECT_EQ(head_budgets(table, 2, 1, 48, 512, "t"), (std::vector<std::int32_t>{48, 48}));
  EXPECT_EQ(head_budgets(table, 2, 2, 48, 512, "t"), (std::vector<std::int32_t>{52, 44}));
  // Half the mean, half of each: 24 x 52 / 48 = 26, 24 x 44 / 48 = 22.
  EXPECT_EQ(head_budgets(table, 2, 0, 24, 512, "t"), (std::vector<std::int32_t>{26, 22}));
  EXPECT_EQ(head_budgets(table, 2, 0, 0, 512, "t"), (std::vector<std::int32_t>{0, 0}));
  // 30 x 52 / 48 = 32.5 and 30 x 44 / 48 = 27.5 round away from zero; then clamped to 32.
  EXPECT_EQ(head_budgets(table, 2, 0, 30, 32, "t"), (std::vector<std::int32_t>{32, 28}));
  EXPECT_EQ(head_budgets(std::vector<int>{1, 2}, 2, 0, 10, 512, "t"),
            (std::vector<std::int32_t>{7, 13}));  // 6.67 and 13.33
  EXPECT_EQ(test::error_message([&] {
              (void)head_budgets(std::vector<int>{1, 2, 3}, 2, 0, 48, 512, "fathom.head_budgets");
            }),
            "fathom.head_budgets: 3 per-head budgets for a model with 2 KV heads; give 2 budgets "
            "per layer (one per KV head), layer by layer");
  EXPECT_EQ(test::error_message([&] {
              (void)head_budgets(std::vector<int>{0, 0}, 2, 0, 48, 512, "fathom.head_budgets");
            }),
            "fathom.head_budgets: every per-head budget is 0, so the table says nothing about a "
            "split; give the heads' calibrated budgets (positive numbers)");
}

TEST(FathomPlanner, ComparisonMethodsAndCosts) {
  const int d = 128, heads = 4;
  std::vector<float> q(static_cast<std::size_t>(heads) * d), var(d, 1.0f);
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < d; ++j) q[h * d + j] = static_cast<float>((j * 37 + h) % 101) - 50.0f;
  const auto full = method_depths({ScanMethod::full_scan, 0, 0}, q.data(), heads, d, var, {});
  EXPECT_DOUBLE_EQ(plan_bits(full), 544.0);
  std::vector<int> fixed(32);
  std::iota(fixed.begin(), fixed.end(), 10);
  const auto fx =
      method_depths({ScanMethod::fixed_channels, 0, 32}, q.data(), heads, d, var, fixed);
  EXPECT_DOUBLE_EQ(plan_bits(fx), 136.0);
  EXPECT_EQ(fx[10], 4);
  EXPECT_EQ(fx[9], 0);
  const auto sq = method_depths({ScanMethod::sparq, 0, 16}, q.data(), heads, d, var, {});
  EXPECT_EQ(active_channels(sq), 16);
  EXPECT_DOUBLE_EQ(plan_bits(sq), 68.0);
  const auto f48 = method_depths({ScanMethod::fathom, 48, 0}, q.data(), heads, d, var, {});
  EXPECT_EQ(std::accumulate(f48.begin(), f48.end(), 0), 48);
  EXPECT_DOUBLE_EQ(plan_bits(f48), 48 + 0.25 * active_channels(f48));
  EXPECT_EQ(MethodSpec({ScanMethod::fathom, 48, 0}).name(), "fathom-48");
  EXPECT_EQ(MethodSpec({ScanMethod::sparq, 0, 32}).name(), "sparq-32");
}

TEST(FathomPlannerMeasured, CalibrationOfAPlusMinusOneChannel) {
  // One channel of +-1 alternating: every block's absmax is 1 (fp16 exact), codes 15 and 0, so
  // the midpoint read at depth t is +-(1 - 2^-t): 0.5, 0.75, 0.875, 0.9375. Its least-squares
  // gain is 1 / (1 - 2^-t) and the gained read is exact. Block 0 holds +-4 and is skipped: the
  // calibration starts at the first whole block at or after skip = 1.
  const int tokens = 128;
  std::vector<std::uint16_t> keys(tokens);
  for (int i = 0; i < tokens; ++i)
    keys[i] = float_to_bf16((i % 2 ? -1.0f : 1.0f) * (i < 64 ? 4.0f : 1.0f));
  const auto reads = calibrate_plane_reads(keys.data(), tokens, 1, 1, tokens - 1);
  ASSERT_EQ(reads.gain.size(), 5u);
  EXPECT_FLOAT_EQ(reads.distortion[0], 1.0f);  // Var(k) of block 1 only (16 with block 0)
  EXPECT_FLOAT_EQ(reads.gain[0], 1.0f);
  const float midpoint[5] = {0, 0.5f, 0.75f, 0.875f, 0.9375f};
  for (int t = 1; t <= 4; ++t) {
    EXPECT_NEAR(reads.gain[t], 1.0f / midpoint[t], 1e-5f) << "depth " << t;
    EXPECT_NEAR(reads.distortion[t], 0.0f, 1e-6f) << "depth " << t;
  }
  // Nothing whole after skip = 70: every whole block (both; block 0's +-4 widens the variance).
  const auto all = calibrate_plane_reads(keys.data(), tokens, 1, 70, 58);
  EXPECT_FLOAT_EQ(all.distortion[0], 8.5f);  // mean 0; (64 x 16 + 64 x 1) / 128
  // Not one whole block (62 tokens of +-4): the paper's model, Var(k) 4^-t with gains 1.
  const auto short_run = calibrate_plane_reads(keys.data(), 62, 1, 16, 62);
  EXPECT_EQ(short_run.gain, std::vector<float>(5, 1.0f));
  EXPECT_EQ(short_run.distortion, (std::vector<float>{16.0f, 4.0f, 1.0f, 0.25f, 0.0625f}));
}

TEST(FathomPlannerMeasured, GreedyByErrorPerBitOverTheConvexHull) {
  // Weights sum_h q^2 = (1, 1, 4). Worked by hand (rates = weight x error removed / bits, a first
  // plane also paying 0.25 bit of scale):
  //  ch0 halves then quarters its error: from 0, 1 plane 0.5 / 1.25 = 0.4;
  //  ch1 gains nothing from its first plane but 0.9 from two: 0.9 / 2.25 = 0.4 (the hull step);
  //  ch2 has little error: at most 4 x 0.05 / 2.25 = 0.089.
  // Budget 8: ch0 -> 1 (0.4, lower channel first), ch1 -> 2 (0.4), ch0 -> 2 (0.375), ch0 -> 3
  // (0.094), ch2 -> 2 (0.089), then one plane left: ch1 -> 3 (0.05) beats ch2 -> 3 (0.04).
  PlaneReadCalibration reads;
  reads.distortion = {1.0f, 0.5f,  0.125f, 0.03125f, 0.0078125f,  //
                      1.0f, 1.0f,  0.1f,   0.05f,    0.04f,       //
                      0.1f, 0.09f, 0.05f,  0.04f,    0.035f};
  reads.gain = {1.0f, 2.0f, 1.5f,  1.0f, 1.0f,  //
                1.0f, 1.0f, 1.0f,  1.0f, 1.0f,  //
                1.0f, 0.5f, 0.25f, 1.0f, 1.0f};
  reads.sign_distortion = {1.0f, 1.0f, 0.1f};  // sign reads that remove nothing
  reads.sign_gain = {1.0f, 1.0f, 1.0f};
  const std::vector<float> q = {1.0f, 1.0f, 2.0f};
  std::vector<std::uint8_t> depths(3, 9);
  depth_plan_measured(q.data(), 1, 3, reads, 8, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{3, 3, 2}));
  // Budget 3: ch0 -> 1, then ch1's two-plane step still fits.
  depth_plan_measured(q.data(), 1, 3, reads, 3, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{1, 2, 0}));
  // Budget 2: after ch0 -> 1 one plane is left, and ch1's first plane alone gains nothing.
  depth_plan_measured(q.data(), 1, 3, reads, 2, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{2, 0, 0}));
  depth_plan_measured(q.data(), 1, 3, reads, 0, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{0, 0, 0}));
  // Planes that remove no error are not bought, even with budget left.
  depth_plan_measured(q.data(), 1, 3, reads, 12, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{4, 4, 4}));
  PlaneReadCalibration flat;
  flat.distortion.assign(15, 1.0f);
  flat.gain.assign(15, 1.0f);
  flat.sign_distortion.assign(3, 1.0f);
  flat.sign_gain.assign(3, 1.0f);
  depth_plan_measured(q.data(), 1, 3, flat, 8, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{0, 0, 0}));
  // The scan reads with each channel's weight times the gain of its read.
  const std::vector<std::uint8_t> plan = {1, 0, 2};
  std::vector<float> gained = q;
  apply_read_gains(gained.data(), 1, 3, reads, plan);
  EXPECT_EQ(gained, (std::vector<float>{2.0f, 1.0f, 0.5f}));
}

TEST(FathomPlannerMeasured, PerHeadBudgetsPlanEveryStreamAsAloneWithItsBudget) {
  // 4 streams over 2 read tables with budgets (8, 3): each stream plans as it would alone with
  // its table's budget (the hand-worked plans of the test above for budgets 8 and 3).
  PlaneReadCalibration reads;
  reads.distortion = {1.0f, 0.5f,  0.125f, 0.03125f, 0.0078125f,  //
                      1.0f, 1.0f,  0.1f,   0.05f,    0.04f,       //
                      0.1f, 0.09f, 0.05f,  0.04f,    0.035f};
  reads.gain = std::vector<float>(15, 1.0f);
  reads.sign_distortion = {1.0f, 1.0f, 0.1f};
  reads.sign_gain = {1.0f, 1.0f, 1.0f};
  std::vector<float> distortion, gain;
  pack_read_tables(std::vector<PlaneReadCalibration>{reads, reads}, 3, distortion, gain);
  const std::vector<float> q = {1.0f, 1.0f, 2.0f, 1.0f, 1.0f, 2.0f,
                                1.0f, 1.0f, 2.0f, 1.0f, 1.0f, 2.0f};
  const std::vector<std::int32_t> budgets = {8, 3};
  std::vector<std::uint8_t> depths(12, 9);
  kf::MeasuredPlanArgs a;
  a.queries = q.data();
  a.distortion = distortion.data();
  a.gain = gain.data();
  a.period = 2;
  a.streams = 4;
  a.heads = 1;
  a.channels = 3;
  a.budget = 8;
  a.budgets = budgets.data();
  a.depths = depths.data();
  kf::depth_plan_measured_ref(a);
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{3, 3, 2, 1, 2, 0, 3, 3, 2, 1, 2, 0}));
}

TEST(FathomPlannerMeasured, SignReadsCostOneBitAndNoScale) {
  // The reads of the test above, but ch0's sign alone removes 0.45 of its error for 1 bit (rate
  // 0.45, above its scaled first plane's 0.5 / 1.25 = 0.4), and ch2's removes 0.01 (x 4 = 0.04).
  // Budget 3: ch0 -> sign (0.45), ch1 -> 2 (0.4), nothing left. Budget 4: then ch0 sign -> 2
  // ((0.55 - 0.125) / 1.25 = 0.34) beats sign -> 1 (adding the scale: 0.05 / 0.25 = 0.2) and
  // ch1 -> 3 (0.05).
  PlaneReadCalibration reads;
  reads.distortion = {1.0f, 0.5f,  0.125f, 0.03125f, 0.0078125f,  //
                      1.0f, 1.0f,  0.1f,   0.05f,    0.04f,       //
                      0.1f, 0.09f, 0.05f,  0.04f,    0.035f};
  reads.gain.assign(15, 1.0f);
  reads.sign_distortion = {0.55f, 1.0f, 0.09f};
  reads.sign_gain = {3.0f, 1.0f, 1.0f};
  const std::vector<float> q = {1.0f, 1.0f, 2.0f};
  const std::uint8_t s = kernels::fathom::kSignRead;
  std::vector<std::uint8_t> depths(3, 9);
  depth_plan_measured(q.data(), 1, 3, reads, 3, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{s, 2, 0}));
  EXPECT_EQ(plan_bits(depths), 1.0 + 2.25);
  EXPECT_EQ(active_channels(depths), 2);
  std::vector<float> gained = q;
  apply_read_gains(gained.data(), 1, 3, reads, depths);
  EXPECT_EQ(gained, (std::vector<float>{3.0f, 1.0f, 2.0f}));
  depth_plan_measured(q.data(), 1, 3, reads, 4, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{2, 2, 0}));
  // Without budget for planes, nothing is read (the sign read is a plane).
  depth_plan_measured(q.data(), 1, 3, reads, 0, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{0, 0, 0}));
  // Budget 1: only ch0's sign read fits a single plane at the best rate.
  depth_plan_measured(q.data(), 1, 3, reads, 1, depths.data());
  EXPECT_EQ(depths, (std::vector<std::uint8_t>{s, 0, 0}));
}

TEST(FathomPlannerMeasured, MethodNeedsItsCalibration) {
  MethodSpec m{ScanMethod::fathom, 8, 0};
  m.rule = PlanRule::measured;
  EXPECT_EQ(m.name(), "fathom-m-8");
  const std::vector<float> q = {1.0f, 1.0f, 2.0f}, var = {1, 1, 1};
  EXPECT_EQ(test::error_message([&] { (void)method_depths(m, q.data(), 1, 3, var, {}); }),
            "fathom method: fathom-m-8: the measured rule needs calibration; pass "
            "calibrate_plane_reads() of the keys");
  PlaneReadCalibration wrong;
  wrong.distortion.assign(10, 1.0f);
  wrong.gain.assign(10, 1.0f);
  EXPECT_EQ(test::error_message([&] { (void)method_depths(m, q.data(), 1, 3, var, {}, &wrong); }),
            "fathom planner (measured rule): plane read calibration: 10 values for head_dim 3; "
            "calibrate with calibrate_plane_reads() on keys of this head_dim");
}

TEST(FathomPlanner, FixedChannelCalibrationPicksLargestVarianceTimesQuerySquare) {
  const std::vector<float> var = {1, 100, 1, 1, 50};
  const std::vector<float> qs = {10, 0, 1, 1, 1, /*row 2*/ 10, 0, 1, 1, 1};  // 200, 0, 2, 2, 100
  EXPECT_EQ(calibrate_fixed_channels(var, qs, 5, 2), (std::vector<int>{0, 4}));
}

// ---- The multi-level depth search (kernels/fathom/depth_search.hpp) ----

float from_bits(std::uint32_t u) {
  return detail::bits_float(u);
}

// Importances of one random stream: spreads from none to 40 decades at any scale, and (per
// stream, by chance) zero, subnormal, huge, infinite, NaN and tied channels.
std::vector<float> random_importances(Rng& rng, int n) {
  static constexpr float kSpread[] = {0.0f, 0.5f, 3.0f, 10.0f, 40.0f};
  const float spread = kSpread[rng.below(5)];
  const float offset = 60.0f * rng.uniform() - 30.0f;
  const bool specials = rng.below(3) == 0, ties = rng.below(4) == 0;
  std::vector<float> g(n);
  for (int j = 0; j < n; ++j) {
    g[j] = std::pow(10.0f, offset + spread * rng.uniform());
    if (specials) {
      switch (rng.below(12)) {
        case 0:
          g[j] = 0.0f;
          break;
        case 1:
          g[j] = 1e-40f * (1.0f + rng.uniform());
          break;  // subnormal
        case 2:
          g[j] = 3e38f * (1.0f + 0.1f * rng.uniform());
          break;
        case 3:
          g[j] = std::numeric_limits<float>::infinity();
          break;
        case 4:
          g[j] = rng.below(2) ? -0.0f : std::numeric_limits<float>::quiet_NaN();
          break;
        default:
          break;
      }
    }
    if (ties && j > 0 && rng.below(2)) g[j] = g[rng.below(static_cast<std::uint64_t>(j))];
  }
  return g;
}

// log2 importances placed so that depth thresholds log2_g - (2m - 1) fall exactly on bisection
// midpoints -60 + 120 i / 2^e (the comparisons at their ties).
std::vector<float> on_grid_log2(Rng& rng, int n) {
  std::vector<float> out(n);
  for (int j = 0; j < n; ++j) {
    const int e = 1 + static_cast<int>(rng.below(22));
    const auto i = static_cast<float>(rng.below(std::uint64_t{1} << e));
    const float x = -60.0f + std::ldexp(120.0f * i, -e);
    out[j] = x + static_cast<float>(2 * rng.below(4) + 1);
  }
  return out;
}

int random_budget(Rng& rng, int n) {
  switch (rng.below(8)) {
    case 0:
      return 0;
    case 1:
      return 4 * n;
    case 2:
      return static_cast<int>(rng.below(4));
    default:
      return static_cast<int>(rng.below(static_cast<std::uint64_t>(4 * n + 1)));
  }
}

float sequential_theta(const std::vector<float>& log2_g, int budget) {
  return kf::sequential_depth_search(budget, [&](float x) {
    int total = 0;
    for (float l : log2_g) total += kf::depth_at(l, x);
    return total;
  });
}

template <int LEVELS>
float multilevel_theta(const std::vector<float>& log2_g, int budget) {
  return kf::search_log2_theta<LEVELS>(log2_g.data(), static_cast<int>(log2_g.size()), budget);
}

std::vector<int> depths_at(const std::vector<float>& log2_g, float x) {
  std::vector<int> out;
  for (float l : log2_g) out.push_back(kf::depth_at(l, x));
  return out;
}

TEST(FathomDepthSearch, MultilevelSearchIsTheSequentialBisectionOnRandomStreams) {
  // 120,000 streams of 1..256 channels, budgets 0..4 x channels: theta bit for bit (compared as
  // bits: -0 and 0 differ) and the depths at it, for the kernel's 2 and 3 levels per round; 1, 5
  // and 6 levels on every 16th stream.
  Rng rng(2024);
  int streams = 0, mismatches = 0;
  for (int c = 0; c < 120000; ++c) {
    const int n = 1 + static_cast<int>(rng.below(256));
    std::vector<float> log2_g;
    if (rng.below(10) == 0) {
      log2_g = on_grid_log2(rng, n);
    } else {
      for (float g : random_importances(rng, n)) log2_g.push_back(kf::reproducible_log2(g));
    }
    const int budget = random_budget(rng, n);
    const float want = sequential_theta(log2_g, budget);
    std::vector<float> got = {multilevel_theta<2>(log2_g, budget),
                              multilevel_theta<3>(log2_g, budget)};
    if (c % 16 == 0) {
      got.push_back(multilevel_theta<1>(log2_g, budget));
      got.push_back(multilevel_theta<5>(log2_g, budget));
      got.push_back(multilevel_theta<6>(log2_g, budget));
    }
    for (float x : got) {
      if (detail::float_bits(x) != detail::float_bits(want) ||
          depths_at(log2_g, x) != depths_at(log2_g, want)) {
        if (++mismatches <= 5)
          ADD_FAILURE() << "stream " << c << ": " << n << " channels, budget " << budget << ": "
                        << x << " instead of " << want;
      }
    }
    ++streams;
  }
  EXPECT_EQ(streams, 120000);
  EXPECT_EQ(mismatches, 0);
}

TEST(FathomDepthSearch, MultilevelSearchFollowsTheSequentialPathForAnyDepthSum) {
  // The rounds replay the sequential steps' midpoints and decisions, so even a depth sum that
  // is not monotone in x (a hash of x's bits) gives the sequential result.
  Rng rng(7);
  for (int c = 0; c < 20000; ++c) {
    const std::uint64_t salt = rng.next_bits();
    const int budget = static_cast<int>(rng.below(64));
    const auto total = [salt](float x) {
      return static_cast<int>(splitmix64(salt ^ detail::float_bits(x)) % 128);
    };
    const float want = kf::sequential_depth_search(budget, total);
    const auto totals = [&](const auto& mid, auto& out) {
      for (int k = 1; k < static_cast<int>(std::size(mid)); ++k) out[k] = total(mid[k]);
    };
    ASSERT_EQ(detail::float_bits(kf::multilevel_depth_search<1>(budget, totals)),
              detail::float_bits(want));
    ASSERT_EQ(detail::float_bits(kf::multilevel_depth_search<2>(budget, totals)),
              detail::float_bits(want));
    ASSERT_EQ(detail::float_bits(kf::multilevel_depth_search<3>(budget, totals)),
              detail::float_bits(want));
    ASSERT_EQ(detail::float_bits(kf::multilevel_depth_search<5>(budget, totals)),
              detail::float_bits(want));
  }
}

int depth_from_code(float log2_g, float x) {
  return static_cast<int>(kf::depth_code(log2_g, x) - kf::kDepthCodeBiasBits);
}

TEST(FathomDepthSearch, KernelDepthCodeEqualsDepthAt) {
  // The kernel's depth from two round-down FMAs (emulated on the host with the same IEEE
  // operations) against depth_at's four compares.
  EXPECT_EQ(detail::float_bits(kf::kDepthCodeBias), kf::kDepthCodeBiasBits);
  // Hand-worked: d = 1 - 2^-24 has d + 1 rounding to 2 to nearest, but its depth is 0.
  EXPECT_EQ(depth_from_code(1.0f - 0x1p-24f, 0.0f), 0);
  EXPECT_EQ(depth_from_code(1.0f, 0.0f), 1);
  EXPECT_EQ(depth_from_code(7.0f - 0x1p-21f, 0.0f), 3);
  EXPECT_EQ(depth_from_code(7.0f, 0.0f), 4);
  EXPECT_EQ(depth_from_code(1e30f, 60.0f), 4);
  EXPECT_EQ(depth_from_code(-1e30f, -60.0f), 0);
  EXPECT_EQ(depth_from_code(3.5f, 0.5f), 2);  // d = 3 exactly
  const float inf = std::numeric_limits<float>::infinity();
  for (float d : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e-45f, -1e-45f,
                  3.4e38f, -3.4e38f})
    EXPECT_EQ(depth_from_code(d, 0.0f), kf::depth_at(d, 0.0f)) << d;
  // Every float within 2^16 steps of the thresholds 1, 3, 5, 7, of -1 (where the clamp to 0
  // starts) and of 0, as d = log2_g - 0.
  int checked = 0, wrong = 0;
  for (float centre : {-1.0f, 0.0f, 1.0f, 3.0f, 5.0f, 7.0f}) {
    const std::uint32_t c = detail::float_bits(centre);
    for (std::int64_t k = -65536; k <= 65536; ++k) {
      const std::int64_t bits = static_cast<std::int64_t>(c) + k;
      if (bits < 0 || bits > 0xffffffffll) continue;
      const float d = from_bits(static_cast<std::uint32_t>(bits));
      wrong += depth_from_code(d, 0.0f) != kf::depth_at(d, 0.0f);
      ++checked;
    }
  }
  // Random (log2_g, x) pairs: any bit pattern for log2_g, midpoint-like x.
  Rng rng(99);
  for (int i = 0; i < 200000; ++i) {
    const float l = from_bits(static_cast<std::uint32_t>(rng.next_bits()));
    const float x = 120.0f * rng.uniform() - 60.0f;
    const float near = x + static_cast<float>(2 * rng.below(4) + 1);  // d close to a threshold
    const float l2 =
        from_bits(detail::float_bits(near) + static_cast<std::uint32_t>(rng.below(9)) - 4u);
    wrong += depth_from_code(l, x) != kf::depth_at(l, x);
    wrong += depth_from_code(l2, x) != kf::depth_at(l2, x);
    checked += 2;
  }
  EXPECT_GT(checked, 1000000);
  EXPECT_EQ(wrong, 0);
}

TEST(FathomDepthSearch, KernelArithmeticOnHostMatchesTheTwin) {
  // The kernel's search as the host can replay it: per-lane sums of depth codes (lane l holds
  // channels l + 32 r), the warp sum, 2 or 3 levels per round as the kernel picks for the width.
  Rng rng(5);
  for (int c = 0; c < 300; ++c) {
    const int n = 1 + static_cast<int>(rng.below(256));
    std::vector<float> log2_g;
    for (float g : random_importances(rng, n)) log2_g.push_back(kf::reproducible_log2(g));
    const int budget = random_budget(rng, n);
    const int per_lane = n <= 32 ? 1 : n <= 64 ? 2 : n <= 128 ? 4 : 8;
    const auto warp_totals = [&](const auto& mid, auto& out) {
      for (int k = 1; k < static_cast<int>(std::size(mid)); ++k) {
        std::uint32_t warp = 0;
        for (int lane = 0; lane < 32; ++lane) {
          std::uint32_t sum = 0;
          for (int r = 0; r < per_lane; ++r) {
            const int j = lane + 32 * r;
            sum += kf::depth_code(j < n ? log2_g[j] : -1e30f, mid[k]);
          }
          warp += sum - static_cast<std::uint32_t>(per_lane) * kf::kDepthCodeBiasBits;
        }
        out[k] = static_cast<int>(warp);
      }
    };
    static_assert(kf::warp_search_levels(1) == 3 && kf::warp_search_levels(2) == 3 &&
                      kf::warp_search_levels(4) == 2 && kf::warp_search_levels(8) == 2,
                  "the levels replayed below");
    const float got = per_lane >= 4 ? kf::multilevel_depth_search<2>(budget, warp_totals)
                                    : kf::multilevel_depth_search<3>(budget, warp_totals);
    ASSERT_EQ(detail::float_bits(got), detail::float_bits(sequential_theta(log2_g, budget)))
        << n << " channels, budget " << budget;
  }
}

TEST(FathomDepthSearch, BisectionTwinKeepsTheSequentialResults) {
  // depth_plan_bisection_ref (now the multi-level search) against the sequential bisection over
  // the same importances, on many streams with 1 to 8 heads and odd widths.
  Rng rng(31);
  for (int c = 0; c < 40; ++c) {
    const int d = 1 + static_cast<int>(rng.below(256)), heads = 1 + static_cast<int>(rng.below(8));
    const int streams = 1 + static_cast<int>(rng.below(40)),
              kv = 1 + static_cast<int>(rng.below(8));
    std::vector<float> q(static_cast<std::size_t>(streams) * heads * d),
        var(static_cast<std::size_t>(kv) * d);
    for (auto& x : q) x = rng.normal();
    for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
    var[0] = 0.0f;
    kf::DepthPlanArgs a = plan_args(q, var, streams, heads, d, random_budget(rng, d), kv);
    std::vector<std::uint8_t> depths(static_cast<std::size_t>(streams) * d, 9);
    std::vector<float> theta(streams);
    a.depths = depths.data();
    a.log2_theta = theta.data();
    kf::depth_plan_bisection_ref(a);
    std::vector<float> g(d), log2_g(d);
    for (int s = 0; s < streams; ++s) {
      kf::importance_ref(a, s, g.data());
      for (int j = 0; j < d; ++j) log2_g[j] = kf::reproducible_log2(g[j]);
      const float want = sequential_theta(log2_g, a.budget);
      ASSERT_EQ(detail::float_bits(theta[s]), detail::float_bits(want)) << "case " << c;
      for (int j = 0; j < d; ++j)
        ASSERT_EQ(depths[static_cast<std::size_t>(s) * d + j], kf::depth_at(log2_g[j], want));
    }
  }
}

// The planner's many-stream form (DepthPlanner::plan_measured's CPU twin, which the CUDA kernel
// matches) equals the one-stream planner plus apply_read_gains for every stream, with tables
// repeating every `period` streams; queries of channels 0-3 tie in some streams.
TEST(FathomPlannerMeasured, ManyStreamsEqualOneStreamAtATime) {
  const int d = 64, heads = 4, period = 3, streams = 7;
  const auto reads = test::random_read_calibrations(period, d, 5);
  Rng rng(6);
  std::vector<float> q(static_cast<std::size_t>(streams) * heads * d);
  for (auto& x : q) x = static_cast<float>(rng.normal());
  for (int h = 0; h < heads; ++h)
    for (int j = 1; j < 4; ++j)
      q[static_cast<std::size_t>(h) * d + j] = q[static_cast<std::size_t>(h) * d];
  std::vector<float> distortion, gain;
  pack_read_tables(reads, d, distortion, gain);
  for (int budget : {0, 1, 7, 48, 100, 256}) {
    std::vector<std::uint8_t> depths(static_cast<std::size_t>(streams) * d, 9);
    std::vector<float> gained(q.size(), -1.0f);
    kf::MeasuredPlanArgs a;
    a.queries = q.data();
    a.distortion = distortion.data();
    a.gain = gain.data();
    a.period = period;
    a.streams = streams;
    a.heads = heads;
    a.channels = d;
    a.budget = budget;
    a.depths = depths.data();
    a.gained_queries = gained.data();
    DepthPlanner(Backend::cpu).plan_measured(a);
    int signs = 0;
    for (int s = 0; s < streams; ++s) {
      const float* qs = q.data() + static_cast<std::size_t>(s) * heads * d;
      std::vector<std::uint8_t> want(static_cast<std::size_t>(d));
      depth_plan_measured(qs, heads, d, reads[static_cast<std::size_t>(s % period)], budget,
                          want.data());
      std::vector<float> want_q(qs, qs + heads * d);
      apply_read_gains(want_q.data(), heads, d, reads[static_cast<std::size_t>(s % period)], want);
      const auto at = static_cast<std::ptrdiff_t>(s) * d;
      EXPECT_EQ(std::vector<std::uint8_t>(depths.begin() + at, depths.begin() + at + d), want)
          << "budget " << budget << " stream " << s;
      EXPECT_EQ(std::vector<float>(gained.begin() + at * heads, gained.begin() + (at + d) * heads),
                want_q)
          << "budget " << budget << " stream " << s;
      int planes = 0;
      for (auto t : want) planes += kf::read_planes(t), signs += t == kf::kSignRead;
      EXPECT_LE(planes, budget);
    }
    if (budget >= 7 && budget <= 100) {
      EXPECT_GT(signs, 0) << "budget " << budget;  // the plans hold sign reads
    }
  }
  // A calibration of another head_dim is named.
  std::vector<float> dd, gg;
  EXPECT_EQ(test::error_message([&] { pack_read_tables(reads, d + 1, dd, gg); }),
            "fathom planner (measured rule): plane read calibration: 320 values for head_dim 65; "
            "calibrate with calibrate_plane_reads() on keys of this head_dim");
}

}  // namespace
}  // namespace hisparse::fathom
