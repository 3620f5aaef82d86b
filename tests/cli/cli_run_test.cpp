// hisparse-bench run end to end on the CPU backend: result files, --json, failed points, --set.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/device.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse::test {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(HISPARSE_TEST_FIXTURES) + "/scenarios/tiny.yaml";

TEST(CliRun, WritesThreeParseableFiles) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --quiet --out " + out.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");  // --quiet
  const auto j = nlohmann::json::parse(read_text(out.path / "results.json"));
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["metadata"]["backend"], "cpu");
  EXPECT_EQ(j["metadata"]["synthetic"]["weights"], true);
  EXPECT_NE(j["metadata"]["command_line"].get<std::string>().find("run "), std::string::npos);
  EXPECT_GT(j["metadata"]["ceilings"]["host_copy_gbps"].get<double>(), 0.0);
  EXPECT_EQ(j["scenario"]["name"], "tiny");
  ASSERT_EQ(j["points"].size(), 2u);
  const nlohmann::json points = j["points"];
  for (const auto& p : points) {
    EXPECT_EQ(p["status"], "ok") << p.dump();
    const nlohmann::json m = p["metrics"];
    EXPECT_GT(m["output_tokens_per_s"].get<double>(), 0.0);
    EXPECT_EQ(m["step_ms"]["count"], 2);  // decode_steps
    EXPECT_DOUBLE_EQ(m["tpot_ms"].get<double>(), m["step_ms"]["median"].get<double>());
    EXPECT_NEAR(m["output_tokens_per_s"].get<double>(),
                1000.0 * m["running_requests"].get<double>() / m["step_ms"]["median"].get<double>(),
                1e-6 * m["output_tokens_per_s"].get<double>());
    EXPECT_EQ(m["running_requests"], 1);
    EXPECT_EQ(m["queued_requests"], 0);
  }
  EXPECT_EQ(j["points"][0]["axes"]["mode"], "dense");
  EXPECT_EQ(j["points"][1]["axes"]["mode"], "sparse-gpu");
  EXPECT_EQ(j["summary"]["complete"], true);

  const std::string csv = read_text(out.path / "results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_EQ(csv.rfind("index,model,mode,", 0), 0u);
  const std::string md = read_text(out.path / "summary.md");
  EXPECT_NE(md.find("## mode: dense"), std::string::npos) << md;
  EXPECT_NE(md.find("## mode: sparse-gpu"), std::string::npos) << md;
  EXPECT_NE(md.find("synthetic weights/workload"), std::string::npos);
  EXPECT_NE(md.find("not GPU figures"), std::string::npos);
}

// The deployment flow of per-head budgets: a quality study writes its calibrated split (and the
// splits on the same path at each of its budgets), and a scenario loads it by path (relative to
// the scenario file). A point at a study budget plans with the split calibrated there, another
// with the shares of the split that reached the target; each records its table, and the mean
// bits stay near the point's budget_bits.
TEST(CliRun, PerHeadBudgetsFromAQualityStudy) {
  TempDir dir;
  fs::create_directories(dir.path);
  const auto study = run_bench(
      "quality --kv-heads 2 --tokens 4096 --budgets 32,48,64,96,128 --rule paper "
      "--calibrated-budgets 8 --centre-keys --json > " +
      (dir.path / "split.json").string());
  ASSERT_EQ(study.exit_code, 0) << study.output;
  const auto split = nlohmann::json::parse(read_text(dir.path / "split.json"));
  const auto table = split["calibrated_head_budgets"]["paper"];
  ASSERT_TRUE(table.is_array() && table.size() == 2u) << split.dump();
  ASSERT_NE(table[0], table[1]) << "the study should split the budget unevenly";
  const auto by_budget = split["calibrated_head_budgets_by_budget"]["paper"];
  ASSERT_TRUE(by_budget.contains("32") && by_budget.contains("64")) << split.dump();
  std::ofstream(dir.path / "s.yaml")
      << "name: split\nmodel: tiny-gqa\nmode: fathom\ncontext_length: 512\ntop_k: 64\n"
         "decode_steps: 1\nwarmup_steps: 0\nsweep: {budget_bits: [32, 40, 64]}\n"
         "fathom: {head_budgets: split.json}\n";
  const auto r = run_bench("run " + (dir.path / "s.yaml").string() +
                           " --backend cpu --quiet --out " + (dir.path / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_text(dir.path / "out" / "results.json"));
  EXPECT_EQ(j["scenario"]["fathom"]["head_budgets"], table);
  ASSERT_EQ(j["points"].size(), 3u);
  for (const auto& p : j["points"]) {
    const int at = p["config"]["budget_bits"].get<int>();
    EXPECT_EQ(p["config"]["fathom_head_budgets"],
              at == 40 ? table : by_budget[std::to_string(at)])
        << at;  // 40 is not one of the study's budgets
    const double bits = p["metrics"]["bits_per_token"].get<double>();
    const double budget = p["config"]["budget_bits"].get<double>();
    EXPECT_GE(bits, budget - 1.0) << p.dump();  // planes: budget +- rounding; plus scale bits
    EXPECT_LE(bits, budget + 1.0 + 0.25 * 32) << p.dump();
  }
}

TEST(CliRun, JsonOnStdoutIsTheResultsDocument) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --json --out " + out.path.string() +
                           " --set sweep.mode=[dense]");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["points"].size(), 1u);
  EXPECT_EQ(j["scenario"]["sweep"]["mode"], nlohmann::json::array({"dense"}));
  EXPECT_EQ(j, nlohmann::json::parse(read_text(out.path / "results.json")));
}

// Points that differ only in a swept budget_bits (or top_k, hot_buffer, policy) say so.
TEST(CliRun, ProgressLinesNameEverySweptAxis) {
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cpu --out " + out.path.string() +
                           " --set sweep.mode=[fathom] --set sweep.budget_bits=[32,64] --set "
                           "top_k=64 --set decode_steps=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[1/2] tiny-gqa fathom concurrency=1 context=128 budget_bits=32: "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[2/2] tiny-gqa fathom concurrency=1 context=128 budget_bits=64: "),
            std::string::npos)
      << r.output;
}

TEST(CliRun, HumanOutputIsATableNamingCpuTimings) {
  TempDir out;
  const auto r =
      run_bench("run " + kTiny + " --backend cpu --out " + out.path.string() +
                " --set sweep.mode=[dense,hisparse,fathom] --set top_k=64 --set decode_steps=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("point  model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CPU wall-clock timings"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[1/3] tiny-gqa dense concurrency=1 context=128: "), std::string::npos)
      << r.output;
  // The last columns: the hit rate of the hot-buffer points and the bits per token of the
  // Fathom points, then (as a hot-buffer mode ran) each hot-buffer point's slots and the miss
  // rate of its replacement-policy replay, as in results.json; "-" where a point has none.
  EXPECT_NE(r.output.find("step ms  hit rate  bits/tok    hot      policy miss\n"),
            std::string::npos)
      << r.output;
  const auto points = read_json(out.path / "results.json")["points"];
  ASSERT_EQ(points.size(), 3u);
  const auto& hisparse = points[1]["metrics"];
  const auto& fathom = points[2]["metrics"];
  ASSERT_TRUE(hisparse["hit_rate"].is_number() && fathom["bits_per_token"].is_number() &&
              hisparse["policy_miss_rate"].is_number());
  const std::vector<std::string> tails{
      "         -         -      -                -\n",
      fmt::format("{:>9.3f}         - {:>6} {:>16}\n", hisparse["hit_rate"].get<double>(),
                  points[1]["config"]["hot_buffer"].get<int>(),
                  fmt::format("lru {:.2f}%", 100 * hisparse["policy_miss_rate"].get<double>())),
      fmt::format("        - {:>9.1f}      -                -\n",
                  fathom["bits_per_token"].get<double>())};
  for (std::size_t i = 0; i < tails.size(); ++i) {
    const auto row = r.output.find(fmt::format("{:>5}  tiny-gqa", i));
    ASSERT_NE(row, std::string::npos) << r.output;
    const auto end = r.output.find('\n', row);
    EXPECT_EQ(r.output.substr(end + 1 - tails[i].size(), tails[i].size()), tails[i]) << r.output;
  }
}

TEST(CliRun, FailedPointIsRecordedAndTheSweepGoesOn) {
  TempDir out;
  const auto r = run_bench("run " + std::string(HISPARSE_TEST_FIXTURES) +
                           "/scenarios/failing.yaml --quiet --out " + out.path.string() +
                           " --set sweep.context_length=[1000000000000,128]");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto j = nlohmann::json::parse(read_text(out.path / "results.json"));
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["status"], "failed");
  EXPECT_NE(j["points"][0]["error"].get<std::string>().find("not one request fits"),
            std::string::npos)
      << j["points"][0]["error"];
  EXPECT_EQ(j["points"][1]["status"], "ok") << j["points"][1].dump();
  EXPECT_EQ(j["summary"]["failed"], 1);
  EXPECT_NE(read_text(out.path / "results.csv").find(",failed,"), std::string::npos);
}

TEST(CliRun, CudaBackendWithoutGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  TempDir out;
  const auto r = run_bench("run " + kTiny + " --backend cuda --out " + out.path.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output.rfind("error: --backend: backend 'cuda' requested but ", 0), 0u) << r.output;
  EXPECT_NE(
      r.output.find("; run on a machine with an NVIDIA GPU, or use backend 'cpu' or 'auto'\n"),
      std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1);
  EXPECT_FALSE(fs::exists(out.path / "results.json"));
}

TEST(CliRun, BadScenarioNameSuggestsTheNearest) {
  const auto r = run_bench("run quik");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "error: run: SCENARIO: no scenario file 'quik'; did you mean 'quick'?\n");
}

TEST(CliRun, UnwritableOutputFolderIsBadInput) {
  const auto r = run_bench("run " + kTiny + " --backend cpu --out /proc/hisparse-no-such/out");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(
      r.output.rfind("error: /proc/hisparse-no-such/out: cannot create the output folder (", 0), 0u)
      << r.output;
}

}  // namespace
}  // namespace hisparse::test
