// Sweep expansion: cartesian product, stable order, counts, resolved defaults.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/mode.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {
namespace {

std::string describe(const SweepPoint& p) {
  std::string s;
  for (const auto& [axis, value] : p.axes) {
    if (!s.empty()) s += ' ';
    s += axis;
    s += '=';
    s += value;
  }
  return s;
}

TEST(ScenarioSweep, CartesianProductInFixedAxisOrderConcurrencyInnermost) {
  // Written in a different order than the expansion order (model, mode, ..., concurrency).
  const Scenario s = parse_scenario(R"(
name: order
context_length: 512
top_k: 64
sweep:
  concurrency: [1, 4]
  mode: [dense, sparse-gpu]
  model: [tiny-dsa, tiny-gqa]
)",
                                    "s.yaml");
  ASSERT_EQ(s.point_count(), 8u);
  EXPECT_EQ(s.swept, (std::vector<std::string>{"model", "mode", "concurrency"}));
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 8u);
  const std::vector<std::string> expected{"model=tiny-dsa mode=dense concurrency=1",
                                          "model=tiny-dsa mode=dense concurrency=4",
                                          "model=tiny-dsa mode=sparse-gpu concurrency=1",
                                          "model=tiny-dsa mode=sparse-gpu concurrency=4",
                                          "model=tiny-gqa mode=dense concurrency=1",
                                          "model=tiny-gqa mode=dense concurrency=4",
                                          "model=tiny-gqa mode=sparse-gpu concurrency=1",
                                          "model=tiny-gqa mode=sparse-gpu concurrency=4"};
  for (std::size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].index, i);
    EXPECT_EQ(describe(points[i]), expected[i]) << i;
  }
  EXPECT_EQ(points[5].config.mode, Mode::dense);
  EXPECT_EQ(points[5].config.concurrency, 4);
  EXPECT_EQ(points[5].model, "tiny-gqa");
  EXPECT_EQ(points[5].config.context_length, 512);
}

TEST(ScenarioSweep, ValuesKeepTheirWrittenOrderAndCountsMultiply) {
  const Scenario s = parse_scenario(R"(
name: counts
model: tiny-gqa
mode: sparse-gpu
sweep:
  context_length: [4096, 1024, 2048]
  top_k: [64, 32]
  concurrency: [8, 1]
)",
                                    "s.yaml");
  EXPECT_EQ(s.point_count(), 12u);
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 12u);
  EXPECT_EQ(describe(points[0]), "context_length=4096 top_k=64 concurrency=8");
  EXPECT_EQ(describe(points[1]), "context_length=4096 top_k=64 concurrency=1");
  EXPECT_EQ(describe(points[2]), "context_length=4096 top_k=32 concurrency=8");
  EXPECT_EQ(describe(points[4]), "context_length=1024 top_k=64 concurrency=8");
  EXPECT_EQ(describe(points[11]), "context_length=2048 top_k=32 concurrency=1");
  EXPECT_EQ(points[11].config.top_k, 32);
  EXPECT_EQ(points[11].config.hot_buffer, 64);  // default 2 * top_k
}

TEST(ScenarioSweep, NoSweepIsOnePointWithDefaults) {
  const Scenario s = parse_scenario("name: one\nmodel: tiny-dsa\n", "s.yaml");
  EXPECT_EQ(s.point_count(), 1u);
  EXPECT_TRUE(s.swept.empty());
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 1u);
  const auto& c = points[0].config;
  EXPECT_TRUE(points[0].axes.empty());
  EXPECT_EQ(c.mode, Mode::dense);
  EXPECT_EQ(c.concurrency, 1);
  EXPECT_EQ(c.context_length, 4096);
  EXPECT_EQ(c.top_k, s.models.at("tiny-dsa").indexer.top_k);  // the model's indexer top_k
  EXPECT_EQ(c.hot_buffer, 2 * c.top_k);
  EXPECT_EQ(c.budget_bits, 48);
  EXPECT_EQ(c.policy, "lru");
  EXPECT_EQ(s.decode_steps, 8);
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_EQ(s.outputs.dir, std::filesystem::path("results/one"));
  EXPECT_EQ(s.outputs.formats, (std::vector<std::string>{"json", "csv", "md", "html"}));
}

TEST(ScenarioSweep, GqaModelWithoutIndexerDefaultsTopKTo2048) {
  const Scenario s = parse_scenario("name: g\nmodel: tiny-gqa\n", "s.yaml");
  EXPECT_EQ(s.expand()[0].config.top_k, 2048);
}

TEST(ScenarioSweep, SweptAxisReplacesTheScalarAndWorkloadIsCopiedToEveryPoint) {
  const Scenario s = parse_scenario(R"(
name: replace
model: tiny-gqa
concurrency: 16
workload: {seed: 99, query_drift: 0.25}
sweep: {concurrency: [2, 3]}
)",
                                    "s.yaml");
  const auto points = s.expand();
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].config.concurrency, 2);
  EXPECT_EQ(points[1].config.concurrency, 3);
  for (const auto& p : points) {
    EXPECT_EQ(p.config.workload.seed, 99u);
    EXPECT_DOUBLE_EQ(p.config.workload.query_drift, 0.25);
  }
}

TEST(ScenarioSweep, ResolvedJsonListsSweepAndScalars) {
  const Scenario s = parse_scenario(
      "name: j\nmodel: tiny-gqa\nsweep: {concurrency: [1, 2]}\ntrace: {enabled: true, steps: 3}\n",
      "s.yaml");
  const auto j = s.to_json();
  EXPECT_EQ(j["name"], "j");
  EXPECT_EQ(j["model"], "tiny-gqa");
  EXPECT_EQ(j["sweep"]["concurrency"], nlohmann::json::array({1, 2}));
  EXPECT_FALSE(j.contains("concurrency"));
  EXPECT_EQ(j["context_length"], 4096);
  EXPECT_EQ(j["trace"]["enabled"], true);
  EXPECT_EQ(j["trace"]["steps"], 3);
}

TEST(ScenarioSweep, QuickScenarioIsSmallAndCoversBothModelsAndBothAnswers) {
  const Scenario s = load_scenario(find_scenario("quick", "test"));
  EXPECT_EQ(s.point_count(), 14u);
  EXPECT_EQ(s.models.size(), 2u);
  std::map<std::string, std::set<Mode>> modes;
  for (const auto& p : s.expand()) {
    EXPECT_LE(p.config.context_length, 4096);
    modes[p.model].insert(p.config.mode);
  }
  // Both models run the baselines and HiSparse; Fathom runs on the GQA model only.
  const std::set<Mode> both{Mode::dense, Mode::sparse_gpu, Mode::hisparse};
  EXPECT_EQ(modes["tiny-dsa"], both);
  std::set<Mode> gqa = both;
  gqa.insert(Mode::fathom);
  EXPECT_EQ(modes["tiny-gqa"], gqa);
}

}  // namespace
}  // namespace hisparse
