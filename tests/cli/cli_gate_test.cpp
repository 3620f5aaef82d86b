// hisparse-bench gate end to end: the committed CPU baseline against a fresh run of ci-gate, a
// deliberate regression and its refresh with --update, microbenchmark repetitions, every exit
// status, and the files --out writes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource = HISPARSE_SOURCE_DIR;
const fs::path kCpuBaseline = kSource / "reports/baselines/cpu";

/// Runs ci-gate on the CPU into `dir`; the results file.
fs::path run_ci_gate(const fs::path& dir, const std::string& flags = "") {
  const auto r = run_bench("run ci-gate --quiet --out " + dir.string() + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "results.json";
}

void write_json(const fs::path& p, const json& j) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << j.dump(1);
}

std::string contents(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(CliGate, TheCommittedCpuBaselinePassesAFreshRun) {
  TempDir dir;
  const fs::path results = run_ci_gate(dir.path);
  const auto r = run_bench("gate " + kCpuBaseline.string() + " " + results.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("changed"), std::string::npos) << r.output;
}

TEST(CliGate, ADeliberateRegressionFailsAndUpdateRefreshesTheBaseline) {
  TempDir dir;
  const fs::path baseline = dir.path / "baseline";
  fs::create_directories(baseline);
  for (const char* f : {"gate.yaml", "ci-gate.json"}) fs::copy_file(kCpuBaseline / f, baseline / f);
  // As though the code before the change missed 10 fewer rows at one point: the change raised
  // that point's misses, which the gate must catch.
  json base = json::parse(contents(baseline / "ci-gate.json"));
  json* changed = nullptr;
  for (auto& p : base["points"])
    if (p["config"]["mode"] == "hisparse" && p["config"]["model"] == "tiny-dsa" &&
        p["config"]["concurrency"] == 3)
      changed = &p;
  ASSERT_NE(changed, nullptr);
  const auto misses = (*changed)["metrics"]["misses"].get<std::int64_t>();
  (*changed)["metrics"]["misses"] = misses - 10;
  write_json(baseline / "ci-gate.json", base);

  const fs::path results = run_ci_gate(dir.path / "run");
  const std::string gate = "gate " + baseline.string() + " " + results.string();
  auto r = run_bench(gate);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(
      r.output.find(fmt::format("model=tiny-dsa mode=hisparse concurrency=3  misses  "
                                "{:>11} {:>12}    +{:.2f}%                   CHANGED",
                                misses - 10, misses, 1000.0 / static_cast<double>(misses - 10))),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("CHANGED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FAIL: 1 changed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("If the change is intended, refresh the baseline: hisparse-bench " +
                          gate + " --update"),
            std::string::npos)
      << r.output;

  // The refresh shows what it changes, writes the baseline, and the gate passes after it.
  r = run_bench(gate + " --update");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("CHANGED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("updated " + (baseline / "ci-gate.json").string()), std::string::npos)
      << r.output;
  r = run_bench(gate);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CliGate, ARunOfAnotherScenarioSettingIsRefused) {
  TempDir dir;
  const fs::path results = run_ci_gate(dir.path, "--set hot_buffer=192");
  const auto r = run_bench("gate " + kCpuBaseline.string() + " " + results.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(
      r.output.rfind("error: " + results.string() + ": its scenario differs from the baseline's (" +
                         (kCpuBaseline / "ci-gate.json").string() +
                         ") in hot_buffer (160 -> 192): its metrics would differ for that "
                         "reason alone; ",
                     0),
      0u)
      << r.output;
}

/// Google Benchmark JSON of `repetitions` runs of two cases; `factor` scales case one.
fs::path bench_file(const fs::path& path, const std::string& device, double factor,
                    double spread = 0.01) {
  json runs = json::array();
  for (int i = 0; i < 9; ++i) {
    const double wobble = 1 + spread * ((i % 3) - 1) + 0.001 * i;  // distinct values
    runs.push_back({{"name", "swap_in/batch:1/iterations:20/manual_time"},
                    {"run_type", "iteration"},
                    {"repetition_index", i},
                    {"real_time", 10 * factor * wobble},
                    {"time_unit", "us"},
                    {"us_per_call", 10 * factor * wobble}});
    runs.push_back({{"name", "swap_in/batch:64/iterations:20/manual_time"},
                    {"run_type", "iteration"},
                    {"repetition_index", i},
                    {"real_time", 100 * wobble},
                    {"time_unit", "us"},
                    {"us_per_call", 100 * wobble}});
  }
  write_json(path, {{"context",
                     {{"hisparse_device", device},
                      {"hisparse_backend", "cuda"},
                      {"hisparse_git_revision", std::string(40, 'a')}}},
                    {"benchmarks", runs}});
  return path;
}

TEST(CliGate, MicrobenchmarkRepetitionsGateOneDeviceAndRefuseAnother) {
  TempDir dir;
  const fs::path base = bench_file(dir.path / "base/targets.json", "NVIDIA H200", 1.0);
  const std::string gate = "gate " + (dir.path / "base").string() + " ";
  // One case 20% slower over 9 repetitions a side: the rank test rejects at p = 4.1e-5.
  auto r = run_bench(gate + bench_file(dir.path / "slower.json", "NVIDIA H200", 1.2).string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("p=4.11e-05 (9v9)  SLOWER"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FAIL: 1 slower, 1 same"), std::string::npos) << r.output;
  // The same change buried in a 40% spread: the rank test cannot tell, and the gate passes.
  r = run_bench(gate + bench_file(dir.path / "noisy.json", "NVIDIA H200", 1.2, 0.4).string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ambiguous"), std::string::npos) << r.output;
  // 3% slower is below the default gate's 5% minimum effect.
  r = run_bench(gate + bench_file(dir.path / "same.json", "NVIDIA H200", 1.03).string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS: 2 same"), std::string::npos) << r.output;

  const fs::path other = bench_file(dir.path / "other.json", "NVIDIA H100 80GB HBM3", 1.2);
  r = run_bench(gate + other.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: " + other.string() +
                          ": device NVIDIA H100 80GB HBM3 differs from the baseline's NVIDIA "
                          "H200: timings of different devices or backends are not comparable; "
                          "judge runs of the baseline's device and backend (a baseline per "
                          "device, e.g. reports/baselines/<device>/), or pass "
                          "--allow-different-devices\n");
  r = run_bench(gate + other.string() + " --allow-different-devices");
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST(CliGate, BadInputExitsTwoWithOneLine) {
  TempDir dir;
  const std::string fixtures = std::string(HISPARSE_TEST_FIXTURES) + "/results/";
  const fs::path gate_file =
      dir.write("gate.yaml", "baselines:\n  - scenario: s\n    metric: {}\n");
  auto r = run_bench("gate " + dir.path.string() + " " + fixtures + "base.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: " + gate_file.string() +
                          ":3:5: baselines[0].metric: unknown key; did you mean 'metrics'?\n");

  // No baseline of the input's scenario; then a schema this build does not read.
  r = run_bench("gate " + kCpuBaseline.string() + " " + fixtures + "base.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "error: " + fixtures + "base.json: no baseline of scenario 'fixture' in " +
                          (kCpuBaseline / "gate.yaml").string() +
                          " (it gates: ci-gate); judge a run of a scenario the baseline gates, or "
                          "add an entry for it to gate.yaml and record it with --update\n");
  r = run_bench("gate " + fixtures + "base.json " + fixtures + "schema_v2.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("schema_version 2 is not supported"), std::string::npos) << r.output;
  r = run_bench("gate " + fixtures + "base.json " + fixtures + "not_json.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output.rfind("error: " + fixtures + "not_json.json: not valid JSON", 0), 0u)
      << r.output;
  r = run_bench("gate " + (dir.path / "nowhere").string() + " " + fixtures + "base.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nowhere: does not exist"), std::string::npos) << r.output;
}

TEST(CliGate, OutWritesTheVerdictsAndAnOverlaidReport) {
  TempDir dir;
  const std::string fixtures = std::string(HISPARSE_TEST_FIXTURES) + "/results/";
  const auto r = run_bench("gate " + fixtures + "base.json " + fixtures + "regressed.json --out " +
                           dir.path.string() + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const json stdout_json = json::parse(r.output);
  const json written = json::parse(contents(dir.path / "gate.json"));
  EXPECT_EQ(stdout_json, written);
  EXPECT_EQ(written["status"], "fail");
  EXPECT_EQ(written["counts"]["slower"], 1);
  EXPECT_NE(contents(dir.path / "gate.md").find("| **slower** |"), std::string::npos);
  // The report draws the baseline and the new run as two sources, the failing point marked.
  const std::string html = contents(dir.path / "report.html");
  EXPECT_NE(html.find("baseline fixture (git aaaaaaaaaaaa)"), std::string::npos);
  EXPECT_NE(html.find("new fixture (git bbbbbbbbbbbb)"), std::string::npos);
  EXPECT_NE(html.find("gate: output_tokens_per_s slower -10.0%"), std::string::npos);
  EXPECT_NE(html.find("\u25BC"), std::string::npos);
}

}  // namespace
}  // namespace hisparse::test
