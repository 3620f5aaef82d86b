// KLT in the quality study: on correlated key channels (a model without QK-norm) the KLT basis
// lets Fathom beat the fixed 32-channel scan at fewer bits; on independent channels it costs
// nothing beyond noise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fathom/klt.hpp"
#include "fathom/quality_study.hpp"

namespace hisparse::fathom {
namespace {

const QualityRow& row(const std::vector<QualityRow>& rows, const std::string& name) {
  const auto it =
      std::find_if(rows.begin(), rows.end(), [&](const QualityRow& r) { return r.name == name; });
  if (it == rows.end()) throw std::runtime_error("no row " + name);
  return *it;
}

constexpr int kBudgets[] = {32, 40, 48, 56, 64, 80, 96, 128};

/// KV heads (independent seeds) per table: 16 by default (the KLT twins double the methods);
/// HISPARSE_QUALITY_KV_HEADS overrides, as in fathom_select_test.
int kv_heads() {
  const char* env = std::getenv("HISPARSE_QUALITY_KV_HEADS");
  const int v = env ? std::atoi(env) : 0;
  return v > 0 ? v : 16;
}

QualityConfig study(KeyProfile profile) {
  QualityConfig cfg;
  cfg.workload.profile = profile;
  cfg.workload.tokens = 8192;
  cfg.workload.steps = 1;
  cfg.kv_heads = kv_heads();
  cfg.top_k = 256;
  cfg.klt = true;
  for (int b : kBudgets) cfg.methods.push_back({ScanMethod::fathom, b, 0});
  cfg.methods.push_back({ScanMethod::full_scan, 0, 0});
  cfg.methods.push_back({ScanMethod::fixed_channels, 0, 32});
  cfg.methods.push_back({ScanMethod::oracle, 0, 0});
  return cfg;
}

/// Attention error above the oracle's (the error of exact top-k at this k is the floor).
double excess(const std::vector<QualityRow>& rows, const std::string& name) {
  return row(rows, name).attention_error - row(rows, "oracle").attention_error;
}

TEST(FathomKltQuality, MethodNamesAndTwins) {
  EXPECT_EQ((MethodSpec{ScanMethod::fathom, 48, 0, true}).name(), "fathom-klt-48");
  EXPECT_EQ((MethodSpec{ScanMethod::fixed_channels, 0, 32, true}).name(), "fixed-klt-32ch");
  EXPECT_EQ((MethodSpec{ScanMethod::full_scan, 0, 0, true}).name(), "full-klt-4bit");
  EXPECT_EQ((MethodSpec{ScanMethod::sparq, 0, 16, true}).name(), "sparq-klt-16");
  QualityConfig cfg;
  cfg.methods = {{ScanMethod::fathom, 48, 0},
                 {ScanMethod::sparq, 0, 16},
                 {ScanMethod::fixed_channels, 0, 32},
                 {ScanMethod::fathom, 64, 0, true}};
  std::vector<std::string> names;
  for (const auto& m : study_methods(cfg)) names.push_back(m.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"fathom-48", "sparq-16", "fixed-32ch", "fathom-klt-64"}));
  cfg.klt = true;
  names.clear();
  for (const auto& m : study_methods(cfg)) names.push_back(m.name());
  EXPECT_EQ(names, (std::vector<std::string>{"fathom-48", "sparq-16", "fixed-32ch", "fathom-klt-64",
                                             "fathom-klt-48", "fixed-klt-32ch"}));
}

TEST(FathomKltQuality, CorrelatedChannelsTable) {
  const auto rows = quality_study(study(KeyProfile::correlated));
  std::printf("%s", format_quality_table(rows).c_str());
  const auto& fixed = row(rows, "fixed-32ch");
  const double plain_bits = fathom_bits_at_error(rows, fixed.attention_error);
  const double klt_bits = fathom_bits_at_error(rows, fixed.attention_error, true);
  const auto& fixed_klt = row(rows, "fixed-klt-32ch");
  std::printf(
      "correlated: Fathom bits at the 32-channel scan's error (%.5f): plain %.1f, KLT %.1f; at the "
      "KLT 32-channel scan's error (%.5f): KLT %.1f\n",
      fixed.attention_error, plain_bits, klt_bits, fixed_klt.attention_error,
      fathom_bits_at_error(rows, fixed_klt.attention_error, true));
  RecordProperty("klt_fathom_bits_at_fixed32_error", std::to_string(klt_bits));
  RecordProperty("plain_fathom_bits_at_fixed32_error", std::to_string(plain_bits));
  for (int b : kBudgets) {
    const std::string plain = "fathom-" + std::to_string(b),
                      klt = "fathom-klt-" + std::to_string(b);
    EXPECT_LT(excess(rows, klt), 0.5 * excess(rows, plain)) << b;
    EXPECT_GT(row(rows, klt).recall, row(rows, plain).recall + 0.1) << b;
  }
  // KLT Fathom at 56 bits beats the channel-basis 32-channel scan at 136 bits.
  EXPECT_LT(row(rows, "fathom-klt-48").attention_error, fixed.attention_error);
  EXPECT_LT(klt_bits, 0.8 * plain_bits);
  // Every KLT budget, down to 37.6 bits (0.28x of 136), is below the channel-basis scan's error.
  EXPECT_LT(klt_bits, 0.4 * 136.0);
  // Against the Loki-like calibrated KLT channel set the margin is smaller: measured 80 bits
  // (0.59x) here, 79-96 bits over 3 seeds of 64 KV heads.
  EXPECT_LT(fathom_bits_at_error(rows, fixed_klt.attention_error, true), 0.85 * 136.0);
}

TEST(FathomKltQuality, IndependentChannelsLoseNothingBeyondNoise) {
  const auto rows = quality_study(study(KeyProfile::independent));
  std::printf("%s", format_quality_table(rows).c_str());
  // A basis calibrated on 4096 tokens mixes channels of nearly equal variance, which costs a
  // little. Over workload seeds 1-6 (16 KV heads each), worst budget: recall 0.011-0.020 lower,
  // attention error 0.4-4% higher; more is a defect.
  for (int b : kBudgets) {
    const auto& p = row(rows, "fathom-" + std::to_string(b));
    const auto& k = row(rows, "fathom-klt-" + std::to_string(b));
    EXPECT_LT(k.attention_error, 1.05 * p.attention_error) << b;
    EXPECT_GT(k.recall, p.recall - 0.04) << b;
  }
}

}  // namespace
}  // namespace hisparse::fathom
