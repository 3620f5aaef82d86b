// The regression gate on documents built here: every verdict, every refusal (exit 2), gate.yaml
// errors with their exact messages, repetitions judged by the rank test, Google Benchmark files.
#include "report/gate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "support/error_message.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

using nlohmann::json;
using test::error_message;

/// A results point of mode `mode` at concurrency 1: tokens/s (with repetitions when given),
/// misses and a digest.
json point(const std::string& mode, double tps, std::int64_t misses,
           const std::vector<double>& repetitions = {}) {
  json metrics = {
      {"output_tokens_per_s", tps},
      {"step_ms", {{"median", 1000.0 / tps}, {"p10", 990.0 / tps}, {"p90", 1010.0 / tps}}},
      {"misses", misses},
      {"selection_recall", mode == "dense" ? json(nullptr) : json(0.9)},
      {"next_tokens_digest", "00000000000000aa"}};
  if (!repetitions.empty())
    metrics["repetitions"] = {{"count", repetitions.size()}, {"output_tokens_per_s", repetitions}};
  return {{"index", 0},
          {"axes", {{"mode", mode}}},
          {"config", {{"model", "tiny"}, {"mode", mode}, {"concurrency", 1}}},
          {"status", "ok"},
          {"metrics", metrics}};
}

json results(std::vector<json> points, const std::string& device = "cpu0",
             const std::string& backend = "cpu", int decode_steps = 8) {
  for (std::size_t i = 0; i < points.size(); ++i) points[i]["index"] = i;
  return {
      {"schema_version", 1},
      {"metadata", {{"backend", backend}, {"device", {{"name", device}}}, {"git_revision", "abc"}}},
      {"scenario", {{"name", "s"}, {"decode_steps", decode_steps}, {"source", "x.yaml"}}},
      {"points", points}};
}

GateMetric exact(const std::string& name, GateMetric::Better better = GateMetric::Better::none,
                 double tolerance = 0) {
  GateMetric m;
  m.name = name;
  m.better = better;
  m.tolerance = tolerance;
  return m;
}

GateMetric timing(const std::string& name, GateMetric::Better better, double min_effect = 5) {
  GateMetric m;
  m.name = name;
  m.timing = true;
  m.better = better;
  m.min_effect_pct = min_effect;
  return m;
}

GateBaseline baseline(std::vector<GateMetric> metrics,
                      GateInputKind kind = GateInputKind::results) {
  GateBaseline b;
  b.kind = kind;
  b.name = "s";
  b.where = "gate.yaml:2:5: baselines[0]";
  b.metrics = std::move(metrics);
  return b;
}

GateOutcome judge(const GateBaseline& b, const json& base, const json& next,
                  const GateOptions& options = {}) {
  return judge_documents(b, {base}, {"base.json"}, {next}, {"new.json"}, options);
}

const GateRow& row(const GateOutcome& o, const std::string& item, const std::string& metric) {
  for (const auto& r : o.rows)
    if (r.item == item && r.metric == metric) return r;
  throw std::runtime_error("no row " + item + " " + metric);
}

TEST(ReportGate, DeterministicMetricsAreExactUnlessAToleranceOrADirectionIsGiven) {
  const json base = results({point("dense", 100, 40), point("hisparse", 100, 40)});
  json next = results({point("dense", 100, 41), point("hisparse", 100, 40)});
  next["points"][1]["metrics"]["next_tokens_digest"] = "00000000000000ab";
  next["points"][1]["metrics"]["selection_recall"] = 0.8;
  const GateOutcome o =
      judge(baseline({exact("misses"), exact("next_tokens_digest"),
                      exact("selection_recall", GateMetric::Better::higher, 0.05)}),
            base, next);
  EXPECT_EQ(row(o, "mode=dense", "misses").verdict, GateVerdict::changed);  // 40 -> 41
  EXPECT_NEAR(row(o, "mode=dense", "misses").delta_pct, 2.5, 1e-12);
  EXPECT_EQ(row(o, "mode=hisparse", "misses").verdict, GateVerdict::same);
  EXPECT_EQ(row(o, "mode=hisparse", "next_tokens_digest").verdict, GateVerdict::changed);
  EXPECT_EQ(row(o, "mode=hisparse", "selection_recall").verdict, GateVerdict::worse);  // -11%
  EXPECT_EQ(row(o, "mode=dense", "selection_recall").verdict, GateVerdict::not_measured);
  EXPECT_TRUE(o.failed());
  EXPECT_EQ(o.count(GateVerdict::changed), 2u);

  // Within the tolerance (11% < 20%), and better in its direction.
  next["points"][1]["metrics"]["selection_recall"] = 0.95;
  const GateOutcome better =
      judge(baseline({exact("selection_recall", GateMetric::Better::higher, 0.01)}), base, next);
  EXPECT_EQ(row(better, "mode=hisparse", "selection_recall").verdict, GateVerdict::better);
  EXPECT_FALSE(better.failed());
  next["points"][1]["metrics"]["selection_recall"] = 0.9 * (1 + 1e-10);
  EXPECT_EQ(
      row(judge(baseline({exact("selection_recall", GateMetric::Better::none, 1e-9)}), base, next),
          "mode=hisparse", "selection_recall")
          .verdict,
      GateVerdict::same);
}

TEST(ReportGate, TimingsWithRepetitionsAreJudgedByTheRankTest) {
  const std::vector<double> base_reps{100, 101, 99, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9};
  std::vector<double> slower, close, overlapping;
  for (double v : base_reps) slower.push_back(v * 0.8), close.push_back(v * 0.97);
  // A median 10% lower, but spread as widely as the whole change: the test cannot tell.
  overlapping = {60, 120, 70, 110, 80, 100, 90, 95, 85};
  const json base = results({point("a", 100, 1, base_reps)});
  const auto b = baseline({timing("output_tokens_per_s", GateMetric::Better::higher)});

  const GateOutcome s = judge(b, base, results({point("a", 80, 1, slower)}));
  const GateRow& r = row(s, "mode=a", "output_tokens_per_s");
  EXPECT_EQ(r.verdict, GateVerdict::slower);
  EXPECT_EQ(r.base_samples, 9u);
  EXPECT_EQ(r.new_samples, 9u);
  EXPECT_NEAR(r.delta_pct, -20.0, 1e-9);
  EXPECT_LT(r.p_value, 1e-3);  // exact: 2 / C(18, 9) = 4.1e-5
  EXPECT_NEAR(r.p_value, 2.0 / 48620, 1e-12);
  EXPECT_TRUE(s.failed());

  EXPECT_EQ(
      row(judge(b, base, results({point("a", 97, 1, close)})), "mode=a", "output_tokens_per_s")
          .verdict,
      GateVerdict::same);  // -3% < 5%
  const GateOutcome o = judge(b, base, results({point("a", 90, 1, overlapping)}));
  EXPECT_EQ(row(o, "mode=a", "output_tokens_per_s").verdict, GateVerdict::ambiguous);
  EXPECT_GT(row(o, "mode=a", "output_tokens_per_s").p_value, 0.05);
  EXPECT_FALSE(o.failed());
  const GateOutcome f = judge(b, results({point("a", 80, 1, slower)}), base);
  EXPECT_EQ(row(f, "mode=a", "output_tokens_per_s").verdict, GateVerdict::faster);
}

TEST(ReportGate, ASingleRunIsJudgedAgainstItsStepTimeSpread) {
  // One run a side: the rank test cannot decide, so the change must exceed the p10..p90
  // spread of the step times (2% here).
  const auto b = baseline({timing("step_ms.median", GateMetric::Better::lower)});
  const GateOutcome o = judge(b, results({point("a", 100, 1)}), results({point("a", 90, 1)}));
  const GateRow& r = row(o, "mode=a", "step_ms.median");
  EXPECT_EQ(r.verdict, GateVerdict::slower);  // 10 ms -> 11.1 ms
  EXPECT_NEAR(r.noise_pct, 2.0, 1e-9);
  EXPECT_TRUE(std::isnan(r.p_value));
}

TEST(ReportGate, PointsOnOneSideFailedPointsAndMissingMetrics) {
  const json base = results({point("a", 100, 1), point("b", 100, 1)});
  json next = results({point("b", 100, 1), point("c", 100, 1)});
  next["points"][0]["metrics"].erase("misses");
  const GateOutcome o = judge(baseline({exact("misses")}), base, next);
  EXPECT_EQ(row(o, "mode=a", "-").verdict, GateVerdict::missing);
  EXPECT_EQ(row(o, "mode=a", "-").note, "only in BASE");
  EXPECT_EQ(row(o, "mode=c", "-").verdict, GateVerdict::added);
  EXPECT_EQ(row(o, "mode=b", "misses").verdict, GateVerdict::missing);
  EXPECT_EQ(row(o, "mode=b", "misses").note, "NEW has no metrics.misses");

  json failed = results({point("a", 100, 1), point("b", 100, 1)});
  failed["points"][1]["status"] = "failed";
  failed["points"][1]["error"] = "out of memory";
  const GateOutcome f = judge(baseline({exact("misses")}), base, failed);
  EXPECT_EQ(row(f, "mode=b", "status").verdict, GateVerdict::failed);
  EXPECT_EQ(row(f, "mode=b", "status").note, "failed in NEW: out of memory");
  const GateOutcome was_failed = judge(baseline({exact("misses")}), failed, base);
  EXPECT_EQ(row(was_failed, "mode=b", "status").verdict, GateVerdict::not_measured);
  EXPECT_FALSE(was_failed.failed());

  // A metric no baseline point has is a mistake in the gate file: refused.
  EXPECT_EQ(error_message([&] { (void)judge(baseline({exact("hits")}), base, base); }),
            "gate.yaml:2:5: baselines[0]: metrics.hits: no point or case of base.json has hits; "
            "use one of: misses, next_tokens_digest, output_tokens_per_s, selection_recall, "
            "step_ms.median, step_ms.p10, step_ms.p90");
  GateMetric optional = exact("hits");
  optional.required = false;  // the default gate: skipped where the baseline lacks it
  EXPECT_TRUE(judge(baseline({optional}), base, base).rows.empty());
}

TEST(ReportGate, TimingsOfAnotherDeviceOrBackendAreRefusedUnlessAllowed) {
  const json base = results({point("a", 100, 1)});
  const json other_device = results({point("a", 100, 1)}, "cpu1");
  const auto timed = baseline({timing("output_tokens_per_s", GateMetric::Better::higher)});
  EXPECT_EQ(error_message([&] { (void)judge(timed, base, other_device); }),
            "new.json: device cpu1 differs from the baseline's cpu0: timings of different devices "
            "or backends are not comparable; judge runs of the baseline's device and backend (a "
            "baseline per device, e.g. reports/baselines/<device>/), or pass "
            "--allow-different-devices");
  GateOptions allow;
  allow.allow_different_devices = true;
  EXPECT_EQ(judge(timed, base, other_device, allow).warnings.front(),
            "new.json: device cpu1 differs from the baseline's cpu0 (judged anyway: "
            "--allow-different-devices)");
  // Deterministic metrics are the same on any machine of one backend...
  const GateOutcome d = judge(baseline({exact("misses")}), base, other_device);
  EXPECT_FALSE(d.failed());
  EXPECT_EQ(d.warnings.front(),
            "new.json: device cpu1 differs from the baseline's cpu0; judged, since this baseline "
            "gates no timing");
  // ...but not across backends (the CUDA engine matches the CPU twin within tolerances only).
  EXPECT_THROW((void)judge(baseline({exact("misses")}), base,
                           results({point("a", 100, 1)}, "NVIDIA H200", "cuda")),
               Error);
}

TEST(ReportGate, AScenarioThatDiffersIsRefusedWithTheKeysThatDiffer) {
  const json base = results({point("a", 100, 1)});
  json next = results({point("a", 100, 1)}, "cpu0", "cpu", 16);
  next["scenario"]["source"] = "elsewhere/x.yaml";  // where it was read from does not matter
  EXPECT_EQ(error_message([&] { (void)judge(baseline({exact("misses")}), base, next); }),
            "new.json: its scenario differs from the baseline's (base.json) in decode_steps (8 -> "
            "16): its metrics would differ for that reason alone; run the scenario the baseline "
            "was recorded with, or, if the scenario changed on purpose, record the baseline on "
            "purpose: hisparse-bench gate BASELINE RESULTS... --update");
}

/// A Google Benchmark document: case -> per-repetition us_per_call.
json benchmark(const std::vector<std::pair<std::string, std::vector<double>>>& cases,
               const std::string& device = "NVIDIA H200") {
  json runs = json::array();
  for (const auto& [name, values] : cases)
    for (std::size_t i = 0; i < values.size(); ++i) {
      runs.push_back({{"name", name + "/iterations:20/manual_time"},
                      {"run_type", "iteration"},
                      {"repetition_index", i},
                      {"real_time", values[i] * 1000},
                      {"time_unit", "ns"},
                      {"GBps", 10.0}});
      if (i == 0)  // an aggregate, which the gate leaves out
        runs.push_back({{"name", name + "/iterations:20/manual_time_mean"},
                        {"run_type", "aggregate"},
                        {"real_time", 1.0},
                        {"time_unit", "ns"}});
    }
  return {{"context", {{"hisparse_device", device}, {"hisparse_backend", "cuda"}}},
          {"benchmarks", runs}};
}

TEST(ReportGate, MicrobenchmarkCasesAreMatchedByNameAndJudgedOnTheirRepetitions) {
  const std::vector<double> reps{10, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.01, 9.99};
  std::vector<double> slower, noisy;
  for (double v : reps) slower.push_back(v * 1.2);
  noisy = {8, 14, 9, 13, 10, 12, 11, 10.5, 11.5};  // +10% median, spread over the change
  const json base = benchmark({{"swap_in/batch:1", reps}, {"swap_in/batch:64", reps}});
  auto b = baseline({timing("us_per_call", GateMetric::Better::lower)}, GateInputKind::microbench);
  b.cases = "batch:1$";
  const GateOutcome o =
      judge(b, base, benchmark({{"swap_in/batch:1", slower}, {"swap_in/batch:64", slower}}));
  ASSERT_EQ(o.rows.size(), 1u);  // batch:64 is not gated
  EXPECT_EQ(o.rows[0].item, "swap_in/batch:1");
  EXPECT_EQ(o.rows[0].verdict, GateVerdict::slower);  // real_time in ns, read as us
  EXPECT_NEAR(o.rows[0].base, 10.0, 1e-9);
  EXPECT_NEAR(o.rows[0].delta_pct, 20.0, 1e-9);
  EXPECT_TRUE(o.failed());
  const GateOutcome n = judge(b, base, benchmark({{"swap_in/batch:1", noisy}}));
  EXPECT_EQ(n.rows[0].verdict, GateVerdict::ambiguous);
  EXPECT_FALSE(n.failed());
  // Counters are metrics too.
  auto counters = baseline({timing("GBps", GateMetric::Better::higher)}, GateInputKind::microbench);
  EXPECT_EQ(judge(counters, base, base).rows[0].verdict, GateVerdict::same);
  EXPECT_EQ(error_message([&] {
              (void)judge(b, base, benchmark({{"swap_in/batch:1", reps}}, "NVIDIA H100"));
            }),
            "new.json: device NVIDIA H100 differs from the baseline's NVIDIA H200: timings of "
            "different devices or backends are not comparable; judge runs of the baseline's "
            "device and backend (a baseline per device, e.g. reports/baselines/<device>/), or "
            "pass --allow-different-devices");
}

TEST(ReportGate, GateFileErrorsNameTheKeyAndTheFix) {
  const auto message = [](const std::string& yaml) {
    return error_message([&] { (void)parse_gate(yaml, "base/gate.yaml"); });
  };
  EXPECT_EQ(message("baselines:\n  - scenario: s\n    fil: s.json\n"),
            "base/gate.yaml:3:5: baselines[0].fil: unknown key; did you mean 'file'?");
  EXPECT_EQ(message("baselines:\n  - scenario: s\n    file: s.json\n    metrics:\n      misses: "
                    "{timing: higher, tolerance: 0.1}\n"),
            "base/gate.yaml:5:43: baselines[0].metrics.misses.tolerance: a timing metric has no "
            "tolerance or better; give its direction as 'timing: higher|lower' and its noise "
            "allowance as min_effect_pct");
  EXPECT_EQ(
      message("baselines:\n  - microbench: m\n    file: m.json\n    cases: '(('\n    "
              "metrics: {us_per_call: exact}\n")
          .rfind("base/gate.yaml:4:12: baselines[0].cases: '((' is not a regular expression", 0),
      0u);
  EXPECT_EQ(message("baselines:\n  - scenario: s\n    file: s.json\n"),
            "base/gate.yaml:2:5: baselines[0]: has no metrics to judge; add 'metrics:' with e.g. "
            "'misses: exact' or 'output_tokens_per_s: {timing: higher}'");
  EXPECT_EQ(message("baselines:\n  - scenario: s\n    file: s.json\n    metrics: {misses: "
                    "exactly}\n"),
            "base/gate.yaml:4:23: baselines[0].metrics.misses: unknown value 'exactly'; did you "
            "mean 'exact'?");
  EXPECT_EQ(message("baselines: [\n"),
            "base/gate.yaml:2:1: gate: not valid YAML (end of sequence flow not found); fix the "
            "YAML syntax (see README 'Gating a CI job')");
  EXPECT_EQ(message("baselines:\n  - scenario: s\n    file: a.json\n    metrics: {misses: "
                    "exact}\n  - scenario: s\n    file: b.json\n    metrics: {misses: exact}\n"),
            "base/gate.yaml:5:5: baselines[1]: 's' is gated twice; keep one entry per scenario "
            "or microbenchmark label");

  const GateSpec spec = parse_gate(
      "baselines:\n  - scenario: ci\n    file: ci.json\n    metrics:\n      misses: exact\n"
      "      recall: {tolerance: 1.0e-9, better: higher}\n"
      "      output_tokens_per_s: {timing: higher, min_effect_pct: 3, alpha: 0.01}\n",
      "base/gate.yaml");
  ASSERT_EQ(spec.baselines.size(), 1u);
  const GateBaseline& b = spec.baselines[0];
  EXPECT_EQ(b.file, std::filesystem::path("base/ci.json"));
  ASSERT_EQ(b.metrics.size(), 3u);
  EXPECT_FALSE(b.metrics[0].timing);
  EXPECT_EQ(b.metrics[1].tolerance, 1e-9);
  EXPECT_EQ(b.metrics[1].better, GateMetric::Better::higher);
  EXPECT_TRUE(b.metrics[2].timing);
  EXPECT_EQ(b.metrics[2].min_effect_pct, 3.0);
  EXPECT_EQ(b.metrics[2].alpha, 0.01);
}

TEST(ReportGate, AFolderWithoutAGateFileIsJudgedByTheDefaultGate) {
  test::TempDir dir;
  dir.write("run.json", results({point("a", 100, 1)}).dump());
  dir.write("bench-1.json", benchmark({{"c", {1.0}}}).dump());
  dir.write("bench-2.json", benchmark({{"c", {1.1}}}).dump());
  const GateSpec spec = load_gate(dir.path);
  ASSERT_EQ(spec.baselines.size(), 2u);  // the two benchmark files pooled as one baseline
  EXPECT_EQ(spec.baselines[0].kind, GateInputKind::microbench);
  EXPECT_EQ(spec.baselines[0].extra_files.size(), 1u);
  EXPECT_EQ(spec.baselines[1].name, "s");  // the results baseline is named by its scenario
  EXPECT_EQ(spec.baselines[1].metrics.front().name, "output_tokens_per_s");

  const auto input = dir.write("new-run.json", results({point("a", 100, 2)}).dump());
  const GateOutcome o = run_gate(spec, {input});
  EXPECT_EQ(row(o, "mode=a", "misses").verdict, GateVerdict::changed);
  EXPECT_EQ(o.warnings, std::vector<std::string>{"baseline 'microbench' was not judged: no input "
                                                 "matched it"});
  const auto other = dir.write("new-other.json", [] {
    json d = results({point("a", 100, 2)});
    d["scenario"]["name"] = "t";
    return d.dump();
  }());
  EXPECT_EQ(error_message([&] { (void)run_gate(spec, {other}); }),
            other.string() +
                ": no baseline of scenario 't' in the default gate (it gates: s); judge a run of "
                "a scenario the baseline gates, or add an entry for it to gate.yaml and record it "
                "with --update");
  EXPECT_EQ(error_message([&] { (void)load_gate(dir.path / "none"); }),
            (dir.path / "none").string() +
                ": does not exist; give a baseline folder (with gate.yaml, or holding results.json "
                "and Google Benchmark files) or one baseline file");
}

TEST(ReportGate, UpdateWritesTheBaselineAndRefusesTwoRunsOfOneScenario) {
  test::TempDir dir;
  dir.write("gate.yaml",
            "baselines:\n  - scenario: s\n    file: s.json\n    metrics: {misses: exact}\n");
  const GateSpec spec = load_gate(dir.path);
  const auto input = dir.write("new-results.json", results({point("a", 100, 3)}).dump());
  EXPECT_EQ(error_message([&] { (void)run_gate(spec, {input}); }),
            (dir.path / "s.json").string() +
                ": the baseline file does not exist; record the baseline on purpose: "
                "hisparse-bench gate BASELINE RESULTS... --update");
  EXPECT_EQ(update_gate_baselines(spec, {input}),
            std::vector<std::filesystem::path>{dir.path / "s.json"});
  EXPECT_FALSE(run_gate(spec, {input}).failed());
  EXPECT_EQ(error_message([&] {
              (void)update_gate_baselines(spec, {input, input});
            }),
            input.string() +
                ": is a second results file of scenario 's'; record one run, with --repetitions "
                "N for timings");
}

}  // namespace
}  // namespace hisparse
