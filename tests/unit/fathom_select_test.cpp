// Selection rule, the CPU scan + selection pipeline, and the quality study table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "fathom/quality_study.hpp"
#include "fathom/selector.hpp"
#include "kernels/fathom/plane_scan.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

TEST(FathomSelect, HandWorkedSmallCase) {
  // n = 46: sinks 0..3, recent 14..45 (32), eligible 4..13. Two heads, keep 2.
  const std::int64_t n = 46;
  std::vector<float> scores(2 * n, 0.0f);
  scores[7] = 5, scores[9] = 4, scores[12] = 3;  // head 0: 7, 9
  scores[n + 9] = 1, scores[n + 5] = 1;          // head 1: tie 5 vs 9 -> 5 first, then 9
  scores[n + 20] = 100;                          // recent: already kept, not counted in keep
  std::vector<std::int32_t> out(4 + 32 + 4);
  const auto count = kf::select_from_scores_ref(scores.data(), 2, n, 2, 4, 32, out.data());
  std::vector<std::int32_t> expect = {0, 1, 2, 3, 5, 7, 9};
  for (int i = 14; i < 46; ++i) expect.push_back(i);
  ASSERT_EQ(count, static_cast<std::int64_t>(expect.size()));
  EXPECT_EQ(std::vector<std::int32_t>(out.begin(), out.begin() + count), expect);
}

TEST(FathomSelect, ShortSequencesSelectEverything) {
  for (std::int64_t n : {0, 1, 4, 5, 36, 37}) {
    std::vector<float> scores(static_cast<std::size_t>(n) * 3, 1.0f);
    std::vector<std::int32_t> out(36 + 3 * 1);
    const auto count = kf::select_from_scores_ref(scores.data(), 3, n, 1, 4, 32, out.data());
    EXPECT_EQ(count, n) << n;
    for (std::int64_t i = 0; i < count; ++i) EXPECT_EQ(out[i], i);
  }
}

TEST(FathomSelect, SelectorKeepsSinksAndRecentNeverTwiceAndFindsPlantedTokens) {
  SyntheticKeySpec spec;
  spec.tokens = 4096 + 37;
  spec.steps = 1;
  spec.relevant_tokens = 40;
  const auto data = make_synthetic_keys(spec);
  const int d = spec.channels;
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, d, spec.tokens);
  store.append(0, 1, data.keys.data(), d, 0, spec.tokens);
  FathomSelector selector(Backend::cpu, SelectorConfig{256, 4, 32, 64});
  const auto sel = selector.select(store, data.query(0), spec.heads, data.variance.data(), 1);
  ASSERT_EQ(sel.size(), 1u);
  const auto& pos = sel[0];
  EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end()));
  EXPECT_EQ(std::set<std::int32_t>(pos.begin(), pos.end()).size(), pos.size());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), i));
  for (std::int64_t i = spec.tokens - 32; i < spec.tokens; ++i)
    EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), i));
  EXPECT_LE(pos.size(), static_cast<std::size_t>(36 + spec.heads * 220));
  EXPECT_GE(pos.size(), static_cast<std::size_t>(36 + 220));
  int depth_sum = 0;
  for (auto t : selector.last_depths()) depth_sum += t;
  EXPECT_EQ(depth_sum, 64);
  // The selection overlaps the exact top-k selection heavily.
  std::vector<float> exact(static_cast<std::size_t>(spec.tokens) * spec.heads);
  exact_scores(data.query(0), spec.heads, data.keys.data(), spec.tokens, d, exact.data());
  std::vector<std::int32_t> oracle(36 + spec.heads * 220);
  const auto on =
      kf::select_from_scores_ref(exact.data(), spec.heads, spec.tokens, 220, 4, 32, oracle.data());
  std::vector<std::int32_t> inter;
  std::set_intersection(pos.begin(), pos.end(), oracle.begin(), oracle.begin() + on,
                        std::back_inserter(inter));
  EXPECT_GT(static_cast<double>(inter.size()) / static_cast<double>(on), 0.6);
}

TEST(FathomSelect, TopKSmallerThanSinksPlusRecentIsNamed) {
  try {
    FathomSelector s(Backend::cpu, SelectorConfig{36, 4, 32, 48});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "fathom selector: top_k: top_k 36 leaves no room beyond 4 sinks and 32 recent tokens; "
        "use top_k > 36");
  }
}

TEST(FathomQuality, DefaultWorkloadTable) {
  QualityConfig cfg;
  cfg.workload.tokens = 8192;
  cfg.workload.steps = 2;
  cfg.kv_heads = 2;
  cfg.top_k = 256;
  const auto rows = quality_study(cfg);
  std::printf("%s", format_quality_table(rows).c_str());
  const auto find = [&](const std::string& name) {
    return *std::find_if(rows.begin(), rows.end(),
                         [&](const QualityRow& r) { return r.name == name; });
  };
  const auto oracle = find("oracle");
  EXPECT_DOUBLE_EQ(oracle.recall, 1.0);
  const auto full = find("full-4bit"), fixed = find("fixed-32ch");
  EXPECT_DOUBLE_EQ(full.bits_per_token, 544.0);
  EXPECT_DOUBLE_EQ(fixed.bits_per_token, 136.0);
  EXPECT_LT(full.attention_error, find("fathom-40").attention_error * 1.5);
  EXPECT_GT(find("fathom-128").recall, find("fathom-40").recall);
  const double bits = fathom_bits_at_error(rows, fixed.attention_error);
  std::printf("Fathom bits at the 32-channel scan's error (%.5f): %.1f = %.2fx of 136\n",
              fixed.attention_error, bits, bits / 136.0);
  RecordProperty("fathom_bits_at_fixed32_error", std::to_string(bits));
}

TEST(FathomQuality, IndependentChannelWorkloadTable) {
  // The wave-1 workload, for comparison with the RoPE/QK-norm default.
  QualityConfig cfg;
  cfg.workload.profile = KeyProfile::independent;
  cfg.workload.tokens = 8192;
  cfg.workload.steps = 2;
  cfg.kv_heads = 2;
  cfg.top_k = 256;
  const auto rows = quality_study(cfg);
  std::printf("%s", format_quality_table(rows).c_str());
  const auto fixed = *std::find_if(rows.begin(), rows.end(),
                                   [](const QualityRow& r) { return r.name == "fixed-32ch"; });
  const double bits = fathom_bits_at_error(rows, fixed.attention_error);
  std::printf("independent profile: Fathom bits at the 32-channel scan's error: %.1f = %.2fx\n",
              bits, bits / 136.0);
  EXPECT_GT(bits, 0.0);
  EXPECT_DOUBLE_EQ(rows.back().recall, 1.0);
}

TEST(FathomWorkload, CalibrationQueriesAreHeldOut) {
  SyntheticKeySpec spec;
  spec.tokens = 2048;
  spec.steps = 3;
  spec.calibration_queries = 16;
  const auto data = make_synthetic_keys(spec);
  const std::size_t row = static_cast<std::size_t>(spec.heads) * spec.channels;
  ASSERT_EQ(data.calibration_queries.size(), 16 * row);
  for (std::size_t c = 0; c < 16; ++c)
    for (int s = 0; s < spec.steps; ++s)
      EXPECT_FALSE(
          std::equal(data.calibration_queries.begin() + static_cast<std::ptrdiff_t>(c * row),
                     data.calibration_queries.begin() + static_cast<std::ptrdiff_t>((c + 1) * row),
                     data.query(s)))
          << c << " " << s;
  // Drawing more calibration queries does not change the test data.
  spec.calibration_queries = 64;
  const auto more = make_synthetic_keys(spec);
  EXPECT_EQ(more.keys, data.keys);
  EXPECT_EQ(more.queries, data.queries);
}

TEST(FathomWorkload, RopeProfileHasPairedVariancesRisingTowardsSlowPairs) {
  SyntheticKeySpec spec;
  spec.tokens = 8192;
  spec.steps = 1;
  spec.relevant_tokens = 0;
  spec.outlier_channels = 0;
  const auto data = make_synthetic_keys(spec);
  const int half = spec.channels / 2;
  double fast = 0, slow = 0;
  for (int i = 0; i < half; ++i) {
    const double ratio = data.variance[i] / data.variance[i + half];
    EXPECT_GT(ratio, 0.8) << "pair " << i;
    EXPECT_LT(ratio, 1.25) << "pair " << i;
    if (i < 16) fast += std::log10(data.variance[i]) / 16;
    if (i >= half - 16) slow += std::log10(data.variance[i]) / 16;
  }
  EXPECT_GT(slow - fast, 1.5);  // three decades over the pairs by default
  // The independent profile has no pair structure.
  spec.profile = KeyProfile::independent;
  const auto flat = make_synthetic_keys(spec);
  int unpaired = 0;
  for (int i = 0; i < half; ++i) {
    const double ratio = flat.variance[i] / flat.variance[i + half];
    unpaired += ratio < 0.8 || ratio > 1.25;
  }
  EXPECT_GT(unpaired, half / 2);
}

}  // namespace
}  // namespace hisparse::fathom
