// compare_results (the gate on one metric) on small documents built here: matching by axis
// values, noise, verdicts, points present in one run only, and notes on configs that differ
// outside the axes.
#include "report/compare.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hisparse {
namespace {

using nlohmann::json;

json point(int concurrency, double tps, double p10, double p90, int context = 128) {
  const double median = 1000.0 * concurrency / tps;
  return {{"index", 0},
          {"axes", {{"concurrency", concurrency}}},
          {"config",
           {{"model", "m"},
            {"mode", "dense"},
            {"concurrency", concurrency},
            {"context_length", context}}},
          {"status", "ok"},
          {"metrics",
           {{"output_tokens_per_s", tps},
            {"step_ms", {{"median", median}, {"p10", p10 * median}, {"p90", p90 * median}}}}}};
}

json doc(std::vector<json> points) {
  return {{"schema_version", 1},
          {"metadata", {{"backend", "cpu"}, {"device", {{"name", "cpu0"}}}}},
          {"points", points}};
}

const GateRow& find(const GateOutcome& c, const std::string& key) {
  for (const auto& r : c.rows)
    if (r.item == key) return r;
  throw std::runtime_error("no point " + key);
}

TEST(ReportCompare, NoiseIsTheLargerRelativeSpread) {
  // BASE spread 0.9..1.1 = 20%, NEW 0.95..1.05 = 10%: a 15% drop is within noise, 25% is not.
  const json base = doc({point(1, 100, 0.9, 1.1), point(2, 200, 0.9, 1.1)});
  const json next = doc({point(1, 85, 0.95, 1.05), point(2, 150, 0.95, 1.05)});
  const GateOutcome c = compare_results(base, next, {}, "a", "b");
  const auto& one = find(c, "concurrency=1");
  EXPECT_NEAR(one.delta_pct, -15.0, 1e-9);
  EXPECT_NEAR(one.noise_pct, 20.0, 1e-9);
  EXPECT_EQ(one.verdict, GateVerdict::ambiguous);
  EXPECT_EQ(find(c, "concurrency=2").verdict, GateVerdict::slower);
  EXPECT_EQ(c.count(GateVerdict::slower), 1u);
  EXPECT_TRUE(c.failed());
}

TEST(ReportCompare, ExactlyAtTheThresholdIsTheSame) {
  const json base = doc({point(1, 100, 1, 1)});
  const json next = doc({point(1, 95, 1, 1)});
  EXPECT_EQ(compare_results(base, next, {}, "a", "b").rows[0].verdict, GateVerdict::same);
  CompareOptions strict;
  strict.threshold_pct = 4.9;
  EXPECT_EQ(compare_results(base, next, strict, "a", "b").rows[0].verdict, GateVerdict::slower);
}

TEST(ReportCompare, PointsInOneRunOnlyAreAddedOrMissing) {
  const json base = doc({point(1, 100, 1, 1), point(2, 200, 1, 1)});
  const json next = doc({point(2, 200, 1, 1), point(4, 400, 1, 1)});
  const GateOutcome c = compare_results(base, next, {}, "a", "b");
  ASSERT_EQ(c.rows.size(), 3u);
  EXPECT_EQ(find(c, "concurrency=4").note, "only in NEW");
  EXPECT_EQ(find(c, "concurrency=4").verdict, GateVerdict::added);
  EXPECT_EQ(find(c, "concurrency=1").note, "only in BASE");
  // A point the new run no longer measures fails the gate: coverage was lost.
  EXPECT_EQ(find(c, "concurrency=1").verdict, GateVerdict::missing);
  EXPECT_TRUE(c.failed());
}

TEST(ReportCompare, ConfigDifferenceOutsideTheAxesIsNoted) {
  const GateOutcome c = compare_results(doc({point(1, 100, 1, 1, 128)}),
                                        doc({point(1, 100, 1, 1, 256)}), {}, "a", "b");
  EXPECT_EQ(c.rows[0].note, "config differs: context_length 128 -> 256");
}

TEST(ReportCompare, BaseFailureIsNotARegression) {
  json base = doc({point(1, 100, 1, 1)});
  base["points"][0]["status"] = "failed";
  base["points"][0]["metrics"] = nullptr;
  const GateOutcome c = compare_results(base, doc({point(1, 50, 1, 1)}), {}, "a", "b");
  EXPECT_EQ(c.rows[0].verdict, GateVerdict::not_measured);
  EXPECT_EQ(c.rows[0].note, "failed in BASE");
  EXPECT_FALSE(c.failed());
}

TEST(ReportCompare, MetricMissingInNewFailsAndInBaseIsAnError) {
  json next = doc({point(1, 100, 1, 1)});
  next["points"][0]["metrics"].erase("output_tokens_per_s");
  const GateOutcome c = compare_results(doc({point(1, 100, 1, 1)}), next, {}, "a.json", "b.json");
  EXPECT_EQ(c.rows[0].verdict, GateVerdict::missing);
  EXPECT_EQ(c.rows[0].note, "NEW has no metrics.output_tokens_per_s");
  try {
    (void)compare_results(next, doc({point(1, 100, 1, 1)}), {}, "a.json", "b.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "a.json: metrics.output_tokens_per_s");
    EXPECT_EQ(e.problem(), "no point or case of a.json has output_tokens_per_s");
    EXPECT_EQ(e.fix(), "use one of: step_ms.median, step_ms.p10, step_ms.p90");
  }
  CompareOptions o;
  o.threshold_pct = -1;
  EXPECT_THROW((void)compare_results(doc({}), doc({}), o, "a", "b"), Error);
}

// A point that chose rows: recall, error and Fathom's bits per token, with a wide step spread that
// must not hide a change of these deterministic metrics.
json selection_point(int concurrency, double recall, double error, double bits) {
  json p = point(concurrency, 100, 0.5, 1.5);
  p["metrics"]["selection_recall"] = recall;
  p["metrics"]["attention_rel_error"] = error;
  p["metrics"]["bits_per_token"] = bits;
  p["metrics"]["hit_rate"] = nullptr;
  return p;
}

TEST(ReportCompare, SelectionMetricsHaveNoNoiseAllowanceAndTheirOwnDirection) {
  const json base = doc({selection_point(1, 0.90, 0.010, 50), selection_point(2, 0.90, 0.010, 50)});
  const json next = doc({selection_point(1, 0.80, 0.009, 50), selection_point(2, 0.89, 0.012, 60)});
  CompareOptions recall;
  recall.metric = CompareMetric::selection_recall;
  const GateOutcome r = compare_results(base, next, recall, "a", "b");
  EXPECT_EQ(find(r, "concurrency=1").verdict, GateVerdict::worse);  // -11.1%, spread ignored
  EXPECT_TRUE(std::isnan(find(r, "concurrency=1").noise_pct));
  EXPECT_EQ(find(r, "concurrency=2").verdict, GateVerdict::same);  // -1.1%
  CompareOptions error;
  error.metric = CompareMetric::attention_rel_error;
  const GateOutcome e = compare_results(base, next, error, "a", "b");
  EXPECT_EQ(find(e, "concurrency=1").verdict, GateVerdict::better);  // lower is better
  EXPECT_EQ(find(e, "concurrency=2").verdict, GateVerdict::worse);   // +20%
  CompareOptions bits;
  bits.metric = CompareMetric::bits_per_token;
  EXPECT_EQ(find(compare_results(base, next, bits, "a", "b"), "concurrency=2").verdict,
            GateVerdict::worse);
  const std::string text = comparison_text(e, error);
  EXPECT_NE(text.find("compare attention_rel_error (lower is better), threshold 5%, no noise "
                      "allowance"),
            std::string::npos)
      << text;
}

TEST(ReportCompare, PointsWithoutTheSelectionMetricAreNotComparedAndNoneAtAllIsAnError) {
  json base = doc({point(1, 100, 1, 1), selection_point(2, 0.9, 0.01, 50)});
  json next = doc({point(1, 100, 1, 1), selection_point(2, 0.9, 0.01, 50)});
  base["points"][0]["metrics"]["selection_recall"] = nullptr;  // a dense point measures none
  next["points"][0]["metrics"]["selection_recall"] = nullptr;
  CompareOptions recall;
  recall.metric = CompareMetric::selection_recall;
  const GateOutcome c = compare_results(base, next, recall, "a", "b");
  EXPECT_EQ(find(c, "concurrency=1").verdict, GateVerdict::not_measured);
  EXPECT_EQ(find(c, "concurrency=1").base_text, "null");
  EXPECT_EQ(find(c, "concurrency=2").verdict, GateVerdict::same);
  CompareOptions hits;
  hits.metric = CompareMetric::hit_rate;
  try {
    (void)compare_results(base, next, hits, "a.json", "b.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "b.json: no point in both runs has a metrics.hit_rate to compare; "
                 "choose a metric these runs measure (selection_recall and attention_rel_error "
                 "for sparse modes, hit_rate for hisparse modes, bits_per_token for fathom "
                 "modes)");
  }
}

TEST(ReportCompare, MetricNamesRoundTrip) {
  EXPECT_EQ(parse_compare_metric("tokens_per_s", "--metric"), CompareMetric::tokens_per_s);
  EXPECT_EQ(name_of(parse_compare_metric("step_ms.median", "--metric")), "step_ms.median");
  for (const auto& name : compare_metric_names())
    EXPECT_EQ(name_of(parse_compare_metric(name, "--metric")), name);
  EXPECT_TRUE(higher_is_better(CompareMetric::selection_recall));
  EXPECT_FALSE(higher_is_better(CompareMetric::bytes_h2d_per_step));
  EXPECT_FALSE(is_timing(CompareMetric::hit_rate));
  EXPECT_THROW((void)parse_compare_metric("tps", "--metric"), Error);
}

TEST(ReportCompare, JsonCarriesTheVerdicts) {
  const GateOutcome c =
      compare_results(doc({point(1, 100, 1, 1)}), doc({point(1, 120, 1, 1)}), {}, "a", "b");
  const json j = to_json(c);
  EXPECT_EQ(j["status"], "pass");
  EXPECT_EQ(j["counts"]["faster"], 1);
  EXPECT_EQ(j["rows"][0]["verdict"], "faster");
  EXPECT_EQ(j["rows"][0]["item"], "concurrency=1");
  EXPECT_NEAR(j["rows"][0]["delta_pct"].get<double>(), 20.0, 1e-9);
  EXPECT_EQ(j["runs"][0]["base"]["label"], "a");
}

}  // namespace
}  // namespace hisparse
