// hisparse-bench compare end to end on the hand-made results in tests/fixtures/results: exit
// status 0 / 1 / 2, the verdict per point, and one clear line for each kind of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_command.hpp"

namespace hisparse::test {
namespace {

const std::string kDir = std::string(HISPARSE_TEST_FIXTURES) + "/results/";

CommandResult compare(const std::string& base, const std::string& next,
                      const std::string& flags = "") {
  return run_bench("compare " + kDir + base + " " + kDir + next + (flags.empty() ? "" : " ") +
                   flags);
}

/// The output line that starts with `prefix` ("" when none).
std::string line_of(const std::string& output, const std::string& prefix) {
  std::size_t pos = 0;
  while (pos < output.size()) {
    const std::size_t end = output.find('\n', pos);
    const std::string line = output.substr(pos, end == std::string::npos ? end : end - pos);
    if (line.rfind(prefix, 0) == 0) return line;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "";
}

TEST(CliCompare, SmallChangesAreNoRegression) {
  const auto r = compare("base.json", "same.json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // dense 1000 -> 990 tok/s is -1.0%; the noise is the larger spread: (4.08 - 4.0) / 4.0404 = 2.0%.
  EXPECT_EQ(line_of(r.output, "mode=dense"),
            "mode=dense       output_tokens_per_s         1000          990    -1.00%             "
            "      same");
  EXPECT_EQ(line_of(r.output, "PASS"), "PASS: 2 same");
}

TEST(CliCompare, SlowerBeyondThresholdAndNoiseIsARegression) {
  const auto r = compare("base.json", "regressed.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The noise of a single run is the larger step-time p10..p90 spread: (4.08 - 4.0) / 4.0404.
  EXPECT_EQ(line_of(r.output, "mode=sparse-gpu"),
            "mode=sparse-gpu  output_tokens_per_s         2000         1800   -10.00%      spread "
            "2.0%  SLOWER");
  EXPECT_EQ(line_of(r.output, "FAIL"), "FAIL: 1 slower, 1 same");
}

TEST(CliCompare, ChangeWithinTheNoiseIsNotARegression) {
  // -10% but p10..p90 of NEW spans (2.6 - 1.8) / 2.2222 = 36% of its median.
  const auto r = compare("base.json", "noisy.json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(line_of(r.output, "mode=sparse-gpu"),
            "mode=sparse-gpu  output_tokens_per_s         2000         1800   -10.00%     spread "
            "36.0%  ambiguous (within the 36.0% spread; 4 repetitions a side would let a rank "
            "test decide)");
}

TEST(CliCompare, ThresholdAboveTheChangeMakesItTheSame) {
  const auto r = compare("base.json", "regressed.json", "--threshold 15");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("threshold 15%"), std::string::npos) << r.output;
}

TEST(CliCompare, FasterIsAnImprovementAndExitsZero) {
  const auto r = compare("base.json", "improved.json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(line_of(r.output, "mode=sparse-gpu").find("+20.00%"), std::string::npos) << r.output;
  EXPECT_NE(line_of(r.output, "mode=sparse-gpu").find("faster"), std::string::npos);
}

TEST(CliCompare, StepTimeMetricIsLowerIsBetter) {
  const auto r = compare("base.json", "regressed.json", "--metric step_ms.median --json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["metric"], "step_ms.median");
  EXPECT_EQ(j["status"], "fail");
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][1]["item"], "mode=sparse-gpu");
  EXPECT_NEAR(j["rows"][1]["delta_pct"].get<double>(), 11.11, 0.01);
  EXPECT_EQ(j["rows"][1]["verdict"], "slower");
  const auto improved = compare("base.json", "improved.json", "--metric step_ms.median --json");
  EXPECT_EQ(improved.exit_code, 0) << improved.output;
}

TEST(CliCompare, PointFailingInNewIsARegression) {
  const auto r = compare("base.json", "failed_point.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(line_of(r.output, "mode=sparse-gpu")
                .find("FAILED (failed in NEW: tiny-gqa sparse-gpu at context 128: not one "
                      "request fits)"),
            std::string::npos)
      << r.output;
}

TEST(CliCompare, MissingFileIsBadInput) {
  const auto r = compare("base.json", "no_such.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kDir +
                          "no_such.json: cannot read the file (No such file or directory); give "
                          "the path of a results.json written by 'hisparse-bench run'\n");
}

TEST(CliCompare, BadJsonIsBadInput) {
  const auto r = compare("not_json.json", "base.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output.rfind("error: " + kDir + "not_json.json: not valid JSON (parse error at ", 0),
            0u)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(CliCompare, SchemaVersionMismatchIsBadInput) {
  const auto r = compare("base.json", "schema_v2.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kDir +
                          "schema_v2.json: schema_version 2 is not supported; this "
                          "hisparse-bench reads schema_version 1; use the hisparse-bench version "
                          "that wrote it, or run the scenario again\n");
}

TEST(CliCompare, DifferentDevicesAreRefusedUnlessAllowed) {
  const auto r = compare("base.json", "other_device.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kDir +
                          "other_device.json: backend cuda differs from the baseline's cpu: "
                          "timings of different devices or backends are not comparable; judge "
                          "runs of the baseline's device and backend (a baseline per device, "
                          "e.g. reports/baselines/<device>/), or pass --allow-different-devices\n");
  const auto allowed = compare("base.json", "other_device.json", "--allow-different-devices");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_NE(allowed.output.find("warning: " + kDir +
                                "other_device.json: backend cuda differs from the baseline's cpu "
                                "(judged anyway: --allow-different-devices)"),
            std::string::npos)
      << allowed.output;
}

TEST(CliCompare, NoMatchingPointIsBadInput) {
  const auto r = compare("base.json", "other_axes.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: " + kDir +
                          "other_axes.json: no sweep point matches one of the baseline's (" + kDir +
                          "base.json) by its axis values (mode, concurrency); judge a run of the "
                          "scenario the baseline was recorded with\n");
}

TEST(CliCompare, UnknownMetricIsAFlagError) {
  const auto r = compare("base.json", "same.json", "--metric tok/s");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output.rfind("error: --metric: tok/s not in {", 0), 0u) << r.output;
}

}  // namespace
}  // namespace hisparse::test
