// Every validation rule of a scenario, with its exact one-line message (file:line:column: key:
// problem; fix).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "scenario/scenario.hpp"
#include "support/error_message.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

std::string error_of(const std::string& text) {
  try {
    (void)parse_scenario(text, "s.yaml");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
    return e.what();
  }
  return "no error";
}

TEST(ScenarioValidation, AcceptsAFullScenario) {
  EXPECT_EQ(error_of(R"(
name: full-1.0
description: every key
model: tiny-gqa
backend: cpu
mode: fathom
concurrency: 2
context_length: 1024
decode_steps: 3
warmup_steps: 0
top_k: 64
hot_buffer: 128
budget_bits: 128
policy: belady
workload: {generator: synthetic, seed: 5, channel_spread_decades: 2, outlier_channels: 1,
           outlier_scale: 8, sink_tokens: 2, recency_bias: 1, query_drift: 0, replay_path: ""}
outputs: {dir: out, formats: [md]}
trace: {enabled: false, steps: 2}
fathom: {klt: true}
)"),
            "no error");
}

TEST(ScenarioValidation, FathomRuleReachesEveryPointAndTheResults) {
  const Scenario s = parse_scenario(
      "name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {rule: measured}\nsweep: {budget_bits: "
      "[32, 64]}\n",
      "s.yaml");
  for (const auto& p : s.expand()) EXPECT_EQ(p.config.fathom_rule, fathom::PlanRule::measured);
  EXPECT_EQ(s.to_json()["fathom"]["rule"], "measured");
  const Scenario plain = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml");
  EXPECT_EQ(plain.expand().front().config.fathom_rule, fathom::PlanRule::paper);
  EXPECT_EQ(plain.to_json()["fathom"]["rule"], "paper");
  const Scenario set = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml",
                                      {"fathom.rule=measured"});
  EXPECT_EQ(set.expand().front().config.fathom_rule, fathom::PlanRule::measured);
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: {rule: mesured}\n"),
            "s.yaml:3:16: fathom.rule: unknown value 'mesured'; did you mean 'measured'?");
}

TEST(ScenarioValidation, DeploymentKeysReachThePointsAndTheResults) {
  const Scenario s = parse_scenario(
      "name: a\nmodel: tiny-dsa\ndeployment: {share_layer_weights: true, gpu_memory_gib: 141}\n",
      "s.yaml");
  EXPECT_TRUE(s.expand().front().config.share_layer_weights);
  EXPECT_FALSE(s.expand().front().config.bf16_gemm);
  EXPECT_EQ(s.deployment.gpu_memory_gib, 141.0);
  EXPECT_EQ(s.to_json()["deployment"]["gpu_memory_gib"], 141.0);
  const Scenario plain = parse_scenario("name: a\nmodel: tiny-dsa\n", "s.yaml");
  EXPECT_FALSE(plain.expand().front().config.share_layer_weights);
  EXPECT_FALSE(plain.to_json().contains("deployment"));  // older results compare equal
  const Scenario set = parse_scenario("name: a\nmodel: tiny-dsa\n", "s.yaml",
                                      {"deployment.share_layer_weights=true"});
  EXPECT_TRUE(set.expand().front().config.share_layer_weights);
  const Scenario bf16 =
      parse_scenario("name: a\nmodel: tiny-dsa\ndeployment: {gemm_dtype: bf16}\n", "s.yaml");
  EXPECT_TRUE(bf16.expand().front().config.bf16_gemm);
  EXPECT_EQ(bf16.to_json()["deployment"]["gemm_dtype"], "bf16");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\ndeployment: {gemm_dtype: fp16}\n"),
            "s.yaml:3:26: deployment.gemm_dtype: unknown value 'fp16'; did you mean 'fp32'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\ndeployment: {gpu_memory_gib: -1}\n"),
            "s.yaml:3:30: deployment.gpu_memory_gib: -1 is out of range; use a value from 0 to "
            "1000000");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\ndeployment: {share_weights: true}\n"),
            "s.yaml:3:14: deployment.share_weights: unknown key; use one of share_layer_weights, "
            "gpu_memory_gib, gemm_dtype, overlap_selection, cuda_graph");
  EXPECT_TRUE(plain.expand().front().config.overlap_selection);
  const Scenario one_stream = parse_scenario("name: a\nmodel: tiny-dsa\n", "s.yaml",
                                             {"deployment.overlap_selection=false"});
  EXPECT_FALSE(one_stream.expand().front().config.overlap_selection);
  EXPECT_EQ(one_stream.to_json()["deployment"]["overlap_selection"], false);
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\ndeployment: {overlap_selection: 2}\n"),
            "s.yaml:3:33: deployment.overlap_selection: expected true or false, got '2'; write "
            "true or false");
  EXPECT_TRUE(plain.expand().front().config.cuda_graph);
  const Scenario eager =
      parse_scenario("name: a\nmodel: tiny-dsa\n", "s.yaml", {"deployment.cuda_graph=false"});
  EXPECT_FALSE(eager.expand().front().config.cuda_graph);
  EXPECT_EQ(eager.to_json()["deployment"]["cuda_graph"], false);
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\ndeployment: {cuda_graph: yes please}\n"),
            "s.yaml:3:26: deployment.cuda_graph: expected true or false, got 'yes please'; write "
            "true or false");
}

TEST(ScenarioValidation, FathomCentreKeysReachesEveryPointAndTheResults) {
  const Scenario s = parse_scenario(
      "name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {centre_keys: true}\n", "s.yaml");
  for (const auto& p : s.expand()) EXPECT_TRUE(p.config.fathom_centre_keys);
  EXPECT_EQ(s.to_json()["fathom"]["centre_keys"], true);
  const Scenario set = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml",
                                      {"fathom.centre_keys=true"});
  EXPECT_TRUE(set.expand().front().config.fathom_centre_keys);
  EXPECT_FALSE(parse_scenario("name: a\nmodel: tiny-gqa\n", "s.yaml")
                   .expand()
                   .front()
                   .config.fathom_centre_keys);
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-gqa\nfathom: {centre_keys: 2}\n"),
      "s.yaml:3:23: fathom.centre_keys: expected true or false, got '2'; write true or false");
}

TEST(ScenarioValidation, FathomHeadBudgetsInlineReachEveryPointAndTheResults) {
  const Scenario s = parse_scenario(
      "name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {head_budgets: [52, 44, 48, 48]}\n",
      "s.yaml");
  for (const auto& p : s.expand())
    EXPECT_EQ(p.config.fathom_head_budgets, (std::vector<int>{52, 44, 48, 48}));
  EXPECT_EQ(s.to_json()["fathom"]["head_budgets"], nlohmann::json({52, 44, 48, 48}));
  EXPECT_EQ(s.to_json()["fathom"]["head_budgets_source"], "inline");
  const Scenario none = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml");
  EXPECT_TRUE(none.expand().front().config.fathom_head_budgets.empty());
  EXPECT_TRUE(none.to_json()["fathom"]["head_budgets"].is_null());
  const Scenario set = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml",
                                      {"fathom.head_budgets=[40, 56]"});
  EXPECT_EQ(set.expand().front().config.fathom_head_budgets, (std::vector<int>{40, 56}));
  // tiny-gqa has 2 KV heads and 2 layers.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {head_budgets: [1, 2, 3]}\n"),
            "s.yaml:4:24: fathom.head_budgets: 3 per-head budgets, but 'tiny-gqa' has 2 KV heads "
            "per layer; give a multiple of 2 budgets (one per KV head, layer by layer; rows are "
            "reused for deeper layers)");
  EXPECT_EQ(
      error_of(
          "name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {head_budgets: [1, 2, 3, 4, 5, 6]}\n"),
      "s.yaml:4:24: fathom.head_budgets: 3 rows of per-head budgets, but 'tiny-gqa' has 2 "
      "layers; give at most one row of KV-head budgets per layer");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: {head_budgets: [1, -2]}\n"),
            "s.yaml:3:28: fathom.head_budgets: -2 is out of range; use a value from 0 to 1024");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: {head_budgets: []}\n"),
            "s.yaml:3:24: fathom.head_budgets: the list of per-head budgets is empty; list one "
            "budget per (layer, KV head), or leave the key out");
  // Not a fathom mode: the table is not checked against the model.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: dense\nfathom: {head_budgets: [1, 2, 3]}\n"),
            "no error");
}

TEST(ScenarioValidation, FathomHeadBudgetsFromAQualityStudysJson) {
  const test::TempDir dir;
  dir.write(
      "q.json",
      R"({"calibrated_head_budgets": {"paper": [40, 56], "measured": [50, 46], "paper_klt": null}})");
  dir.write("bad.json", "{not json");
  dir.write("none.json", R"({"rows": []})");
  const auto parse = [&](const std::string& fathom) {
    return parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: " + fathom + "\n",
                          "s.yaml", {}, dir.path);
  };
  const auto error = [&](const std::string& fathom) {
    return test::error_message([&] { (void)parse(fathom); });
  };
  const std::string file = (dir.path / "q.json").string();
  EXPECT_EQ(parse("{head_budgets: q.json}").expand().front().config.fathom_head_budgets,
            (std::vector<int>{40, 56}));
  const Scenario measured = parse("{rule: measured, head_budgets: q.json}");
  EXPECT_EQ(measured.expand().front().config.fathom_head_budgets, (std::vector<int>{50, 46}));
  EXPECT_EQ(measured.to_json()["fathom"]["head_budgets_source"], file + " (measured)");
  const std::string fix =
      "write it with 'hisparse-bench quality --calibrated-budgets N --json > FILE' (add the "
      "scenario's --rule, and --klt for a KLT basis), or list the budgets inline";
  EXPECT_EQ(error("{head_budgets: missing.json}"),
            "s.yaml:4:24: fathom.head_budgets: cannot read '" +
                (dir.path / "missing.json").string() + "'; " + fix);
  EXPECT_EQ(error("{head_budgets: none.json}"), "s.yaml:4:24: fathom.head_budgets: '" +
                                                    (dir.path / "none.json").string() +
                                                    "' has no calibrated_head_budgets; " + fix);
  EXPECT_NE(error("{head_budgets: bad.json}").find("is not valid JSON"), std::string::npos);
  EXPECT_EQ(error("{klt: true, head_budgets: q.json}"),
            "s.yaml:4:35: fathom.head_budgets: '" + file +
                "': the calibrated split for 'paper_klt' never reached the 32-channel scan's "
                "error, so the study gave no budgets; run the study with larger budgets (quality "
                "--budgets) or more calibration steps");
  EXPECT_EQ(error("{klt: true, rule: measured, head_budgets: q.json}"),
            "s.yaml:4:51: fathom.head_budgets: '" + file +
                "' has no calibrated budgets for 'measured_klt' (it has: measured, paper, "
                "paper_klt); set fathom.rule and fathom.klt to the study's, or run the study with "
                "them");
}

TEST(ScenarioValidation, FathomHeadBudgetsPickTheSplitCalibratedAtEachBudget) {
  const test::TempDir dir;
  dir.write("q.json", R"({"calibrated_head_budgets": {"paper": [40, 56]},
      "calibrated_head_budgets_by_budget": {"paper": {"32": [24, 40], "64": [56, 72]}}})");
  dir.write("keys.json", R"({"calibrated_head_budgets": {"paper": [40, 56]},
      "calibrated_head_budgets_by_budget": {"paper": {"forty": [40, 40]}}})");
  dir.write("heads.json", R"({"calibrated_head_budgets": {"paper": [40, 56]},
      "calibrated_head_budgets_by_budget": {"paper": {"32": [24, 40, 8, 8]}}})");
  const auto parse = [&](const std::string& yaml) {
    return parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n" + yaml, "s.yaml", {},
                          dir.path);
  };
  // Points at 32 and 64 take the splits calibrated there; 48 takes the shares of the split that
  // reached the target.
  const Scenario s = parse("sweep: {budget_bits: [32, 48, 64]}\nfathom: {head_budgets: q.json}\n");
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].config.fathom_head_budgets, (std::vector<int>{24, 40}));
  EXPECT_EQ(points[1].config.fathom_head_budgets, (std::vector<int>{40, 56}));
  EXPECT_EQ(points[2].config.fathom_head_budgets, (std::vector<int>{56, 72}));
  EXPECT_EQ(s.to_json()["fathom"]["head_budgets_by_budget"]["64"], nlohmann::json({56, 72}));
  const std::string keys = (dir.path / "keys.json").string();
  EXPECT_EQ(test::error_message([&] { (void)parse("fathom: {head_budgets: keys.json}\n"); }),
            "s.yaml:4:24: fathom.head_budgets: '" + keys +
                "': calibrated_head_budgets_by_budget.paper.forty is not keyed by a budget; write "
                "it with 'hisparse-bench quality --calibrated-budgets N --json > FILE' (add the "
                "scenario's --rule, and --klt for a KLT basis), or list the budgets inline");
  const std::string heads = (dir.path / "heads.json").string();
  EXPECT_EQ(test::error_message([&] { (void)parse("fathom: {head_budgets: heads.json}\n"); }),
            "s.yaml:4:24: fathom.head_budgets: " + heads +
                ": the splits by budget have 4 heads, the split at the target 2; write the file "
                "again with hisparse-bench quality --calibrated-budgets N");
}

TEST(ScenarioValidation, FathomKltReachesEveryPointAndTheResults) {
  const Scenario s = parse_scenario(
      "name: a\nmodel: tiny-gqa\nmode: fathom\nfathom: {klt: true}\nsweep: {budget_bits: [32, "
      "64]}\n",
      "s.yaml");
  ASSERT_EQ(s.expand().size(), 2u);
  for (const auto& p : s.expand()) EXPECT_TRUE(p.config.fathom_klt);
  EXPECT_EQ(s.to_json()["fathom"]["klt"], true);
  const Scenario plain = parse_scenario("name: a\nmodel: tiny-gqa\nmode: fathom\n", "s.yaml");
  EXPECT_FALSE(plain.expand().front().config.fathom_klt);
  EXPECT_EQ(plain.to_json()["fathom"]["klt"], false);
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: {klt: 3}\n"),
            "s.yaml:3:15: fathom.klt: expected true or false, got '3'; write true or false");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: {kl: true}\n"),
            "s.yaml:3:10: fathom.kl: unknown key; did you mean 'klt'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nfathom: true\n"),
            "s.yaml:3:9: fathom: expected a mapping; write e.g. 'fathom: {klt: true}'");
}

TEST(ScenarioValidation, UnknownKeysSuggestTheNearest) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ncontext_lenght: 5\n"),
            "s.yaml:3:1: context_lenght: unknown key; did you mean 'context_length'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nworkload:\n  seeed: 5\n"),
            "s.yaml:4:3: workload.seeed: unknown key; did you mean 'seed'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nsweep:\n  batch: [1]\n"),
            "s.yaml:4:3: sweep.batch: unknown key; use one of model, mode, context_length, top_k, "
            "hot_buffer, budget_bits, policy, concurrency");
}

TEST(ScenarioValidation, WrongTypes) {
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-gqa\ncontext_length: 1.5\n"),
      "s.yaml:3:17: context_length: expected an integer, got '1.5'; write a whole number such "
      "as 1");
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-gqa\nworkload: {recency_bias: high}\n"),
      "s.yaml:3:26: workload.recency_bias: expected a number, got 'high'; write a number such "
      "as 0.5");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ntrace: {enabled: maybe}\n"),
            "s.yaml:3:18: trace.enabled: expected true or false, got 'maybe'; write true or false");
  EXPECT_EQ(error_of("name: a\nmodel: [tiny-gqa]\n"),
            "s.yaml:2:8: model: expected a string, got a list; write a single value");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nsweep:\n  concurrency: 4\n"),
            "s.yaml:4:16: sweep.concurrency: expected a list of values; write e.g. 'concurrency: "
            "[a, b]'");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ntop_k:\n"),
            "s.yaml:3:1: top_k: missing value; write an integer after 'top_k:'");
}

// Found by tests/fuzz (scenario_yaml): the run failed writing results.json after its first point.
TEST(ScenarioValidation, TextThatIsNotUtf8) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ndescription: caf\xe9\n"),
            "s.yaml:3:14: description: the value is not UTF-8 text; save the file as UTF-8");
}

TEST(ScenarioValidation, RequiredKeysAndEmptyDocument) {
  EXPECT_EQ(error_of("model: tiny-gqa\n"),
            "s.yaml:1:1: name: missing required key; add 'name: <identifier>'");
  EXPECT_EQ(
      error_of("name: a\n"),
      "s.yaml:1:1: model: missing required key; add 'model: <preset or path>' (hisparse-bench "
      "list models) or sweep.model");
  EXPECT_EQ(error_of(""),
            "s.yaml:1:1: name: the scenario is empty; write at least 'name:' and "
            "'model:' (see scenarios/quick.yaml)");
  EXPECT_EQ(
      error_of("name: a b\nmodel: tiny-gqa\n"),
      "s.yaml:1:7: name: 'a b' is not an identifier; use letters, digits, '.', '_' and '-' only");
}

TEST(ScenarioValidation, EmptySweepAndDuplicates) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nsweep: {mode: []}\n"),
            "s.yaml:3:15: sweep.mode: empty sweep (no values); list at least one value, or remove "
            "the axis");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nsweep: {concurrency: [1, 2, 1]}\n"),
            "s.yaml:3:29: sweep.concurrency: value '1' is listed twice; list each value once");
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-gqa\noutputs: {formats: []}\n"),
      "s.yaml:3:20: outputs.formats: no output format; list at least one of json, csv, md, html");
}

TEST(ScenarioValidation, RangesOfSingleValues) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nconcurrency: 0\n"),
            "s.yaml:3:14: concurrency: 0 is out of range; use 1 or more");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nhot_buffer: 32769\n"),
            "s.yaml:3:13: hot_buffer: 32769 is out of range; use a value from 0 to 32768");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nbudget_bits: -1\n"),
            "s.yaml:3:14: budget_bits: -1 is out of range; use 0 or more");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ndecode_steps: 0\n"),
            "s.yaml:3:15: decode_steps: 0 is out of range; use a value from 1 to 1000000");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nworkload: {query_drift: 1.5}\n"),
            "s.yaml:3:25: workload.query_drift: 1.5 is out of range; use a value from 0 to 1");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nconcurrency: 99999999999999999999\n"),
            "s.yaml:3:14: concurrency: 99999999999999999999 is out of range; use 1 or more");
}

TEST(ScenarioValidation, UnknownNamesSuggestTheNearest) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisprase\n"),
            "s.yaml:3:7: mode: unknown value 'hisprase'; did you mean 'hisparse'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\npolicy: optimal\n"),
            "s.yaml:3:9: policy: unknown value 'optimal'; use one of lru, fifo, random, belady");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nbackend: gpu\n"),
            "s.yaml:3:10: backend: unknown value 'gpu'; did you mean 'cpu'?");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqb\n"),
            "s.yaml:2:8: model: unknown model 'tiny-gqb'; did you mean 'tiny-gqa'?");
  EXPECT_EQ(error_of("name: a\nmodel: models/none.yaml\n"),
            "s.yaml:2:8: model: model file 'models/none.yaml' does not exist; give a path relative "
            "to the scenario file, or a preset name (hisparse-bench list models)");
}

TEST(ScenarioValidation, TopKAboveContext) {
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-gqa\nmode: sparse-gpu\ncontext_length: 100\ntop_k: 128\n"),
      "s.yaml:5:8: top_k: top_k 128 is larger than context_length 100; use top_k <= 100 or a "
      "longer context");
  // The default top_k (2048 for a model without an indexer) blames the context length.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: sparse-gpu\ncontext_length: 100\n"),
            "s.yaml:4:17: context_length: top_k 2048 is larger than context_length 100; use top_k "
            "<= 100 or a longer context");
  // Dense mode selects nothing: no rule.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\ncontext_length: 100\ntop_k: 128\n"), "no error");
  // In a sweep the offending value is named.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: sparse-gpu\ncontext_length: 100\n"
                     "sweep: {top_k: [64, 200]}\n"),
            "s.yaml:5:21: sweep.top_k: top_k 200 is larger than context_length 100; use top_k <= "
            "100 or a longer context");
}

TEST(ScenarioValidation, HotBufferRules) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\nmode: hisparse\ncontext_length: 1024\ntop_k: 64\n"
                     "hot_buffer: 63\n"),
            "s.yaml:6:13: hot_buffer: hot_buffer 63 is smaller than top_k 64; use hot_buffer >= 64 "
            "(0 means 2 * top_k)");
  // The default hot buffer (2 * top_k) above the limit blames top_k.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\nmode: hisparse\ncontext_length: 100000\n"
                     "top_k: 20000\n"),
            "s.yaml:5:8: top_k: hot_buffer 40000 exceeds the 32768-slot limit; use at most 32768 "
            "slots (top_k <= 16384 with the default hot_buffer)");
  // Not a hisparse mode: the hot buffer is unused.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-dsa\nmode: sparse-gpu\ncontext_length: 1024\ntop_k: 64\n"
                     "hot_buffer: 63\n"),
            "no error");
}

TEST(ScenarioValidation, ModeAndModelMismatch) {
  EXPECT_EQ(
      error_of("name: a\nmodel: tiny-dsa\nmode: fathom\n"),
      "s.yaml:3:7: mode: mode 'fathom' needs a GQA model, but 'tiny-dsa' uses MLA; use dense, "
      "sparse-gpu or hisparse with this model, or a GQA model");
  // GQA models run hisparse with the exact top-k over their GPU-resident keys.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisparse\ncontext_length: 1024\ntop_k: "
                     "64\n"),
            "no error");
}

TEST(ScenarioValidation, SkipLeavesCombinationsOutAndKeepsTheOrder) {
  const std::string sweep =
      "name: a\ncontext_length: 1024\ntop_k: 64\nsweep:\n  model: [tiny-dsa, tiny-gqa]\n  mode: "
      "[dense, fathom]\n  concurrency: [1, 2]\n";
  // Without the skip, the MLA model cannot run fathom, and the fix names the skip entry.
  EXPECT_EQ(error_of(sweep),
            "s.yaml:6:17: sweep.mode: mode 'fathom' needs a GQA model, but 'tiny-dsa' uses MLA; "
            "leave the pair out with 'skip: [{model: tiny-dsa, mode: fathom}]'");
  const Scenario s =
      parse_scenario(sweep + "skip:\n  - {model: tiny-dsa, mode: fathom}\n", "s.yaml");
  EXPECT_EQ(s.point_count(), 6u);
  EXPECT_EQ(s.skipped_count(), 2u);
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 6u);
  const std::vector<std::vector<std::string>> want{
      {"tiny-dsa", "dense", "1"}, {"tiny-dsa", "dense", "2"},  {"tiny-gqa", "dense", "1"},
      {"tiny-gqa", "dense", "2"}, {"tiny-gqa", "fathom", "1"}, {"tiny-gqa", "fathom", "2"}};
  for (std::size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].index, i);
    ASSERT_EQ(points[i].axes.size(), 3u);
    for (std::size_t a = 0; a < 3; ++a) EXPECT_EQ(points[i].axes[a].second, want[i][a]) << i;
  }
  EXPECT_EQ(s.to_json()["skip"],
            nlohmann::json::parse(R"([{"model": "tiny-dsa", "mode": "fathom"}])"));
  // A numeric axis, and one entry naming one axis only.
  const Scenario one = parse_scenario(sweep +
                                          "skip: [{model: tiny-dsa, mode: fathom}, "
                                          "{concurrency: 2}]\n",
                                      "s.yaml");
  EXPECT_EQ(one.point_count(), 3u);
  EXPECT_EQ(one.to_json()["skip"][1]["concurrency"], 2);
  // --set replaces the list like any key.
  const Scenario set =
      parse_scenario(sweep, "s.yaml", {"skip=[{model: tiny-dsa, mode: fathom}, {mode: dense}]"});
  EXPECT_EQ(set.point_count(), 2u);
  EXPECT_TRUE(parse_scenario("name: a\nmodel: tiny-gqa\n", "s.yaml").to_json().count("skip") == 0);
}

TEST(ScenarioValidation, SkipRules) {
  const std::string sweep =
      "name: a\nmodel: tiny-gqa\nsweep: {mode: [dense, sparse-gpu], concurrency: [1, 2]}\n";
  EXPECT_EQ(error_of(sweep + "skip: {mode: dense}\n"),
            "s.yaml:4:7: skip: expected a list of combinations to leave out; write e.g. 'skip: "
            "[{model: tiny-dsa, mode: fathom}]'");
  EXPECT_EQ(error_of(sweep + "skip: [dense]\n"),
            "s.yaml:4:8: skip[0]: expected a mapping of swept axes to one value each; write e.g. "
            "'{model: tiny-dsa, mode: fathom}'");
  EXPECT_EQ(error_of(sweep + "skip: [{}]\n"),
            "s.yaml:4:8: skip[0]: expected a mapping of swept axes to one value each; write e.g. "
            "'{model: tiny-dsa, mode: fathom}'");
  EXPECT_EQ(error_of(sweep + "skip: [{model: tiny-gqa}]\n"),
            "s.yaml:4:16: skip[0].model: 'model' is not swept; name swept axes only (mode, "
            "concurrency)");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nskip: [{mode: dense}]\n"),
            "s.yaml:3:15: skip[0].mode: 'mode' is not swept; skip needs a sweep; remove it or "
            "add one");
  EXPECT_EQ(error_of(sweep + "skip: [{mode: hisparse}]\n"),
            "s.yaml:4:15: skip[0].mode: mode 'hisparse' is not in sweep.mode; use one of: dense, "
            "sparse-gpu");
  EXPECT_EQ(error_of(sweep + "skip: [{mode: dens}]\n"),
            "s.yaml:4:15: skip[0].mode: unknown value 'dens'; did you mean 'dense'?");
  EXPECT_EQ(error_of(sweep + "skip: [{concurrency: 3}]\n"),
            "s.yaml:4:22: skip[0].concurrency: concurrency '3' is not in sweep.concurrency; use "
            "one of: 1, 2");
  EXPECT_EQ(error_of(sweep + "skip: [{mode: dense}, {mode: sparse-gpu}]\n"),
            "s.yaml:4:7: skip: every combination of the sweep is skipped; remove a skip entry or "
            "sweep more values");
}

TEST(ScenarioValidation, FathomNeedsTopKBeyondItsSinksAndRecentTokens) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: fathom\ncontext_length: 128\ntop_k: 36\n"),
            "s.yaml:5:8: top_k: top_k 36 leaves no room beyond the 4 sinks and 32 recent tokens "
            "that mode 'fathom' always selects; use top_k > 36");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisparse+fathom\ncontext_length: 128\n"
                     "top_k: 37\n"),
            "no error");
  // hisparse+fathom: the hot buffer must hold one whole selection (tiny-gqa: 4 query heads per
  // KV head; the default hot_buffer is 2 x top_k = 128 < 4 + 32 + 4 x 28 = 148).
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisparse+fathom\ncontext_length: 1024\n"
                     "top_k: 64\n"),
            "s.yaml:5:8: top_k: hot_buffer 128 cannot hold one Fathom selection of up to 148 rows "
            "(4 sinks + 32 recent + 4 query heads x (top_k 64 - 36)); use hot_buffer >= 148");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisparse+fathom\ncontext_length: 1024\n"
                     "top_k: 64\nhot_buffer: 147\n"),
            "s.yaml:6:13: hot_buffer: hot_buffer 147 cannot hold one Fathom selection of up to 148 "
            "rows (4 sinks + 32 recent + 4 query heads x (top_k 64 - 36)); use hot_buffer >= 148");
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: hisparse+fathom\ncontext_length: 1024\n"
                     "top_k: 64\nhot_buffer: 148\n"),
            "no error");
  // Other modes select any top_k.
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nmode: sparse-gpu\ncontext_length: 128\ntop_k: 8\n"),
            "no error");
}

TEST(ScenarioValidation, BudgetBitsUpToFourBitsPerChannel) {
  const std::string base =
      "name: a\nmodel: tiny-gqa\nmode: fathom\ncontext_length: 1024\ntop_k: 64\n";
  EXPECT_EQ(error_of(base + "budget_bits: 128\n"), "no error");  // head_dim 32: 4 * 32
  EXPECT_EQ(
      error_of(base + "budget_bits: 129\n"),
      "s.yaml:6:14: budget_bits: budget_bits 129 is above 4 * head_dim = 128 of 'tiny-gqa'; use "
      "a budget from 0 to 128");
}

TEST(ScenarioValidation, ReplayNeedsAPath) {
  EXPECT_EQ(error_of("name: a\nmodel: tiny-gqa\nworkload: {generator: replay}\n"),
            "s.yaml:3:23: workload.generator: generator 'replay' needs workload.replay_path; set "
            "workload.replay_path to captured q/k tensors, or use generator 'synthetic'");
}

TEST(ScenarioValidation, SyntaxErrorHasLineAndColumn) {
  const std::string e = error_of("name: a\nmodel: tiny-gqa\nsweep: {mode: [dense}\n");
  EXPECT_EQ(e.rfind("s.yaml:3:", 0), 0u) << e;
  EXPECT_NE(e.find("YAML syntax error: "), std::string::npos) << e;
  EXPECT_NE(e.find("; fix the YAML syntax at that position"), std::string::npos) << e;
}

TEST(ScenarioValidation, FindScenarioByNameOrPath) {
  EXPECT_EQ(find_scenario("quick", "x").filename(), "quick.yaml");
  EXPECT_EQ(test::error_message([] { (void)find_scenario("quik", "run: SCENARIO"); }),
            "run: SCENARIO: no scenario file 'quik'; did you mean 'quick'?");
}

TEST(ScenarioValidation, NearestNameNeedsAReasonableMatch) {
  EXPECT_EQ(nearest_name("concurency", {"concurrency", "context_length"}), "concurrency");
  EXPECT_EQ(nearest_name("zzzzzz", {"concurrency", "context_length"}), "");
}

}  // namespace
}  // namespace hisparse
