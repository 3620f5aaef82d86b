// --set key=value overrides: scalars, nested keys, lists, whole sections, bad keys and values.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "scenario/scenario.hpp"

namespace hisparse {
namespace {

const char* kBase = R"(name: base
model: tiny-gqa
context_length: 1024
top_k: 64
workload:
  seed: 3
sweep:
  concurrency: [1, 2]
)";

std::string error_of(const std::vector<std::string>& sets, const std::string& text = kBase) {
  try {
    (void)parse_scenario(text, "s.yaml", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ScenarioOverride, ScalarReplacesValue) {
  const Scenario s = parse_scenario(kBase, "s.yaml", {"context_length=2048", "mode=sparse-gpu"});
  const auto p = s.expand();
  EXPECT_EQ(p[0].config.context_length, 2048);
  EXPECT_EQ(std::string(name_of(p[0].config.mode)), "sparse-gpu");
}

TEST(ScenarioOverride, DottedKeyReachesNestedValueAndKeepsSiblings) {
  const Scenario s = parse_scenario(kBase, "s.yaml", {"workload.query_drift=0.5"});
  EXPECT_EQ(s.workload.seed, 3u);
  EXPECT_DOUBLE_EQ(s.workload.query_drift, 0.5);
  const Scenario t = parse_scenario(kBase, "s.yaml", {"workload.seed=7"});
  EXPECT_EQ(t.workload.seed, 7u);
}

TEST(ScenarioOverride, ListValueReplacesSweepAxisAndCanAddOne) {
  const Scenario s = parse_scenario(
      kBase, "s.yaml", {"sweep.concurrency=[1,2,4]", "sweep.mode=[dense, sparse-gpu]"});
  EXPECT_EQ(s.point_count(), 6u);
  EXPECT_EQ(s.swept, (std::vector<std::string>{"mode", "concurrency"}));
  EXPECT_EQ(s.expand()[5].config.concurrency, 4);
}

TEST(ScenarioOverride, CreatesMissingSectionAndLaterOverrideWins) {
  const Scenario s = parse_scenario("name: x\nmodel: tiny-gqa\n", "s.yaml",
                                    {"outputs.dir=/tmp/o", "trace.steps=2", "trace.steps=5"});
  EXPECT_EQ(s.outputs.dir, std::filesystem::path("/tmp/o"));
  EXPECT_EQ(s.trace.steps, 5);
}

TEST(ScenarioOverride, UnknownKeySuggestsNearest) {
  EXPECT_EQ(error_of({"workload.sed=7"}),
            "--set workload.sed=7: workload.sed: unknown key; did you mean 'workload.seed'?");
  EXPECT_EQ(error_of({"topk=7"}), "--set topk=7: topk: unknown key; did you mean 'top_k'?");
}

TEST(ScenarioOverride, MalformedArgument) {
  EXPECT_EQ(error_of({"top_k"}),
            "--set top_k: expected key=value; write e.g. --set workload.seed=7");
  EXPECT_EQ(error_of({"=3"}), "--set =3: expected key=value; write e.g. --set workload.seed=7");
}

TEST(ScenarioOverride, ValueThatIsNotYaml) {
  const std::string e = error_of({"sweep.concurrency=[1,2"});
  EXPECT_EQ(
      e.rfind("--set sweep.concurrency=[1,2: sweep.concurrency: the value is not valid YAML (", 0),
      0u)
      << e;
}

TEST(ScenarioOverride, ErrorsInOverriddenValuesNameTheArgument) {
  EXPECT_EQ(
      error_of({"top_k=lots"}),
      "--set top_k=lots: top_k: expected an integer, got 'lots'; write a whole number such as 1");
  EXPECT_EQ(error_of({"sweep.concurrency=[]"}),
            "--set sweep.concurrency=[]: sweep.concurrency: empty sweep (no values); list at least "
            "one value, or remove the axis");
  EXPECT_EQ(
      error_of({"workload={seed: 1, speed: 2}"}),
      "--set workload={seed: 1, speed: 2}: workload.speed: unknown key; did you mean 'seed'?");
  // A cross-key rule blames the overridden key.
  EXPECT_EQ(error_of({"mode=sparse-gpu", "top_k=4096"}),
            "--set top_k=4096: top_k: top_k 4096 is larger than context_length 1024; use top_k <= "
            "1024 or a longer context");
}

TEST(ScenarioOverride, SectionThatIsNotAMapping) {
  EXPECT_EQ(
      error_of({"workload.seed=1"}, "name: x\nmodel: tiny-gqa\nworkload: 5\n"),
      "--set workload.seed=1: workload.seed: 'workload' in the scenario is not a mapping; make "
      "'workload' a mapping of keys, or set it whole");
}

}  // namespace
}  // namespace hisparse
