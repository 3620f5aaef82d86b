// Where a series stops scaling: near-linear, a bend named with the phase that grew, and the cap
// admission puts on running requests, from crafted results.
#include "report/scaling.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace hisparse {
namespace {

using nlohmann::json;

json point(const std::string& mode, int requested, int running, double tps, double step_ms,
           double attention_ms, double ffn_ms) {
  return {{"status", "ok"},
          {"config",
           {{"model", "m"}, {"mode", mode}, {"context_length", 1024}, {"concurrency", requested}}},
          {"metrics",
           {{"running_requests", running},
            {"output_tokens_per_s", tps},
            {"step_ms", {{"median", step_ms}}},
            {"phase_ms", {{"attention", attention_ms}, {"ffn", ffn_ms}}}}}};
}

TEST(ReportScaling, NamesTheKneeAndWhatGrewThere) {
  const json results = {
      {"points",
       {point("hisparse", 1, 1, 100, 10, 4, 6),
        point("hisparse", 2, 2, 195, 10.3, 4.2, 6.1),
        point("hisparse", 4, 4, 300, 13.3, 7.0, 6.3),
        point("sparse-gpu", 1, 1, 100, 10, 4, 6),
        point("sparse-gpu", 2, 2, 190, 10.5, 4.4, 6.1),
        point("sparse-gpu", 4, 2, 190, 10.5, 4.4, 6.1),
        point("dense", 1, 1, 50, 20, 14, 6),
        point("dense", 4, 4, 190, 21, 15, 6),
        {{"status", "failed"}, {"config", {{"mode", "dense"}, {"concurrency", 8}}}}}}};
  const auto all = scaling_series(results);
  ASSERT_EQ(all.size(), 3u);
  const ScalingSeries& h = all[0];
  EXPECT_EQ(h.label, "m hisparse context_length=1024");
  ASSERT_EQ(h.steps.size(), 3u);
  EXPECT_FALSE(h.steps[0].per_doubling);
  EXPECT_NEAR(*h.steps[1].per_doubling, 1.95, 1e-12);
  EXPECT_NEAR(*h.steps[2].per_doubling, 300.0 / 195.0, 1e-12);  // one doubling
  EXPECT_EQ(h.knee, 2);
  EXPECT_EQ(h.steps[2].grew_phase, "attention");
  EXPECT_NEAR(h.steps[2].grew_ms, 2.8, 1e-12);
  EXPECT_EQ(h.verdict,
            "bends after 2 running requests: 1.54x per doubling from 2 to 4 (below 1.8x); the "
            "step grew from 10.3 to 13.3 ms, most in attention (+2.8 ms)");
  EXPECT_EQ(all[1].knee, 2);
  EXPECT_EQ(all[1].verdict,
            "stops at 2 running requests: admission (concurrency 4 asked, 2 admitted by the "
            "memory budget, the rest wait)");
  // Dense: 1 -> 4 running is two doublings: (190 / 50)^(1/2) = 1.95 per doubling.
  EXPECT_FALSE(all[2].knee);
  EXPECT_NEAR(*all[2].steps[1].per_doubling, std::sqrt(3.8), 1e-12);
  EXPECT_EQ(all[2].verdict, "near-linear (at least 1.8x per doubling) up to 4 running requests");
}

TEST(ReportScaling, OnePointSeriesAndEmptyResultsHaveNone) {
  EXPECT_TRUE(scaling_series(json::object()).empty());
  EXPECT_TRUE(scaling_series({{"points", {point("dense", 1, 1, 50, 20, 14, 6)}}}).empty());
}

}  // namespace
}  // namespace hisparse
