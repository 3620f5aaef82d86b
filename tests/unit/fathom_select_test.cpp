// Selection rule, the CPU scan + selection pipeline, and the quality study table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/metrics.hpp"
#include "fathom/quality_study.hpp"
#include "fathom/selector.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "support/error_message.hpp"

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
  EXPECT_EQ(test::error_message([&] {
              FathomSelector s(Backend::cpu, SelectorConfig{36, 4, 32, 48});
            }),
            "fathom selector: top_k: top_k 36 leaves no room beyond 4 sinks and 32 recent tokens; "
            "use top_k > 36");
}

/// KV heads (independent seeds) per quality table: 32 by default, a test stays at ~3 s on one
/// core; HISPARSE_QUALITY_KV_HEADS=256 gives the larger sample of kernels/fathom/README.md.
int quality_kv_heads() {
  const char* env = std::getenv("HISPARSE_QUALITY_KV_HEADS");
  const int v = env ? std::atoi(env) : 0;
  return v > 0 ? v : 32;
}

/// One query step per KV head: successive steps drift by 5% and add little that a new seed
/// does not.
QualityConfig quality_config(KeyProfile profile) {
  QualityConfig cfg;
  cfg.workload.profile = profile;
  cfg.workload.tokens = 8192;
  cfg.workload.steps = 1;
  cfg.kv_heads = quality_kv_heads();
  cfg.top_k = 256;
  return cfg;
}

const QualityRow& find_row(const std::vector<QualityRow>& rows, const std::string& name) {
  const auto it =
      std::find_if(rows.begin(), rows.end(), [&](const QualityRow& r) { return r.name == name; });
  if (it == rows.end()) throw std::runtime_error("no row " + name);
  return *it;
}

void print_stats(const AttentionStats& s) {
  std::printf(
      "dense attention: entropy %.2f nats, sinks %.3f, last 32 %.3f, exact top-k selection "
      "%.3f, strongest non-sink token %.3f of the mass\n",
      s.entropy, s.sink_mass, s.recent_mass, s.selected_mass, s.top1_mass);
}

/// Properties every workload's table must have: errors ordered by what each method reads, and
/// the fixed baselines costed right.
void expect_ordered(const std::vector<QualityRow>& rows) {
  const auto& oracle = find_row(rows, "oracle");
  const auto& full = find_row(rows, "full-4bit");
  const auto& fixed = find_row(rows, "fixed-32ch");
  EXPECT_DOUBLE_EQ(oracle.recall, 1.0);
  EXPECT_DOUBLE_EQ(full.bits_per_token, 544.0);
  EXPECT_DOUBLE_EQ(fixed.bits_per_token, 136.0);
  // Nothing beats exact top-k at this k; the full 4-bit scan comes within 1% of it.
  EXPECT_LE(oracle.attention_error, full.attention_error);
  EXPECT_LT(full.attention_error, 1.01 * oracle.attention_error);
  EXPECT_LT(full.attention_error, fixed.attention_error);
  EXPECT_LT(full.attention_error, find_row(rows, "fathom-128").attention_error);
  // More planes, better selection: error falls and recall rises with every budget step.
  const int budgets[] = {32, 40, 48, 56, 64, 80, 96, 128};
  for (std::size_t i = 1; i < std::size(budgets); ++i) {
    const auto& lo = find_row(rows, "fathom-" + std::to_string(budgets[i - 1]));
    const auto& hi = find_row(rows, "fathom-" + std::to_string(budgets[i]));
    EXPECT_LT(hi.attention_error, lo.attention_error) << budgets[i];
    EXPECT_GT(hi.recall, lo.recall) << budgets[i];
    EXPECT_GT(hi.bits_per_token, lo.bits_per_token) << budgets[i];
  }
  // At about the fixed set's cost (144 vs 136 bits) Fathom reads better channels.
  EXPECT_LT(find_row(rows, "fathom-128").attention_error, fixed.attention_error);
  // Query-magnitude channel choice without key variances (SparQ) is the weakest at equal bits.
  EXPECT_GT(find_row(rows, "sparq-32").attention_error, fixed.attention_error);
  EXPECT_GT(find_row(rows, "sparq-16").attention_error, find_row(rows, "sparq-32").attention_error);
}

TEST(FathomQuality, DefaultWorkloadTable) {
  const QualityConfig cfg = quality_config(KeyProfile::rope_qk_norm);
  const auto stats = attention_stats(cfg);
  print_stats(stats);
  // The workload's attention looks like real attention at this context (see SyntheticKeySpec):
  // spread over several nats, a quarter on the sinks, ~2% left outside the exact top-k.
  EXPECT_GT(stats.entropy, 2.5);
  EXPECT_LT(stats.entropy, 4.5);
  EXPECT_GT(stats.sink_mass, 0.1);
  EXPECT_LT(stats.sink_mass, 0.5);
  EXPECT_GT(stats.selected_mass, 0.95);
  EXPECT_LT(stats.selected_mass, 0.995);
  const auto rows = quality_study(cfg);
  std::printf("%s", format_quality_table(rows).c_str());
  // Exact top-k leaves a relative output error of a few percent, as in real models.
  const auto& oracle = find_row(rows, "oracle");
  EXPECT_GT(oracle.attention_error, 0.01);
  EXPECT_LT(oracle.attention_error, 0.1);
  expect_ordered(rows);
  const auto& fixed = find_row(rows, "fixed-32ch");
  const double bits = fathom_bits_at_error(rows, fixed.attention_error);
  std::printf("Fathom bits at the 32-channel scan's error (%.5f): %.1f = %.2fx of 136\n",
              fixed.attention_error, bits, bits / 136.0);
  RecordProperty("fathom_bits_at_fixed32_error", std::to_string(bits));
  // Measured 0.72x here (0.72-0.79x over other seeds, 0.76x with 256 KV heads); issue 4's target
  // of 0.6x is not reached on this workload (kernels/fathom/README.md "Quality").
  EXPECT_LT(bits, 0.85 * 136.0);
  EXPECT_GT(bits, find_row(rows, "fathom-48").bits_per_token);
}

TEST(FathomQuality, IndependentChannelWorkloadTable) {
  // Independent channels, one query direction shared by the group: for comparison.
  const QualityConfig cfg = quality_config(KeyProfile::independent);
  const auto stats = attention_stats(cfg);
  print_stats(stats);
  const auto rows = quality_study(cfg);
  std::printf("%s", format_quality_table(rows).c_str());
  const auto& oracle = find_row(rows, "oracle");
  EXPECT_GT(oracle.attention_error, 0.01);
  EXPECT_LT(oracle.attention_error, 0.15);
  expect_ordered(rows);
  const auto& fixed = find_row(rows, "fixed-32ch");
  const double bits = fathom_bits_at_error(rows, fixed.attention_error);
  std::printf("independent profile: Fathom bits at the 32-channel scan's error: %.1f = %.2fx\n",
              bits, bits / 136.0);
  // Measured 0.66x here (0.59x with 256 KV heads).
  EXPECT_LT(bits, 0.85 * 136.0);
}

/// Recall and attention error of one selection, computed here from scratch.
std::pair<double, double> score_selection(const SyntheticKeys& data, int top_k,
                                          const std::vector<std::int32_t>& sel) {
  const auto& spec = data.spec;
  const int d = spec.channels, heads = spec.heads, keep = top_k - 36;
  const std::int64_t n = spec.tokens;
  std::vector<float> scores(static_cast<std::size_t>(n) * heads);
  exact_scores(data.query(0), heads, data.keys.data(), n, d, scores.data());
  std::vector<std::int32_t> oracle(36 + static_cast<std::size_t>(heads) * keep);
  oracle.resize(static_cast<std::size_t>(
      kf::select_from_scores_ref(scores.data(), heads, n, keep, 4, 32, oracle.data())));
  std::vector<std::int32_t> inter;
  std::set_intersection(sel.begin(), sel.end(), oracle.begin(), oracle.end(),
                        std::back_inserter(inter));
  std::vector<float> dense(static_cast<std::size_t>(heads) * d), approx(dense.size());
  attention_over(data.query(0), heads, data.keys.data(), data.values.data(), n, d, {},
                 dense.data());
  attention_over(data.query(0), heads, data.keys.data(), data.values.data(), n, d, sel,
                 approx.data());
  return {static_cast<double>(inter.size()) / static_cast<double>(oracle.size()),
          mean_relative_l2_error(approx.data(), dense.data(), heads, d)};
}

/// A study of one KV head and one step (each row is one sample) running `method`.
QualityConfig one_sample_study(const MethodSpec& method) {
  QualityConfig cfg;
  cfg.workload.tokens = 4096;
  cfg.workload.steps = 1;
  cfg.kv_heads = 1;
  cfg.top_k = 256;
  cfg.methods = {method};
  return cfg;
}

TEST(FathomQuality, StudyThreadsFitHalfTheFreeMemory) {
  // 1M tokens x 128 channels x 10 B = 1.25 GiB per head; 16 GiB free holds 6 heads in half of it.
  constexpr std::size_t kGiB = std::size_t{1} << 30;
  EXPECT_EQ(study_threads(0, 64, 16 * kGiB, 1 << 20, 128), 6);
  EXPECT_EQ(study_threads(0, 4, 16 * kGiB, 1 << 20, 128), 4);  // fewer hardware threads
  EXPECT_EQ(study_threads(0, 64, kGiB / 4, 1 << 20, 128), 1);  // never below one
  EXPECT_EQ(study_threads(3, 64, kGiB / 4, 1 << 20, 128), 3);  // asked for: as asked
  EXPECT_EQ(study_threads(0, 0, 16 * kGiB, 8192, 128), 1);     // hardware count unknown
}

TEST(FathomQuality, ThreadCountDoesNotChangeAFigure) {
  // Heads studied in parallel are summed in head order: bit-identical rows and statistics for
  // 1, 2 and 5 threads (more threads than heads included).
  QualityConfig cfg;
  cfg.workload.tokens = 2048;
  cfg.workload.steps = 2;
  cfg.kv_heads = 4;
  cfg.top_k = 128;
  const auto study = [&](int threads) {
    cfg.threads = threads;
    return std::make_pair(quality_study(cfg), attention_stats(cfg));
  };
  const auto [one, one_stats] = study(1);
  for (int threads : {2, 5}) {
    const auto [rows, stats] = study(threads);
    ASSERT_EQ(rows.size(), one.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(rows[r].bits_per_token, one[r].bits_per_token) << one[r].name << threads;
      EXPECT_EQ(rows[r].active_channels, one[r].active_channels) << one[r].name << threads;
      EXPECT_EQ(rows[r].recall, one[r].recall) << one[r].name << threads;
      EXPECT_EQ(rows[r].attention_error, one[r].attention_error) << one[r].name << threads;
    }
    EXPECT_EQ(stats.entropy, one_stats.entropy);
    EXPECT_EQ(stats.selected_mass, one_stats.selected_mass);
  }
  // A head that fails fails the study, whichever thread studied it.
  cfg.threads = 3;
  cfg.source = [&](int kvh) {
    if (kvh == 2) throw Error("study head 2", "unreadable", "fix it");
    SyntheticKeySpec spec = cfg.workload;
    spec.seed += static_cast<std::uint64_t>(kvh);
    return make_synthetic_keys(spec);
  };
  EXPECT_EQ(test::error_message([&] { (void)quality_study(cfg); }),
            "study head 2: unreadable; fix it");
}

// score_calibration_steps scores the last N held-out calibration queries: the same study as a
// source whose test queries are those, bit for bit; asking for more than are held is refused.
TEST(FathomQuality, StudyCanScoreTheHeldOutCalibrationQueries) {
  QualityConfig cfg = one_sample_study({ScanMethod::fathom, 48, 0});
  cfg.methods.push_back({ScanMethod::fixed_channels, 0, 32});
  QualityConfig on_calibration = cfg;
  on_calibration.score_calibration_steps = 2;
  QualityConfig by_hand = cfg;
  by_hand.source = [&](int kvh) {
    SyntheticKeySpec spec = cfg.workload;
    spec.seed += static_cast<std::uint64_t>(kvh) * 1000003ull;
    SyntheticKeys k = make_synthetic_keys(spec);
    const auto per_step = static_cast<std::ptrdiff_t>(spec.heads) * spec.channels;
    k.queries.assign(k.calibration_queries.end() - 2 * per_step, k.calibration_queries.end());
    k.spec.steps = 2;
    return k;
  };
  const auto got = quality_study(on_calibration), want = quality_study(by_hand);
  const auto test = quality_study(cfg);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].attention_error, want[i].attention_error) << got[i].name;
    EXPECT_EQ(got[i].recall, want[i].recall) << got[i].name;
    EXPECT_EQ(got[i].bits_per_token, want[i].bits_per_token) << got[i].name;
    EXPECT_NE(got[i].attention_error, test[i].attention_error) << got[i].name;
  }
  on_calibration.score_calibration_steps = cfg.workload.calibration_queries + 1;
  EXPECT_EQ(test::error_message([&] { (void)quality_study(on_calibration); }),
            "quality study: calibration steps: 65 calibration query steps asked for, 64 are held "
            "out; use at most 64");
}

TEST(FathomQuality, StudyScoresWhatTheSelectorShips) {
  // The study's fathom row must be the shipped selector's result (8-bit-weight scores), and with
  // float_scores the REFERENCE.md formula's.
  QualityConfig cfg = one_sample_study({ScanMethod::fathom, 48, 0});
  const auto data = make_synthetic_keys(cfg.workload);
  const int d = cfg.workload.channels, heads = cfg.workload.heads;
  const std::int64_t n = cfg.workload.tokens;
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, d, n);
  store.append(0, 1, data.keys.data(), d, 0, n);
  FathomSelector selector(Backend::cpu, SelectorConfig{256, 4, 32, 48});
  const auto shipped = selector.select(store, data.query(0), heads, data.variance.data(), 1)[0];
  const auto [recall, error] = score_selection(data, 256, shipped);
  const auto rows = quality_study(cfg);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].recall, recall);
  EXPECT_NEAR(rows[0].attention_error, error, 1e-12 * error);
  // The definition: float-weight scores over the selector's depths.
  std::vector<float> scores(static_cast<std::size_t>(n) * heads);
  kf::PlaneScanArgs args;
  args.words = store.words();
  args.scales = store.scales();
  args.layout = store.layout();
  args.queries = data.query(0);
  args.depths = selector.last_depths().data();
  args.streams = 1;
  args.heads = heads;
  kf::plane_scores_ref(args, 0, n, scores.data());
  std::vector<std::int32_t> defined(36 + static_cast<std::size_t>(heads) * 220);
  defined.resize(static_cast<std::size_t>(
      kf::select_from_scores_ref(scores.data(), heads, n, 220, 4, 32, defined.data())));
  // The 8-bit weights do move this selection, so the equalities above tell the two apart.
  EXPECT_NE(defined, shipped);
  const auto [recall_f, error_f] = score_selection(data, 256, defined);
  cfg.float_scores = true;
  const auto rows_f = quality_study(cfg);
  EXPECT_DOUBLE_EQ(rows_f[0].recall, recall_f);
  EXPECT_NEAR(rows_f[0].attention_error, error_f, 1e-12 * error_f);
  std::printf(
      "fathom-48: shipped recall %.4f error %.5f; float definition recall %.4f error %.5f\n",
      recall, error, recall_f, error_f);
}

TEST(FathomQuality, StudyMeasuredRowIsTheSelectorsMeasuredRule) {
  // The study's fathom-m row is what FathomSelector selects with PlanRule::measured, given the
  // same read calibration (the workload's calibration tokens).
  MethodSpec measured{ScanMethod::fathom, 48, 0};
  measured.rule = PlanRule::measured;
  const QualityConfig cfg = one_sample_study(measured);
  const auto data = make_synthetic_keys(cfg.workload);
  const int d = cfg.workload.channels, heads = cfg.workload.heads;
  const std::int64_t n = cfg.workload.tokens;
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, d, n);
  store.append(0, 1, data.keys.data(), d, 0, n);
  SelectorConfig sc{256, 4, 32, 48};
  sc.rule = PlanRule::measured;
  FathomSelector selector(Backend::cpu, sc);
  const std::vector<PlaneReadCalibration> reads = {calibrate_plane_reads(
      data.keys.data(), n, d, cfg.workload.calibration_skip, cfg.workload.calibration_tokens)};
  const ReadTables tables(Backend::cpu, reads, d);
  const auto shipped = selector.select(store, data.query(0), heads, nullptr, 1, &tables)[0];
  std::vector<std::uint8_t> plan(static_cast<std::size_t>(d));
  depth_plan_measured(data.query(0), heads, d, reads[0], 48, plan.data());
  EXPECT_EQ(selector.last_depths(), plan);
  const auto [recall, error] = score_selection(data, 256, shipped);
  const auto rows = quality_study(cfg);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].name, "fathom-m-48");
  EXPECT_DOUBLE_EQ(rows[0].recall, recall);
  EXPECT_NEAR(rows[0].attention_error, error, 1e-12 * error);
  EXPECT_EQ(
      test::error_message([&] { (void)selector.select(store, data.query(0), heads, nullptr, 1); }),
      "fathom selector: rule measured: no read calibration was given; pass ReadTables of "
      "calibrate_plane_reads() of each KV head's stored keys");
  const ReadTables narrow(Backend::cpu,
                          std::vector<PlaneReadCalibration>{
                              calibrate_plane_reads(data.keys.data(), 2048, d / 2, 0, 2048)},
                          d / 2);
  EXPECT_EQ(test::error_message(
                [&] { (void)selector.select(store, data.query(0), heads, nullptr, 1, &narrow); }),
            "fathom selector: rule measured: read tables for head_dim 64, the store holds "
            "head_dim 128; calibrate on keys of this head_dim");
}

TEST(FathomSelect, OneSelectorServesStoresOfEveryShapeInTurn) {
  // The selector keeps its buffers between calls and grows them on demand: a small store, a
  // larger one, then the small one again must each select what a fresh selector selects.
  SyntheticKeySpec spec;
  spec.tokens = 3000;
  spec.steps = 2;
  const auto data = make_synthetic_keys(spec);
  const int d = spec.channels, heads = spec.heads;
  PlaneStore small(Backend::cpu, PlaneLayoutKind::host, 1, d, 1000);
  small.append(0, 1, data.keys.data(), d, 0, 1000);
  PlaneStore large(Backend::cpu, PlaneLayoutKind::hbm, 2, d, spec.tokens);
  large.append(0, 1, data.keys.data(), d, 0, spec.tokens);
  large.append(1, 1, data.keys.data() + 500 * d, d, 0, 2400);
  std::vector<float> queries(data.query(0), data.query(0) + heads * d);
  queries.insert(queries.end(), data.query(1), data.query(1) + heads * d);
  const SelectorConfig config{128, 4, 32, 40};
  FathomSelector reused(Backend::cpu, config);
  const auto fresh = [&](const PlaneStore& store, const float* q) {
    return FathomSelector(Backend::cpu, config).select(store, q, heads, data.variance.data(), 1);
  };
  const auto want_small = fresh(small, data.query(1));
  const auto want_large = fresh(large, queries.data());
  ASSERT_EQ(want_large.size(), 2u);
  EXPECT_NE(want_large[0], want_large[1]);
  EXPECT_EQ(reused.select(small, data.query(1), heads, data.variance.data(), 1), want_small);
  EXPECT_EQ(reused.select(large, queries.data(), heads, data.variance.data(), 1), want_large);
  EXPECT_EQ(reused.last_depths().size(), static_cast<std::size_t>(2 * d));
  EXPECT_EQ(reused.select(small, data.query(1), heads, data.variance.data(), 1), want_small);
  EXPECT_EQ(reused.last_depths().size(), static_cast<std::size_t>(d));
  // Seeded (SelectorConfig::seeded): the score ranges kept between calls restart at each change of
  // shape, and the selections stay the same (the CPU twin writes the ranges, ignores the seeds).
  SelectorConfig seeded_config = config;
  seeded_config.seeded = true;
  FathomSelector seeded(Backend::cpu, seeded_config);
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(seeded.select(small, data.query(1), heads, data.variance.data(), 1), want_small);
    EXPECT_EQ(seeded.select(large, queries.data(), heads, data.variance.data(), 1), want_large);
    EXPECT_EQ(seeded.select(large, queries.data(), heads, data.variance.data(), 1), want_large);
  }
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

TEST(FathomQuality, MeasuredRuleNeedsFewerBitsOnTheDefaultWorkload) {
  // PlanRule::measured against the paper's rule, same budgets, same scan and selection: the bits
  // each needs at the 32-channel scan's error (kernels/fathom/README.md "Quality").
  QualityConfig cfg = quality_config(KeyProfile::rope_qk_norm);
  for (const auto& m : default_methods()) {
    if (m.method == ScanMethod::fixed_channels) cfg.methods.push_back(m);
    if (m.method != ScanMethod::fathom) continue;
    cfg.methods.push_back(m);
    MethodSpec measured = m;
    measured.rule = PlanRule::measured;
    cfg.methods.push_back(measured);
  }
  const auto rows = quality_study(cfg);
  std::printf("%s", format_quality_table(rows).c_str());
  const double error = find_row(rows, "fixed-32ch").attention_error;
  double bits[2] = {};
  for (PlanRule rule : {PlanRule::paper, PlanRule::measured}) {
    std::vector<QualityRow> own;
    for (const auto& r : rows)
      if (r.method.method == ScanMethod::fathom && r.method.rule == rule) own.push_back(r);
    bits[static_cast<int>(rule)] = fathom_bits_at_error(own, error);
  }
  std::printf(
      "bits at the 32-channel scan's error (%.5f): paper rule %.1f (%.3fx of 136), "
      "measured rule %.1f (%.3fx)\n",
      error, bits[0], bits[0] / 136.0, bits[1], bits[1] / 136.0);
  // Measured 97.7 -> 80.7 bits (0.72x -> 0.59x) here (84.8 before sign reads); 101.8 -> 84.0
  // (0.75x -> 0.62x) with 256 KV heads.
  // Bounds hold for both samples (HISPARSE_QUALITY_KV_HEADS=256 too).
  EXPECT_LT(bits[1], 0.85 * bits[0]);
  EXPECT_LT(bits[1], 0.62 * 136.0);
  // At every budget the measured rule pays fewer bits (fewer scales) and reads fewer channels;
  // above the smallest budget it also errs less.
  for (int b : {32, 48, 64, 80}) {
    const auto& paper = find_row(rows, "fathom-" + std::to_string(b));
    const auto& measured = find_row(rows, "fathom-m-" + std::to_string(b));
    EXPECT_LT(measured.bits_per_token, paper.bits_per_token) << b;
    EXPECT_LT(measured.active_channels, paper.active_channels) << b;
    if (b > 32) {
      EXPECT_LT(measured.attention_error, paper.attention_error) << b;
    }
  }
}

TEST(FathomQuality, CentredKeysLowerTheBitsAtTheFixedScansError) {
  // Keys minus their calibration mean before quantization (KeyCentre) for every scanned method,
  // the 32-channel scan included: the slow RoPE pairs' bias no longer widens their blocks'
  // scales. Measured rule: 80.7 -> 77.7 bits (0.59x -> 0.57x of 136) here; 83.7 -> 81.0 bits
  // (0.62x -> 0.60x) with 256 KV heads.
  double bits[2] = {};
  for (bool centre : {false, true}) {
    QualityConfig cfg = quality_config(KeyProfile::rope_qk_norm);
    cfg.centre_keys = centre;
    for (const auto& m : default_methods()) {
      if (m.method == ScanMethod::fixed_channels) cfg.methods.push_back(m);
      if (m.method != ScanMethod::fathom) continue;
      MethodSpec measured = m;
      measured.rule = PlanRule::measured;
      cfg.methods.push_back(measured);
    }
    const auto rows = quality_study(cfg);
    bits[centre ? 1 : 0] = fathom_bits_at_error(rows, find_row(rows, "fixed-32ch").attention_error);
  }
  std::printf("bits at the 32-channel scan's error: %.1f, centred keys %.1f\n", bits[0], bits[1]);
  EXPECT_LT(bits[1], bits[0] - 1.5);  // both bounds hold for 256 KV heads too
  EXPECT_LT(bits[1], 0.6 * 136.0);
}

// Worked by hand. Head A: (10, 0.50), (20, 0.10), (30, 0.09), convex. Head B: (10, 0.20),
// (20, 0.19), (30, 0.05): (20, 0.19) lies above the line from (10, 0.20) to (30, 0.05) and leaves
// the hull. From 10 bits and mean error 0.35, the segments in order: A +10 bits -0.40, B +20 bits
// -0.15, A +10 bits -0.01 (each changes the mean by half).
TEST(FathomQuality, PerHeadAllocationTakesTheSteepestHullSegmentsFirst) {
  // A Fathom row; its budget is its bits unless given.
  const auto row = [](double bits, double error, PlanRule rule = PlanRule::measured,
                      int budget = 0) {
    QualityRow r;
    r.method.method = ScanMethod::fathom;
    r.method.rule = rule;
    r.method.budget = budget > 0 ? budget : static_cast<int>(bits);
    r.bits_per_token = bits;
    r.attention_error = error;
    return r;
  };
  QualityRow fixed;
  fixed.method.method = ScanMethod::fixed_channels;
  fixed.bits_per_token = 1.0;
  fixed.attention_error = 0.0;
  const std::vector<std::vector<QualityRow>> heads{
      {row(30, 0.09), row(10, 0.50), row(20, 0.10), fixed, row(5, 0.0, PlanRule::paper)},
      {row(10, 0.20), row(20, 0.19), row(30, 0.05)}};
  const auto at = [&](double error) {
    return per_head_allocation_bits(heads, error, PlanRule::measured);
  };
  EXPECT_DOUBLE_EQ(*at(0.5), 10.0);                           // already there at the smallest
  EXPECT_DOUBLE_EQ(*at(0.15), 15.0);                          // A's first segment exactly
  EXPECT_NEAR(*at(0.10), 15.0 + 10.0 * 0.05 / 0.075, 1e-12);  // two thirds of B's segment
  EXPECT_NEAR(*at(0.145), 15.0 + 10.0 * 0.005 / 0.075, 1e-12);
  // Equal budgets reach 0.145 only at 20 bits each.
  EXPECT_LT(*at(0.145), 20.0);
  EXPECT_FALSE(at(0.06).has_value());  // 0.07 at 30 bits each is the floor
  // Only the rows of the asked rule and basis count, and every head needs some.
  EXPECT_FALSE(per_head_allocation_bits(heads, 1.0, PlanRule::paper).has_value());
  EXPECT_FALSE(per_head_allocation_bits(heads, 1.0, PlanRule::measured, true).has_value());
  EXPECT_FALSE(per_head_allocation_bits({}, 1.0, PlanRule::measured).has_value());

  // Chosen on these curves, scored on others (matched by budget). The path of splits: every head
  // at 10, then A to 20, B to 30, A to 30; scored means (bits, error): (11, 0.35), (16, 0.25),
  // (26, 0.11), (31, 0.06).
  const std::vector<std::vector<QualityRow>> scored{
      {row(10, 0.40), row(20, 0.20), row(30, 0.10)},
      {row(12, 0.30, PlanRule::measured, 10), row(22, 0.25, PlanRule::measured, 20),
       row(32, 0.02, PlanRule::measured, 30)}};
  const auto chosen_at = [&](double error) {
    const auto split = per_head_allocation(heads, scored, error, PlanRule::measured);
    return split ? std::optional<double>(split->bits) : std::nullopt;
  };
  EXPECT_DOUBLE_EQ(*chosen_at(0.5), 11.0);
  EXPECT_NEAR(*chosen_at(0.30), 11.0 + 5.0 * 0.05 / 0.10, 1e-12);
  EXPECT_NEAR(*chosen_at(0.11), 16.0 + 10.0 * 0.14 / 0.14, 1e-12);
  EXPECT_FALSE(chosen_at(0.05).has_value());
  // The whole-budget split: the first on the path at or below the error.
  const auto split_at = [&](double error) {
    return per_head_allocation(heads, scored, error, PlanRule::measured)->budgets;
  };
  EXPECT_EQ(split_at(0.5), (std::vector<int>{10, 10}));
  EXPECT_EQ(split_at(0.30), (std::vector<int>{20, 10}));
  EXPECT_EQ(split_at(0.11), (std::vector<int>{20, 30}));
  EXPECT_EQ(split_at(0.07), (std::vector<int>{30, 30}));
  EXPECT_FALSE(per_head_allocation(heads, scored, 0.05, PlanRule::measured).has_value());
  EXPECT_FALSE(per_head_allocation(heads, {scored[0]}, 0.3, PlanRule::measured).has_value());
}

TEST(FathomQuality, SplitsAtMeanBudgetsFollowTheSamePath) {
  // The curves of the test above: the path of splits is (10, 10), (20, 10), (20, 30), (30, 30),
  // mean budgets 10, 15, 25, 30. Each mean gets the last split at or below it.
  const auto row = [](int budget, double error) {
    QualityRow r;
    r.method.method = ScanMethod::fathom;
    r.method.rule = PlanRule::measured;
    r.method.budget = budget;
    r.bits_per_token = budget;
    r.attention_error = error;
    return r;
  };
  const std::vector<std::vector<QualityRow>> heads{{row(30, 0.09), row(10, 0.50), row(20, 0.10)},
                                                   {row(10, 0.20), row(20, 0.19), row(30, 0.05)}};
  const std::vector<int> means{64, 5, 10, 14, 15, 24, 25, 29, 30};  // any order
  const auto splits = per_head_splits_at_mean_budgets(heads, PlanRule::measured, false, means);
  using V = std::vector<int>;
  const std::map<int, V> expected{{10, V{10, 10}}, {14, V{10, 10}}, {15, V{20, 10}},
                                  {24, V{20, 10}}, {25, V{20, 30}}, {29, V{20, 30}},
                                  {30, V{30, 30}}, {64, V{30, 30}}};
  EXPECT_EQ(splits, expected);  // 5 is below every head's smallest budget: no entry
  // Another rule's rows (none here), or no heads: no splits.
  EXPECT_TRUE(per_head_splits_at_mean_budgets(heads, PlanRule::paper, false, means).empty());
  EXPECT_TRUE(per_head_splits_at_mean_budgets({}, PlanRule::measured, false, means).empty());
}

}  // namespace
}  // namespace hisparse::fathom
